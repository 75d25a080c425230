// CUDA ops: the device twins of engine/cpu/*. Each launcher enqueues work on `s` and returns at
// once; nothing here synchronises, allocates or copies to the host. All pointers are device
// pointers (or host-mapped pinned pointers where said). Shapes are outermost-first.
//
// Determinism (every op): no atomics, no data-dependent launch shapes, and every reduction runs
// in a fixed order that depends only on the reduced length, never on T, on the number of rows in
// the launch or on the grid. So each row's result is bitwise independent of how many rows are
// computed together (batch invariance, DESIGN "deterministic mode") and identical run to run on
// the same GPU model and binary.
//
// The arithmetic of each op lives in kernel_math.h as __host__ __device__ functions, so CI (no
// GPU) runs the very same expressions on the host against the CPU ops (cuda_kernel_math_test).
//
// Files mirror engine/cpu: matmul.cu, norm.cu, rope.cu, attention.cu, gdn.cu, moe.cu,
// elementwise.cu, kv.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lockstep::cuda {

// A sequence position as kernels read it: `base`, plus the int at `dev` (device memory, read when
// the kernel runs) when `dev` is set. The engine keeps the step's position in device memory so a
// captured CUDA graph, whose kernel arguments are fixed at capture, replays at each new position.
// An int converts implicitly (a position fixed at launch).
struct Pos {
  int base = 0;
  const int* dev = nullptr;
  Pos(int b) : base(b) {}  // NOLINT(google-explicit-constructor): an int is a fixed position
  Pos(int b, const int* d) : base(b), dev(d) {}
  __host__ __device__ int Get() const {
    return dev != nullptr ? base + *dev : base;
  }  // device: kernels only
};

// ---- matmul.cu ----

// Batch-invariant product for decode / verify windows: y[t, o] = x[t, :] . W[o, :] for t < T,
// o < n_out. x f32 [T, n_in] (row stride n_in), W f32 [n_out, n_in] row-major, y f32 [T, ldy].
// One warp per output row o: the weight row is read once per 16 rows of x (once for any verify
// window of T <= 16); each (t, o) sum uses
// the fixed lane layout of kernel_math.h (lane l accumulates elements i with (i / 4) % 32 == l in
// increasing i, then a fixed xor-butterfly), whatever T is. T >= 1, any n_in >= 1.
void RowsMatmul(const float* x, int T, const float* W, int n_out, int n_in, float* y, int ldy,
                cudaStream_t s);
// The same with W as bf16 bits [n_out, n_in]: every weight widened exactly to f32 and the same
// operations in the same order, so for bf16-valued weights the result is bitwise the f32 call's.
void RowsMatmul(const float* x, int T, const std::uint16_t* W, int n_out, int n_in, float* y,
                int ldy, cudaStream_t s);
// Up to three RowsMatmul products of the same x in one launch (decode issues ~25 launches a
// layer; fewer launches, the same bits): product i is y_i[t, o] = x[t, :] . W_i[o, :] for
// o < n_out_i, into y_i [T, ldy_i], computed exactly as RowsMatmul computes it. 1 <= n <= 3.
template <typename WT>
struct RowsProduct {
  const WT* W = nullptr;
  int n_out = 0;
  float* y = nullptr;
  int ldy = 0;
  // When set (same shape as W): a SwiGLU pair, y = silu(x . W^T) * (x . W_up^T), bitwise the two
  // products then SiluMul (the warp of row o runs both dots, then the element op).
  const WT* W_up = nullptr;
};
void RowsMatmulMulti(const float* x, int T, int n_in, const RowsProduct<float>* p, int n,
                     cudaStream_t s);
void RowsMatmulMulti(const float* x, int T, int n_in, const RowsProduct<std::uint16_t>* p, int n,
                     cudaStream_t s);
// dst[i] = src[i] as f32 (bf16 bits widened, exact), n elements: a bf16 weight matrix becomes the
// f32 operand of a cuBLAS GEMM (prefill).
void WidenBf16(const std::uint16_t* src, std::int64_t n, float* dst, cudaStream_t s);

// ---- norm.cu ----

// Zero-centred RMSNorm per row: y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * (1 + w). x row r at
// x + r*ldx, y row r at y + r*ldy (may alias x when ldx == ldy). w f32 [n].
void RmsNormZc(const float* x, int ldx, int rows, int n, const float* w, float eps, float* y,
               int ldy, cudaStream_t s);
// The residual add and the next norm in one launch: hid[r] += add[r], then y[r] = RmsNormZc(hid[r])
// (bitwise AddInPlace followed by RmsNormZc). hid, add, y f32 [rows, n] contiguous; w f32 [n].
void AddRmsNormZc(float* hid, const float* add, int rows, int n, const float* w, float eps,
                  float* y, cudaStream_t s);
// Gated RMSNorm per row (GDN output): y = x * rsqrt(mean(x^2) + eps) * w * silu(z). x, z, y f32
// [rows, n] contiguous; w f32 [n] (plain weight).
void GatedRmsNorm(const float* x, const float* z, int rows, int n, const float* w, float eps,
                  float* y, cudaStream_t s);

// ---- rope.cu ----

// Partial NeoX RoPE in place: x f32 [T, n_heads, head_dim] with row stride ld (floats between
// rows t and t+1; heads contiguous, head_dim apart); row t is at position p0 + t. inv_freq f32
// [rotary_dim/2] (computed on the host exactly as cpu::Rope does).
void RopeApply(float* x, int T, int ld, int n_heads, int head_dim, int rotary_dim,
               const float* inv_freq, Pos p0, cudaStream_t s);

// ---- attention.cu ----

// Splits q_proj's output qg f32 [T, Hq, 2, D] (per head: D query then D gate) into
// q f32 [T, Hq, D] and gate f32 [T, Hq, D].
void SplitQGate(const float* qg, int T, int n_heads, int head_dim, float* q, float* gate,
                cudaStream_t s);

// Causal attention of T query rows at positions p..p+T-1 over the K/V cache (row t sees cache
// rows [0, p+t]). q f32 [T, Hq, D]; cache rows of `kv_dtype` (0 f32, 1 bf16 as uint16, 2 int8)
// laid out k/v [rows, Hkv, D], scales f32 [rows, Hkv] (int8 only, else nullptr). Query head h
// uses kv head h / (Hq/Hkv). Softmax with max subtraction, f64 sum of exp, f32 normaliser, as
// cpu::AttendGroup. n_ctx_max >= p + T sizes the launch (which does not depend on p, so p may be
// a device-read position).
// split > 0: a row whose context is longer than `split` positions is attended in blocks of
// `split` positions and combined (split-context decode; attention.cu); rows up to `split` keep
// the single-block order, bitwise. split <= 0: every row in one block.
// scratch: f32 device scratch of scratch_floats floats, 16-byte aligned; the rows run in as many
// launches as it needs (a row's bits do not depend on that). AttentionScratchFloats gives the
// size that runs all T rows at once within a fixed budget (64 MiB); 0 means none is needed.
// o f32 [T, Hq, D]; gated when gate.g is set: o[t, h, i] = attn * sigmoid(gate.g[(t * Hq + h) *
// gate.ld + i]), bitwise Attention then MulSigmoid (the gated layer's output gate, applied as the
// rows are stored; qg's gate half is gate.g = qg + D, gate.ld = 2 * D).
// heads: query heads per block. kOne: one (t, head) per block. kGrouped: up to 8 heads of one kv
// head per block, which loads each K / V element once for all of them (the one-head layout reads
// it once per head). The bits are the same either way; kAuto groups when rows are split (long
// contexts, where those reads are the cost) and keeps one head per block otherwise.
enum class AttnHeads { kAuto, kOne, kGrouped };
struct AttnGate {
  const float* g = nullptr;  // nullptr: o is not gated
  int ld = 0;                // floats between the gates of (t, h) and (t, h + 1)
};
void Attention(const float* q, int T, Pos p, int n_heads, int n_heads_kv, int head_dim,
               int kv_dtype, const void* k_cache, const void* v_cache, const float* k_scales,
               const float* v_scales, float scale, int n_ctx_max, int split, float* scratch,
               std::size_t scratch_floats, float* o, cudaStream_t s,
               AttnHeads heads = AttnHeads::kAuto, AttnGate gate = {});
// Query heads per block that Attention launches with (1, 2, 4 or 8; 1 when head_dim % 4 != 0).
int AttentionHeadsPerBlock(int n_heads, int n_heads_kv, int head_dim, int n_ctx_max, int split,
                           AttnHeads heads);
// Context splits per (row, head) of a launch (1: no split) and the scratch Attention wants.
int AttentionSplits(int n_ctx_max, int split);
std::size_t AttentionScratchFloats(int T, int n_heads, int head_dim, int n_ctx_max, int split);

// ---- kv.cu ----

// Stores T rows [row0, row0+T) of f32 k, v [T, Hkv, D] into the cache arrays (layout as in
// Attention), quantising per (row, head) exactly like KvCache::StoreRow (bf16 round-to-nearest-
// even with quiet NaN; int8 symmetric scale = max|x| / 127, codes = nearbyint(x / scale)).
void KvStore(const float* k, const float* v, int T, Pos row0, int n_heads_kv, int head_dim,
             int kv_dtype, void* k_cache, void* v_cache, float* k_scales, float* v_scales,
             cudaStream_t s);
// The attention layer's inputs in one launch, bitwise SplitQGate, RmsNormZc of q and k per head
// (q_norm, k_norm f32 [D]), RopeApply of both and KvStore: qg f32 [T, Hq, 2, D] (q_proj's output,
// per head D query then D gate; the gate stays there for Attention's AttnGate) -> q f32 [T, Hq, D]
// normed and rotated; k f32 [T, Hkv, D] normed, rotated and v f32 [T, Hkv, D] stored at cache rows
// [row0, row0 + T) as KvStore stores them. One warp per (row, head) of q, of K and of V.
void AttnPrep(const float* qg, const float* k, const float* v, int T, Pos row0, int n_heads,
              int n_heads_kv, int head_dim, int rotary_dim, const float* inv_freq,
              const float* q_norm, const float* k_norm, float eps, int kv_dtype, void* k_cache,
              void* v_cache, float* k_scales, float* v_scales, float* q, cudaStream_t s);
// Multiplies rows [row0, row0+n) of K (which == 0) or V (1) by `factor` (f32 exact, bf16
// re-rounded, int8 through the scales): KvCache::ScaleRows on the device (fault injection).
void KvScaleRows(int which, int row0, int n, int n_heads_kv, int head_dim, int kv_dtype,
                 void* k_cache, void* v_cache, float* k_scales, float* v_scales, float factor,
                 cudaStream_t s);

// ---- gdn.cu ----

// De-interleaves the GDN projections of T rows (as cpu::GdnForward): P f32 [T, qkvz_dim] grouped
// per key head [q Dk | k Dk | v r*Dv | z r*Dv], B f32 [T, 2*Hv] grouped per key head [b r | a r].
// Writes win f32 [K-1+T, conv_dim]: rows [0, K-1) = conv_state f32 [K-1, conv_dim] (copied), rows
// [K-1, K-1+T) = q | k | v of every head; Z f32 [T, Hv, Dv], beta = sigmoid(b) f32 [T, Hv] and
// g = -exp(a_log) * softplus(a + dt_bias) f32 [T, Hv].
void GdnSplit(const float* P, const float* B, int T, int n_k_heads, int n_v_heads, int k_head_dim,
              int v_head_dim, int conv_kernel, const float* a_log, const float* dt_bias,
              const float* conv_state, float* win, float* Z, float* beta, float* g, cudaStream_t s);
// Causal depthwise conv + SiLU: win f32 [K-1+T, C], weight f32 [C, K] -> U f32 [T, C].
// steps (may be null): the conv state after each of the T steps, f32 [T, K-1, C], block t = win
// rows [t+1, t+K), copied by the threads that read those rows for the conv. The engine runs split
// and conv as GdnSplitConv in verify windows; this form serves prefill (which needs the window
// for the next conv state) and is GdnSplitConv's reference in the tests.
void CausalConvSilu(const float* win, int T, int C, int K, const float* weight, float* U,
                    cudaStream_t s, float* steps = nullptr);
// Verify windows: GdnSplit and CausalConvSilu (with steps) in one launch, bitwise the two: U f32
// [T, conv_dim], steps f32 [T, K-1, conv_dim], Z, beta and g as they write them. The window is
// read from conv_state and P in place (not written); conv_state is left alone.
void GdnSplitConv(const float* P, const float* B, int T, int n_k_heads, int n_v_heads,
                  int k_head_dim, int v_head_dim, int conv_kernel, const float* a_log,
                  const float* dt_bias, const float* conv_state, const float* weight, float* U,
                  float* steps, float* Z, float* beta, float* g, cudaStream_t s);
// From U f32 [T, conv_dim]: l2-normalised q (then scaled by 1/sqrt(Dk)) and k per key head,
// qh, kh f32 [T, Hk, Dk] (eps 1e-6 inside the sqrt, as cpu::L2NormInPlace).
void GdnQkNorm(const float* U, int T, int n_k_heads, int k_head_dim, int conv_dim, float* qh,
               float* kh, cudaStream_t s);
// The gated delta rule, recurrent form, T steps for every value head (head j uses key head
// j / (Hv/Hk)); each step is cpu::GatedDeltaStep with alpha = exp(g). v of head j is read from U
// at column 2*key_dim + j*Dv. S0 f32 [Hv, Dk, Dv] is the entering state.
//   steps != nullptr (verify): the state after step t goes to steps + t*Hv*Dk*Dv; S0 untouched.
//   steps == nullptr (prefill): S0 is updated in place to the state after the last step.
// O f32 [T, Hv, Dv].
// blocks: kAuto, where GdnRecurrentHoldsColumns(Dk), keeps each state column in registers for
// the whole window (one-warp blocks, Dv / 32 per head) and reads the state once per launch;
// kOnePerHead (any Dk, kAuto's form elsewhere) runs one block per value head and reads the state
// twice per step. The bits are the same either way.
enum class GdnBlocks { kAuto, kOnePerHead };
void GdnRecurrent(float* S0, float* steps, const float* qh, const float* kh, const float* U,
                  const float* g, const float* beta, int T, int n_k_heads, int n_v_heads,
                  int k_head_dim, int v_head_dim, int conv_dim, float* O, cudaStream_t s,
                  GdnBlocks blocks = GdnBlocks::kAuto);
// qh == kh == nullptr (kAuto with GdnRecurrentHoldsColumns(Dk) only): q and k are taken from U's
// columns [0, key_dim) and [key_dim, 2 key_dim) and l2-normalised inside, bitwise GdnQkNorm's qh
// / kh, so a verify window skips that launch.
// Whether GdnRecurrent's kAuto holds the state columns in registers: Dk in {16, 32, 64, 128}.
bool GdnRecurrentHoldsColumns(int k_head_dim);
// The same T steps in the chunked form (cpu::GatedDeltaChunked, MODEL.md 3.7), for prefill: S0,
// qh, kh, U, g, beta and O as GdnRecurrent's prefill form (S0 updated in place to the state after
// the last row). Rows are taken in chunks of `chunk` (1 <= chunk <= 64; the last one may be
// shorter); each block runs its head's chunks in order. Any Dk, Dv. The value columns of a head
// are independent (Delta, O and the state column c read column c only), so kAuto gives a head
// GdnChunkedSlices(Dv) blocks of up to 32 columns each, every block computing the chunk's
// column-free terms (decays, Tm, W, the masked Q K^T) itself; kOnePerHead runs one block per head.
// The bits are the same either way (each element is one thread's, in the same order).
// scratch: device f32 [GdnChunkedScratchFloats(...)], per block W [chunk, Dk] and Delta
// [chunk, Dv]; its contents on entry are ignored. Equal to the recurrent form up to f32 rounding;
// deterministic run to run.
inline constexpr int kGdnPrefillChunk = 64;  // the chunk of the prefill (as cpu::GatedDeltaChunked)
int GdnChunkedSlices(int v_head_dim, GdnBlocks blocks = GdnBlocks::kAuto);
std::size_t GdnChunkedScratchFloats(int n_v_heads, int k_head_dim, int v_head_dim, int chunk,
                                    GdnBlocks blocks = GdnBlocks::kAuto);
void GdnChunked(float* S0, const float* qh, const float* kh, const float* U, const float* g,
                const float* beta, int T, int n_k_heads, int n_v_heads, int k_head_dim,
                int v_head_dim, int conv_dim, int chunk, float* scratch, float* O, cudaStream_t s,
                GdnBlocks blocks = GdnBlocks::kAuto);

// ---- moe.cu ----

// Router top-k per token (cpu::RouteToken): softmax over E logits, k passes of argmax with the
// lower id winning ties, optional renormalisation. logits f32 [T, E] -> idx int32 [T, k],
// wts f32 [T, k]. E <= 4096. idx_host (may be null): host-mapped pinned int32 [T, k] that gets the
// same ids, written by the kernel over PCIe (the expert counters read them after a sync; no copy).
void RouteTopK(const float* logits, int T, int n_experts, int k, bool norm, int* idx, float* wts,
               int* idx_host, cudaStream_t s);
// Expert-major grouping of the T*k (token, rank) slots, in the order cpu::MoeForward uses
// (experts ascending; within an expert, t then r ascending). Writes slot_of int32 [T*k]
// (value t*k + r), first int32 [E+1] (slots of expert e: [first[e], first[e+1])), active int32
// [T*k] (the distinct experts in ascending order; entries past n_active are -1) and
// n_active int32 [1]. One block; no atomics.
void GroupByExpert(const int* idx, int T, int k, int n_experts, int* slot_of, int* first,
                   int* active, int* n_active, cudaStream_t s);
// RouteTopK then GroupByExpert, the same numbers (for finite logits). Where RouteAndGroupFused
// (T <= 16, E <= 512: decode steps and verify windows of every preset and of Qwen3-Next) one
// launch: one block, a warp routes each token, then the block groups the slots. Otherwise the two
// launches (one routing block per token).
bool RouteAndGroupFused(int T, int n_experts, int k);
void RouteAndGroup(const float* logits, int T, int n_experts, int k, bool norm, int* idx,
                   float* wts, int* idx_host, int* slot_of, int* first, int* active, int* n_active,
                   cudaStream_t s);
// Routed experts, gate/up + SwiGLU: for every active expert a < max_active (blocks past n_active
// exit) and each of its slots i: act[slot i] = silu(x[t] . Wg[e][o]) * (x[t] . Wu[e][o]) for
// o < I, with t = slot_of[i] / k. gate_w, up_w: device arrays [E] of pointers to [I, H] weights,
// f32, or bf16 bits when `bf16` (device or host-mapped pinned memory: non-resident experts are
// read over PCIe). Each dot uses RowsMatmul's fixed order. act f32 [T*k, I], indexed by slot
// position (expert-major).
void ExpertGateUp(const float* x, int H, int I, int k, const int* slot_of, const int* first,
                  const int* active, const int* n_active, int max_active, const void* const* gate_w,
                  const void* const* up_w, bool bf16, float* act, cudaStream_t s);
// A dense product riding along ExpertDown's launch (the shared expert's down projection):
// y f32 [T, H] = act f32 [T, I] . w^T, w [H, I] of the experts' dtype, computed exactly as
// RowsMatmul computes it (one more column of blocks). w == nullptr: none.
struct DenseDown {
  const float* act = nullptr;
  int T = 0;
  int I = 0;
  const void* w = nullptr;
  float* y = nullptr;
};
// Routed experts, down projection: ranked[slot_of[i]] = act[i] . Wd[e] rows, f32 [T*k, H] by
// (t*k + r). down_w: [E] pointers to [H, I] weights (f32, or bf16 bits when `bf16`). dense: a
// product of the same launch, bitwise RowsMatmul(dense.act, dense.T, dense.w, H, dense.I,
// dense.y, H).
void ExpertDown(const float* act, int H, int I, const int* slot_of, const int* first,
                const int* active, const int* n_active, int max_active, const void* const* down_w,
                bool bf16, float* ranked, cudaStream_t s, DenseDown dense = {});
// out[t] = sum over r in rank order of wts[t, r] * ranked[t, r] (f32, starting from 0).
void MoeCombine(const float* ranked, const float* wts, int T, int k, int H, float* out,
                cudaStream_t s);
// Shared expert gate: out[t] += sigmoid(x[t] . gate_w) * sh[t]; x, sh, out f32 [T, H].
void SharedGateAdd(const float* x, const float* gate_w, const float* sh, int T, int H, float* out,
                   cudaStream_t s);
// The end of an MoE layer in one launch (one block per row): MoeCombine, then SharedGateAdd with
// x / gate_w / sh (skipped when sh is null), then hid += the result (AddInPlace), then, when
// norm_w is not null, y = RmsNormZc(hid) with weight norm_w (the next layer's input norm). Bitwise
// those launches in that order. hid, x, sh, y f32 [T, H]; norm_w, gate_w f32 [H].
void MoeEpilogue(const float* ranked, const float* wts, int T, int k, int H, const float* x,
                 const float* gate_w, const float* sh, float* hid, const float* norm_w, float eps,
                 float* y, cudaStream_t s);

// ---- elementwise.cu ----

// out[t] = embed[tokens[t]] (rows of H floats). Token ids were validated on the host.
void EmbedRows(const float* embed, const int* tokens, int T, int H, float* out, cudaStream_t s);
void AddInPlace(float* x, const float* y, std::int64_t n, cudaStream_t s);     // x += y
void SiluMul(float* g, const float* u, std::int64_t n, cudaStream_t s);        // g = silu(g) * u
void MulSigmoid(float* x, const float* gate, std::int64_t n, cudaStream_t s);  // x *= sigmoid(gate)
void Scale(float* x, std::int64_t n, float factor, cudaStream_t s);            // x *= factor
void SetInt(int* dst, int value, cudaStream_t s);  // *dst = value (one thread)

}  // namespace lockstep::cuda
