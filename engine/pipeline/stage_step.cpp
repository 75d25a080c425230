// StageSession's default engine step: one sequence per step (device backends without slots).
#include "lockstep/engine/stage.h"

namespace lockstep {

Status StageSession::ForwardStep(const StepPlan& plan, const std::int32_t* tokens,
                                 Activation& act) {
  if (plan.groups.size() != 1)
    return Status::NotSupported("engine step", "this backend runs one sequence per step");
  const RowGroup& g = plan.groups[0];
  const int prev = slot();
  UseSlot(g.slot);
  act.p = g.p;
  act.T = g.T;
  Status st = Forward(g.mode, tokens, act);
  UseSlot(prev);
  return st;
}

void StageSession::StepLogits(const StepPlan& plan, const Activation& act, float* normed,
                              float* logits) {
  if (plan.groups.size() == 1 && plan.groups[0].mode == ForwardMode::kVerify) {
    Logits(act, normed, logits);
  } else {
    FinalNorm(act, normed);
  }
}

}  // namespace lockstep
