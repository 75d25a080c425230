// The probes' runner: one request (the "target") on a fresh engine through the Scheduler, with
// its state exported to a file of the probe folder, optionally among seeded background requests
// or after the same prompt on the same engine (warm); and the comparison of two such runs with
// the comparator (DiffExports bitwise, AlignWindows on the window records, the outputs).
//
// Exports hold window 0's pre_verify (the state prefill left), every window's commit (pre_verify
// of window w > 0 is the commit of w - 1) and of every post_verify the window's own items
// (k_spec, v_spec, hidden_out, logits, draft K/V: its committed K/V and GDN state are the
// previous commit's). A CheckpointMap may instead choose
// the checkpoints and relabel them (the verify probe names a spec-0 run's commits after the
// windows of the speculative run they match). Not thread-safe; one run at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/observer.h"
#include "lockstep/engine/request_options.h"
#include "lockstep/engine/scheduler.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/weights.h"
#include "lockstep/harness/preflight.h"

namespace lockstep::preflight {

// Which checkpoints a run exports and under which labels (null members: the default above).
struct CheckpointMap {
  std::function<bool(int window, CheckpointPoint point)> wants;
  std::function<void(CheckpointInfo& info)> relabel;  // rewrites window / p / T
};

// Seeded random-token requests beside (or before) the target: prompts of prompt_lo .. prompt_hi
// tokens, max_new of max_new_lo .. max_new_hi, arriving at steps 0 .. arrive_hi, the target's
// options without injection or replay. The default is the load probe's (the --background
// machinery's shape).
struct BackgroundShape {
  int prompt_lo = 32, prompt_hi = 160;
  int max_new_lo = 4, max_new_hi = 12;
  int arrive_hi = 4;
  std::uint64_t seed = 0x5eedu;
};

struct ArmSpec {
  std::string name;  // file stem in the probe folder, and the export's arm name
  EngineConfig cfg;  // the engine (threads resolved)
  RequestOptions opts;
  std::vector<std::int32_t> prompt;
  int background = 0;  // seeded background requests sharing the engine (needs cfg.slots >= 2)
  BackgroundShape shape;
  // Requests the engine serves to their end, one after another, before the target (engine_age:
  // the target is then request served_before + 1 of its engine), shaped by `before`.
  int served_before = 0;
  BackgroundShape before;
  bool warm = false;  // run the prompt twice on one engine: result 0 cold, result 1 warm
  bool export_state = true;
  CheckpointMap map;
};

struct Arm {
  std::string name;
  RequestResult result;     // the target's
  std::string export_path;  // "" without an export
  int shared_windows = 0;   // target windows whose engine step carried another request
  int seqs_max = 0;         // most sequences in one engine step of the target's windows
};

class ProbeRunner {
 public:
  // `dir` exists and is writable; `model_sha256` goes into every export.
  ProbeRunner(const ModelWeights& weights, std::string dir, std::string model_sha256)
      : weights_(weights), dir_(std::move(dir)), model_sha256_(std::move(model_sha256)) {}
  // One arm (two with spec.warm). kRuntime when the target fails or does not finish; engine
  // and export errors as they come.
  Result<std::vector<Arm>> Run(const ArmSpec& spec);
  int runs() const { return runs_; }
  const std::string& dir() const { return dir_; }

 private:
  const ModelWeights& weights_;
  std::string dir_, model_sha256_;
  int runs_ = 0;
};

struct CompareSpec {
  std::string points = "pre_verify,post_verify,commit";
  std::vector<ItemKind> exclude;  // kinds left out of the comparison (and the counts)
  bool compare_path = true;       // align the window records (false: paths differ by design)
};

struct Comparison {
  int total = 0;  // state items of a's export of the compared kinds (paired or not)
  int compared = 0, differ = 0;
  double max_nrmse = 0.0, max_kl = 0.0;
  bool within_default = true;
  bool output_equal = true;
  std::optional<FirstDifference> first;
};

// Bitwise comparison of b against a (the reference): state items of the windows before the
// first path divergence (after it windows are not paired by index), the path, the outputs.
// Errors: the exports cannot be read.
Result<Comparison> CompareArms(const Arm& a, const Arm& b, const CompareSpec& spec, int threads);
// The first path divergence of two window-record lists as a FirstDifference (nullopt: none).
std::optional<FirstDifference> PathDifference(const std::vector<WindowRecord>& a,
                                              const std::vector<WindowRecord>& b);

}  // namespace lockstep::preflight
