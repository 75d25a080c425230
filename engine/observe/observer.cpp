// The names of observer.h's enums: the one spelling of each checkpoint point and item kind, used by
// the exporter, the reader, the comparator, injections and reports.
#include "lockstep/engine/observer.h"

namespace lockstep {

const char* CheckpointPointName(CheckpointPoint p) {
  switch (p) {
    case CheckpointPoint::kPreVerify:
      return "pre_verify";
    case CheckpointPoint::kPostVerify:
      return "post_verify";
    case CheckpointPoint::kCommit:
      return "commit";
  }
  return "?";
}

const char* ItemKindName(ItemKind k) {
  switch (k) {
    case ItemKind::kK:
      return "k";
    case ItemKind::kV:
      return "v";
    case ItemKind::kKSpec:
      return "k_spec";
    case ItemKind::kVSpec:
      return "v_spec";
    case ItemKind::kConvState:
      return "conv_state";
    case ItemKind::kSsmState:
      return "ssm_state";
    case ItemKind::kMtpK:
      return "mtp_k";
    case ItemKind::kMtpV:
      return "mtp_v";
    case ItemKind::kHiddenOut:
      return "hidden_out";
    case ItemKind::kLogits:
      return "logits";
  }
  return "?";
}

}  // namespace lockstep
