// `lockstep localize` as a library call (issue 37): the CLI (harness/cli/localize_cli.cpp) and the
// campaign runner (`localize = true`, runner.h) both call RunLocalization.
//
// Inputs: two exports, or a campaign run folder (`lockstep run PLAN --out DIR`) and one of its
// comparisons ("A1:A2" = baseline:arm; by default the first failing comparison that is not the
// positive control), whose arms' exports (DIR/arms/<arm>/export.h5) are localised.
//
// Modes:
//   plain   Localize() over the exports' op records (compare/localize.h).
//   rerun   exports without op digests: both requests are re-run as fresh `lockstep generate`
//           processes with the configs, model and prompt they record, with --op-digests all, and
//           the re-runs are localised; a re-run that does not reproduce the difference says so
//           ("timing-dependent: did not reproduce") with the timing-dependent knobs preflight
//           names. A re-run whose fingerprints (model, request, executable) are not the
//           original's is refused (kInvalidArgument).
//   graft   a pair whose window paths diverge: A and B are re-run exporting every commit; B is
//           re-run again with A's state items grafted (--graft, graft_spec.h) at the commit of the
//           last window before the first divergent one. When B still takes a different path at
//           that window, the state is not the cause (the finding names the timing- or
//           policy-dependent knobs); otherwise the items that differ at that commit are bisected
//           to the one whose graft alone makes the paths agree (or the smallest set found).
//
// Files: the re-runs' configs, prompts, exports and logs go to `work` (default: next to A, or
// DIR/localize/work-<baseline>-<arm> for a run folder). Not thread-safe (runs child processes).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/compare/localize.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct LocalizeRunOptions {
  std::string a, b;         // two exports; or a run folder in `a` and `b` empty
  std::string comparison;   // run folder: "BASELINE:ARM" (empty: the first failing one)
  bool rerun = false;       // re-run exports without op digests (see above)
  bool graft = false;       // bisect a path divergence by state transplant (see above)
  bool no_isolate = false;  // parse the given exports in process
  std::string work;         // the re-runs' folder (empty: the default above)
  std::string model;        // the model at hand (empty: the recorded path; a run folder: DIR/model)
  std::string exe;          // the lockstep binary re-runs use (empty: this executable)
  std::string exe_b;        // B's re-runs (a change gate's candidate build; empty: exe)
};

// What the re-runs were (rerun or graft mode).
struct LocalizeRerun {
  bool ran = false;
  std::string a, b;                // the re-runs' exports
  bool originals_differ = false;   // outputs or window paths of the given exports differ
  std::vector<std::string> knobs;  // timing- or batch-dependent knobs active in the configs
};

// One re-run of B with grafts: which items, and whether its path then agrees with A's.
struct GraftTrial {
  std::vector<std::string> items;  // rel paths grafted
  bool agrees = false;             // same path as A's re-run at the divergent window
  int first_divergence = -1;       // first window whose path differs from A's (-1: none)
};

struct LocalizeGraft {
  bool ran = false;
  int divergence = -1;    // first window whose path differs (A's re-run vs B's)
  int graft_window = -1;  // the commit grafted at (divergence - 1)
  bool reproduced = false;
  int items = 0;                       // graftable items at that commit
  std::vector<std::string> differing;  // of them, those whose bytes differ between A and B
  std::vector<GraftTrial> trials;      // in the order run
  bool state_is_cause = false;         // grafting A's state made B's path agree
  std::vector<std::string> culprit;    // the item (or the smallest set) whose graft suffices
  std::string finding;                 // one line
};

struct LocalizeRun {
  std::string a, b;           // the exports as given (or as found in the run folder)
  std::string pair;           // "A1 vs A2" for a run folder; "" for two exports
  std::string baseline, arm;  // a run folder's comparison
  LocalizeResult result;
  LocalizeRerun rerun;
  LocalizeGraft graft;
};

// Runs the localisation `o` asks for. Errors: kInvalidArgument for bad input (unreadable exports,
// a run folder without that comparison, fingerprints that do not match, --graft on paths that
// agree), kRuntime when a re-run fails. The result's own verdict (nothing comparable, did not
// reproduce, a difference) is in the value; LocalizeRunStatus maps it to the exit status.
Result<LocalizeRun> RunLocalization(const LocalizeRunOptions& o);

// 0 no difference, 1 a difference / did not reproduce, 2 nothing comparable, as a Status
// (Ok, kGateFailed, kInvalidArgument) naming the verdict.
Status LocalizeRunStatus(const LocalizeRun& run);

// The verdict line, and with re-runs a second line saying what they found.
std::string LocalizeRunSummary(const LocalizeRun& run);
// lockstep.localize v1 JSON (LocalizeJson) with `rerun` and `graft` objects when they ran, and
// `pair` / `baseline` / `arm` for a run folder; Markdown likewise (the graft trials as a table).
std::string LocalizeRunJson(const LocalizeRun& run);
std::string LocalizeRunMarkdown(const LocalizeRun& run);
std::string LocalizeRunHtml(const LocalizeRun& run);
// One sentence for a campaign report's verdict box: "A1 vs A2 differ from window 26; born at
// stage 2, layer 19, `moe_combine`, row 3 (inputs equal)", "... path differs at window 14; the
// state is not the cause (draft_policy=latency)", "... carried in stage0/layer1/ssm_state".
std::string LocalizeVerdictSentence(const LocalizeRun& run);
// The allowlisted part of a result, for a campaign's summary (no paths, no values): pair,
// verdict, kind, window, stage, layer, op, row, item, state_is_cause (graft), sentence.
nlohmann::json LocalizeSummaryJson(const LocalizeRun& run);
// Of a summary read back from a run folder (DIR/localize/<baseline>-<arm>.json's `summary`), the
// allowlisted keys above only; anything else in the file is dropped.
nlohmann::json AllowlistedLocalizeSummary(const nlohmann::json& summary);

// Campaigns (plan key `localize = true`, runner.h): localises the comparison BASELINE:ARM of run
// folder `dir` (already in its ledger) with re-runs on `exe_a` / `exe_b` (each side's build), and
// writes DIR/localize/<baseline>-<arm>.json (LocalizeRunJson plus `summary`, the allowlisted
// LocalizeSummaryJson) and .md. Returns the verdict sentence. When the localisation itself fails
// (a re-run that crashes, fingerprints that do not match) the json file holds {"error": ...} and
// that Status is returned; the campaign goes on either way.
Result<std::string> LocalizeCampaignPair(const std::string& dir, const std::string& baseline,
                                         const std::string& arm, const std::string& exe_a,
                                         const std::string& exe_b);

}  // namespace lockstep
