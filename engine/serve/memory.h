// Memory reservations of the serving scheduler (issue 22, "Admission and memory").
//
// A request is admitted only while its reservation fits --memory-mib minus the reservations of
// the requests holding slots, so no allocation fails mid-step. The reservation is an upper bound
// of what the request's slot can grow to:
//   K/V      every full-attention layer's K and V for `rows` positions, rounded up to pages
//            (int8: with the per-row-per-head scales)
//   MTP K/V  the MTP layer's draft K/V for `rows` positions (with MTP)
//   GDN      every linear-attention layer's conv + ssm state, x (1 + max_T): the checkpoint and
//            one per-step state per verify row
//   scratch  host buffers of one step for this request: logits f32 [max_T, V], normed and a
//            few activations f32 [max(max_T, prefill_chunk), H] x 16
#pragma once

#include <cstdint>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/model_config.h"

namespace lockstep {

struct Reservation {
  std::uint64_t kv = 0, mtp_kv = 0, gdn = 0, scratch = 0;
  std::uint64_t total() const { return kv + mtp_kv + gdn + scratch; }
};

// `rows`: positions the request can reach (prompt + max_new); `max_T`: its largest verify window.
Reservation ReserveRequest(const EngineConfig& cfg, const ModelConfig& mc, bool mtp, int rows,
                           int max_T);
// --memory-mib in bytes; 0 = unlimited.
std::uint64_t MemoryLimitBytes(const EngineConfig& cfg);

}  // namespace lockstep
