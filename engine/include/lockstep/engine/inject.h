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
//   perturb-op:stage=S:layer=L:op=NAME:window=W:row=R:ulps=K
//                                 move one output element of one named op (op_table.h) by K ULPs
//                                 (the element's bits as an integer + K) in verify window W, row R
//                                 of the window, layer L (-1: a stage op such as lm_head; the MTP
//                                 layer is n_layers), before anything reads it. Which element: the
//                                 row's first element whose magnitude is its largest. The planted
//                                 fault of a localisation's positive control (issue 37).
// `stage` and `window` may be omitted (= every stage / every window; for layer items the stage is
// the layer's). A malformed or unknown injection is kInvalidArgument naming the text.
//
// Every injection accounts for itself: the engine records each time it takes effect
// (InjectionFiring) and the run reports the record (InjectionRecordJson) in generate's --json,
// the Chrome trace and the export's /injections (instrument/SCHEMA.md). One that can never fire
// is refused before the run (Engine::Create: a window at or past max_new, a stage or layer that
// does not exist, a layer of the wrong kind); one that did not fire is an error after the run
// (CheckInjectionsFired), once every output is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/engine/observer.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct Injection {
  enum class Kind { kDelay, kPerturb, kPerturbOp };
  Kind kind = Kind::kDelay;
  int stage = -1;                // -1: any
  int window = -1;               // -1: any
  double ms = 0.0;               // delay
  int layer = -1;                // perturb: global layer index (layer items)
  ItemKind item = ItemKind::kK;  // perturb: one of IsPerturbable (observer.h)
  double eps = 0.0;              // perturb: relative size, the item is multiplied by (1 + eps)
  std::string op;                // perturb-op: the op's name (op_table.h)
  int row = -1;                  // perturb-op: the row of the window
  int ulps = 0;                  // perturb-op: ULPs added to the element's bits
  std::string text;              // as given
};

Result<std::vector<Injection>> ParseInjections(const std::vector<std::string>& specs);

// One time an injection took effect: in verify window `window` (rows p .. p+T-1), on `stage`
// (layer items: on `layer`), multiplying by `factor` (perturb) or sleeping `ms` (delay).
struct InjectionFiring {
  int window = -1, stage = -1, layer = -1;
  int p = 0, T = 0;
  double factor = 0.0;                        // perturb: 1 + eps
  double ms = 0.0;                            // delay
  int row = -1, position = -1, element = -1;  // perturb-op: the row, its position, the element
};

// What one injection did over a run: how often it fired and the first kMaxFirings firings.
struct InjectionRecord {
  static constexpr std::size_t kMaxFirings = 16;
  std::int64_t count = 0;
  std::vector<InjectionFiring> firings;
  void Add(const InjectionFiring& f) {
    ++count;
    if (firings.size() < kMaxFirings) firings.push_back(f);
  }
};

// The record as one JSON object (instrument/SCHEMA.md "/injections"): text, kind, item, eps /
// ms, the requested stage / layer / window (null: any), fired, count, firings (the first
// kMaxFirings; firings_truncated when count is larger).
std::string InjectionRecordJson(const Injection& inj, const InjectionRecord& rec);

// kInvalidArgument naming every injection of `inj` whose record shows it never fired (after a run
// of `windows` verify windows that stopped for `stop_reason`); Ok when all fired.
Status CheckInjectionsFired(const std::vector<Injection>& inj,
                            const std::vector<InjectionRecord>& records, int windows,
                            const std::string& stop_reason);

}  // namespace lockstep
