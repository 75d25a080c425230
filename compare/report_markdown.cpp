// RenderMarkdown and its public sections, in the seed issue's structure; RenderHtml renders the
// same text (report_html.cpp). Every string from outside goes through Md() / MdCode(), so it can
// neither open a block nor start markup.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/compare/report.h"
#include "report_util.h"

namespace lockstep {
namespace {

using report_internal::ArmName;
using report_internal::ConfigDifferences;
using report_internal::FailureDetail;
using report_internal::FormatThreshold;
using report_internal::Plural;
using report_internal::Redact;

std::string Ms(double v) { return std::isfinite(v) ? fmt::format("{:.3f}", v) : FormatMetric(v); }
std::string Percent(double v) {
  return std::isfinite(v) ? fmt::format("{:+.2f}%", v * 100.0) : FormatMetric(v);
}

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

// ---- Markdown sections (bodies without their "## " headings; HTML renders the same text) ----

struct Sections {
  std::string intro, scope, state, timing, limitations, conclusion;
};

std::string ScopeSection(const ReportInput& in) {
  const std::string na = Md(ArmName(in.a, "A")), nb = Md(ArmName(in.b, "B"));
  std::string s = fmt::format("Arms: {} (reference) and {}. {}\n\n", na, nb,
                              in.a.has_export && in.b.has_export
                                  ? "Values come from each arm's own export."
                                  : "Values come from each arm's export where it has one; a "
                                    "trace carries no hashes, token counts or configuration "
                                    "(unknown).");
  s += fmt::format("| | {} | {} |\n|---|---|---|\n", na, nb);
  auto row = [&s](const char* what, const std::string& a, const std::string& b) {
    s += fmt::format("| {} | {} | {} |\n", what, a, b);
  };
  // Unknown is never shown as 0 or as an empty hash (a trace carries none of these).
  auto hash = [](const std::string& h) {
    return h.empty() || h == "unknown" ? std::string("unknown") : MdCode(h);
  };
  auto count = [](std::int64_t n) { return n < 0 ? std::string("unknown") : std::to_string(n); };
  auto text = [](const std::string& t) {
    return t.empty() ? std::string("unknown") : Md(Redact(t));
  };
  row("model SHA-256 (first 12)", hash(in.a.model_sha256_12), hash(in.b.model_sha256_12));
  row("request SHA-256 (first 12)", hash(in.a.request_sha256_12), hash(in.b.request_sha256_12));
  row("config SHA-256 (first 12)", hash(in.a.config_sha256_12), hash(in.b.config_sha256_12));
  row("prompt tokens", count(in.a.prompt_tokens), count(in.b.prompt_tokens));
  row("output tokens", count(in.a.output_tokens), count(in.b.output_tokens));
  row("stop reason", text(in.a.stop_reason), text(in.b.stop_reason));
  row("verify windows", count(in.a.windows), count(in.b.windows));
  row("state checkpoints", count(in.a.checkpoints), count(in.b.checkpoints));

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
  if (!any_key)
    s += in.a.has_export && in.b.has_export ? "| (no configuration recorded) | | | |\n"
                                            : "| (unknown: no export) | | | |\n";

  const std::vector<std::string> diffs = ConfigDifferences(in);
  if (in.diff == nullptr && (!in.a.has_export || !in.b.has_export)) {
    s += "\nConfiguration differences: unknown (a trace carries no configuration).\n";
  } else if (diffs.empty()) {
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
      known(s.min_host_available_bytes, 1048576.0, "{:.0f} MiB"),
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
  } else if (!in.align->fingerprint_differences.empty()) {
    s += fmt::format("- Path: not comparable: the {} fingerprints differ.\n",
                     Md(fmt::format("{}", fmt::join(in.align->fingerprint_differences, ", "))));
  } else if (!in.align->path_unchecked.empty()) {
    s += fmt::format("- Path: not checked ({}); no divergence is claimed over {} windows.\n",
                     Md(Redact(in.align->path_unchecked)), in.align->matched);
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

// The side exported no state: no checkpoint is known to have been exported and no window
// measured an export interval.
bool NoStateExport(const ArmInfo& arm, const std::vector<WindowRecord>* w) {
  return arm.checkpoints <= 0 && w != nullptr && !w->empty() &&
         std::all_of(w->begin(), w->end(), [](const WindowRecord& r) { return r.export_ns < 0; });
}

// How to read the device rows of a timing table (compare/align.h DeviceTimingIntervals()).
constexpr const char* kDeviceIntervalsNote =
    "dev_wait, dev_compute and dev_copy are CUDA-event intervals on each stage's stream "
    "(waiting for the stage's input, its kernels, its host copies), summed over the stages; "
    "init is host time in one-time set-up (allocations, handles, graph capture).";

Sections BuildSections(const ReportInput& in) {
  Sections sec;
  sec.intro = fmt::format("A/A diagnostic comparing {} (reference) and {}.\n",
                          Md(ArmName(in.a, "A")), Md(ArmName(in.b, "B")));
  sec.scope = ScopeSection(in);
  sec.state = in.diff != nullptr ? MarkdownStateSection(*in.diff)
                                 : "State was not compared in this report.\n";
  sec.timing = in.align != nullptr
                   ? MarkdownTimingSection(
                         *in.align, ArmName(in.a, "A"), ArmName(in.b, "B"),
                         NoStateExport(in.a, in.windows_a) && NoStateExport(in.b, in.windows_b))
                   : "Windows were not aligned in this report.\n";
  for (const std::string& l : Limitations(in)) sec.limitations += "- " + Md(l) + "\n";
  const bool device = in.align != nullptr && in.align->timing.size() > TimingIntervals().size();
  sec.limitations +=
      device ? "- Timings are monotonic host-side intervals around the instrumented calls, and "
               "per-stage CUDA-event spans (dev_*), not individual kernel timings; there is no "
               "complete kernel-launch trace.\n"
             : "- Timings are monotonic host-side intervals around the instrumented calls, not "
               "individual kernel timings; there is no complete kernel-launch trace.\n";
  for (const ArmInfo* arm : {&in.a, &in.b})
    if (arm->has_export && arm->sampler.n_samples > 0)
      sec.limitations += ResourceLine(ArmName(*arm, arm == &in.a ? "A" : "B"), arm->sampler);
  sec.conclusion = ConclusionSection(in);
  return sec;
}

}  // namespace

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
                                  const std::string& name_b, bool export_not_applicable) {
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
  } else if (!al.path_unchecked.empty()) {
    s += fmt::format("Path not checked: {}. No divergence is claimed over {} windows.\n",
                     Md(Redact(al.path_unchecked)), al.matched);
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
        const char* v = export_not_applicable && t.name == "export" ? "not applicable" : "unknown";
        s += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", t.name, v, v, v, v, v, v);
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

std::string MarkdownVerdictBox(const VerdictBox& v) {
  std::string s = "> **" + Md(v.label) + "**: " + Md(v.reason) + "\n>\n";
  for (const auto* lines : {&v.compared, &v.details})
    for (const std::string& l : *lines) s += "> - " + Md(l) + "\n";
  return s + "\n";
}

std::string RenderMarkdown(const ReportInput& in) {
  const Sections sec = BuildSections(in);
  return MarkdownVerdictBox(ReportVerdict(in)) + "# " + Md(in.title) + "\n\n" + sec.intro +
         "\n## Tested configuration and scope\n\n" + sec.scope + "\n## Early state checks\n\n" +
         sec.state + "\n## Timing and execution-path observations\n\n" + sec.timing +
         "\n## Measurement limitations\n\n" + sec.limitations + "\n## Conclusion\n\n" +
         sec.conclusion;
}

}  // namespace lockstep
