// The campaign's bug-report summary (`lockstep report DIR`), rendered from the run folder alone:
// the plan copy, the ledger, the comparison records and the arms' outputs. Markdown follows the
// seed issue's structure (tested configuration and scope; early state and output checks with
// item counts and thresholds; timing and execution-path observations; gates; stop decision and
// measurement limitations; conclusion with "No fix is claimed."). HTML is the same document
// (compare/markdown_html.h) with inline SVG charts; JUnit has one test case per gate per
// comparison (plus the positive control and the verdict). Allowlisted fields only: no paths,
// host names, user names or prompt text.
#pragma once

#include <iosfwd>
#include <string>

#include "lockstep/engine/status.h"

namespace lockstep {

struct CampaignDocuments {
  std::string markdown, html, junit;
  std::string verdict;  // pass | fail | stopped | insensitive | "" (not finished)
};

// Renders the campaign in `run_dir` from its files alone (nothing runs). Errors: the ledger's
// (Ledger::Read: a corrupt ledger is kRuntime), the plan copy's (ReadFile, ParseCampaign), and
// kInvalidArgument when the ledger has no planned entry (not a run folder). An arm without an
// output, a record or a trace is shown as not sent / not compared / without a chart: no error.
Result<CampaignDocuments> RenderCampaign(const std::string& run_dir);

// `lockstep report DIR [--md F] [--html F] [--junit F]`: renders the campaign in DIR from its
// ledger and comparison records (the files default to DIR/report.md etc.).
struct ReportOptions {
  std::string dir, md, html, junit;
};
// RenderCampaign(opts.dir), then the three files written atomically and one line on `out` naming
// them. Errors: RenderCampaign's, or kIOError from a write (files written before it stay).
Status RunCampaignReport(const ReportOptions& opts, std::ostream& out);

}  // namespace lockstep
