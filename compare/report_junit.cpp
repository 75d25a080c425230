// RenderJUnit and the gates the report input decides (InferredGates): suite "lockstep.state"
// has one testcase per compared item, suite "lockstep.gates" one per gate.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/compare/report.h"
#include "report_util.h"

namespace lockstep {

using report_internal::ConfigDifferences;
using report_internal::FailureDetail;
using report_internal::HasMetric;
using report_internal::Plural;
using report_internal::Redact;

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
    // As the verdict box: paths of different fingerprints are not comparable, and a path check
    // that cannot fail is no pass in a report that compared nothing else.
    const bool unchecked = !al.path_unchecked.empty() && in.diff == nullptr;
    const bool comparable = al.fingerprint_differences.empty();
    g.push_back({"path_identical", !al.diverged && comparable && !unchecked,
                 al.diverged   ? fmt::format("first divergence at window {} ({})", al.div_idx,
                                           df.empty() ? "one trace ended" : df + " differ")
                 : !comparable ? fmt::format("not comparable: the {} fingerprints differ",
                                             fmt::join(al.fingerprint_differences, ", "))
                 : unchecked   ? "path not checked: " + Redact(al.path_unchecked)
                               : fmt::format("no divergence over {} windows", al.matched)});
  }
  // Without a diff the configurations come from the arms' exports; a trace carries none, so
  // there is nothing to gate on (not applicable, not a pass).
  if (in.diff == nullptr && (!in.a.has_export || !in.b.has_export)) return g;
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

}  // namespace lockstep
