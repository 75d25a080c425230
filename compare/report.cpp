// What every report format says, shared by report_json.cpp, report_markdown.cpp,
// report_junit.cpp and report_html.cpp: the allowlisted config keys, the arm summary, the
// measurement limitations, the escapes and number formats, and the helpers of report_util.h.
#include "lockstep/compare/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
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

std::string HtmlEscape(std::string_view s) { return Escape(s, "&#39;"); }
std::string XmlEscape(std::string_view s) { return Escape(s, "&apos;"); }

std::string FormatMetric(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return "0";
  return fmt::format("{:.1e}", v);
}

}  // namespace lockstep
