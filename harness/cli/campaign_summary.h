// The JSON summary of a campaign run folder, for `lockstep run / gate / report --json PATH|-`.
// Built from the folder's ledger alone (what the runner recorded; nothing is recomputed), so the
// three commands give the same object for the same folder. Keys (harness/README.md, "JSON
// summary"): schema "lockstep.campaign_summary", schema_version 1, campaign, folder, plan_sha256,
// verdict (pass | fail | stopped | insensitive; null while the campaign has not finished),
// reason, passed, stopped (null, or rule / message / fired_by / before_arm), arms (per planned
// arm: name, status finished | failed | not_sent | sent | planned, repeats finished and failed,
// not_sent_reason), pairs (per comparison: arm, baseline, control, passed, caught for a
// control, failed_gates), reports (md, html, junit: where they were written, "-" for stdout).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/engine/status.h"

namespace lockstep {

struct ReportPaths {
  std::string md, html, junit;
};

// Errors: Ledger::Read's (a missing ledger is kNotFound / kIOError, a corrupt one kRuntime).
Result<nlohmann::json> CampaignSummaryJson(const std::string& run_dir, const ReportPaths& reports);

}  // namespace lockstep
