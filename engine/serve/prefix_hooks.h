// The prefix cache's two calls from the scheduler (engine/serve/scheduler.cpp hook points):
// admission (look up, restore the slot and the MTP drafter, resume prefill at the snapshot) and
// capture after a prefill chunk (snapshot the slot when the chunk ends on the grid).
//
// Only a fresh request (prefill from position 0) looks up and captures: a continuation's state
// holds rows computed by verify windows, which a cold prefill of the same tokens would not
// reproduce bitwise.
#pragma once

#include "decode/sequence.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/prefix_cache.h"
#include "lockstep/engine/scheduler.h"

namespace lockstep {

// On admission, slot seq.slot() open and untouched, before the first prefill chunk: on a hit
// the slot takes the entry's snapshot (Engine::OpenSlotFrom, keeping the slot's injections),
// the drafter its MTP state, and prefill resumes at the snapshot position. Fills `report`
// (reused_tokens, snapshot_position; prefill_computed = 0: the scheduler adds each chunk it
// runs). Then trims
// the cache (slots that ended may have left pages to entries only). Errors: a snapshot that
// does not fit the engine (the slot is closed: the request fails).
Status PrefixAdmit(PrefixCache& cache, Engine& engine, Sequence& seq, PrefixReport* report);
// After a prefill chunk of `seq` ending at `chunk_end` (its slot committed): stores the slot's
// state when the cache wants that position (prefix_cache.h Wants).
Status PrefixCapture(PrefixCache& cache, Engine& engine, const Sequence& seq, int chunk_end);

}  // namespace lockstep
