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

// One part of a multi-part MoE call: rows x f32 [T, H] of n_seqs sequences computed with `kind`,
// into out f32 [T, H].
struct MoePart {
  const float* x = nullptr;
  int T = 0;
  const MoeSeq* seqs = nullptr;
  int n_seqs = 0;
  MatmulKind kind = MatmulKind::kInvariant;
  float* out = nullptr;
  int row0 = 0;  // the part's first row in the step (op reports, op_report.h)
};

// Several parts in one call (a step's verify rows, kInvariant, and a prefill chunk, kGemm): every
// part's outputs and expert-cache records are bitwise what MoeForwardSeqs gives that part alone
// (its own router product, routing, per-expert products over its own rows, shared expert and
// combine); only the order of the work changes: each active expert is one work item running the
// expert over every part's rows routed to it, back to back, so its weights are read from memory
// once for all parts. One part is exactly MoeForwardSeqs.
// `work` (may be null) receives the routed experts' work: distinct active experts (each read
// once) and (row, rank) slots over all parts.
struct MoeWork {
  int experts = 0;
  int slots = 0;
};
void MoeForwardParts(const MoeWeights& w, const ModelConfig& c, const MoePart* parts, int n_parts,
                     ThreadPool* pool, Arena& arena, int cache_layer, MoeWork* work = nullptr);

}  // namespace lockstep::cpu
