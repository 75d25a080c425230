// Verify-window alignment of two traces (DESIGN.md "Window alignment", seed issue "timing and
// execution-path observations").
//
// Walks both traces by index while the path fields are equal; the first index where any differs
// (or where one trace ends before the other) is the first path divergence. Timing differences
// (B - A) are computed over the matched prefix only, never past the divergence. After the
// divergence each side's remaining windows are listed on their own, never paired by index, and
// each side's notable windows (verify time far above that side's median) are reported per side.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/state_diff.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/window.h"

namespace lockstep {

// Path fields that can be aligned on.
const std::vector<std::string>&
AlignableFields();  // p, T, T_mtp, merged, from_sfx, chain_n, accepted
const std::vector<std::string>& DefaultAlignFields();  // p, T, T_mtp, merged, from_sfx, chain_n
// "p,T,T_mtp" -> validated list (kInvalidArgument naming an unknown field; empty list rejected).
Result<std::vector<std::string>> ParseAlignFields(std::string_view csv);
// The value of one path field as text ("6", "true").
std::string FieldValue(const WindowRecord& w, const std::string& field);
// "p=120, T=6, T_mtp=6, merged=false, from_sfx=true, chain_n=2" over the given fields.
std::string DescribeWindow(const WindowRecord& w, const std::vector<std::string>& fields);

// Timing intervals compared per window (WindowRecord fields, ns -> ms).
const std::vector<std::string>& TimingIntervals();  // verify, wait, compute, draft, commit, export
// Device-backend intervals (StageTiming, summed over the window's stages): the CUDA-event split of
// each stage's time line (dev_wait, dev_compute, dev_copy) and the host's one-time set-up (init).
// Compared only when either trace recorded any of them; unknown when one side did not.
const std::vector<std::string>& DeviceTimingIntervals();  // dev_wait, dev_compute, dev_copy, init

struct IntervalDiff {
  std::string name;               // TimingIntervals() or DeviceTimingIntervals()
  bool known = true;              // false when either side recorded it as unknown (-1) anywhere
  std::vector<double> delta_ms;   // per matched window: B - A (empty when unknown)
  double max_abs_delta_ms = 0.0;  // largest |delta|
  int max_at = -1;                // its window index
  double median_delta_ms = 0.0;   // median of delta (signed)
  double median_abs_delta_ms = 0.0;
  double sum_a_ms = 0.0, sum_b_ms = 0.0;  // over the matched prefix
  double rel_diff = 0.0;  // (sum_b - sum_a) / sum_a (0 when sum_a == 0 and sum_b == 0)
};

struct NotableWindow {
  int idx = 0;  // the side's own window index
  int p = 0, T = 0;
  double verify_ms = 0.0;
  double ratio_to_median = 0.0;  // verify_ms / the side's median verify time
  bool after_divergence = false;
};

struct AlignResult {
  std::vector<std::string> fields;
  int n_a = 0, n_b = 0;
  int matched = 0;        // length of the matched prefix
  bool diverged = false;  // false only when both traces are equal over their whole length
  int div_idx = -1;       // first divergence index (== matched when diverged)
  std::optional<WindowRecord> div_a, div_b;   // the windows at div_idx (nullopt: that side ended)
  std::vector<std::string> differing_fields;  // at div_idx (empty when one side ended)
  // One per TimingIntervals(), then one per DeviceTimingIntervals() when either trace has device
  // timing; matched prefix only.
  std::vector<IntervalDiff> timing;
  std::vector<WindowRecord> rest_a, rest_b;  // windows after the divergence, per side (div_idx ..)
  std::vector<NotableWindow> notable_a, notable_b;            // per side, over the whole trace
  double median_verify_ms_a = 0.0, median_verify_ms_b = 0.0;  // each side, whole trace
  // Fingerprints that differ between the two sides, checked as `diff` checks them
  // (FingerprintDifferences below; filled by the commands, which know the inputs' metadata):
  // "the models differ: ...", "the requests differ: ..." make the paths not comparable (no "no
  // divergence" is claimed, and --fail-on-divergence fails); "config: spec: 4 | 2" lines are
  // reported, as diff reports them, and the alignment stands (comparing two configs' paths is
  // what align is for).
  std::vector<std::string> fingerprint_differences;
  // False when a model or request difference makes the paths not comparable.
  bool comparable() const;
  // Non-empty (AlignWindows fills it; only when the paths did not diverge): why the compared path
  // fields cannot differ over the matched prefix (every window has T = 1 and no drafts, or
  // neither side has a window), so "no divergence" would say nothing.
  std::string path_unchecked;
};

// A window is notable when its verify time is >= notable_ratio x its side's median verify time
// and at least notable_min_ms; at most max_notable per side, largest first.
struct AlignOptions {
  std::vector<std::string> fields = DefaultAlignFields();
  double notable_ratio = 5.0;
  double notable_min_ms = 1.0;
  int max_notable = 5;
};

AlignResult AlignWindows(const std::vector<WindowRecord>& a, const std::vector<WindowRecord>& b,
                         const AlignOptions& opts = {});

// FingerprintDifferences (state_diff.h) fills AlignResult::fingerprint_differences.

}  // namespace lockstep
