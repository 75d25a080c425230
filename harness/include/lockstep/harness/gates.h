// Gates and stop-rule predicates of a campaign (issue "Harness and campaigns").
//
// A comparison is one arm against its baseline arm. Its inputs are what the arms' child processes
// left behind: the generate JSON (output ids, stop reason, resources), the window trace(s), and
// for state arms the state diff of their exports. Gates are evaluated from the campaign's
// GateSpec; predicates (the names stop rules use) are computed from the same data whether or not
// a gate of that kind was declared (with the gate's parameters when it was, defaults otherwise).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/compare/align.h"
#include "lockstep/compare/report.h"
#include "lockstep/compare/state_diff.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/timing_stats.h"

namespace lockstep {

// What one arm produced (one repeat for timing arms: repeats hold the others).
struct ArmOutcome {
  std::string name;
  bool ok = false;  // the child exited 0
  int exit_code = -1;
  std::vector<std::int32_t> output_ids;
  std::string stop_reason;
  bool guard_tripped = false;
  std::int64_t max_swap_used_bytes = -1;           // -1 unknown
  std::int64_t min_host_available_bytes = -1;      // -1 unknown
  std::vector<WindowRecord> windows;               // repeat 0
  std::vector<std::vector<WindowRecord>> repeats;  // timing arms: every repeat (including 0)
  // The --inject records of repeat 0 (generate --json "injections", SCHEMA.md /injections); empty
  // when the arm had none or left no JSON.
  std::vector<nlohmann::json> injections;
  // Service arms (ArmSpec::server fresh | shared, or a remote server): what the runner recorded
  // in arms/<arm>/service.json and the ledger's finished entry, `service` (campaigns/README.md
  // "Service arms"): {"server": "fresh"|"shared"|"remote", "instance", "engine_config_sha256",
  // "cold": bool, "prompt_tokens_reused", "snapshot_position", "engine_state": "fresh" |
  // "carried" | "lost: re-primed", "primed": bool, "load": null | {"requests", "concurrency",
  // "completed", "failed", "digest", "digests": [...]}}. Null for process arms.
  nlohmann::json service;
};

// What the gates that were on actually compared in one comparison (issue 35). A gate that compared
// nothing proves nothing: a comparison whose gates compared 0 tokens, 0 items and 0 windows cannot
// make a campaign pass, and a positive control counts as caught only by a gate that failed on a
// compared quantity (`ComparisonResult::caught_by`).
struct CheckedCounts {
  std::int64_t tokens = 0;   // output gate: output tokens compared (the longer side's count)
  std::int64_t items = 0;    // state gate: checkpoint items compared
  std::int64_t windows = 0;  // path and timing gates: verify windows compared
  bool any() const { return tokens + items + windows > 0; }
};

struct ComparisonResult {
  std::string arm, baseline;
  bool control = false;
  std::vector<GateOutcome> gates;  // evaluated gates in declaration order
  std::map<std::string, bool>
      predicates;         // StopPredicates() -> value (timing ones only when the plan asks)
  bool passed = true;     // every evaluated gate passed
  CheckedCounts checked;  // what the gates that were on compared
  // The gates that failed on something they compared (tokens that differ, items beyond their
  // thresholds, a path divergence, timing outside its band), in order. A gate that failed with
  // nothing compared ("nothing compared", an arm that failed, the models differ) is not here.
  std::vector<std::string> caught_by;
  // Control arms: the control injection fired (its record says so). False: "control not
  // applied": the comparison says nothing about the gates' sensitivity (neither caught nor
  // insensitive), and the campaign fails with verdict "control_not_applied".
  bool control_applied = true;
  std::optional<TimingVerdict> timing;  // timing arms
  int timing_repeats_a = 0, timing_repeats_b = 0;
  // Service arms (either side's ArmOutcome::service set, or a stop rule naming a service
  // predicate): {"a": side, "b": side, "contrast": ["cold_warm" | "load" | "engine_reuse"...],
  // "bitwise_equal": output and every compared item bitwise equal, "state_compared": a state
  // diff was made}; side = {"server" ("process" for a process arm), "cold",
  // "prompt_tokens_reused", "requests_before", "load_digest" (null: no load)}. Null otherwise.
  // The service predicates follow from it: warm_differs_from_cold (contrast cold_warm and not
  // bitwise_equal), load_changes_state (load, not bitwise_equal), load_changes_path (load, and
  // the window paths diverged), engine_reuse_changes_state (engine_reuse: one side's engine had
  // served requests before, the other's none; not bitwise_equal). A process arm counts as a
  // fresh engine's cold request without load.
  nlohmann::json service;
  // Units merged from a scheduler (units.h): {"a": host label, "b": host label, "same": bool,
  // "note": the report's sentence when the two sides ran on different hosts ("" same)}. Null: the
  // sides' hosts are not known (a local run's children).
  nlohmann::json hosts;
};

// Evaluates gates and predicates. A control arm gets the gate "control applied" (its injection's
// record shows it fired); any other arm whose injections did not all fire gets "injections
// applied" (failed). `diff` is null for timing arms (no exports) or when an arm
// failed; `al` aligns the baseline (A) with the arm (B).
ComparisonResult EvaluateComparison(const Campaign& c, const ArmSpec& arm, const ArmOutcome& base,
                                    const ArmOutcome& out, const DiffResult* diff,
                                    const AlignResult& al);

// Stop rules before an arm is sent: the first rule that fires over the comparisons so far
// (control comparisons excluded), or nullopt. `fired_by` names the predicates that were true.
struct StopDecision {
  const StopRule* rule = nullptr;
  std::vector<std::string> fired_by;
};
std::optional<StopDecision> EvaluateStopRules(const Campaign& c,
                                              const std::vector<ComparisonResult>& so_far);

nlohmann::json ToJson(const ComparisonResult& r);
Result<ComparisonResult> ComparisonFromJson(const nlohmann::json& j);

}  // namespace lockstep
