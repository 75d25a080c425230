// The campaign's bug-report summary (`lockstep report DIR`), rendered from the run folder alone:
// the plan copy, the ledger, the comparison records and the arms' outputs. Markdown follows the
// seed issue's structure (tested configuration and scope; early state and output checks with
// item counts and thresholds; timing and execution-path observations; gates; stop decision and
// measurement limitations; conclusion with "No fix is claimed."). HTML is the same document with
// inline SVG charts; JUnit has one test case per gate per comparison (plus the positive control
// and the verdict). Allowlisted fields only: no paths, host names, user names or prompt text.
#pragma once

#include <string>

#include "lockstep/engine/status.h"

namespace lockstep {

struct CampaignDocuments {
  std::string markdown, html, junit;
  std::string verdict;  // pass | fail | stopped | insensitive | "" (not finished)
};

Result<CampaignDocuments> RenderCampaign(const std::string& run_dir);

}  // namespace lockstep
