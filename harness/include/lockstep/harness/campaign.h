// Campaign: the predeclared plan of an A/A (then B) diagnostic, parsed from TOML
// (campaigns/README.md documents every key). Parsing is strict: an unknown key, a wrong type, an
// arm overriding an engine field that does not exist, a stop rule naming an unknown predicate, a
// missing model or request is kInvalidArgument (exit 2) naming the file, line and column, before
// anything runs. The parser is harness/campaign/plan.cpp (sections) and plan_values.cpp (typed
// values); the needle prompt generator is harness/campaign/needle_prompt.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/compare/state_diff.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/observer.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct ModelSpec {
  std::string path;        // checkpoint folder (absolute, resolved against the plan's folder), or
  std::string preset;      // synthetic preset (tiny | small | seed48), created on demand
  std::uint64_t seed = 0;  // synthetic seed
  bool induction = false;  // synthetic induction wiring (repetitive text drafts well)
  // The preset's file (`lockstep model init --format F --quant Q --dtype D --layers N`):
  // "safetensors" (a folder, DIR/model) or "gguf" (DIR/model.gguf; llama.cpp arms need it).
  std::string format = "safetensors";
  std::string quant;  // gguf: q8_0 | q4_k | q6_k ("": the dtype's matrices)
  std::string dtype;  // f32 | bf16 | f16 ("": the preset's default)
  int layers = 0;     // a cut in depth (0: the preset's)
};

// Generated needle-in-a-haystack prompt (byte tokens): filler sentences with `needles` facts
// ("The code of vault 3 is 48213.") at seeded positions and a question at the end.
struct NeedleSpec {
  int tokens = 0;  // prompt length in tokens (bytes), exactly
  int needles = 1;
  std::uint64_t seed = 0;
};

struct RequestSpec {
  std::string prompt_file;  // raw text (absolute after parsing)
  std::string token_file;   // token ids (absolute after parsing)
  std::string prompt;       // inline text
  std::string chat_file;    // chat messages (JSON, as `generate --chat`), rendered with the model's
                            // chat template (absolute after parsing)
  std::optional<NeedleSpec> needle;
};

struct ExportPlan {
  std::string windows = "0-2";                                  // state arms: --export-windows
  std::vector<std::string> points = AllCheckpointPointNames();  // state arms: --export-points
  int sample_ms = 100;
};

// Gates a comparison (arm vs its baseline) must pass. Unset optional = gate not evaluated.
struct GateSpec {
  bool output = false;                      // tokens and stop reason identical
  bool state = false;                       // every compared item within the thresholds
  std::optional<int> path_within;           // 0: no divergence at all; N: none in windows [0, N)
  std::optional<double> aggregate_rel_max;  // |sum verify B - sum verify A| / sum A <= X
  std::optional<double> window_abs_ms;      // per matched window |delta verify| <= max(abs_ms,
  std::optional<double> window_rel;         //   rel x median verify time of the baseline)
  bool resources = false;                   // no guard trip, and:
  bool no_swap = true;                      //   no swap used (when known)
  std::int64_t min_free_mib = -1;           //   host available memory never below (-1: off)
  // State gate: skipped items allowed (max_skipped = N; -1: any). 0 by default: a state diff that
  // skips items (checkpoints whose windows differ) fails; arms that compare different configs set
  // their own ArmSpec::max_skipped.
  std::int64_t max_skipped = 0;
  // The state gate asks for bitwise equality of every compared item instead of the thresholds
  // (`exact = true`: a change that must not alter what the engine computes).
  bool exact = false;
};

// Background load sent while a service arm's request runs (`load = {...}` of an arm): `requests`
// seeded random-token requests, `concurrency` at a time, prompts of prompt_lo..prompt_hi tokens,
// max_new tokens each. Bounded in count and time (timeout_s for the whole load).
struct LoadSpec {
  int requests = 8;
  int concurrency = 4;
  int prompt_lo = 50, prompt_hi = 400;
  int max_new = 16;
  std::uint64_t seed = 1;
  double timeout_s = 300.0;
};

// A server someone else started (`[service] url`, `api_key_env`): every service arm runs there.
// Empty url: the runner starts its own `lockstep serve` children.
struct ServiceSpec {
  std::string url;          // http://HOST:PORT (loopback in tests)
  std::string api_key_env;  // the environment variable holding the API key ("" none)
  int line = 0;
};

struct ArmSpec {
  std::string name;            // unique, [A-Za-z0-9_.-]+
  std::string mode = "state";  // state (exports at the planned checkpoints) | timing (trace only)
  int repeat = 1;              // timing arms: fresh processes
  std::string baseline;        // arm compared against (empty: none; the first arm has none)
  std::vector<std::string> require;  // decisions that must hold for this arm to be sent
  std::string decision;  // name recorded for this arm's comparison verdict (e.g. aa_stable)
  nlohmann::json engine = nlohmann::json::object();  // engine-config overrides (EngineConfig keys)
  bool control = false;                     // the positive-control arm (must FAIL its gates)
  std::optional<std::int64_t> max_skipped;  // overrides GateSpec::max_skipped for this arm
  std::string build;  // the [builds] name it runs on ("": the running executable)
  // Where the arm's request runs: "process" (default: a fresh `lockstep generate`, as in the
  // seed), "fresh" (a `lockstep serve` the runner starts for this arm and stops after) or
  // "shared" (the campaign's long-lived server: its conversation cache and slot history carry
  // over between arms). The issue's `engine = "fresh"` is spelled `server` because `[arm.engine]`
  // is the overrides table.
  std::string server = "process";
  bool prime = false;            // service arms: send the request once (no export) before the
                                 // arm's own, so the arm's request is warm
  std::optional<LoadSpec> load;  // service arms: background load during the request
  // Placement of the arm's units on a scheduler (units.h): `same_host_as = "A1"` asks for the
  // host of that arm's units (checked at merge from the host fingerprints, never trusted);
  // `placement = "spread"` asks for any other host. Neither: anywhere.
  std::string same_host_as;
  bool spread = false;
  int line = 0;  // where it was declared (messages)
};

struct StopRule {
  std::string name;
  bool all = false;                     // any (default) | all of the predicates
  std::vector<std::string> predicates;  // from StopPredicates()
  std::string message;                  // printed when it fires
  std::vector<std::string> arms = {};   // judge only these arms' comparisons (empty: every arm's)
};

struct Campaign {
  std::string name, question, hypothesis;
  ModelSpec model;
  RequestSpec request;
  nlohmann::json engine = nlohmann::json::object();  // fixed config every arm inherits
  ExportPlan export_plan;
  Thresholds thresholds;
  GateSpec gates;
  // Named builds arms run on ([builds] name = path): absolute paths, resolved against the plan's
  // folder, not checked here (ResolveBuilds in builds.h checks them before anything runs, after
  // the command line's --build overrides).
  std::map<std::string, std::string> builds;
  ServiceSpec service;         // [service]: a remote server for every service arm
  std::vector<ArmSpec> arms;   // in order; the control arm (if any) is appended last
  std::vector<StopRule> stop;  // the default rule is filled in for A/A-then-B campaigns
  bool default_stop = false;   // stop holds the default rule (none was declared)
  std::string control;         // injection text of the positive control ("" none)
  int min_timing_repeats = 6;  // below: no timing verdict
  // The order in which consecutive timing arms (same requirements) send their repeats: "plan"
  // (arm by arm), "abba" (A B B A A B ...) or "random" (seeded by order_seed). units.h.
  std::string order = "plan";
  std::uint64_t order_seed = 0;
  // localize = true (issue 37): a failing comparison (an A/A, or a change gate's) is localised
  // after it is made (localize_run.h, re-run with op digests): DIR/localize/<baseline>-<arm>.json
  // and .md, and the verdict box names where the difference is born.
  bool localize = false;
  std::string plan_dir;     // folder of the plan file (relative paths resolve here)
  std::string plan_text;    // the file as read
  std::string plan_sha256;  // SHA-256 of plan_text
};

// Predicates stop rules may name (each is true when any comparison so far shows it).
const std::vector<std::string>& StopPredicates();

Result<Campaign> LoadCampaign(const std::string& path);
// `source` names the text in messages ("campaigns/aa-smoke.toml").
Result<Campaign> ParseCampaign(std::string_view text, const std::string& source,
                               const std::string& plan_dir);

// The arm's effective engine config: EngineConfig defaults <- campaign [engine] <- arm engine
// overrides, with `model_dir` as the model; validated (kInvalidArgument).
Result<EngineConfig> EffectiveConfig(const Campaign& c, const ArmSpec& arm,
                                     const std::string& model_dir);

// The needle-in-a-haystack prompt text: exactly spec.tokens bytes (byte tokenizer), deterministic
// in spec.seed.
std::string NeedleHaystackPrompt(const NeedleSpec& spec);

}  // namespace lockstep
