// Fault injection for testing the harness and the engine's timing paths (DESIGN.md):
//   delay:stage=S:window=W:ms=M   sleep M ms inside stage S's forward of verify window W
//                                 (counted in that stage's compute interval)
//   perturb:stage=S:layer=L:item=I:eps=E:window=W
//                                 multiply one state item by (1 + E) inside verify window W, after
//                                 the stage's forward: I = k | v (the window's K/V rows of
//                                 attention layer L; int8: their scales), conv_state | ssm_state
//                                 (the per-step states of GDN layer L, so commit installs the
//                                 perturbed state), hidden_out (the activations stage S hands on),
//                                 logits (the window's verify logits, last stage). The perturbed
//                                 item and everything computed from it afterwards differ; nothing
//                                 before it does. This is the positive control of a campaign.
// `stage` and `window` may be omitted (= every stage / every window; for layer items the stage is
// the layer's). A malformed or unknown injection is kInvalidArgument naming the text.
#pragma once

#include <string>
#include <vector>

#include "lockstep/engine/observer.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct Injection {
  enum class Kind { kDelay, kPerturb };
  Kind kind = Kind::kDelay;
  int stage = -1;                // -1: any
  int window = -1;               // -1: any
  double ms = 0.0;               // delay
  int layer = -1;                // perturb: global layer index (layer items)
  ItemKind item = ItemKind::kK;  // perturb: one of IsPerturbable (observer.h)
  double eps = 0.0;              // perturb: relative size, the item is multiplied by (1 + eps)
  std::string text;              // as given
};

Result<std::vector<Injection>> ParseInjections(const std::vector<std::string>& specs);

}  // namespace lockstep
