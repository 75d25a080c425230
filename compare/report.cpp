#include "lockstep/compare/report.h"

#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep {
namespace {

using Json = nlohmann::ordered_json;  // keeps the documented key order (schema first)

// ---- small formatting helpers ----

std::string Redact(std::string_view text);
// Arm names come from a command-line flag; they pass the same redaction as any outside text.
std::string ArmName(const ArmInfo& arm, const char* fallback) {
  return arm.arm.empty() ? fallback : Redact(arm.arm);
}

bool IsHex(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isxdigit(static_cast<unsigned char>(c));
  });
}

// Only hex digits may pass: a hash field that holds anything else (a path, "unknown: ...") is
// not a hash and must not leak into an allowlisted report.
std::string Hash12(const std::string& h) {
  const std::string head = h.substr(0, 12);
  return IsHex(head) ? head : "unknown";
}

// Thresholds print with as few digits as represent them exactly ("2e-04", "2.5e-04"), so the
// line reads like the acceptance rule that was declared rather than like a measurement.
std::string FormatThreshold(double v) {
  if (v == 0.0 || !std::isfinite(v)) return FormatMetric(v);
  for (int prec = 0; prec <= 3; ++prec) {
    std::string s = fmt::format("{:.{}e}", v, prec);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return fmt::format("{:.3e}", v);
}

std::string Ms(double v) { return std::isfinite(v) ? fmt::format("{:.3f}", v) : FormatMetric(v); }
std::string Percent(double v) {
  return std::isfinite(v) ? fmt::format("{:+.2f}%", v * 100.0) : FormatMetric(v);
}

// JSON has no inf/nan; nlohmann would write null, which reads as "unknown". Strings keep the value.
Json Num(double v) { return std::isfinite(v) ? Json(v) : Json(FormatMetric(v)); }
// -1 is the exports' "unknown" (STYLE 17): null in JSON, never a number.
Json Known(std::int64_t v) { return v < 0 ? Json(nullptr) : Json(v); }

// Markdown text from outside (arm names, reasons, config values): backslash-escape what could
// start markup, and fold newlines so a value cannot open a new block. '>' and ']' stay ('>' only
// matters at a line start, where outside text never sits; ']' cannot close a link whose '[' is
// escaped) so "NRMSE 3.1e-02 > 2e-04" and "[12,24,36]" read as written.
std::string Md(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n' || c == '\r') {
      out += ' ';
    } else if (std::string_view("\\`*<|&#[").find(c) != std::string_view::npos) {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  return out;
}
// Inline code from outside: backticks would end the span, so they become quotes.
std::string MdCode(std::string_view s) {
  std::string t(s);
  std::replace(t.begin(), t.end(), '`', '\'');
  std::replace(t.begin(), t.end(), '\n', ' ');
  return "`" + t + "`";
}

std::string Plural(std::int64_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

// Shared by both escapes. C0 controls other than tab/newline are invalid in XML 1.0 (JUnit
// parsers reject the file), so they become U+FFFD.
std::string Escape(std::string_view s, const char* apos) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += apos;
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t' && c != '\r') {
          out += "\xEF\xBF\xBD";
        } else {
          out += c;
        }
    }
  }
  return out;
}

// ---- forbidden text (shared by FindForbiddenText and Redact) ----

struct Span {
  std::size_t begin, end;
};

bool IsAlnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
bool IsPathChar(char c) {
  return IsAlnum(c) || std::string_view("_.-/~+@%").find(c) != std::string_view::npos;
}
// A '/' starts an absolute path only after something that cannot be part of a word or a tag:
// "p/T", "1/2", "A/A" (letter/digit before) and "</svg>" ('<' before) are not paths.
bool PathStartBoundary(char c) { return !IsPathChar(c) && c != '<' && c != '\\'; }

std::string Lower(std::string_view s) {
  std::string t(s);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

// Host and account names of this process (each read once; names of 2 characters or fewer are
// too common as substrings to search for).
const std::vector<std::string>& LocalIdentities() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    auto add = [&v](std::string s) {
      if (s.size() > 2 && std::find(v.begin(), v.end(), Lower(s)) == v.end()) v.push_back(Lower(s));
    };
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) == 0) {
      const std::string host(buf);
      add(host);
      add(host.substr(0, host.find('.')));  // short name
    }
    char login[256] = {};
    if (getlogin_r(login, sizeof(login)) == 0) add(login);
    if (const char* user = std::getenv("USER")) add(user);  // env: USER
    if (const passwd* pw = getpwuid(geteuid())) add(pw->pw_name);
    return v;
  }();
  return names;
}

void FindPathSpans(std::string_view t, std::vector<Span>& out) {
  auto token_end = [&t](std::size_t i) {
    while (i < t.size() && IsPathChar(t[i])) ++i;
    return i;
  };
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '/' && (i == 0 || PathStartBoundary(t[i - 1]))) {
      const std::size_t e = token_end(i);
      std::size_t k = i;
      while (k < e && t[k] == '/') ++k;
      // "/a/..." or "//host/...": a non-empty segment followed by another separator.
      const std::size_t next = t.substr(k, e - k).find('/');
      if (k < e && next != std::string_view::npos && next > 0) {
        out.push_back({i, e});
        i = e;
      }
    } else if (c == '~' && i + 1 < t.size() && t[i + 1] == '/') {
      out.push_back({i, token_end(i)});
    } else if (IsAlnum(c) && i + 2 < t.size() && t[i + 1] == ':' && t[i + 2] == '\\' &&
               (i == 0 || !IsAlnum(t[i - 1]))) {  // "C:\..."
      std::size_t e = i + 3;
      while (e < t.size() && (IsPathChar(t[e]) || t[e] == '\\')) ++e;
      out.push_back({i, e});
    } else if (c == '\\' && i + 2 < t.size() && t[i + 1] == '\\' &&
               IsAlnum(t[i + 2])) {  // "\\server\share"
      std::size_t e = i + 2;
      while (e < t.size() && (IsPathChar(t[e]) || t[e] == '\\')) ++e;
      out.push_back({i, e});
    }
  }
  // Well-known roots anywhere, even glued to a word ("x/home/alice" is still a home folder).
  for (std::string_view root :
       {"/home/", "/tmp/", "/work/", "/usr/", "/var/", "/root/", "/Users/", "/mnt/", "/opt/"}) {
    for (std::size_t p = t.find(root); p != std::string_view::npos; p = t.find(root, p + 1))
      out.push_back({p, token_end(p)});
  }
}

std::vector<Span> ForbiddenSpans(std::string_view text, const std::vector<std::string>& extra) {
  std::vector<Span> spans;
  FindPathSpans(text, spans);
  const std::string lower = Lower(text);
  for (const std::string& name : LocalIdentities()) {
    for (std::size_t p = lower.find(name); p != std::string::npos; p = lower.find(name, p + 1)) {
      const std::size_t e = p + name.size();
      // Whole words only: a host called "dev" must not flag "device", and a user called "root"
      // must not flag the hyphenated word "root-cause".
      auto word_edge = [&lower](std::size_t i) { return !IsAlnum(lower[i]) && lower[i] != '-'; };
      if ((p == 0 || word_edge(p - 1)) && (e == lower.size() || word_edge(e)))
        spans.push_back({p, e});
    }
  }
  for (const std::string& s : extra) {
    if (s.empty()) continue;
    for (std::size_t p = text.find(s); p != std::string_view::npos; p = text.find(s, p + 1))
      spans.push_back({p, p + s.size()});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  return spans;
}

// Free text that came from an export (reasons, unknowns, stop reasons) with anything forbidden
// replaced: the reports are allowlisted even when an input string is not.
std::string Redact(std::string_view text) {
  const std::vector<Span> spans = ForbiddenSpans(text, {});
  if (spans.empty()) return std::string(text);
  std::string out;
  std::size_t pos = 0;
  for (const Span& s : spans) {
    if (s.begin < pos) {  // overlaps the previous span (a host name inside a path): widen it
      pos = std::max(pos, s.end);
      continue;
    }
    out.append(text.substr(pos, s.begin - pos));
    out += "(redacted)";
    pos = s.end;
  }
  out.append(text.substr(pos));
  return out;
}

// ---- state helpers ----

bool HasMetric(const ItemResult& it) { return it.verdict != Verdict::kSkip && it.elements > 0; }

// What made an item fail, as "NRMSE 3.1e-02 > 2e-04" (metric and the threshold applied).
std::string FailureDetail(const ItemResult& it) {
  if (HasMetric(it)) {
    if (it.stats.non_finite || (it.has_kl && it.kl.non_finite)) return "non-finite values";
    if (!(it.stats.nrmse <= it.nrmse_max))
      return fmt::format("NRMSE {} > {}", FormatMetric(it.stats.nrmse),
                         FormatThreshold(it.nrmse_max));
    if (it.has_kl && !(it.kl.kl_max <= it.kl_max))
      return fmt::format("KL {} > {}", FormatMetric(it.kl.kl_max), FormatThreshold(it.kl_max));
  }
  return it.reason.empty() ? std::string("failed") : Redact(it.reason);
}

std::string ItemWhere(const ItemResult& it) {
  std::string s = MdCode(it.checkpoint);
  if (it.stage >= 0) s += fmt::format(" stage {}", it.stage);
  if (it.layer >= 0) s += fmt::format(" layer {}", it.layer);
  return s + " " + MdCode(it.kind.empty() ? it.rel : it.kind);
}

std::string SkipReasons(const std::map<std::string, int>& reasons) {
  std::string s;
  for (const auto& [reason, n] : reasons) {
    if (!s.empty()) s += "; ";
    s += Md(Redact(reason));
    if (reasons.size() > 1) s += fmt::format(" x{}", n);
  }
  return s;
}

// Config differences for reports: allowlisted keys verbatim, others by name only (the model and
// replay paths differ between folders even for identical content).
std::vector<std::string> ConfigDifferences(const ReportInput& in) {
  const auto& keys = ReportConfigKeys();
  std::vector<std::string> out;
  if (in.diff != nullptr) {
    for (const std::string& d : in.diff->config_differences) {
      const std::string key = d.substr(0, d.find(':'));
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
        out.push_back(Redact(d));
      } else {
        out.push_back(Redact(key) + ": differs (value not shown: not an allowlisted key)");
      }
    }
    return out;
  }
  for (const std::string& key : keys) {
    auto ia = in.a.config.find(key), ib = in.b.config.find(key);
    const std::string va = ia == in.a.config.end() ? "(absent)" : ia->second;
    const std::string vb = ib == in.b.config.end() ? "(absent)" : ib->second;
    if (va != vb) out.push_back(Redact(key + ": " + va + " | " + vb));
  }
  return out;
}

Json WindowJson(const std::optional<WindowRecord>& w) {
  if (!w) return nullptr;
  const Json verify_ms =
      w->verify_ns < 0 ? Json(nullptr) : Num(static_cast<double>(w->verify_ns) / 1e6);
  return Json{{"idx", w->idx},
              {"p", w->p},
              {"T", w->T},
              {"T_mtp", w->T_mtp},
              {"merged", w->merged},
              {"from_sfx", w->from_sfx},
              {"chain_n", w->chain_n},
              {"accepted", w->accepted},
              {"verify_ms", verify_ms}};
}

Json NotableJson(const std::vector<NotableWindow>& v) {
  Json arr = Json::array();
  for (const NotableWindow& n : v)
    arr.push_back({{"idx", n.idx},
                   {"p", n.p},
                   {"T", n.T},
                   {"verify_ms", Num(n.verify_ms)},
                   {"ratio_to_median", Num(n.ratio_to_median)},
                   {"after_divergence", n.after_divergence}});
  return arr;
}

Json ArmJson(const ArmInfo& a, const char* fallback) {
  Json config = Json::object();
  for (const auto& [k, v] : a.config) {
    Json parsed = Json::parse(v, nullptr, /*allow_exceptions=*/false);
    config[k] = parsed.is_discarded() ? Json(v) : parsed;
  }
  const SamplerSummary& s = a.sampler;
  Json sampler = {{"n_samples", s.n_samples},
                  {"interval_min_ns", Known(s.interval_min_ns)},
                  {"interval_median_ns", Known(s.interval_median_ns)},
                  {"interval_max_ns", Known(s.interval_max_ns)},
                  {"nvml", Redact(s.nvml)},
                  {"guard", Redact(s.guard)},
                  {"min_host_available_bytes", Known(s.min_host_available_bytes)},
                  {"max_swap_used_bytes", Known(s.max_swap_used_bytes)},
                  {"max_rss_bytes", Known(s.max_rss_bytes)},
                  {"n_device_samples", s.n_device_samples},
                  {"min_device_free_bytes", Known(s.min_device_free_bytes)},
                  {"max_temperature_c", Known(s.max_temperature_c)},
                  {"min_sm_clock_mhz", Known(s.min_sm_clock_mhz)},
                  {"max_sm_clock_mhz", Known(s.max_sm_clock_mhz)},
                  {"pcie_gen", Known(s.pcie_gen)},
                  {"pcie_width", Known(s.pcie_width)}};
  Json unknowns = Json::array();
  for (const std::string& u : a.unknowns) unknowns.push_back(Redact(u));
  return {{"arm", ArmName(a, fallback)},
          {"run_id", Redact(a.run_id)},
          {"model_sha256_12", a.model_sha256_12},
          {"request_sha256_12", a.request_sha256_12},
          {"config_sha256_12", a.config_sha256_12},
          {"config", config},
          {"prompt_tokens", a.prompt_tokens},
          {"output_tokens", a.output_tokens},
          {"stop_reason", Redact(a.stop_reason)},
          {"windows", a.windows},
          {"checkpoints", a.checkpoints},
          {"sampler", sampler},
          {"unknowns", unknowns}};
}

Json ItemJson(const ItemResult& it) {
  const bool m = HasMetric(it);
  const bool kl = m && it.has_kl;
  auto metric = [m](double v) { return m ? Num(v) : Json(nullptr); };
  return {{"checkpoint", it.checkpoint},
          {"rel", it.rel},
          {"kind", it.kind},
          {"stage", it.stage},
          {"layer", it.layer},
          {"dtype", it.dtype},
          {"label", it.label},
          {"verdict", VerdictName(it.verdict)},
          {"reason", Redact(it.reason)},
          {"rows", it.rows},
          {"capacity_rows", it.capacity_rows},
          {"elements", it.elements},
          {"nrmse", metric(it.stats.nrmse)},
          {"max_abs", metric(it.stats.max_abs)},
          {"n_diff", m ? Json(it.stats.n_diff) : Json(nullptr)},
          {"first_diff", m ? Json(it.stats.first_diff) : Json(nullptr)},
          {"non_finite",
           m ? Json(it.stats.non_finite || (it.has_kl && it.kl.non_finite)) : Json(nullptr)},
          {"code_diff", m && it.dtype == "int8" ? Json(it.code_diff) : Json(nullptr)},
          {"kl_max", kl ? Num(it.kl.kl_max) : Json(nullptr)},
          {"kl_mean", kl ? Num(it.kl.kl_mean) : Json(nullptr)},
          {"top1_agree", kl ? Json(it.kl.top1_agree) : Json(nullptr)},
          {"kl_rows", kl ? Json(it.kl.rows) : Json(nullptr)},
          {"nrmse_max", Num(it.nrmse_max)},
          {"kl_max_threshold", it.has_kl ? Num(it.kl_max) : Json(nullptr)}};
}

Json StateJson(const DiffResult& d) {
  Json first = nullptr;
  if (d.first_failure >= 0 && static_cast<std::size_t>(d.first_failure) < d.items.size()) {
    const ItemResult& f = d.items[static_cast<std::size_t>(d.first_failure)];
    first = {{"checkpoint", f.checkpoint},
             {"stage", f.stage},
             {"layer", f.layer},
             {"kind", f.kind},
             {"rel", f.rel},
             {"reason", FailureDetail(f)}};
  }
  Json cps = Json::array();
  for (const CheckpointSummary& c : d.checkpoints) {
    Json reasons = Json::object();
    for (const auto& [r, n] : c.skip_reasons) reasons[Redact(r)] = n;
    cps.push_back({{"name", c.name},
                   {"window", c.window},
                   {"point", c.point},
                   {"p", c.p},
                   {"T", c.T},
                   {"compared", c.compared},
                   {"passed", c.passed},
                   {"failed", c.failed},
                   {"skipped", c.skipped},
                   {"skip_reasons", reasons}});
  }
  Json items = Json::array();
  for (const ItemResult& it : d.items) items.push_back(ItemJson(it));
  return {{"passed", d.Passed()},
          {"model_differs", d.model_differs},
          {"request_differs", d.request_differs},
          {"output_differs", d.output_differs},
          {"compared", d.compared},
          {"passed_items", d.passed},
          {"failed", d.failed},
          {"skipped", d.skipped},
          {"first_failure", first},
          {"checkpoints", cps},
          {"items", items}};
}

Json AlignJson(const AlignResult& al) {
  Json timing = Json::array();
  for (const IntervalDiff& t : al.timing) {
    auto v = [&t](double x) { return t.known ? Num(x) : Json(nullptr); };
    timing.push_back({{"name", t.name},
                      {"known", t.known},
                      {"max_abs_delta_ms", v(t.max_abs_delta_ms)},
                      {"max_at", t.known ? Json(t.max_at) : Json(nullptr)},
                      {"median_delta_ms", v(t.median_delta_ms)},
                      {"median_abs_delta_ms", v(t.median_abs_delta_ms)},
                      {"sum_a_ms", v(t.sum_a_ms)},
                      {"sum_b_ms", v(t.sum_b_ms)},
                      {"rel_diff", v(t.rel_diff)}});
  }
  return {{"fields", al.fields},
          {"n_a", al.n_a},
          {"n_b", al.n_b},
          {"matched", al.matched},
          {"diverged", al.diverged},
          {"div_idx", al.diverged ? Json(al.div_idx) : Json(nullptr)},
          {"div_a", WindowJson(al.div_a)},
          {"div_b", WindowJson(al.div_b)},
          {"differing_fields", al.differing_fields},
          {"timing", timing},
          {"median_verify_ms_a", Num(al.median_verify_ms_a)},
          {"median_verify_ms_b", Num(al.median_verify_ms_b)},
          {"notable_a", NotableJson(al.notable_a)},
          {"notable_b", NotableJson(al.notable_b)},
          {"rest_a_count", al.rest_a.size()},
          {"rest_b_count", al.rest_b.size()}};
}

// ---- Markdown sections (bodies without their "## " headings; HTML renders the same text) ----

struct Sections {
  std::string intro, scope, state, timing, limitations, conclusion;
};

std::string ScopeSection(const ReportInput& in) {
  const std::string na = Md(ArmName(in.a, "A")), nb = Md(ArmName(in.b, "B"));
  std::string s = fmt::format(
      "Arms: {} (reference) and {}. Values come from each arm's own export.\n\n", na, nb);
  s += fmt::format("| | {} | {} |\n|---|---|---|\n", na, nb);
  auto row = [&s](const char* what, const std::string& a, const std::string& b) {
    s += fmt::format("| {} | {} | {} |\n", what, a, b);
  };
  row("model SHA-256 (first 12)", MdCode(in.a.model_sha256_12), MdCode(in.b.model_sha256_12));
  row("request SHA-256 (first 12)", MdCode(in.a.request_sha256_12), MdCode(in.b.request_sha256_12));
  row("config SHA-256 (first 12)", MdCode(in.a.config_sha256_12), MdCode(in.b.config_sha256_12));
  row("prompt tokens", std::to_string(in.a.prompt_tokens), std::to_string(in.b.prompt_tokens));
  row("output tokens", std::to_string(in.a.output_tokens), std::to_string(in.b.output_tokens));
  row("stop reason", Md(Redact(in.a.stop_reason)), Md(Redact(in.b.stop_reason)));
  row("verify windows", std::to_string(in.a.windows), std::to_string(in.b.windows));
  row("state checkpoints", std::to_string(in.a.checkpoints), std::to_string(in.b.checkpoints));

  s += "\nEngine configuration (allowlisted keys; differing values marked):\n\n";
  s += fmt::format("| key | {} | {} | |\n|---|---|---|---|\n", na, nb);
  auto shown = [](const std::map<std::string, std::string>& m, const std::string& k) {
    auto it = m.find(k);
    if (it == m.end()) return std::string("(absent)");
    std::string v = it->second;
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"')
      v = v.substr(1, v.size() - 2);  // plain strings read better
    return Md(Redact(v));
  };
  bool any_key = false;
  for (const std::string& key : ReportConfigKeys()) {
    if (!in.a.config.count(key) && !in.b.config.count(key)) continue;
    any_key = true;
    const std::string va = shown(in.a.config, key), vb = shown(in.b.config, key);
    s += fmt::format("| {} | {} | {} | {} |\n", MdCode(key), va, vb, va == vb ? "" : "**differs**");
  }
  if (!any_key) s += "| (no configuration recorded) | | | |\n";

  const std::vector<std::string> diffs = ConfigDifferences(in);
  if (diffs.empty()) {
    s += "\nConfiguration differences: none.\n";
  } else {
    s += "\nConfiguration differences:\n\n";
    for (const std::string& d : diffs) s += "- " + Md(d) + "\n";
  }
  if (in.diff != nullptr) {
    if (in.diff->model_differs) s += "\nThe model differs between the arms.\n";
    if (in.diff->request_differs) s += "\nThe request differs between the arms.\n";
  }
  s += "\nOnly allowlisted configuration keys, hashes (first 12 hex digits) and aggregate "
       "measurements are "
       "included; no file paths, host names, account names or request text.\n";
  return s;
}

std::string ResourceLine(const std::string& name, const SamplerSummary& s) {
  auto known = [](std::int64_t v, double scale, const char* f) {
    return v < 0 ? std::string("unknown")
                 : fmt::format(fmt::runtime(f), static_cast<double>(v) / scale);
  };
  std::string line = fmt::format(
      "- Resource samples ({}): {} host samples, interval median {} / max {}; minimum host "
      "available memory {}; "
      "maximum swap used {}",
      Md(name), s.n_samples, known(s.interval_median_ns, 1e6, "{:.1f} ms"),
      known(s.interval_max_ns, 1e6, "{:.1f} ms"),
      known(s.min_host_available_bytes, 1073741824.0, "{:.1f} GiB"),
      known(s.max_swap_used_bytes, 1048576.0, "{:.0f} MiB"));
  if (s.n_device_samples > 0) {
    line += fmt::format(
        "; {} device samples, minimum device free memory {}, peak temperature {}, SM clock {} to "
        "{}, "
        "PCIe {}",
        s.n_device_samples, known(s.min_device_free_bytes, 1048576.0, "{:.0f} MiB"),
        known(s.max_temperature_c, 1.0, "{:.0f} C"), known(s.min_sm_clock_mhz, 1.0, "{:.0f} MHz"),
        known(s.max_sm_clock_mhz, 1.0, "{:.0f} MHz"),
        s.pcie_gen < 0 ? std::string("unknown")
                       : fmt::format("Gen{} x{}", s.pcie_gen, s.pcie_width));
  } else {
    line += "; no device samples";
  }
  return line + ".\n";
}

std::string ConclusionSection(const ReportInput& in) {
  const std::string na = Md(ArmName(in.a, "A")), nb = Md(ArmName(in.b, "B"));
  std::string s;
  if (in.diff == nullptr) {
    s += "- State: not compared.\n";
  } else if (in.diff->model_differs || in.diff->request_differs) {
    s += fmt::format("- State: not compared, because the {} differs between the arms.\n",
                     in.diff->model_differs ? "model" : "request");
  } else if (in.diff->compared == 0 && in.diff->failed == 0) {
    s += "- State: no items were compared.\n";
  } else if (in.diff->failed == 0) {
    s += fmt::format("- State: all {} compared at {} matched within the thresholds.\n",
                     Plural(in.diff->compared, "item", "items"),
                     Plural(static_cast<std::int64_t>(in.diff->checkpoints.size()), "checkpoint",
                            "checkpoints"));
  } else {
    s += fmt::format("- State: {} of {} compared items failed the thresholds.\n", in.diff->failed,
                     in.diff->compared);
  }
  if (in.diff != nullptr)
    s += in.diff->output_differs ? "- Output: differs between the arms.\n"
                                 : "- Output: identical token ids and stop reason.\n";
  if (in.align == nullptr) {
    s += "- Path: windows not aligned.\n";
  } else if (in.align->diverged) {
    s += fmt::format(
        "- Path: first divergence at window {} after {} matched windows ({}: {} windows, {}: "
        "{}).\n",
        in.align->div_idx, in.align->matched, na, in.align->n_a, nb, in.align->n_b);
  } else {
    s += fmt::format("- Path: no divergence over {} windows.\n", in.align->matched);
  }
  s += "\nThis is a bounded diagnostic observation of these two runs: it does not establish a "
       "cause, a "
       "correctness bug or a performance result, and two runs are not a statistical "
       "characterization.\n\n";
  s += "No fix is claimed.\n";
  return s;
}

// How to read the device rows of a timing table (compare/align.h DeviceTimingIntervals()).
constexpr const char* kDeviceIntervalsNote =
    "dev_wait, dev_compute and dev_copy are CUDA-event intervals on each stage's stream (waiting for "
    "the stage's input, its kernels, its host copies), summed over the stages; init is host time in "
    "one-time set-up (allocations, handles, graph capture).";

Sections BuildSections(const ReportInput& in) {
  Sections sec;
  sec.intro = fmt::format("A/A diagnostic comparing {} (reference) and {}.\n",
                          Md(ArmName(in.a, "A")), Md(ArmName(in.b, "B")));
  sec.scope = ScopeSection(in);
  sec.state = in.diff != nullptr ? MarkdownStateSection(*in.diff)
                                 : "State was not compared in this report.\n";
  sec.timing = in.align != nullptr
                   ? MarkdownTimingSection(*in.align, ArmName(in.a, "A"), ArmName(in.b, "B"))
                   : "Windows were not aligned in this report.\n";
  for (const std::string& l : Limitations(in)) sec.limitations += "- " + Md(l) + "\n";
  const bool device = in.align != nullptr && in.align->timing.size() > TimingIntervals().size();
  sec.limitations += device ? "- Timings are monotonic host-side intervals around the instrumented calls, and "
                              "per-stage CUDA-event spans (dev_*), not individual kernel timings; there is no "
                              "complete kernel-launch trace.\n"
                            : "- Timings are monotonic host-side intervals around the instrumented calls, not "
                              "individual kernel timings; there is no complete kernel-launch trace.\n";
  if (in.a.sampler.n_samples > 0) sec.limitations += ResourceLine(ArmName(in.a, "A"), in.a.sampler);
  if (in.b.sampler.n_samples > 0) sec.limitations += ResourceLine(ArmName(in.b, "B"), in.b.sampler);
  sec.conclusion = ConclusionSection(in);
  return sec;
}

}  // namespace

// ---- public API ----

const std::vector<std::string>& ReportConfigKeys() {
  // model and replay_path are folders/files: the model is identified by its SHA-256 instead.
  static const std::vector<std::string> keys = {
      "backend",    "threads",      "stages",          "split",        "prefill_chunk",  // pipeline
      "kv_dtype",   "kv_page_rows", "expert_cache",    "pcie_frac",                      // caches
      "max_new",    "seed",         "temperature",     "top_k",        "top_p",
      "ignore_eos",  // request
      "spec",       "mtp",          "spec_max_suffix", "suffix_index", "draft_policy",
      "inject"};  // drafts, faults
  return keys;
}

ArmInfo SummarizeArm(const ExportMeta& meta, const std::string& fallback_name) {
  ArmInfo a;
  a.arm = meta.arm.empty() ? fallback_name : meta.arm;
  a.run_id = meta.run_id;
  a.model_sha256_12 = Hash12(meta.model_sha256);
  a.request_sha256_12 = Hash12(meta.request_sha256);
  a.config_sha256_12 = Hash12(meta.config_sha256);
  // A broken /config leaves the map empty rather than failing the report: the hashes still say
  // whether the configurations were equal.
  const Json cfg = Json::parse(meta.config_json, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_object()) {
    for (const std::string& key : ReportConfigKeys()) {
      auto it = cfg.find(key);
      if (it != cfg.end()) a.config[key] = it->dump(-1, ' ', false, Json::error_handler_t::replace);
    }
  }
  a.prompt_tokens = static_cast<std::int64_t>(meta.request_tokens.size());
  a.output_tokens = static_cast<std::int64_t>(meta.output_tokens.size());
  a.stop_reason = meta.stop_reason;
  a.windows = static_cast<std::int64_t>(meta.windows.size());
  a.checkpoints = static_cast<std::int64_t>(meta.checkpoints.size());
  a.sampler = meta.sampler;
  a.unknowns = meta.unknowns;
  return a;
}

std::vector<std::string> Limitations(const ReportInput& in) {
  std::vector<std::string> out;
  auto add = [&out](std::string s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  };
  const std::string na = ArmName(in.a, "A"), nb = ArmName(in.b, "B");
  auto in_arms = [&](bool a, bool b) {
    return a && b ? std::string("both arms") : (a ? na : nb) + " only";
  };

  // Unknowns, once each, naming the arm(s) that recorded them.
  std::vector<std::string> seen;
  for (const auto* list : {&in.a.unknowns, &in.b.unknowns}) {
    for (const std::string& u : *list) {
      if (std::find(seen.begin(), seen.end(), u) != seen.end()) continue;
      seen.push_back(u);
      const bool a = std::count(in.a.unknowns.begin(), in.a.unknowns.end(), u) > 0;
      const bool b = std::count(in.b.unknowns.begin(), in.b.unknowns.end(), u) > 0;
      add(fmt::format("Recorded as unknown in {}: {}", in_arms(a, b), Redact(u)));
    }
  }
  // NVML state, unless the unknowns already said it.
  auto nvml_missing = [](const ArmInfo& arm) {
    const bool listed =
        std::any_of(arm.unknowns.begin(), arm.unknowns.end(),
                    [](const std::string& u) { return u.find("nvml") != std::string::npos; });
    return !listed && arm.sampler.nvml.starts_with("unknown");
  };
  const bool nvml_a = nvml_missing(in.a), nvml_b = nvml_missing(in.b);
  if (nvml_a && nvml_b && in.a.sampler.nvml == in.b.sampler.nvml) {
    add(fmt::format("GPU samples (NVML) were not read in both arms: {}",
                    Redact(in.a.sampler.nvml)));
  } else {
    if (nvml_a)
      add(fmt::format("GPU samples (NVML) were not read in {}: {}", na, Redact(in.a.sampler.nvml)));
    if (nvml_b)
      add(fmt::format("GPU samples (NVML) were not read in {}: {}", nb, Redact(in.b.sampler.nvml)));
  }
  for (const ArmInfo* arm : {&in.a, &in.b}) {
    const std::string name = arm == &in.a ? na : nb;
    if (!arm->sampler.guard.empty())
      add(fmt::format("The resource guard tripped in {}: {}", name, Redact(arm->sampler.guard)));
    if (arm->sampler.n_samples == 0)
      add(fmt::format("No resource samples were recorded in {}.", name));
  }

  if (in.diff == nullptr) {
    add("State not compared: this report has no state diff.");
  } else {
    if (in.diff->model_differs) add("The model differs between the arms: state was not compared.");
    if (in.diff->request_differs)
      add("The request differs between the arms: state was not compared.");
    std::map<std::string, int> skipped;
    for (const CheckpointSummary& c : in.diff->checkpoints)
      for (const auto& [reason, n] : c.skip_reasons) skipped[Redact(reason)] += n;
    for (const auto& [reason, n] : skipped)
      add(fmt::format("{} skipped: {}", Plural(n, "item", "items"), reason));
  }
  if (in.align == nullptr) {
    add("Windows not aligned: this report has no trace comparison.");
  } else {
    for (const IntervalDiff& t : in.align->timing)
      if (!t.known)
        add(fmt::format("The {} interval was recorded as unknown in at least one arm.", t.name));
  }
  const bool exported = in.a.checkpoints > 0 || in.b.checkpoints > 0 ||
                        (in.diff != nullptr && !in.diff->checkpoints.empty());
  if (exported)
    add("State export perturbs execution: timing of state-exporting arms is perturbed by the "
        "export (timing "
        "questions need trace-only arms); subtracting export time does not give an uninstrumented "
        "measurement.");
  const std::int64_t wa = in.align != nullptr ? in.align->n_a : in.a.windows;
  const std::int64_t wb = in.align != nullptr ? in.align->n_b : in.b.windows;
  if (wa != wb)
    add(
        fmt::format("The arms ran different numbers of windows ({}: {}, {}: {}); windows after the "
                    "divergence are "
                    "listed per side, not paired.",
                    na, wa, nb, wb));
  return out;
}

std::string MarkdownStateSection(const DiffResult& d) {
  constexpr std::size_t kMaxListed = 50;  // Markdown stays readable; JSON carries every checkpoint
  std::string s;
  if (d.model_differs || d.request_differs)
    s += fmt::format("State was not compared: the {} differs between the arms.\n\n",
                     d.model_differs ? "model" : "request");
  if (!d.checkpoints.empty()) {
    std::string counts;
    for (std::size_t i = 0; i < d.checkpoints.size() && i < kMaxListed; ++i)
      counts += (i ? " / " : "") + std::to_string(d.checkpoints[i].compared);
    s += fmt::format(
        "There were {} compared items at the respective checkpoints (in all: {} compared, {} "
        "skipped).\n\n",
        counts, d.compared, d.skipped);
  }
  for (std::size_t i = 0; i < d.checkpoints.size() && i < kMaxListed; ++i) {
    const CheckpointSummary& c = d.checkpoints[i];
    s += fmt::format("- {}: {} compared / {} passed / {} failed / {} skipped", MdCode(c.name),
                     c.compared, c.passed, c.failed, c.skipped);
    if (c.skipped > 0)
      s += fmt::format(" ({}: {})", c.skip_reasons.size() > 1 ? "reasons" : "reason",
                       SkipReasons(c.skip_reasons));
    s += fmt::format(", p={}, T={}\n", c.p, c.T);
  }
  if (d.checkpoints.size() > kMaxListed)
    s += fmt::format("- ... and {} more checkpoints (listed in the JSON report)\n",
                     d.checkpoints.size() - kMaxListed);
  if (d.checkpoints.empty()) s += "No state checkpoints were exported.\n";

  std::string overrides;
  for (const auto& [kind, v] : d.thresholds.nrmse_by_kind)
    overrides += (overrides.empty() ? "" : ", ") + Md(kind) + " " + FormatThreshold(v);
  s += fmt::format("\nThresholds: NRMSE <= {} ({}), logits KL <= {}.\n",
                   FormatThreshold(d.thresholds.nrmse_max),
                   overrides.empty() ? "no per kind overrides" : "per kind overrides: " + overrides,
                   FormatThreshold(d.thresholds.kl_max));
  s += "\nUnused paged tails were excluded; speculative rows were compared only against "
       "speculative rows of the same "
       "(p, T), never as committed state.\n\n";

  if (d.first_failure >= 0 && static_cast<std::size_t>(d.first_failure) < d.items.size()) {
    const ItemResult& f = d.items[static_cast<std::size_t>(d.first_failure)];
    s += fmt::format("First failing item: {} ({}).\n", ItemWhere(f), Md(FailureDetail(f)));
    constexpr int kMaxFailed = 20;
    s += fmt::format(
        "\nFailed items ({} in all{}):\n\n| checkpoint | item | label | detail "
        "|\n|---|---|---|---|\n",
        d.failed, d.failed > kMaxFailed ? fmt::format(", first {} shown", kMaxFailed) : "");
    int shown = 0;
    for (const ItemResult& it : d.items) {
      if (it.verdict != Verdict::kFail || shown++ >= kMaxFailed) continue;
      s += fmt::format("| {} | {} | {} | {} |\n", MdCode(it.checkpoint), MdCode(it.rel),
                       Md(it.label), Md(FailureDetail(it)));
    }
  } else if (d.compared > 0) {
    s += "All compared items passed.\n";
  } else {
    s += "No items were compared.\n";
  }
  s += d.output_differs
           ? "\nOutput: the output token ids or the stop reason differ between the arms.\n"
           : "\nOutput: identical output token ids and stop reason in both arms.\n";
  s += "\nThese checks establish equality only at the exported checkpoints; they do not establish "
       "equality of "
       "all later hidden states.\n";
  return s;
}

std::string MarkdownTimingSection(const AlignResult& al, const std::string& name_a,
                                  const std::string& name_b) {
  const std::string na = Md(name_a), nb = Md(name_b);
  std::string s =
      "Timings are monotonic host-side intervals around the instrumented calls, not individual "
      "kernel "
      "timings.\n\n";
  std::string fields;
  for (const std::string& f : al.fields) fields += (fields.empty() ? "" : ", ") + f;
  s += fmt::format("Path fields compared per window: {}.\n\n", fields);
  if (al.diverged) {
    const WindowRecord* wa = al.div_a ? &*al.div_a : nullptr;
    const WindowRecord* wb = al.div_b ? &*al.div_b : nullptr;
    const bool same_p = wa != nullptr && wb != nullptr && wa->p == wb->p;
    std::vector<std::string> shown_fields;
    for (const std::string& f : al.fields)
      if (!(same_p && f == "p")) shown_fields.push_back(f);
    if (same_p || wa == nullptr || wb == nullptr) {
      const int p = wa != nullptr ? wa->p : (wb != nullptr ? wb->p : -1);
      s += p >= 0 ? fmt::format("First path divergence at window {} (p={}):\n\n", al.div_idx, p)
                  : fmt::format("First path divergence at window {}:\n\n", al.div_idx);
    } else {
      s += fmt::format("First path divergence at window {}:\n\n", al.div_idx);
    }
    auto side = [&](const std::string& name, const WindowRecord* w, int n) {
      return w != nullptr ? fmt::format("- {}: {}.\n", name, DescribeWindow(*w, shown_fields))
                          : fmt::format("- {}: no window {} (its trace ended after {} windows).\n",
                                        name, al.div_idx, n);
    };
    s += side(na, wa, al.n_a) + side(nb, wb, al.n_b);
    if (!al.differing_fields.empty()) {
      std::string df;
      for (const std::string& f : al.differing_fields) df += (df.empty() ? "" : ", ") + f;
      s += fmt::format(
          "\nDiffering fields: {}. Windows after that point are not paired by index.\n", df);
    } else {
      s += "\nWindows after that point are not paired by index.\n";
    }
  } else {
    s += fmt::format("No path divergence over {} windows.\n", al.matched);
  }

  s += fmt::format("\nMatched prefix: {} windows.\n\n", al.matched);
  if (al.matched > 0 && !al.timing.empty()) {
    s += fmt::format(
        "| interval | sum {} ms | sum {} ms | rel diff | median delta ms | largest \\|delta\\| ms "
        "| at window |\n"
        "|---|---|---|---|---|---|---|\n",
        na, nb);
    for (const IntervalDiff& t : al.timing) {
      if (!t.known) {
        s += fmt::format("| {} | unknown | unknown | unknown | unknown | unknown | unknown |\n",
                         t.name);
        continue;
      }
      s += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", t.name, Ms(t.sum_a_ms),
                       Ms(t.sum_b_ms), Percent(t.rel_diff), Ms(t.median_delta_ms),
                       Ms(t.max_abs_delta_ms), t.max_at >= 0 ? std::to_string(t.max_at) : "-");
    }
    s += fmt::format("\nDeltas are {} - {} over the matched prefix only.", nb, na);
    if (al.timing.size() > TimingIntervals().size()) s += std::string(" ") + kDeviceIntervalsNote;
    for (const IntervalDiff& t : al.timing) {
      if (t.name != "verify" || !t.known || t.max_at < 0) continue;
      s += fmt::format(
          " The largest verify difference, {} ms at window {}, compares windows with the same "
          "recorded "
          "path fields; it does not prove identical kernel launches or scheduling.",
          Ms(t.max_abs_delta_ms), t.max_at);
    }
    s += "\n";
  } else {
    s += "No windows matched, so no timing is compared.\n";
  }

  s += "\nNotable verify windows (far above that side's median), per side:\n\n";
  auto notable = [&s](const std::string& name, const std::vector<NotableWindow>& v) {
    for (const NotableWindow& n : v)
      s += fmt::format(
          "- {} had a {} ms T={} verify at its own window {} ({}), {:.1f}x its median verify "
          "time.\n",
          name, Ms(n.verify_ms), n.T, n.idx,
          n.after_divergence ? "after the divergence" : "in the matched prefix", n.ratio_to_median);
  };
  notable(na, al.notable_a);
  notable(nb, al.notable_b);
  if (al.notable_a.empty() && al.notable_b.empty()) s += "- None on either side.\n";
  s += "\nA notable window of one side is not treated as a matched event of the other.\n";

  if (al.diverged) {
    s += fmt::format(
        "\nAfter the divergence: {} ran {} more windows, {} ran {} (listed per side, not "
        "paired).\n\n",
        na, al.rest_a.size(), nb, al.rest_b.size());
    auto rest = [&s](const std::string& name, const std::vector<WindowRecord>& v) {
      if (v.empty()) {
        s += fmt::format("- {}: none.\n", name);
        return;
      }
      constexpr std::size_t kShown = 8;
      std::string ts;
      double verify_ms = 0.0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i < kShown) ts += (i ? ", " : "") + std::to_string(v[i].T);
        if (v[i].verify_ns > 0) verify_ms += static_cast<double>(v[i].verify_ns) / 1e6;
      }
      s += fmt::format("- {}: windows {} to {}, T of the first {}: {}{}; verify total {} ms.\n",
                       name, v.front().idx, v.back().idx, std::min(v.size(), kShown), ts,
                       v.size() > kShown ? ", ..." : "", Ms(verify_ms));
    };
    rest(na, al.rest_a);
    rest(nb, al.rest_b);
  }
  return s;
}

std::string RenderJson(const ReportInput& in) {
  Json j;
  j["schema"] = "lockstep.report";
  j["schema_version"] = 1;
  j["title"] = in.title;
  j["arms"] = {{"a", ArmJson(in.a, "A")}, {"b", ArmJson(in.b, "B")}};
  j["config_differences"] = ConfigDifferences(in);
  Json th = nullptr;
  if (in.diff != nullptr) {
    Json by_kind = Json::object();
    for (const auto& [k, v] : in.diff->thresholds.nrmse_by_kind) by_kind[k] = Num(v);
    th = {{"nrmse_max", Num(in.diff->thresholds.nrmse_max)},
          {"kl_max", Num(in.diff->thresholds.kl_max)},
          {"nrmse_by_kind", by_kind}};
  }
  j["thresholds"] = th;
  j["state"] = in.diff != nullptr ? StateJson(*in.diff) : Json(nullptr);
  j["alignment"] = in.align != nullptr ? AlignJson(*in.align) : Json(nullptr);
  j["limitations"] = Limitations(in);
  // replace: invalid UTF-8 from a file becomes U+FFFD instead of an exception.
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string RenderMarkdown(const ReportInput& in) {
  const Sections sec = BuildSections(in);
  return "# " + Md(in.title) + "\n\n" + sec.intro + "\n## Tested configuration and scope\n\n" +
         sec.scope + "\n## Early state checks\n\n" + sec.state +
         "\n## Timing and execution-path observations\n\n" + sec.timing +
         "\n## Measurement limitations\n\n" + sec.limitations + "\n## Conclusion\n\n" +
         sec.conclusion;
}

std::vector<GateOutcome> InferredGates(const ReportInput& in) {
  std::vector<GateOutcome> g;
  if (in.diff != nullptr) {
    const DiffResult& d = *in.diff;
    std::string msg =
        fmt::format("{} of {} compared items failed, {} skipped", d.failed, d.compared, d.skipped);
    if (d.model_differs) msg += "; the model differs";
    if (d.request_differs) msg += "; the request differs";
    g.push_back({"state", d.Passed(), msg});
    g.push_back({"output_identical", !d.output_differs,
                 d.output_differs ? "output token ids or stop reason differ"
                                  : "identical output token ids and stop reason"});
  }
  if (in.align != nullptr) {
    const AlignResult& al = *in.align;
    std::string df;
    for (const std::string& f : al.differing_fields) df += (df.empty() ? "" : ", ") + f;
    g.push_back({"path_identical", !al.diverged,
                 al.diverged ? fmt::format("first divergence at window {} ({})", al.div_idx,
                                           df.empty() ? "one trace ended" : df + " differ")
                             : fmt::format("no divergence over {} windows", al.matched)});
  }
  const std::vector<std::string> diffs = ConfigDifferences(in);
  std::string msg = "no configuration differences";
  if (!diffs.empty()) {
    msg = fmt::format(
        "{}:", Plural(static_cast<std::int64_t>(diffs.size()), "differing key", "differing keys"));
    for (const std::string& d : diffs) msg += " " + d + ";";
    msg.pop_back();
  }
  g.push_back({"config_identical", diffs.empty(), msg});
  return g;
}

std::string RenderJUnit(const ReportInput& in) { return RenderJUnit(in, {}); }

std::string RenderJUnit(const ReportInput& in, const std::vector<GateOutcome>& extra_gates) {
  std::vector<GateOutcome> gates = InferredGates(in);
  for (const GateOutcome& e : extra_gates) {
    auto it = std::find_if(gates.begin(), gates.end(),
                           [&e](const GateOutcome& x) { return x.name == e.name; });
    if (it != gates.end()) {
      *it = e;
    } else {
      gates.push_back(e);
    }
  }
  std::string items;
  int n_items = 0, n_fail = 0, n_skip = 0;
  if (in.diff != nullptr) {
    for (const ItemResult& it : in.diff->items) {
      ++n_items;
      items += fmt::format("    <testcase classname=\"{}\" name=\"{}\"", XmlEscape(it.checkpoint),
                           XmlEscape(it.rel));
      if (it.verdict == Verdict::kPass) {
        items += "/>\n";
        continue;
      }
      items += ">\n";
      if (it.verdict == Verdict::kSkip) {
        ++n_skip;
        items += fmt::format("      <skipped message=\"{}\"/>\n", XmlEscape(Redact(it.reason)));
      } else {
        ++n_fail;
        const std::string detail =
            HasMetric(it)
                ? fmt::format(
                      "label={} dtype={} rows={} nrmse={} max_abs={} n_diff={} first_diff={}",
                      it.label, it.dtype, it.rows, FormatMetric(it.stats.nrmse),
                      FormatMetric(it.stats.max_abs), it.stats.n_diff, it.stats.first_diff)
                : fmt::format("label={} dtype={}", it.label, it.dtype);
        const bool non_finite = it.stats.non_finite || (it.has_kl && it.kl.non_finite);
        const char* type = !HasMetric(it) ? "mismatch" : (non_finite ? "non_finite" : "threshold");
        items += fmt::format("      <failure message=\"{}\" type=\"{}\">{}</failure>\n",
                             XmlEscape(FailureDetail(it)), type, XmlEscape(detail));
      }
      items += "    </testcase>\n";
    }
  }
  std::string gate_xml;
  int n_gate_fail = 0;
  for (const GateOutcome& g : gates) {
    gate_xml += fmt::format("    <testcase classname=\"gates\" name=\"{}\"", XmlEscape(g.name));
    if (g.passed) {
      gate_xml += g.message.empty()
                      ? "/>\n"
                      : fmt::format(">\n      <system-out>{}</system-out>\n    </testcase>\n",
                                    XmlEscape(Redact(g.message)));
    } else {
      ++n_gate_fail;
      gate_xml += fmt::format(">\n      <failure message=\"{}\" type=\"gate\"/>\n    </testcase>\n",
                              XmlEscape(Redact(g.message)));
    }
  }
  const int n_gates = static_cast<int>(gates.size());
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += fmt::format(
      "<testsuites name=\"lockstep\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\">\n",
      n_items + n_gates, n_fail + n_gate_fail, n_skip);
  x += fmt::format(
      "  <testsuite name=\"lockstep.state\" tests=\"{}\" failures=\"{}\" errors=\"0\" "
      "skipped=\"{}\">\n",
      n_items, n_fail, n_skip);
  x += items + "  </testsuite>\n";
  x += fmt::format(
      "  <testsuite name=\"lockstep.gates\" tests=\"{}\" failures=\"{}\" errors=\"0\" "
      "skipped=\"0\">\n",
      n_gates, n_gate_fail);
  x += gate_xml + "  </testsuite>\n</testsuites>\n";
  return x;
}

std::string HtmlEscape(std::string_view s) { return Escape(s, "&#39;"); }
std::string XmlEscape(std::string_view s) { return Escape(s, "&apos;"); }

std::string FormatMetric(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return "0";
  return fmt::format("{:.1e}", v);
}

std::vector<std::string> FindForbiddenText(const std::string& text,
                                           const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  for (const Span& s : ForbiddenSpans(text, extra)) {
    // A little context on each side, so the caller can see where it sits.
    const std::size_t b = s.begin >= 16 ? s.begin - 16 : 0;
    const std::size_t e = std::min(text.size(), s.end + 16);
    std::string snippet = text.substr(b, e - b);
    std::replace(snippet.begin(), snippet.end(), '\n', ' ');
    if (std::find(out.begin(), out.end(), snippet) == out.end()) out.push_back(std::move(snippet));
  }
  return out;
}

}  // namespace lockstep
