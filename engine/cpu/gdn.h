// Gated DeltaNet (MODEL.md 3.6-3.7), CPU.
//
// Two forms of the same recurrence:
//   recurrent (verify windows, decode): one step per token, per-step states into GdnState
//     scratch; each step's arithmetic is independent of T (batch-invariant).
//   chunked (prefill): the FLA/HF chunk algorithm with chunk size 64, updating the committed
//     checkpoint in place. Algebraically identical; differs by f32 rounding (tests bound it).
#pragma once

#include "cpu/matmul.h"
#include "lockstep/engine/gdn_state.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/weights.h"
#include "util/arena.h"

namespace lockstep::cpu {

enum class GdnMode {
  kPrefill,  // chunked form; checkpoint updated in place, position advanced
  kVerify,   // recurrent form; steps written to scratch, checkpoint untouched until CommitSteps
};

// ---- low-level kernels (exposed for the reference tests) ----

// One recurrent step for one value head (state S f32 [Dk, Dv], updated in place):
//   S <- alpha*S; m = S^T k; delta = beta*(v - m); S += k (x) delta; o = S^T q.
void GatedDeltaStep(float* S, const float* q, const float* k, const float* v, float alpha,
                    float beta, int dk, int dv, float* o);
// The same step from state S_in into S_out (may alias S_in): identical arithmetic, without a
// separate copy of the entering state. `stream`: S_out is written with non-temporal stores where
// it lies on 64-byte boundaries (a state not read again soon: the last step of a window); the
// values are the same either way.
void GatedDeltaStepFrom(const float* S_in, float* S_out, const float* q, const float* k,
                        const float* v, float alpha, float beta, int dk, int dv, float* o,
                        bool stream = false);

// Chunked form over T tokens for one value head: Q, K f32 [T, Dk], V f32 [T, Dv], g (log
// decay, <= 0) and beta f32 [T]; S f32 [Dk, Dv] is the entering state and is replaced by the
// state after token T-1; O f32 [T, Dv].
// The chunk of the prefill form: a prefill chunk's GDN rows run in blocks of this many tokens.
inline constexpr int kGdnPrefillChunk = 64;
void GatedDeltaChunked(float* S, const float* Q, const float* K, const float* V, const float* g,
                       const float* beta, int T, int dk, int dv, float* O,
                       int chunk = kGdnPrefillChunk);

// Causal depthwise conv + SiLU for T rows: `win` f32 [K-1+T, C] holds the K-1 previous inputs
// followed by the T new ones; weight f32 [C, K]; U f32 [T, C]. With a pool the channels split
// over it (each channel's bits are its own).
void CausalConvSilu(const float* win, int T, int C, int K, const float* weight, float* U,
                    ThreadPool* pool = nullptr);

// ---- the layer ----

// The whole mixer for T rows starting at the state's committed position: projections, conv,
// gates, l2 norms, the delta rule (form per `mode`), gated RMSNorm, out_proj.
// a, out f32 [T, H].
void GdnForward(const GdnWeights& w, const ModelConfig& c, const float* a, int T, GdnState& state,
                GdnMode mode, MatmulKind kind, ThreadPool* pool, Arena& arena, float* out);

// One sequence's rows inside a multi-sequence mixer call: rows [row0, row0 + T) of a / out,
// starting at its state's committed position, in its own form.
struct GdnSeq {
  int row0 = 0;
  int T = 0;
  GdnState* state = nullptr;
  GdnMode mode = GdnMode::kVerify;
};

// The same mixer for several sequences sharing the products: in_proj_qkvz / in_proj_ba and
// out_proj are one `kind` product over all n_rows rows (a, out f32 [n_rows, H]); the conv window
// (from each sequence's checkpoint), gates, l2 norms and the recurrence run per sequence on its
// own state (the recurrent steps of all kVerify sequences in one parallel loop). With kInvariant
// products every row gets the bits it gets alone; one sequence is exactly GdnForward.
void GdnForwardSeqs(const GdnWeights& w, const ModelConfig& c, const float* a, int n_rows,
                    const GdnSeq* seqs, int n_seqs, MatmulKind kind, ThreadPool* pool, Arena& arena,
                    float* out);

}  // namespace lockstep::cpu
