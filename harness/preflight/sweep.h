// The sweep of `lockstep preflight --sweep` (preflight.h: SweepReport), on the probes' runner.
#pragma once

#include <optional>
#include <vector>

#include "lockstep/harness/preflight.h"
#include "preflight/probe_run.h"

namespace lockstep::preflight {

struct SweepOptions {
  std::vector<int> k;                    // empty: DefaultSweepK(slots)
  std::optional<std::vector<int>> rows;  // unset: StraddlingRows(CpuRowTiles())
  bool keep_exports = false;             // --work: keep each point's exports
  bool progress = false;                 // one stderr line per point
};

// Point `p` from the comparison of `b` (the probe beside others, or aged) against `a` (its solo
// run): the counts and the result (holds, differs, or n/a when nothing was compared or, with
// background > 0, no window shared a step).
Status JudgePoint(const Arm& a, const Arm& b, int threads, SweepPoint& p);

// Runs every point of the sweep for `base` (the pinned config, the probe request and its
// options, threads resolved) into `rep`. Errors: a run's engine or export error (exit 3).
Status RunSweep(const SweepOptions& o, ProbeRunner& runner, const ArmSpec& base, SweepReport& rep);

}  // namespace lockstep::preflight
