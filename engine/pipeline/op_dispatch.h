// OpDispatch: the engine's OpSink (op_table.h). For one forward call (an engine step, a final norm
// or lm_head, an MTP step) it knows which rows belong to which request: it applies the requests'
// `perturb-op` injections to the rows they name, digests every row of a request whose observer
// wants op records and hands each OpRecord to that observer. Engine-internal; one driver thread.
#pragma once

#include <vector>

#include "lockstep/engine/inject.h"
#include "lockstep/engine/observer.h"
#include "lockstep/engine/op_table.h"

namespace lockstep {

class OpDispatch final : public OpSink {
 public:
  struct Group {
    int window = -1;  // the request's verify window; -1 prefill
    int p = 0;        // position of the group's first row
    int row0 = 0, T = 0;
    Observer* obs = nullptr;  // null: no records for this group
    std::vector<const Injection*> inj;
    std::vector<InjectionRecord*> records;  // parallel to inj
  };
  // The groups of the next call (only those with an observer or an injection).
  void Begin(std::vector<Group> groups) { groups_ = std::move(groups); }
  bool active() const { return !groups_.empty(); }
  void End() { groups_.clear(); }

  void OnOp(const OpRows& rows) override;
  void OnStateRead(const OpStateRead& read) override;

 private:
  std::vector<Group> groups_;
};

// Moves x's bits by `ulps` as an integer (the perturbation of `perturb-op`).
float AddUlps(float x, int ulps);

}  // namespace lockstep
