// What every report format says, shared by report_json.cpp, report_markdown.cpp,
// report_junit.cpp and report_html.cpp: the allowlisted config keys, the arm summary, the
// measurement limitations, the escapes and number formats, and the helpers of report_util.h.
#include "lockstep/compare/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "report_util.h"

namespace lockstep {
namespace report_internal {

// Arm names come from a command-line flag; they pass the same redaction as any outside text.
std::string ArmName(const ArmInfo& arm, const char* fallback) {
  return arm.arm.empty() ? fallback : Redact(arm.arm);
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

std::string Plural(std::int64_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

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

}  // namespace report_internal

namespace {

using Json = nlohmann::ordered_json;  // keeps the documented key order (schema first)
using report_internal::ArmName;
using report_internal::Plural;
using report_internal::Redact;

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
  a.has_export = true;
  return a;
}

namespace {

// Counters the cpu backend does not measure (instrument/SCHEMA.md /counters/stage{S}: -1 there).
bool CudaOnlyCounter(std::string_view name) {
  return name == "first_call_ns" || name == "first_calls" || name == "graph_captures" ||
         name == "graph_launches";
}

bool CpuBackend(const ArmInfo& arm) {
  auto it = arm.config.find("backend");
  return it != arm.config.end() && it->second == "\"cpu\"";
}

// Why NVML was not read, in words: a loader failure is the missing driver, anything else is the
// sampler's own text (redacted).
std::string NvmlReason(const std::string& nvml) {
  if (nvml.find("not found") != std::string::npos || nvml.find("dlopen") != std::string::npos ||
      nvml.find("no NVIDIA driver") != std::string::npos)
    return "no NVIDIA driver on this machine";
  std::string_view why(nvml);
  if (why.starts_with("unknown: ")) why.remove_prefix(9);
  return Redact(why);
}

// "A and B", "A" or "B" for the arms a sentence is about (empty when neither).
std::string WhichArms(const ReportInput& in, bool a, bool b) {
  const std::string na = ArmName(in.a, "A"), nb = ArmName(in.b, "B");
  return a && b ? na + " and " + nb : a ? na : b ? nb : std::string();
}

// Per side: does every window lack a measured export interval (no observer: not applicable)?
bool NoExportTiming(const std::vector<WindowRecord>* w) {
  return w != nullptr && !w->empty() &&
         std::all_of(w->begin(), w->end(), [](const WindowRecord& r) { return r.export_ns < 0; });
}

// The arms' unknowns, grouped: CUDA-only counters of a cpu arm (not applicable), other counters
// (stages folded), the NVML line (said by GpuSamplingLine instead), and the rest one line each.
void UnknownLines(const ReportInput& in, const std::function<void(std::string)>& add) {
  struct Counters {
    std::set<std::string> names;
    std::set<int> stages;
  };
  Counters na_counters;  // CUDA-only counters of cpu arms: one line for every arm and stage
  bool na_a = false, na_b = false;
  std::map<std::pair<bool, bool>, Counters> unknown_counters;  // (in a, in b) -> counters
  std::vector<std::string> seen;
  auto has = [](const ArmInfo& arm, const std::string& u) {
    return arm.has_export && std::count(arm.unknowns.begin(), arm.unknowns.end(), u) > 0;
  };
  const std::string marker = "counters/stage";
  for (const auto* arm : {&in.a, &in.b}) {
    if (!arm->has_export) continue;
    for (const std::string& u : arm->unknowns) {
      if (std::find(seen.begin(), seen.end(), u) != seen.end()) continue;
      seen.push_back(u);
      if (u.starts_with("nvml")) continue;
      const bool a = has(in.a, u), b = has(in.b, u);
      if (u.starts_with(marker)) {
        std::size_t i = marker.size();
        int stage = 0;
        while (i < u.size() && std::isdigit(static_cast<unsigned char>(u[i])))
          stage = stage * 10 + (u[i++] - '0');
        if (i < u.size() && u[i] == ' ') {
          const std::string name = u.substr(i + 1);
          const bool cpu = (!a || CpuBackend(in.a)) && (!b || CpuBackend(in.b));
          if (cpu && CudaOnlyCounter(name)) na_a = na_a || a, na_b = na_b || b;
          Counters& c = cpu && CudaOnlyCounter(name) ? na_counters : unknown_counters[{a, b}];
          c.names.insert(Redact(name));
          c.stages.insert(stage);
          continue;
        }
      }
      add(fmt::format("Recorded as unknown in {}: {}", WhichArms(in, a, b), Redact(u)));
    }
  }
  if (!na_counters.names.empty())
    add(
        fmt::format("First-call and graph counters ({}): CUDA backend only; not measured on cpu "
                    "(not applicable in {}).",
                    fmt::join(na_counters.names, ", "), WhichArms(in, na_a, na_b)));
  for (const auto& [arms, c] : unknown_counters)
    add(fmt::format("Counters recorded as unknown in {}: {} (stages {}).",
                    WhichArms(in, arms.first, arms.second), fmt::join(c.names, ", "),
                    *c.stages.begin() == *c.stages.rbegin()
                        ? std::to_string(*c.stages.begin())
                        : fmt::format("{}-{}", *c.stages.begin(), *c.stages.rbegin())));
}

// Resource-sampler lines of the exporting arms: GPU sampling, the guard, no samples.
void ResourceLimitLines(const ReportInput& in, const std::function<void(std::string)>& add) {
  auto nvml_unknown = [](const ArmInfo& arm) {
    return arm.has_export && arm.sampler.nvml.starts_with("unknown");
  };
  const bool ga = nvml_unknown(in.a), gb = nvml_unknown(in.b);
  if (ga && gb && NvmlReason(in.a.sampler.nvml) == NvmlReason(in.b.sampler.nvml)) {
    add(fmt::format("GPU sampling: {}; GPU fields are unknown ({}).", NvmlReason(in.a.sampler.nvml),
                    WhichArms(in, true, true)));
  } else {
    if (ga)
      add(fmt::format("GPU sampling: {}; GPU fields are unknown ({}).",
                      NvmlReason(in.a.sampler.nvml), WhichArms(in, true, false)));
    if (gb)
      add(fmt::format("GPU sampling: {}; GPU fields are unknown ({}).",
                      NvmlReason(in.b.sampler.nvml), WhichArms(in, false, true)));
  }
  for (const ArmInfo* arm : {&in.a, &in.b}) {
    if (!arm->has_export) continue;
    const std::string name = WhichArms(in, arm == &in.a, arm == &in.b);
    if (!arm->sampler.guard.empty())
      add(fmt::format("The resource guard tripped in {}: {}", name, Redact(arm->sampler.guard)));
    if (arm->sampler.n_samples == 0)
      add(fmt::format("No resource samples were recorded in {}.", name));
  }
}

// The alignment's unknown intervals: the export interval of a side that exported nothing is not
// applicable; any other -1 is unknown, naming the sides that recorded it.
void IntervalLines(const ReportInput& in, const std::function<void(std::string)>& add) {
  for (const IntervalDiff& t : in.align->timing) {
    if (t.known) continue;
    if (t.name == "export") {
      // An arm known to have exported checkpoints did export: its -1 is unknown, not n/a.
      const bool na_a = NoExportTiming(in.windows_a) && in.a.checkpoints <= 0;
      const bool na_b = NoExportTiming(in.windows_b) && in.b.checkpoints <= 0;
      if (na_a || na_b)
        add(fmt::format("The export interval is not applicable: no state was exported ({}).",
                        WhichArms(in, na_a, na_b)));
      if (na_a && na_b) continue;
    }
    add(fmt::format("The {} interval was recorded as unknown in at least one arm.", t.name));
  }
}

}  // namespace

std::vector<std::string> Limitations(const ReportInput& in) {
  std::vector<std::string> out;
  const std::function<void(std::string)> add = [&out](std::string s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  };
  const std::string pair = ArmName(in.b, "B") + " vs " + ArmName(in.a, "A");
  const bool trace_a = !in.a.has_export, trace_b = !in.b.has_export;
  if (trace_a || trace_b)
    add(fmt::format(
        "{} {} no export data in this report (windows only): model, request and config hashes, "
        "token counts, engine configuration and resource samples are unknown.",
        WhichArms(in, trace_a, trace_b), trace_a && trace_b ? "have" : "has"));
  UnknownLines(in, add);
  ResourceLimitLines(in, add);

  if (in.diff == nullptr) {
    add(fmt::format("State not compared for {}: this comparison has no state diff.", pair));
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
    add(fmt::format("Windows not aligned for {}: this comparison has no trace alignment.", pair));
  } else {
    IntervalLines(in, add);
  }
  const bool ex_a = in.a.checkpoints > 0, ex_b = in.b.checkpoints > 0;
  if (ex_a || ex_b)
    add(fmt::format(
        "State export perturbs execution: the timing of an arm that exports state is perturbed "
        "by the export (timing questions need trace-only arms); subtracting export time does "
        "not give an uninstrumented measurement ({}).",
        WhichArms(in, ex_a, ex_b)));
  const std::int64_t wa = in.align != nullptr ? in.align->n_a : in.a.windows;
  const std::int64_t wb = in.align != nullptr ? in.align->n_b : in.b.windows;
  if (wa >= 0 && wb >= 0 && wa != wb)
    add(
        fmt::format("The arms ran different numbers of windows ({}: {}, {}: {}); windows after "
                    "the divergence are listed per side, not paired.",
                    ArmName(in.a, "A"), wa, ArmName(in.b, "B"), wb));
  return out;
}

std::string HtmlEscape(std::string_view s) { return Escape(s, "&#39;"); }
std::string XmlEscape(std::string_view s) { return Escape(s, "&apos;"); }

std::string FormatMetric(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return "0";
  return fmt::format("{:.1e}", v);
}

}  // namespace lockstep
