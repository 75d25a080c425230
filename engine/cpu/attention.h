// Gated full attention over the paged K/V cache (MODEL.md 3.5), CPU.
//
// Determinism: each (query row, head) result is computed by one thread with a fixed order over
// cached positions (scores via Dot(), softmax max/exp/sum in increasing position, the value sum
// in increasing position), so it is independent of T and of the thread count: the same kernel
// serves prefill chunks and verify windows.
#pragma once

#include "cpu/matmul.h"
#include "cpu/rope.h"
#include "lockstep/engine/kv_cache.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/weights.h"
#include "util/arena.h"

namespace lockstep::cpu {

// One query head group against cache rows [0, n_ctx): q f32 [G, D] (G query heads sharing kv
// head `kv_head`), o f32 [G, D]. `scores` scratch f32 [G, n_ctx], `tmp` f32 [2, D].
void AttendGroup(const float* q, int n_group, int kv_head, const KvCache& cache, int n_ctx,
                 float scale, float* o, float* scores, float* tmp);

// The whole mixer for T rows at positions p..p+T-1: q/gate/k/v projections, q/k RMSNorm,
// partial RoPE, K/V rows written to `cache` at [p, p+T) (speculative until committed), causal
// attention (row t sees positions <= p+t), sigmoid output gate, o_proj. a, out f32 [T, H].
void AttentionForward(const AttentionWeights& w, const ModelConfig& c, const Rope& rope,
                      const float* a, int T, int p, KvCache& cache, MatmulKind kind,
                      ThreadPool* pool, Arena& arena, float* out);

}  // namespace lockstep::cpu
