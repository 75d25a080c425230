// `lockstep preflight`: is this engine configuration deterministic, and where not, why?
//
// Two parts (harness/README.md, "Preflight", is the reference):
//  * Static: StaticKnobs() lists each knob of the effective config that makes results timing-
//    or batch-dependent, or whose value the bits depend on (draft_policy = latency, suffix_index
//    = async, batch_invariant = off, deterministic = off on cuda, the thread count against
//    prefill, the prefix cache against the snapshot grid, delay / perturb injections), each with
//    its value, whether it can act in this config, its effect and the property it breaks.
//  * Probes: short in-process runs of one request on the given model (fresh engines, Scheduler,
//    exports to temporary files) compared by the comparator (DiffExports bitwise, AlignWindows),
//    one pair per property: the same request twice on fresh engines with a stall injected into
//    the second; drafts against an always caught-up suffix index; alone vs among background
//    requests; cold vs warm through the prefix cache; verify windows vs the same tokens one by
//    one (spec 0); 1 vs 2 threads; request 1 on a fresh engine vs the same request as request k
//    on an engine that served k - 1 others (engine_age, prefix cache on and off).
//  * Sweep (--sweep): the probe beside k background requests for k up to slots - 1, and with
//    prefill chunks straddling the CPU kernels' tile boundaries (SweepReport).
//
// Claims: a config claims a property when the property is about something the config does:
// fresh_repeat and index_timing always (the premise of an A/A), load when slots > 1, cold_warm
// when prefix_cache is on, verify_single when spec > 0 (or replay_path), engine_age when slots > 1
// or prefix_cache is on (an engine that serves many requests), threads never (the cpu
// backend is bitwise for a fixed thread count only). A probe the config makes inapplicable is run
// with the minimal change (PropertyResult::change says which); its result is then reported but not
// claimed. A claimed property fails when its probe finds a difference, or when an active knob
// breaks it by design and the probe did not provoke the difference (kNotProvoked): timing can hide
// a difference in one run, never make the config deterministic.
//
// Results: RunPreflightCommand exits 0 when no claimed property fails, 1 when one does
// (kGateFailed), 2 for bad input (flags, config, model, prompt), 3 for a runtime failure (an
// engine or export error in a probe). Not thread-safe; one call at a time per process (the probes
// use the process-wide HDF5 library).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/cpu_tiles.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/weights.h"

namespace lockstep {

// ---- properties, one probe each ----

enum class PreflightProperty : std::uint8_t {
  kFreshRepeat,   // the same request twice on fresh engines (the second with a stall): equal
  kIndexTiming,   // drafts do not depend on when the suffix index catches up
  kLoad,          // a request alone == the same request among background requests
  kColdWarm,      // cold == warm (the prefix cache)
  kVerifySingle,  // a verify window == the same tokens one by one (T = 1)
  kThreads,       // 1 thread == 2 threads
  kEngineAge,     // request 1 on a fresh engine == the same request as request k (issue 40)
};
// "fresh_repeat" | "index_timing" | "load" | "cold_warm" | "verify_single" | "threads" |
// "engine_age".
const char* PropertyId(PreflightProperty p);
// One line: what the property says.
const char* PropertyTitle(PreflightProperty p);
std::optional<PreflightProperty> ParsePropertyId(std::string_view id);
const std::vector<PreflightProperty>& AllPreflightProperties();

// ---- static part (harness/preflight/knobs.cpp) ----

struct KnobFinding {
  std::string knob;    // config key ("draft_policy")
  std::string value;   // as its flag spells it ("latency"; threads = 0 as "0 (auto: 2 here)")
  bool active = true;  // false: set, but it cannot act in this config (`note` says why)
  std::string effect;  // what it does to results, one sentence
  std::optional<PreflightProperty> breaks;  // the property it breaks when active
  std::string note;                         // why inactive, or a measured figure
};

// The knobs of `cfg` (validated) that make results timing- or batch-dependent or whose value
// the bits depend on, in option-table order. `hardware_threads` resolves threads = 0. Pure.
std::vector<KnobFinding> StaticKnobs(const EngineConfig& cfg, int hardware_threads);

struct Claim {
  bool claimed = false;
  std::string why;  // one line
};
// Whether `cfg` claims `p` (see "Claims" above). Pure.
Claim ClaimOf(const EngineConfig& cfg, PreflightProperty p);

// ---- results ----

enum class ProbeResult : std::uint8_t {
  kNotRun,         // --skip-probes, or not in --probes
  kHolds,          // bitwise equal: output, path and every compared item
  kDiffers,        // the probe found a difference (PropertyResult::first)
  kNotProvoked,    // no difference found, but an active knob breaks the property by design
  kNotApplicable,  // the probe cannot run for this config (reason)
};
// "not_run" | "holds" | "differs" | "not_provoked" | "n/a".
const char* ProbeResultName(ProbeResult r);

// The first difference a probe found, in window order: a state item (the comparator's first
// bitwise-differing item), a path divergence (align's first window whose path fields differ) or,
// with equal paths and state, the output.
struct FirstDifference {
  std::string what;  // "state" | "path" | "output"
  int window = -1;
  std::string point;            // state: pre_verify | post_verify | commit
  int stage = -1, layer = -1;   // state (layer -1: not a layer item)
  std::string item;             // state: the item kind ("k_spec"); path: differing fields ("T")
  std::string rel;              // state: "stage0/layer3/k_spec"
  std::string a, b;             // path: both windows' fields (DescribeWindow)
  double nrmse = -1.0;          // state: this item's NRMSE (-1: not a state difference)
  double kl = -1.0;             // state, logits: max KL over rows (-1: none)
  bool within_default = false;  // state: passes the default thresholds (NRMSE 2e-4, KL 1e-5)
  std::string text;             // one line for the table
};

// ---- the sweep (`--sweep`, issue 40; harness/README.md "Sweeps") ----
//
// One probe request beside k co-resident background requests for each k of a declared set (k
// points), and with prefill chunks of R rows for each R straddling a kernel tile boundary of the
// CPU backend (rows points, beside a few background requests): each point is an A/A of the probe
// against its solo run (same config) on every exported item, bitwise.
struct SweepPoint {
  std::string axis;  // "k" | "rows"
  int value = 0;     // k: background requests; rows: the prefill chunk R
  int background = 0;
  int seqs_max = 0;  // most sequences in one engine step of the probe's windows (k + 1: all)
  int windows = 0, shared_windows = 0;  // the probe's windows, and those that shared a step
  int items_total = 0;     // state items the solo run's export holds (the compared kinds)
  int items_compared = 0;  // of those, paired and compared bitwise
  int items_differ = 0;
  double max_nrmse = 0.0;
  bool output_equal = true;
  std::optional<FirstDifference> first;
  ProbeResult result = ProbeResult::kNotRun;  // holds | differs | n/a (compared nothing)
  std::string reason;                         // n/a: why
  double seconds = 0.0;
  std::string Label() const;  // "k=7" | "rows=64"
};

struct PropertyResult {
  PreflightProperty property = PreflightProperty::kFreshRepeat;
  Claim claim;
  ProbeResult result = ProbeResult::kNotRun;
  std::string probe;   // what ran, one line
  std::string change;  // the minimal change to the config for this probe ("" = none)
  std::string reason;  // n/a: why; not_provoked: what was tried
  std::vector<std::string> broken_by;  // active knobs that break it by design ("draft_policy")
  std::optional<FirstDifference> first;
  // engine_age: one point per (prefix cache setting, k) (axis "age_cache_on" | "age_cache_off").
  std::vector<SweepPoint> points;
  int runs = 0;                // requests the probe ran
  int items_compared = 0;      // state items compared bitwise (both sides)
  int items_differ = 0;        // of those, bitwise different
  double max_nrmse = 0.0;      // over the differing items
  double max_kl = 0.0;         // over differing logits items
  bool within_default = true;  // every differing item passes the default thresholds
  double seconds = 0.0;
  // Claimed, and it differs, its probe could not check it (n/a), or an active knob breaks it
  // whatever the probe saw.
  bool Fails() const;
};

struct SweepReport {
  bool ran = false;
  int slots = 0;                   // the engine's --slots (k <= slots - 1)
  std::vector<int> k_declared;     // as asked (the default set or --sweep K-LIST)
  std::vector<int> k_clipped;      // declared but over slots - 1: not run
  std::vector<RowTile> tiles;      // the boundaries the rows points straddle
  int rows_background = 0;         // background requests of each rows point
  std::string change;              // the pinned timing knobs (as the probes' change)
  std::vector<SweepPoint> points;  // k points in increasing k, then rows points
  // Holds when it ran, has points, and every point holds (a point that compared nothing is n/a,
  // a failure, never a pass).
  bool passed() const;
  // The first point (in the table's order) where anything differs or nothing was compared;
  // nullptr when none.
  const SweepPoint* FirstFailing() const;
};

// The default k set: 0, 1, 2, 3, 7, 8, 15, 16, 31, 32, 63, 64 and slots - 1 (the maximum), each
// clipped to slots - 1.
std::vector<int> DefaultSweepK(int slots);

struct PreflightReport {
  EngineConfig config;  // effective (threads resolved)
  std::string config_sha256, model_sha256;
  int prompt_tokens = 0, probe_tokens = 0;
  bool builtin_prompt = true;
  std::vector<KnobFinding> knobs;
  std::vector<PropertyResult> properties;  // AllPreflightProperties() order
  std::string work_dir;                    // where the probes' exports were kept ("" = removed)
  SweepReport sweep;                       // --sweep (ran = false without it)
  double seconds = 0.0;
  // No claimed property fails, and the sweep (when it ran) passed.
  bool passed() const;
  // The first line: "preflight: PASS: ..." | "preflight: FAIL: ..." naming the failing properties.
  std::string VerdictLine() const;
  // "2 claimed properties do not hold: fresh_repeat, load" (the exit-1 message).
  std::string FailingSummary() const;
};

struct PreflightOptions {
  EngineConfig config;              // after --config and the engine flags (not yet validated)
  std::string prompt_text;          // --prompt (the model's tokenizer)
  std::string prompt_tokens;        // --prompt-tokens FILE; neither: the built-in prompt
  std::vector<std::string> probes;  // --probes: property ids; empty = every probe
  bool skip_probes = false;         // --skip-probes: the static part only
  // Tokens each probe request generates (ignore_eos on); 0: the config's max_new within 4 .. 24.
  int probe_tokens = 0;
  std::string work_dir;  // --work DIR: keep the probes' exports there
  std::string json;      // --json PATH|- (lockstep.preflight v1)
  bool color = false;    // colour the verdict line
  bool progress = true;  // one stderr line per probe
  // --sweep [K-LIST]: the sweep instead of the property probes (which then do not run unless
  // --probes names some). Empty sweep_k: DefaultSweepK.
  bool sweep = false;
  std::vector<int> sweep_k;
  // --sweep-rows LIST | none: the rows points' prefill chunks; unset: StraddlingRows of the
  // CPU backend's tiles; empty (none): no rows points.
  std::optional<std::vector<int>> sweep_rows;
  // --age LIST: the request positions k of the engine_age probe (each >= 2).
  std::vector<int> age_k = {2, 5};  // 20 too is 2.5x the cost: `--age 2,5,20`
};

// The built-in prompt for a vocabulary of `n_vocab` ids: 32 seeded tokens, then a 48-token block
// three times (so suffix drafts, and a model that copies from its context, have a repeated block
// to continue). 176 tokens.
std::vector<std::int32_t> BuiltinPreflightPrompt(int n_vocab);

// The static part and the probes (harness/preflight/probes.cpp) for a validated config (threads
// 0 is resolved here: the knobs and claims read it as "auto"), on loaded weights. Errors: kRuntime
// / kIOError from a probe's engine or export (exit 3); kInvalidArgument for options the probes
// reject.
Result<PreflightReport> RunPreflight(const PreflightOptions& opts, const ModelWeights& weights,
                                     std::span<const std::int32_t> prompt);

// The report for people: the verdict line first, the knob list, then one row per property
// (claimed, result, first difference with its NRMSE and the default-threshold verdict).
std::string PreflightText(const PreflightReport& r, bool color);
// The `lockstep.preflight` v1 object (keys: harness/README.md, "Preflight").
nlohmann::json PreflightJson(const PreflightReport& r);

// `lockstep preflight`: validates the config, loads the model and the prompt, runs, writes the
// text to `out` (stderr-bound by the caller when --json is "-") and the JSON to opts.json.
// Ok when it passed; kGateFailed (exit 1) naming the failing properties; kInvalidArgument /
// kNotFound (exit 2); kRuntime / kIOError (exit 3).
Status RunPreflightCommand(const PreflightOptions& opts, std::ostream& out);

}  // namespace lockstep
