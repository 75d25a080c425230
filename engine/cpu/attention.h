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

// One sequence's rows inside a multi-sequence mixer call: rows [row0, row0 + T) of a / out, at
// positions p..p+T-1, with its own K/V cache.
struct AttnSeq {
  int row0 = 0;
  int T = 0;
  int p = 0;
  KvCache* cache = nullptr;
};

// The whole mixer for T rows at positions p..p+T-1: q/gate/k/v projections, q/k RMSNorm,
// partial RoPE, K/V rows written to `cache` at [p, p+T) (speculative until committed), causal
// attention (row t sees positions <= p+t), sigmoid output gate, o_proj. a, out f32 [T, H].
void AttentionForward(const AttentionWeights& w, const ModelConfig& c, const Rope& rope,
                      const float* a, int T, int p, KvCache& cache, MatmulKind kind,
                      ThreadPool* pool, Arena& arena, float* out);

// The same mixer for several sequences sharing the products: each projection is one `kind`
// product over all n_rows rows (a, out f32 [n_rows, H]); q/k norms, RoPE, the cache write and
// attention run per sequence at its own positions against its own cache (all sequences' items
// in one parallel loop). With kInvariant products every row gets the bits it gets alone; one
// sequence {0, T, p, &cache} is exactly AttentionForward.
void AttentionForwardSeqs(const AttentionWeights& w, const ModelConfig& c, const Rope& rope,
                          const float* a, int n_rows, const AttnSeq* seqs, int n_seqs,
                          MatmulKind kind, ThreadPool* pool, Arena& arena, float* out);

}  // namespace lockstep::cpu
