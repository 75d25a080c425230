// Re-runs of a recorded request, shared by the localisation modes (localize_run.cpp: --rerun,
// localize_graft.cpp: --graft). Private to harness/localize.
#pragma once

#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/harness/localize_run.h"

namespace lockstep {

// How one re-run is made: its file stem in `work` ("a", "b", "b.graft3"), what it exports, and
// the grafts it takes (--graft texts).
struct RerunSpec {
  std::string stem;
  bool digests = true;                  // --op-digests all
  std::string export_windows = "none";  // --export-windows
  std::string export_points;            // --export-points ("" = the default)
  std::vector<std::string> grafts;
  bool side_b = false;  // B's request: runs on o.exe_b when given
};

// Re-runs the request `m` records as a fresh `lockstep generate` with its recorded config (the
// model from o.model when given) into work/<stem>.rerun.h5 and returns that path. kRuntime when it
// fails (the message names its stderr file); kInvalidArgument when the re-run's model, request or
// executable fingerprint is not the original's.
Result<std::string> RerunRequest(const ExportMeta& m, const RerunSpec& spec,
                                 const LocalizeRunOptions& o, const std::string& work);

// The knobs of a recorded config that make results timing- or batch-dependent (preflight's static
// part), active ones only, of both sides without repeats: "draft_policy=latency".
std::vector<std::string> TimingKnobs(const ExportMeta& a, const ExportMeta& b);

// True when the outputs or the window paths of two exports differ.
bool RunsDiffer(const ExportMeta& a, const ExportMeta& b);
// The first window whose path (WindowRecord::SamePath) differs, or where one run has a window the
// other has not; -1 when the paths agree.
int FirstPathDivergence(const ExportMeta& a, const ExportMeta& b);
// The first window where the runs part: its path differs, or the tokens it emitted (its accepted
// drafts and the bonus token, read from /output/tokens) differ; -1 when neither does. A window
// whose bonus token differs has the same path but hands the next window another token, which no
// state item holds: a graft must come before it.
int FirstDeparture(const ExportMeta& a, const ExportMeta& b);

// An export opened in process (a file this process's child wrote).
Result<std::unique_ptr<ExportReader>> OpenOwn(const std::string& path);

// Graft mode (localize_graft.cpp): fills run->graft and run->result from the given exports.
Status LocalizeByGraft(const ExportMeta& a, const ExportMeta& b, const LocalizeRunOptions& o,
                       const std::string& work, LocalizeRun* run);

}  // namespace lockstep
