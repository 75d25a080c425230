// The campaign verdict rule (issue 35), stated once and enforced here. A CI gate reads only the
// exit code, so a campaign must never pass on what it did not check. Its PASS means:
//   1. at least one predeclared pair (an arm with a baseline, the positive control aside) was
//      compared;
//   2. every comparison's gates that were on compared more than nothing: output tokens, state
//      items or verify windows (gates.h, CheckedCounts);
//   3. every arm that was sent ran against the model, executable and engine config the plan
//      names: the runner checks the exports' fingerprints against the plan's model and the arm's
//      build (the "fingerprints" gate), and a remote server's /v1/lockstep/info before the first
//      arm (a mismatch is exit 2);
//   4. the positive control, when the plan has one, failed on a compared quantity beyond its
//      threshold (ComparisonResult::caught_by is not empty).
// Anything else is FAIL, STOPPED, NOT CHECKED (verdict "not_checked"), INSENSITIVE or CONTROL NOT
// APPLIED, with the reason. Plans that cannot satisfy the rule are refused before anything runs
// (CheckPlanCanPass: exit 2; `lockstep run --check-plan PLAN` says so without running). Relaxed
// thresholds are allowed but named wherever the verdict is (RelaxedThresholds).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "lockstep/compare/state_diff.h"
#include "lockstep/engine/status.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/campaign_outcome.h"
#include "lockstep/harness/gates.h"

namespace lockstep {

// kInvalidArgument naming `source` (the plan's file) and the first reason the plan cannot give an
// honest PASS: nothing paired, nothing gated, a pair no gate that is on applies to, a state gate
// over exports that hold no state (windows "none", or windows that never run), a positive
// control that no gate could catch.
Status CheckPlanCanPass(const Campaign& c, const std::string& source);

// What `lockstep run --check-plan` prints for a plan that can pass: its pairs and, per pair, the
// gates that apply to it; then the relaxed thresholds, if any. One line each.
std::vector<std::string> PlanCheckLines(const Campaign& c);

// The thresholds above the documented defaults (compare/state_diff.h, Thresholds), one phrase
// each: "NRMSE relaxed to 0.01, default 0.0002", "logits KL relaxed to ...", "ssm_state NRMSE
// relaxed to ...". Empty when none is relaxed (a tighter threshold is not named).
std::vector<std::string> RelaxedThresholds(const Thresholds& t);

struct CampaignDecision {
  CampaignOutcome outcome = CampaignOutcome::kPass;  // the ledger's word: CampaignOutcomeName
  std::string reason;                                // one sentence, "" for pass
};

// The verdict from the comparisons the ledger recorded (by arm) and whether a stop rule fired.
CampaignDecision DecideCampaignVerdict(const Campaign& c,
                                       const std::map<std::string, ComparisonResult>& compared,
                                       bool stopped);

// The verdict line's words for a ledger verdict: "PASS", "FAIL (insensitive)", "NOT CHECKED", ...
// (a word this build does not know reads "FAIL (word)").
std::string VerdictWords(const std::string& verdict);

}  // namespace lockstep
