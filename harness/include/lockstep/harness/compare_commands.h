// `lockstep diff`, `lockstep align` and `lockstep summarize`: the comparator's commands. They read
// exports and traces only (never run the engine), print a human summary on `out`, and write the
// requested reports atomically. Status: ok (everything within thresholds / no divergence), a
// GateFailed status (exit 1) when a threshold failed or nothing was compared (DiffResult::vacuous),
// kInvalidArgument (exit 2) for bad input, including A and B being the same file or the same run
// (without --allow-self).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "lockstep/compare/state_diff.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct ReportOutputs {
  std::string json, md, html, junit;  // files to write ("" = not written)
};

struct DiffCommandOptions {
  std::string a, b;  // exports (A is the reference)
  DiffOptions diff;
  std::vector<std::string> kind_overrides;  // --nrmse-kind KIND=VALUE
  ReportOutputs reports;
  // Parse each export's HDF5 metadata in a child process (ReaderLimits::isolate; a crash, hang
  // or memory exhaustion there is exit 2 naming the file); false: --no-isolate.
  bool isolate = true;
  double isolate_timeout_s = 30.0;  // --isolate-timeout
  bool quiet = false;               // only the verdict line
  bool no_index =
      false;           // ignore /index/items and open every dataset (files edited by other tools)
  bool color = false;  // colour the verdict line (main sets it: stdout a TTY, NO_COLOR unset)
  // --nrmse-max / --kl-max given: they replace the cross-engine profile's values (port check).
  bool nrmse_max_given = false, kl_max_given = false;
};

struct AlignCommandOptions {
  std::string a, b;  // exports (.h5) or trace JSON lines (--trace-jsonl files)
  std::string fields = "p,T,T_mtp,merged,from_sfx,chain_n";
  ReportOutputs reports;
  bool isolate = true;  // as DiffCommandOptions (exports only; JSON-lines traces need no HDF5)
  double isolate_timeout_s = 30.0;
  bool fail_on_divergence = false;  // exit 1 when the paths diverge, are not comparable (model or
                                    // request differ) or cannot differ (every window T = 1)
  bool no_index = false;
  bool allow_self = false;  // --allow-self: align a file or run with itself
  bool color = false;       // as DiffCommandOptions::color
};

// `summarize`: diff + align of two exports and every report.
struct SummarizeCommandOptions {
  DiffCommandOptions diff;
  std::string fields = "p,T,T_mtp,merged,from_sfx,chain_n";
};

Status RunDiff(const DiffCommandOptions& opts, std::ostream& out);
Status RunAlign(const AlignCommandOptions& opts, std::ostream& out);
Status RunSummarize(const SummarizeCommandOptions& opts, std::ostream& out);

// Parses sizes like "1G", "512M", "1073741824" (bytes; K/M/G/T are binary multiples).
Result<std::int64_t> ParseByteSize(std::string_view text, std::string_view option);

}  // namespace lockstep
