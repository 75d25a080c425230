// Building observer views from a live engine (see observer.h for the contract).
#pragma once

#include "lockstep/engine/engine.h"
#include "lockstep/engine/observer.h"

namespace lockstep {

// Calls observer.OnCheckpointBegin / OnState (every item of every stage session) /
// OnCheckpointEnd for `info`. `logits` f32 [T, V] is the last verify's output (post_verify only;
// may be null otherwise). Spec items and hidden_out/logits are emitted at post_verify only.
void EmitCheckpoint(Engine& engine, Observer& observer, const CheckpointInfo& info,
                    const float* logits);

}  // namespace lockstep
