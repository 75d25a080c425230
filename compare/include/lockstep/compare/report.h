// Report layer for `lockstep diff` / `align` / `summarize` (and the building blocks the campaign
// report of harness/ reuses): JSON (stable keys, documented in compare/REPORTS.md), Markdown in
// the seed issue's structure, self-contained HTML with inline SVG charts, JUnit XML.
//
// Allowlist: Markdown and HTML carry only the fields named here — no file paths, hostnames,
// user names or raw prompt text. Arm configuration appears through ReportConfigKeys() only (the
// model path and replay path are replaced by the model's SHA-256 prefix). JSON is for machines
// and may carry more (it still never carries prompt text).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/compare/align.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/state_diff.h"

namespace lockstep {

// Engine-config keys allowed into Markdown / HTML reports.
const std::vector<std::string>& ReportConfigKeys();

// What a report says about one arm (derived from its export, allowlisted). Unknown is
// representable and is never shown as 0: a count of -1, an empty hash or stop reason, and
// has_export == false (the arm is a JSON-lines trace, or a timing arm that wrote no export, so
// its hashes, tokens, configuration, resource samples and unknowns are not known) all render as
// "unknown".
struct ArmInfo {
  std::string arm;  // --arm name ("A" / "B" when empty)
  std::string run_id;
  std::string model_sha256_12;  // first 12 hex digits (empty: unknown)
  std::string request_sha256_12;
  std::string config_sha256_12;
  std::map<std::string, std::string> config;  // ReportConfigKeys() -> value as compact JSON text
  std::int64_t prompt_tokens = -1, output_tokens = -1;  // -1: unknown
  std::string stop_reason;                              // empty: unknown
  std::int64_t windows = -1, checkpoints = -1;          // -1: unknown
  SamplerSummary sampler;                               // meaningful only when has_export
  std::vector<std::string> unknowns;                    // ExportMeta::unknowns
  bool has_export = false;                              // SummarizeArm sets it
};
ArmInfo SummarizeArm(const ExportMeta& meta, const std::string& fallback_name);

struct ReportInput {
  std::string title = "lockstep A/A diagnostic";
  ArmInfo a, b;
  const DiffResult* diff = nullptr;    // null: state not compared (e.g. `align` only)
  const AlignResult* align = nullptr;  // null: windows not aligned
  const std::vector<WindowRecord>* windows_a = nullptr;  // whole traces, for the verify chart
  const std::vector<WindowRecord>* windows_b = nullptr;
};

// Measurement limitations, each produced only when its condition holds for the arms it names
// (compare/REPORTS.md "Limitations" lists every sentence and its condition). Unknowns are grouped
// and explained once: the CUDA-only counters of a cpu arm are one "not applicable" line, a
// missing NVIDIA driver one "GPU sampling" line, a trace-only arm one "unknown" line.
std::vector<std::string> Limitations(const ReportInput& in);

// ---- the verdict every report leads with ----
// Mirrors the command's exit: a diff passes when DiffResult::Passed(); an alignment passes when
// the fingerprints agree and the paths do not diverge. A vacuous diff (DiffResult::vacuous), or an
// alignment whose path check cannot fail (AlignResult::path_unchecked) in a report without a
// state diff, is "NOTHING COMPARED", never a pass.
// How a verdict box is coloured: set by whoever decides the verdict (ReportVerdict for a
// comparison, the campaign report for a campaign), so compare/ knows no campaign's words.
enum class VerdictTone : std::uint8_t { kPass, kFail, kWarn };

struct VerdictBox {
  std::string status;  // the deciding command's word: "pass" | "fail" for a comparison (a campaign
                       // has words of its own, harness/campaign_outcome.h)
  VerdictTone tone = VerdictTone::kWarn;
  std::string label;   // the word shown: "PASS", "FAIL", "NOTHING COMPARED", "STOPPED", ...
  std::string reason;  // one sentence: why this verdict
  std::vector<std::string> compared;  // what was compared, one line each (items, windows, arms)
  std::vector<std::string> details;   // first failing item / first path divergence / stop rule
  bool passed() const { return status == "pass"; }
};
VerdictBox ReportVerdict(const ReportInput& in);
// The box as the first Markdown block: "> **PASS** reason" then "> - line" per compared/detail
// line (text from outside escaped), followed by a blank line.
std::string MarkdownVerdictBox(const VerdictBox& v);
// The box as HTML: <div id="verdict" class="verdict verdict-pass|fail|warn"> (colours in
// ReportStylesheet(), markdown_html.h); every text escaped.
std::string HtmlVerdictBox(const VerdictBox& v);

std::string RenderJson(
    const ReportInput& in);  // pretty JSON, keys documented in compare/REPORTS.md
std::string RenderMarkdown(const ReportInput& in);  // seed-issue structure, allowlisted
std::string RenderHtml(
    const ReportInput& in);  // self-contained, inline SVG, no scripts from outside
std::string RenderJUnit(const ReportInput& in);  // one <testcase> per checkpoint item and per gate

// ---- gates (JUnit suite "lockstep.gates") ----
// One pass/fail decision shown as a JUnit testcase; `message` says what was found ("3 of 280
// compared items failed", "first divergence at window 45 (T differs)").
struct GateOutcome {
  std::string name;  // testcase name, e.g. "state", "path_identical"
  bool passed = false;
  std::string message;
};
// The gates the input itself decides: "state" (diff->Passed()) and "output_identical"
// (!diff->output_differs) when diff is set, "path_identical" (no divergence) when align is set,
// "config_identical" (no config difference; from diff, else from the arms' allowlisted config).
std::vector<GateOutcome> InferredGates(const ReportInput& in);
// JUnit with InferredGates(in) followed by `extra_gates` (harness gates, stop rules); an extra gate
// with the name of an inferred one replaces it in place. The one-argument form passes no extras.
std::string RenderJUnit(const ReportInput& in, const std::vector<GateOutcome>& extra_gates);

// The sections RenderMarkdown / RenderHtml are built from, public for reports that compose
// their own documents.
std::string MarkdownStateSection(const DiffResult& d);  // "## Early state checks" body (no heading)
// export_not_applicable: neither side exported state, so the export row reads "not applicable"
// rather than "unknown".
std::string MarkdownTimingSection(const AlignResult& al, const std::string& name_a,
                                  const std::string& name_b, bool export_not_applicable = false);
std::string SvgVerifyChart(const AlignResult& al, const std::vector<WindowRecord>& a,
                           const std::vector<WindowRecord>& b, const std::string& name_a,
                           const std::string& name_b);
std::string SvgNrmseHeatmap(const DiffResult& d);
// Per-window medians of repeated runs with their 95% interval as a shaded band, one series per
// arm (the campaign's timing pairs: never one repeat shown as if it were the distribution).
struct MedianBand {
  double median = 0.0, lo95 = 0.0, hi95 = 0.0;
};
std::string SvgMedianBandChart(const std::vector<MedianBand>& a, const std::vector<MedianBand>& b,
                               const std::string& name_a, const std::string& name_b,
                               const std::string& title);
std::string HtmlEscape(std::string_view s);
std::string XmlEscape(std::string_view s);
// Formats a metric for reports: "0", "3.2e-04", "inf", "nan".
std::string FormatMetric(double v);

// Scans text for things an allowlisted report must never contain: absolute or home-relative
// paths, the host name, the user name. Returns the offending snippets (empty: clean).
std::vector<std::string> FindForbiddenText(const std::string& text,
                                           const std::vector<std::string>& extra = {});

}  // namespace lockstep
