// The campaign runner: `lockstep run PLAN.toml --out DIR`, `--resume DIR`, `lockstep gate`.
//
// Run folder:
//   DIR/plan.toml             the plan as read (its SHA-256 is in the ledger's first entry)
//   DIR/ledger.jsonl          the request ledger (ledger.h): the only record of what happened
//   DIR/model/                the synthetic model (preset plans), created once
//   DIR/request.tokens        the request's prompt token ids
//   DIR/arms/<arm>/           config.json, stdout.json, stderr.log (process arms), trace.jsonl,
//                             export.h5 (state arms); service arms also service.json (the
//                             ledger's `service` object) and, on a fresh server, server/
//                             (server.log, server.stdout, exports/)
//   DIR/arms/<arm>/r<k>/      the same per repeat (timing arms)
//   DIR/shared/               the shared server of service arms: config.json, server.log,
//                             exports/ (replaced when a resumed runner starts it again)
//   DIR/compare/<arm>.json    gates, predicates and the comparator's report of arm vs baseline
//   DIR/compare/<arm>.md|.html  the comparator's Markdown / HTML for that pair
//   DIR/report.md|.html, DIR/junit.xml   the campaign summary (harness/campaign_report.h)
//
// Every process arm runs as a fresh child process (`lockstep generate --config ...`); a service
// arm's request goes to a `lockstep serve` (campaigns/README.md "Service arms";
// harness/campaign/service_arm.h). The ledger is appended before and after every step (sent,
// finished/failed, compared, decision, stopped, not_sent, done; server_started, server_stopped,
// server_failed and reprimed for service arms) and fdatasync'd at each decision point, so a
// killed runner resumes exactly where it was: finished arms are never re-sent; an arm that was
// sent but did not finish is re-run (and the resume entry says so); a changed plan is refused.
#pragma once

#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/harness/ledger.h"

namespace lockstep {

struct Campaign;
struct ArmSpec;
struct ArmBuild;

// Where a run's arms come from when they are not the runner's children: the units a scheduler
// ran (lockstep merge, units.h). Take() is asked for each (arm, repeat) the campaign sends, in
// send order, and either puts its outputs into `arm_dir` (config.json, stdout.json, trace.jsonl,
// export.h5, ... as a child leaves them) and says how it ended, or says it has not run yet: the
// runner then stops where it is (no entry written for it), and RunCampaign returns OK without a
// verdict (RunSource::pending()). Checking the unit's fingerprints against `expect` is Take()'s.
struct RunExpect {
  std::string engine_config_sha256, executable_sha256, build, model_sha256;
};
struct RunTaken {
  bool pending = false;  // not run yet: nothing to record
  bool failed = false;   // a failed run (RunEndEntry::failed)
  int exit_code = 0, signal = 0;
  double seconds = 0;
  std::string error;    // why it failed, when it is not an exit code ("" none)
  nlohmann::json unit;  // RunEndEntry::unit
  std::string note;     // a line for the output ("" none): a retry that differs, a refusal
};
class RunSource {
 public:
  virtual ~RunSource() = default;
  virtual Result<RunTaken> Take(const ArmSpec& arm, int repeat, const std::string& arm_dir,
                                const RunExpect& expect) = 0;
  // The hosts of a comparison's two sides (ComparisonResult::hosts) and, when `b` (or `a`)
  // asked for same_host_as and did not get it, the violation ("" none).
  virtual nlohmann::json PairHosts(const ArmSpec& a, const ArmSpec& b, std::string* violation) = 0;
  virtual bool pending() const = 0;
};

struct RunOptions {
  std::string plan;     // PLAN.toml (new run; with resume: must hash like the recorded plan)
  std::string out_dir;  // the run folder
  bool resume = false;  // continue the campaign in out_dir
  std::string junit;    // JUnit XML path (default out_dir/junit.xml)
  std::string exe;      // lockstep binary for arms without a build (default: this executable)
  // --build NAME=PATH: replaces the path of a build the plan declares in [builds] (builds.h). A
  // new run only: a resumed run uses the builds its ledger recorded (refused if they changed).
  std::vector<std::string> builds;
  int progress = -1;  // progress on stderr: -1 when stderr is a terminal, 0 off, 1 on
  // Each comparison parses the arms' exports in a child process (ReaderLimits::isolate, always):
  // its deadline per file (--isolate-timeout). A child that crashes or hangs fails the
  // comparison's "exports readable" gate; the campaign goes on by its rules.
  double isolate_timeout_s = 30.0;
  // Service arms on a server someone started (--service-url, --service-key-env): override the
  // plan's [service] url / api_key_env for a new run (recorded in the planned entry; a resumed
  // run keeps the recorded server and refuses them). Empty: the plan's.
  std::string service_url;
  std::string service_key_env;
  double service_timeout_s = 600;  // one HTTP request of a service arm at most
  // Not null: the arms' runs come from here (lockstep merge) instead of child processes; a
  // resumed run only. Borrowed: it outlives RunCampaign.
  RunSource* source = nullptr;
};

// Runs (or resumes) a campaign and writes its reports. OK when the campaign's verdict passes;
// GateFailed (exit 1) when it fails (a gate failed, the stop rule fired, the positive control
// was not caught: "insensitive", or its injection did not fire: "control_not_applied");
// kInvalidArgument (exit 2) for a bad plan or folder.
Status RunCampaign(const RunOptions& opts, std::ostream& out);

// `lockstep run --check-plan PLAN`: parses the plan and applies the campaign verdict rule's
// load-time checks (lockstep/harness/verdict.h) without running anything. OK (printing the plan's
// pairs and the gates that apply to each, and any relaxed threshold) or kInvalidArgument with
// the reason.
Status CheckCampaignPlan(const std::string& plan, std::ostream& out);

// The ledger's decision content, for comparing runs: one line per entry with volatile fields
// (times, attempts) removed, 'resumed' entries dropped, and sends that never finished (a killed
// runner) dropped. Two runs of a deterministic campaign, interrupted or not, give equal digests.
// Service arms: the server events (server_started / _stopped / _failed, reprimed) are dropped; a
// `service` object (finished / failed entries, and both sides of a compared entry) loses its
// instance, export names and digests and load seconds, its engine_state "lost: re-primed" reads
// as "carried" and requests_before as whether it is > 0 (a re-primed server got the history
// again without the earlier arms' load); the ledger itself keeps them as they were.
std::vector<std::string> LedgerDigest(const std::vector<LedgerEntry>& entries);

// ---- the pieces of a run other commands reuse (lockstep golden record / check, plan expand) ----

// A new run folder for opts.plan in opts.out_dir, as `lockstep run` makes it: the plan checked
// (CheckPlanCanPass) and its builds resolved before the folder exists, then plan.toml and the
// ledger's planned entry, appearing together (built aside and renamed). *c is the parsed plan.
// Errors: the plan's and the builds' (exit 2), a folder that exists and is not empty (2).
// *builds: the resolved builds by name (builds.h).
Status CreateRunFolder(const RunOptions& opts, const std::string& exe, Campaign* c,
                       std::map<std::string, ArmBuild>* builds);

// SHA-256 of an arm's effective config without the model path (the ledger's
// engine_config_sha256): the model is fixed by the plan, its folder differs between run folders.
struct EngineConfig;
std::string EngineConfigHash(EngineConfig cfg);
// The engine_config_sha256 a campaign records for `arm`: EngineConfigHash(cfg) for a lockstep
// arm; for a llama.cpp arm (llama_arm.h) the SHA-256 of its llama.cpp options, model left out.
std::string ArmConfigSha256(const Campaign& c, const ArmSpec& arm, const EngineConfig& cfg);

// The plan's model folder: [model] path as given, or the synthetic preset created once in
// `dir`/model (built aside and renamed), or `dir`/model.gguf for [model] format = "gguf".
// Errors: those of RunModelInit, kIOError; kInvalidArgument naming scripts/install-llamacpp.sh
// when an arm runs on llama.cpp and the component is absent.
Result<std::string> ProvisionPlanModel(const Campaign& c, const std::string& dir);
// Where ProvisionPlanModel puts (or finds) the model of run folder `dir`.
std::string PlanModelPath(const Campaign& c, const std::string& dir);
// The plan's request as token ids in `tokens_path` (left as it is when it exists). Text prompts
// (`prompt`, `prompt_file`) go through the tokenizer of the model at `model_dir`, as `lockstep
// generate --prompt` does (byte level when the model has none); `chat` messages are rendered with
// the model's chat template first (as `generate --chat`); the needle prompt is byte tokens.
Status ProvisionPlanRequest(const Campaign& c, const std::string& model_dir,
                            const std::string& tokens_path);
// argv of an arm's fresh `lockstep generate` process: `exe` with the config `arm_dir`/config.json
// (written by the caller), the request's tokens, --json on stdout, the window trace in
// `arm_dir`/trace.jsonl and, for state arms, the plan's export (`arm_dir`/export.h5, its windows
// and points). A llama.cpp arm (llama_arm.h) adds LlamaGenerateFlags of that config.
std::vector<std::string> ArmGenerateArgv(const Campaign& c, const ArmSpec& arm,
                                         const std::string& exe, const std::string& arm_dir,
                                         const std::string& tokens_path);

}  // namespace lockstep
