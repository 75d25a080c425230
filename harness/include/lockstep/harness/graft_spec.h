// `--graft FROM.h5:ITEM@WINDOW:CHECKPOINT` (issue 37, item 5): the harness side of a state
// transplant. It reads the value of ITEM at checkpoint WINDOW:CHECKPOINT out of the export FROM
// and hands the engine a Graft (lockstep/engine/graft.h), which installs it when the run reaches
// that checkpoint. ITEM is named as `lockstep diff` names items, the path inside a checkpoint:
// `stage1/layer7/ssm_state`, `stage0/layer3/k`, `stage3/mtp/v`; CHECKPOINT is pre_verify,
// post_verify or commit (instrument/SCHEMA.md).
#pragma once

#include <string>
#include <vector>

#include "lockstep/engine/graft.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// One --graft text split into its parts (nothing opened). FROM may contain ':' (the last two
// fields are cut from the right). kInvalidArgument naming the text for a malformed one.
struct GraftSpec {
  std::string text, from, rel;
  int window = 0;
  CheckpointPoint point = CheckpointPoint::kCommit;
};
Result<GraftSpec> ParseGraftSpec(const std::string& text);

// Every spec's value, read from its FROM export (each file opened once, trusted: in process).
// Refused with kInvalidArgument naming the problem: FROM not an export; FROM of another model
// (`model_sha256` is the run's) or of another config (`config_json`, the run's canonical config;
// `inject` and the model path are not compared: the run under test may carry its own faults);
// a window or checkpoint FROM does not hold (the message lists the windows it holds); an item
// FROM does not hold there or one that is not state (k_spec, hidden_out, logits).
Result<std::vector<Graft>> LoadGrafts(const std::vector<std::string>& specs,
                                      const std::string& config_json,
                                      const std::string& model_sha256);

}  // namespace lockstep
