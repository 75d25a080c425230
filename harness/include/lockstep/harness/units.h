// Campaign units (issue 41): a campaign run folder cut into one unit per (arm, repeat), so any
// index-based scheduler (Slurm job arrays, Kubernetes Indexed Jobs, CI matrices) can run them,
// while `lockstep merge` stays the only judge.
//
//   lockstep plan expand PLAN --out DIR     the run folder (as `lockstep run` makes it: plan.toml,
//                                           ledger.jsonl, model/, request.tokens) + units.json
//   lockstep run-unit DIR --index N         one unit as a fresh process: DIR/units/N/
//   lockstep merge DIR                      verify the fragments, append them to the ledger in
//                                           plan order, compare, decide: the report, or the
//                                           wave and indices to run next (exit kMergePending)
//
// DIR/units.json: {"schema": "lockstep.units", "version": 1, "campaign", "plan_sha256", "order",
// "order_seed", "waves": W, "units": [{"index", "arm", "repeat", "wave", "depends_on": [...],
// "same_host_as" (arm or null), "spread"}]}. Units are numbered by wave, then in the order they
// are sent (plan order; consecutive timing arms interleaved by the plan's `order`), so wave w is
// a contiguous index range (UnitsOfWave).
//
// A unit's wave: 0 for an arm that requires no decision, else one more than the wave of every
// arm whose decision it requires; never earlier than its baseline's. Merge applies the stop rules
// and requirements exactly as the local runner does, in plan order: a unit that ran in a wave
// whose campaign then stopped is "not sent" in the ledger, its outputs unread.
//
// DIR/units/N/ appears complete or not at all (written in DIR/units/.N.tmp-PID, then renamed):
// config.json, stdout.json, stderr.log, trace.jsonl, export.h5 (state arms) and fragment.json,
// the unit's record (UnitFragment) with a CRC-32 over its other keys and the SHA-256 of every
// file beside it. A unit that already finished with verified outputs is a no-op; a failed or
// damaged one is moved aside to DIR/units/N.attempt-K and run again as attempt K+1.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/harness/host_fingerprint.h"

namespace lockstep {

struct Campaign;
struct ArmSpec;

// ---- units ----

struct Unit {
  int index = 0;
  std::string arm;
  int repeat = 0;
  int wave = 0;
  std::vector<int> depends_on;  // units whose merge decides whether this one is sent
  std::string same_host_as;     // ArmSpec::same_host_as ("" none)
  bool spread = false;          // ArmSpec::spread
};

// The arms' waves, by arm index (see above).
std::vector<int> ArmWaves(const Campaign& c);

// The send order of a group of consecutive timing arms (arm indices into c.arms, in plan order):
// (arm index, repeat) pairs, each arm's repeats in increasing order. order "plan": arm after arm;
// "abba": round k sends one repeat of each arm, forward for even k, backward for odd k (A B B A
// A B ...); "random": the plan order's sequence shuffled by a Fisher-Yates over SplitMix64 seeded
// with order_seed (the same on every platform), repeats renumbered in send order. A single arm:
// its repeats.
std::vector<std::pair<std::size_t, int>> GroupSendOrder(const Campaign& c,
                                                        const std::vector<std::size_t>& group);

// The plan's arms cut into send groups, in plan order: a group is one arm, or (order other than
// "plan") a run of consecutive timing arms with the same requirements. The local runner and merge
// decide stop rules and requirements per arm before a group's first send, send the group in
// GroupSendOrder, then compare its arms in plan order.
std::vector<std::vector<std::size_t>> SendGroups(const Campaign& c);

std::vector<Unit> ExpandUnits(const Campaign& c);
nlohmann::json UnitsJson(const Campaign& c, const std::vector<Unit>& units);
// DIR/units.json read back. Errors: kNotFound (no file), kCorruption (not such a file).
Result<std::vector<Unit>> ReadUnits(const std::string& dir);
// Indices of wave `wave`'s units (empty: no such wave).
std::vector<int> UnitsOfWave(const std::vector<Unit>& units, int wave);
// "0-3,7": Slurm's --array syntax for sorted indices.
std::string IndexRanges(const std::vector<int>& indices);

// ---- fragments: what a unit's run left (DIR/units/N/fragment.json) ----

struct UnitFragment {
  int index = 0, repeat = 0, attempt = 1;
  std::string arm, plan_sha256;
  int exit_code = 0, signal = 0;
  double seconds = 0;
  std::string executable_sha256, engine_config_sha256, model_sha256, request_sha256, build;
  HostFingerprint host;
  std::map<std::string, std::string> files;  // file name -> SHA-256 (every file beside it)
  // The earlier attempts' results ({"attempt", "exit_code", "signal", "outputs_sha256"}), and
  // whether this attempt's result differs from the last failed one's (null: no earlier attempt).
  nlohmann::json previous = nlohmann::json::array();
  nlohmann::json retry_differs;
  std::string outputs_sha256;  // SHA-256 over stdout.json's output_ids and the exit code
  // A scheduler's word on the unit (units::kScheduler file, written by a driver): null none.
  bool ran() const { return exit_code == 0 || exit_code == 1; }
  nlohmann::json ToJson() const;  // with "crc"
  static Result<UnitFragment> FromJson(const nlohmann::json& j);
};

// Reads DIR/units/N/fragment.json and checks it: its CRC, and every file it lists against its
// SHA-256 (and that a finished unit has stdout.json, trace.jsonl and, `state`, export.h5).
// kNotFound when the unit folder or its fragment does not exist; kCorruption naming what is
// damaged otherwise.
Result<UnitFragment> VerifyUnit(const std::string& unit_dir, bool state);

std::string UnitDir(const std::string& dir, int index);  // DIR/units/N

// A scheduler's failure of a unit that left no verified fragment (a driver writes it:
// DIR/units/N.scheduler.json, {"state", "exit_code", "job"}): merge records the unit as failed
// with it instead of waiting for it. Removed when the unit is sent again.
std::string SchedulerRecordPath(const std::string& dir, int index);

// ---- commands ----

// The plan of a run folder: DIR/plan.toml, checked against the ledger's SHA-256 and parsed with
// the plan's folder the ledger recorded; *record is the ledger replayed. Errors: the ledger's,
// kCorruption for a plan that does not hash as recorded.
struct RunRecord;
Result<Campaign> LoadRunFolderPlan(const std::string& dir, RunRecord* record);

struct ExpandOptions {
  std::string plan, out_dir;
  std::vector<std::string> builds;  // --build NAME=PATH (runner.h)
  std::string exe;                  // the lockstep binary for arms without a build
};
// `lockstep plan expand`: the run folder and units.json. Errors as `lockstep run`'s new run.
Status ExpandPlan(const ExpandOptions& o, std::ostream& out);
// `lockstep plan expand PLAN --wave N --count`: units in wave N (0 when it has none).
Result<int> WaveUnitCount(const std::string& plan, int wave);

// A test hook, named as one: "N:sleep:S" makes run-unit of unit N wait S seconds before its
// child starts (a unit to scancel while it runs), "N:kill" SIGKILLs run-unit itself after its
// child ended and before the fragment is written (a node that died mid-unit), "N:fail" gives
// the child an unknown flag (a failed attempt, exit 2). Never set it outside tests.
inline constexpr const char* kUnitHookEnv = "LOCKSTEP_TEST_HOOK_UNIT";

struct RunUnitOptions {
  std::string dir;
  int index = -1;         // global index
  std::string index_env;  // or: the variable holding it (SLURM_ARRAY_TASK_ID, ...)
  int wave = -1;          // with index_env / index: the index counts within this wave
};
// `lockstep run-unit`: runs (or confirms) one unit. OK when the unit's process ran (exit 0 or 1)
// or it had already finished; kRuntime (exit 3) when it failed: a unit's exit code never makes
// a campaign green (only merge judges).
Status RunUnit(const RunUnitOptions& o, std::ostream& out);

// The exit code of `lockstep merge` when more units must run first (it prints the wave and the
// indices); 0 / 1 are the verdict's, 2 / 3 as every command.
inline constexpr int kMergePending = 4;

struct MergeResult {
  bool pending = false;  // more units must run: the next wave's
  int wave = -1;
  std::vector<int> indices;  // the units to run (the wave's units without a verified fragment)
};
// `lockstep merge DIR`: verifies the fragments, appends them to the ledger in plan order and
// judges (the campaign's verdict and report, as `lockstep run`), or stops at the first unit
// without a verified fragment (result.pending). Status as RunCampaign's when not pending.
Status MergeUnits(const std::string& dir, std::ostream& out, MergeResult* result);

}  // namespace lockstep
