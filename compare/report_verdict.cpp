// ReportVerdict: the verdict every comparison report leads with (report.h VerdictBox), decided as
// the commands decide their exit status, so the box and the exit code never disagree.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>
#include <string>
#include <vector>

#include "lockstep/compare/report.h"
#include "report_util.h"

namespace lockstep {
namespace {

using report_internal::ArmName;
using report_internal::FailureDetail;
using report_internal::Plural;
using report_internal::Redact;

// "0-2, 5" for the windows of the compared checkpoints.
std::string WindowRanges(const std::set<int>& w) {
  std::vector<std::string> parts;
  for (auto it = w.begin(); it != w.end();) {
    const int lo = *it;
    int hi = lo;
    while (++it != w.end() && *it == hi + 1) ++hi;
    parts.push_back(lo == hi ? std::to_string(lo) : fmt::format("{}-{}", lo, hi));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string Where(const ItemResult& f) {
  std::string s = f.checkpoint;
  if (f.stage >= 0) s += fmt::format(" stage {}", f.stage);
  if (f.layer >= 0) s += fmt::format(" layer {}", f.layer);
  return s + " " + (f.kind.empty() ? f.rel : f.kind);
}

// The diff's share of the box: what it compared, and why it fails (empty: it passed).
void DiffPart(const DiffResult& d, VerdictBox& v, std::vector<std::string>& fails, bool& vacuous) {
  std::set<int> windows;
  for (const CheckpointSummary& c : d.checkpoints)
    if (c.compared > 0) windows.insert(c.window);
  v.compared.push_back(fmt::format(
      "State: {} compared at {}{}{}.", Plural(d.compared, "item", "items"),
      Plural(static_cast<std::int64_t>(d.checkpoints.size()), "checkpoint", "checkpoints"),
      windows.empty() ? "" : " (windows " + WindowRanges(windows) + ")",
      d.skipped > 0 ? fmt::format(", {} skipped", d.skipped) : ""));
  if (d.model_differs) fails.push_back("the model differs between the arms: state not compared");
  if (d.request_differs)
    fails.push_back("the request differs between the arms: state not compared");
  if (d.failed > 0)
    fails.push_back(
        fmt::format("{} of {} compared items failed the thresholds", d.failed, d.compared));
  if (d.first_failure >= 0 && static_cast<std::size_t>(d.first_failure) < d.items.size()) {
    const ItemResult& f = d.items[static_cast<std::size_t>(d.first_failure)];
    v.details.push_back(
        fmt::format("First failing item: {} ({}).", Redact(Where(f)), FailureDetail(f)));
  }
  if (!d.vacuous.empty()) vacuous = true, fails.push_back(Redact(d.vacuous));
  if (d.output_differs)
    v.details.push_back("Output: the token ids or the stop reason differ between the arms.");
}

void AlignPart(const ReportInput& in, const AlignResult& al, VerdictBox& v,
               std::vector<std::string>& fails, bool& vacuous) {
  v.compared.push_back(fmt::format(
      "Path: {} aligned on {} ({}: {}, {}: {}).", Plural(al.matched, "window", "windows"),
      fmt::join(al.fields, ", "), ArmName(in.a, "A"), al.n_a, ArmName(in.b, "B"), al.n_b));
  if (!al.fingerprint_differences.empty())
    fails.push_back(fmt::format("the {} fingerprints differ: the paths are not comparable",
                                fmt::join(al.fingerprint_differences, ", ")));
  if (al.diverged) {
    fails.push_back(fmt::format("the paths diverge at window {}", al.div_idx));
    auto side = [&](const ArmInfo& arm, const char* fb, const std::optional<WindowRecord>& w,
                    int n) {
      return ArmName(arm, fb) + ": " +
             (w ? DescribeWindow(*w, al.fields)
                : fmt::format("no window {} (its trace ended after {} windows)", al.div_idx, n));
    };
    v.details.push_back(
        fmt::format("First path divergence at window {}{}: {}; {}.", al.div_idx,
                    al.differing_fields.empty()
                        ? ""
                        : fmt::format(" ({} {})", fmt::join(al.differing_fields, ", "),
                                      al.differing_fields.size() == 1 ? "differs" : "differ"),
                    side(in.a, "A", al.div_a, al.n_a), side(in.b, "B", al.div_b, al.n_b)));
  } else if (!al.path_unchecked.empty()) {
    if (in.diff == nullptr) {
      vacuous = true;
      fails.push_back("path not checked: " + Redact(al.path_unchecked));
    } else {
      v.details.push_back("Path not checked: " + Redact(al.path_unchecked) + ".");
    }
  }
}

std::string Capitalised(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

}  // namespace

VerdictBox ReportVerdict(const ReportInput& in) {
  VerdictBox v;
  std::vector<std::string> fails;
  bool vacuous = false;
  v.compared.push_back(
      fmt::format("Arms: {} (reference) and {}.", ArmName(in.a, "A"), ArmName(in.b, "B")));
  if (in.diff != nullptr) DiffPart(*in.diff, v, fails, vacuous);
  if (in.align != nullptr) AlignPart(in, *in.align, v, fails, vacuous);
  if (in.diff == nullptr && in.align == nullptr) {
    vacuous = true;
    fails.push_back("nothing compared: this report holds neither a state diff nor an alignment");
  }
  if (fails.empty()) {
    v.status = "pass";
    v.tone = VerdictTone::kPass;
    v.label = "PASS";
    std::vector<std::string> held;
    if (in.diff != nullptr)
      held.push_back(fmt::format("all {} compared items within the thresholds", in.diff->compared));
    if (in.align != nullptr)
      held.push_back(fmt::format("no path divergence over {} windows", in.align->matched));
    v.reason = Capitalised(fmt::format("{}", fmt::join(held, "; "))) + ".";
    return v;
  }
  v.status = "fail";
  v.tone = VerdictTone::kFail;
  // Only a report whose every failure is vacuity says NOTHING COMPARED: a real failure leads.
  const bool only_vacuous = vacuous && (fails.size() == 1);
  v.label = only_vacuous ? "NOTHING COMPARED" : "FAIL";
  v.reason = Capitalised(fmt::format("{}", fmt::join(fails, "; "))) + ".";
  return v;
}

}  // namespace lockstep
