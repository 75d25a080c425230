// Sparse MoE block with the sigmoid-gated shared expert (MODEL.md 3.8), and the dense SwiGLU.
//
// Fixed order (documented choice; HF and vLLM differ from each other here): router softmax in
// f32 over all experts (max, exp, sum in increasing expert id), top-k by descending
// probability with the lower expert id first on ties, renormalised when norm_topk_prob; the
// token's output is sum over ranks r = 0..k-1 of w_r * expert_r(x), accumulated in rank order in
// f32, then + sigmoid(x . w_sg) * shared(x). Each token's result depends only on its own row
// (experts batch the rows routed to them; kInvariant products make that exact).
#pragma once

#include "cpu/matmul.h"
#include "lockstep/engine/expert_cache.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/weights.h"
#include "util/arena.h"

namespace lockstep::cpu {

// Top-k routing of one token from router logits f32 [E]: idx [k] (descending probability, lower
// id first on ties), weights [k] (renormalised when `norm`).
void RouteToken(const float* logits, int n_experts, int k, bool norm, int* idx, float* weights);

// SwiGLU: out = (silu(x G^T) * (x U^T)) D^T for T rows. x f32 [T, H], out f32 [T, H].
void FfnForward(const FfnWeights& f, const float* x, int T, MatmulKind kind, ThreadPool* pool,
                Arena& arena, float* out);

// The MoE block for T rows. `cache` may be null; `cache_layer` is the stage-local MoE index.
void MoeForward(const MoeWeights& w, const ModelConfig& c, const float* x, int T, MatmulKind kind,
                ThreadPool* pool, Arena& arena, ExpertCache* cache, int cache_layer, float* out);

// One sequence's rows inside a multi-sequence MoE call: rows [row0, row0 + T), counted in its own
// expert cache (may be null).
struct MoeSeq {
  int row0 = 0;
  int T = 0;
  ExpertCache* cache = nullptr;
};

// The MoE block over n_rows rows of several sequences (x, out f32 [n_rows, H]): routing, the
// routed experts (each active expert once over every row routed to it) and the shared expert
// run over all rows together. With kInvariant each output is one fixed-lane Dot whatever rows
// share a product, so every row gets the bits it gets alone. Each sequence's cache records what
// it records alone: per expert its own routed rows (hits / misses / host tokens) and, for a
// miss, the expert's bytes once per (expert, sequence). One sequence {0, T, cache} is exactly
// MoeForward.
void MoeForwardSeqs(const MoeWeights& w, const ModelConfig& c, const float* x, int n_rows,
                    const MoeSeq* seqs, int n_seqs, MatmulKind kind, ThreadPool* pool, Arena& arena,
                    int cache_layer, float* out);

}  // namespace lockstep::cpu
