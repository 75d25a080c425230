// The arithmetic of every CUDA kernel (engine/cuda/*.cu), as inline functions that compile for
// the host and the device. The kernels call these bodies and nothing else for their floating-point
// work, so tests/engine/cuda_kernel_math_test.cpp (plain g++, no GPU) runs the very same sequence
// of IEEE operations on the host, looping over lanes and threads in the kernels' order, and
// compares it with engine/cpu.
//
// Rules that keep host and device on the same bits:
//   * no fused multiply-add: the .cu files build with --fmad=false, the host with
//     -ffp-contract=off; every expression below is written as the separate roundings it means.
//   * only IEEE-exact operations (+ - * / sqrtf, comparisons) decide a result bit for bit on both
//     sides; ::expf, ::log1pf, ::sinf, ::cosf are the C library on the host and CUDA's (<= 2 ulp)
//     on the device, so device results differ from the host in those, and only in those.
//   * only the C math functions (::expf, ::sqrtf, ::fabsf, ::nearbyintf, ...), which both
//     compilers provide; no std:: math (not callable from device code without
//     --expt-relaxed-constexpr) and no std::bit_cast (FloatBits / BitsFloat instead).
//   * sqrtf and / are IEEE-rounded on the device too (nvcc's default -prec-sqrt=true,
//     -prec-div=true; never build these files with --use_fast_math).
//
// The section at the end (only under nvcc) holds the warp-level device helpers that several .cu
// files share: the butterfly combine and the batch-invariant multi-row dot product.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOCKSTEP_HD __host__ __device__
#else
#define LOCKSTEP_HD
#endif
// Unrolls the next loop in device code (so a register array stays in registers); nothing on the
// host, whose compilers do not know the pragma.
#if defined(__CUDA_ARCH__)
#define LOCKSTEP_UNROLL _Pragma("unroll")
#else
#define LOCKSTEP_UNROLL
#endif

namespace lockstep::cuda::km {

// ---- launch constants that fix reduction orders (changing one changes results' bits) ----

inline constexpr int kWarp = 32;
inline constexpr int kLaneVec = 4;               // elements per lane per chunk (one float4)
inline constexpr int kChunk = kWarp * kLaneVec;  // 128 elements per warp per chunk
inline constexpr int kMaxRowsPerPass = 16;       // RowsMatmul / experts: rows per weight pass
inline constexpr int kAttnThreads = 256;         // attention block (tree width of max / sum)
inline constexpr int kAttnMaxDimsPerThread = 4;  // head_dim <= 4 * kAttnThreads
inline constexpr int kRouteThreads = 256;        // router block (argmax tree width)
inline constexpr int kMaxExperts = 4096;         // RouteTopK limit (E <= 4096)

// ---- bit patterns ----

LOCKSTEP_HD inline std::uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

LOCKSTEP_HD inline float BitsFloat(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// f32 -> bf16, round to nearest even, NaN -> quiet NaN: the same integer steps as
// lockstep::f32_to_bf16 (engine/dtype.cpp), so the stored cache bits match KvCache's.
LOCKSTEP_HD inline std::uint16_t F32ToBf16(float x) {
  const std::uint32_t u = FloatBits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

LOCKSTEP_HD inline float Bf16ToF32(std::uint16_t b) {
  return BitsFloat(static_cast<std::uint32_t>(b) << 16);
}

// A weight element as f32. Weights live on the device as f32, or as bf16 (raw bits) when every
// value of the stage's matrices is a bf16 value (cuda_weights.cpp): widening is exact, so a product
// over bf16 weights runs the very same f32 operations on the very same values as over f32 ones.
LOCKSTEP_HD inline float WeightF32(float w) { return w; }
LOCKSTEP_HD inline float WeightF32(std::uint16_t w) { return Bf16ToF32(w); }
// True when x is a bf16 value (its low 16 bits are zero; NaN and Inf included): then truncating
// to its high half is exact and Bf16ToF32 gives back x's bits.
LOCKSTEP_HD inline bool IsBf16Exact(float x) { return (FloatBits(x) & 0xffffu) == 0; }

// ---- activations (cpu/norm.h) ----

LOCKSTEP_HD inline float Sigmoid(float x) { return 1.0f / (1.0f + ::expf(-x)); }
LOCKSTEP_HD inline float Silu(float x) { return x / (1.0f + ::expf(-x)); }
// PyTorch softplus (beta 1, threshold 20).
LOCKSTEP_HD inline float Softplus(float x) { return x > 20.0f ? x : ::log1pf(::expf(x)); }

// ---- elementwise ops (elementwise.cu, moe.cu) ----

LOCKSTEP_HD inline float AddElem(float x, float y) { return x + y; }
LOCKSTEP_HD inline float SiluMulElem(float g, float u) { return Silu(g) * u; }
LOCKSTEP_HD inline float MulSigmoidElem(float x, float gate) { return x * Sigmoid(gate); }
LOCKSTEP_HD inline float ScaleElem(float x, float factor) { return x * factor; }

// ---- int8 symmetric quantisation (dtype.cpp quantize_int8_row), split so a warp can run it ----

// One step of the |x| max; the comparison is written like the CPU's so a NaN never wins.
LOCKSTEP_HD inline float AbsMaxStep(float amax, float x) {
  const float a = ::fabsf(x);
  return a > amax ? a : amax;
}
// Combining two partial maxima: same comparison (max is exact, so the tree order is irrelevant).
LOCKSTEP_HD inline float AbsMaxCombine(float a, float b) { return b > a ? b : a; }
// The scale KvCache stores: max/127, or 0 for a row whose max/127 is not > 0.
LOCKSTEP_HD inline float Int8Scale(float amax) {
  const float scale = amax / 127.0f;
  return scale > 0.0f ? scale : 0.0f;
}
// Code of one element for a scale from Int8Scale: x / scale (not x * (1/scale)), ties to even,
// clamped so NaN lands on 127 like the CPU.
LOCKSTEP_HD inline std::int8_t Int8Code(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  float c = ::nearbyintf(x / scale);
  c = c <= 127.0f ? c : 127.0f;
  c = c >= -127.0f ? c : -127.0f;
  return static_cast<std::int8_t>(c);
}
LOCKSTEP_HD inline float Int8Dequant(std::int8_t code, float scale) {
  return static_cast<float>(code) * scale;
}

// ---- the batch-invariant dot product ----
//
// Lane l of a warp accumulates the elements i with (i / 4) % 32 == l in increasing i, starting
// from 0 with acc = acc + a*b (one float4 of each operand per 128-element chunk); the 32 partials
// then combine by the xor butterfly with offsets 16, 8, 4, 2, 1 (lane l adds lane l ^ off). Every
// lane ends with the same value. The order depends only on n: never on how many rows share a
// weight pass, on the grid or on T.

LOCKSTEP_HD inline float LaneStep(float acc, float a, float b) { return acc + a * b; }
// Four consecutive elements of one lane, in increasing index (the float4 path).
LOCKSTEP_HD inline float LaneStep4(float acc, float a0, float a1, float a2, float a3, float b0,
                                   float b1, float b2, float b3) {
  acc = acc + a0 * b0;
  acc = acc + a1 * b1;
  acc = acc + a2 * b2;
  acc = acc + a3 * b3;
  return acc;
}
// Partial of `lane` for a . b over n elements (the scalar path; the float4 path performs the same
// LaneStep sequence).
LOCKSTEP_HD inline float LanePartial(const float* a, const float* b, int n, int lane) {
  float acc = 0.0f;
  for (int base = kLaneVec * lane; base < n; base += kChunk) {
    const int m = n - base < kLaneVec ? n - base : kLaneVec;
    for (int c = 0; c < m; ++c) acc = LaneStep(acc, a[base + c], b[base + c]);
  }
  return acc;
}
// R rows x[r] against one weight row w (f32, or bf16 bits widened exactly), lane `lane` (scalar
// path): each row's accumulator sees exactly LanePartial's sequence whatever R is.
template <int R, typename WT = float>
LOCKSTEP_HD inline void LaneAccumRows(const float* const* x, const WT* w, int n, int lane,
                                      float* acc) {
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int base = kLaneVec * lane; base < n; base += kChunk) {
    const int m = n - base < kLaneVec ? n - base : kLaneVec;
    for (int c = 0; c < m; ++c) {
      const float wv = WeightF32(w[base + c]);
      for (int r = 0; r < R; ++r) acc[r] = LaneStep(acc[r], x[r][base + c], wv);
    }
  }
}
// One butterfly step: lane `mine` adds its partner's value.
LOCKSTEP_HD inline float CombineStep(float mine, float other) { return mine + other; }
// Lane `lane`'s result of the shuffle butterfly `v = op(v, shfl_xor(v, off))` for off = 16 .. 1
// over the 32 lane values v[0..31] (overwritten), every step with the kernels' operands in their
// order (own value first): the host form of WarpCombine / WarpAbsMax. Only the lanes the result
// depends on are computed: after the step of `off` those that differ from `lane` in bits below
// off (16 + 8 + 4 + 2 + 1 operations). Their partners lie in the other half of the step's range,
// which the step does not write, so it can update in place.
template <typename Op>
LOCKSTEP_HD inline float ButterflyLane(float* v, int lane, Op op) {
  for (int off = kWarp / 2; off > 0; off >>= 1) {
    const int base = lane & ~(off - 1);
    for (int l = base; l < base + off; ++l) v[l] = op(v[l], v[l ^ off]);
  }
  return v[lane];
}
// The butterfly over 32 lane values (host emulation of the shuffle sequence); returns lane 0's
// result (all lanes hold the same bits: addition is commutative).
LOCKSTEP_HD inline float CombineLanes(float* v) { return ButterflyLane(v, 0, CombineStep); }
// Rows per weight pass when `remaining` rows are left: up to kMaxRowsPerPass, so a verify window
// of T <= 16 rows reads each weight row once. A pass of n rows runs the kernel template of width
// RowPassWidth(n) (1, 2, 4, 8 or 16 >= n); the extra slots repeat the pass's first row and are
// not stored. A row's bits do not depend on the pass it lands in, its width or the padding: every
// slot runs LanePartial's sequence on its own accumulator.
LOCKSTEP_HD inline int RowGroupSize(int remaining) {
  return remaining < kMaxRowsPerPass ? remaining : kMaxRowsPerPass;
}
LOCKSTEP_HD inline int RowPassWidth(int n) {
  return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : n <= 8 ? 8 : 16;
}
// Calls f.template operator()<R>() with R = RowPassWidth(n) as a compile-time width (the kernels
// instantiate one pass template per width).
template <typename F>
LOCKSTEP_HD inline void WithPassWidth(int n, F&& f) {
  switch (RowPassWidth(n)) {
    case 16:
      f.template operator()<16>();
      break;
    case 8:
      f.template operator()<8>();
      break;
    case 4:
      f.template operator()<4>();
      break;
    case 2:
      f.template operator()<2>();
      break;
    default:
      f.template operator()<1>();
      break;
  }
}

// ---- norms (cpu/norm.cpp), given the sum of squares ss from the dot product above ----

LOCKSTEP_HD inline float RmsInv(float ss, int n, float eps) {
  return 1.0f / ::sqrtf(ss / static_cast<float>(n) + eps);
}
LOCKSTEP_HD inline float RmsNormZcElem(float x, float r, float w) { return x * r * (1.0f + w); }
LOCKSTEP_HD inline float GatedRmsNormElem(float x, float r, float w, float z) {
  return x * r * w * Silu(z);
}
LOCKSTEP_HD inline float L2Inv(float ss, float eps) { return 1.0f / ::sqrtf(ss + eps); }
LOCKSTEP_HD inline float L2NormElem(float x, float r) { return x * r; }
// GDN q scale 1/sqrt(Dk), applied after the l2 norm (x * r then * qscale, as the CPU does).
LOCKSTEP_HD inline float GdnQScale(int dk) { return 1.0f / ::sqrtf(static_cast<float>(dk)); }

// ---- RoPE (cpu/rope.cpp), NeoX pairs (i, i + R/2) ----

LOCKSTEP_HD inline float RopeAngle(int pos, float inv_freq) {
  return static_cast<float>(pos) * inv_freq;
}
LOCKSTEP_HD inline void RopeRotate(float a, float b, float cs, float sn, float* ra, float* rb) {
  *ra = a * cs - b * sn;
  *rb = b * cs + a * sn;
}

// ---- attention softmax (cpu/attention.cpp AttendGroup) ----

// std::max(m, x): keeps m unless m < x.
LOCKSTEP_HD inline float MaxStep(float m, float x) { return m < x ? x : m; }
LOCKSTEP_HD inline float SoftmaxExp(float s, float mx) { return ::expf(s - mx); }
LOCKSTEP_HD inline float SoftmaxInv(double sum) { return static_cast<float>(1.0 / sum); }
LOCKSTEP_HD inline float AttnAccum(float acc, float p, float v) { return acc + p * v; }
// Split-context combine. Block j of a long row leaves m_j (its max score), l_j (f64 sum of
// exp(s_u - m_j)) and acc_j[i] (sum of exp(s_u - m_j) v_u[i], increasing u). With M the max of
// the m_j and w_j = exp(m_j - M): L = sum_j l_j w_j in f64 (increasing j), inv = 1 / L, and
// o[i] = sum_j AttnAccum(o[i], w_j * inv, acc_j[i]) in increasing j.
LOCKSTEP_HD inline double AttnRescaledSum(double sum, double l, float w) {
  return sum + l * static_cast<double>(w);
}

// ---- gated DeltaNet (cpu/gdn.cpp) ----

LOCKSTEP_HD inline float GdnBeta(float b) { return Sigmoid(b); }
// g = -exp(A_log) * softplus(a + dt_bias) (log decay, <= 0).
LOCKSTEP_HD inline float GdnDecay(float a, float a_log, float dt_bias) {
  return -::expf(a_log) * Softplus(a + dt_bias);
}
LOCKSTEP_HD inline float GdnAlpha(float g) { return ::expf(g); }

// Where column c of a projected qkvz row goes (layout per key head: [q Dk | k Dk | v r*Dv | z
// r*Dv]): to_z false -> column `col` of the conv window row (q | k | v of every head), true ->
// column `col` of the Z row [Hv*Dv].
struct SplitDest {
  bool to_z;
  int col;
};
LOCKSTEP_HD inline SplitDest GdnSplitDest(int c, int n_k_heads, int dk, int dv, int r) {
  const int wg = 2 * dk + 2 * r * dv, key_dim = n_k_heads * dk;
  const int gi = c / wg, off = c - gi * wg;
  if (off < dk) return {false, gi * dk + off};
  if (off < 2 * dk) return {false, key_dim + gi * dk + (off - dk)};
  if (off < 2 * dk + r * dv) return {false, 2 * key_dim + gi * r * dv + (off - 2 * dk)};
  return {true, gi * r * dv + (off - 2 * dk - r * dv)};
}
// The inverse of GdnSplitDest: the qkvz column that conv channel ch (to_z false) or Z column
// (to_z true) comes from.
LOCKSTEP_HD inline int GdnSplitSource(bool to_z, int col, int n_k_heads, int dk, int dv, int r) {
  const int wg = 2 * dk + 2 * r * dv, key_dim = n_k_heads * dk, rv = r * dv;
  if (to_z) return (col / rv) * wg + 2 * dk + rv + col % rv;
  if (col < key_dim) return (col / dk) * wg + col % dk;
  if (col < 2 * key_dim) return ((col - key_dim) / dk) * wg + dk + (col - key_dim) % dk;
  const int x = col - 2 * key_dim;
  return (x / rv) * wg + 2 * dk + x % rv;
}
// Column of b (is_a false) or a (true) of value head j in a [2*Hv] in_proj_ba row, grouped per
// key head as [b r | a r].
LOCKSTEP_HD inline int GdnBaColumn(int j, int r, bool is_a) {
  const int gi = j / r, i = j - gi * r;
  return gi * 2 * r + (is_a ? r : 0) + i;
}

// Causal depthwise conv of output (t, ch) + SiLU: sum_j weight[ch, j] * win[t + j, ch], j
// ascending. ConvSiluOf takes the channel's weights wc [K] and at(u), window row u's value of the
// channel (GdnSplitConv reads it from the conv state or the projections); ConvSiluAt a window.
template <typename At>
LOCKSTEP_HD inline float ConvSiluOf(const float* wc, int K, int t, At at) {
  float s = 0.0f;
  for (int j = 0; j < K; ++j) s = s + wc[j] * at(t + j);
  return Silu(s);
}
LOCKSTEP_HD inline float ConvSiluAt(const float* win, int C, int K, const float* weight, int t,
                                    int ch) {
  return ConvSiluOf(weight + static_cast<std::ptrdiff_t>(ch) * K, K, t,
                    [&](int u) { return win[static_cast<std::ptrdiff_t>(u) * C + ch]; });
}

// One gated delta step for column j of one value head (cpu::GatedDeltaStep restricted to j; the
// columns are independent): s_prev / s_cur point at S[0][j] of the entering / leaving state with
// row stride ld (they may be the same array: each element is read before it is written).
//   pass 1: m = sum_kk (S[kk][j] * alpha) * k[kk]           (kk ascending)
//   delta = beta * (v - m)
//   pass 2: S'[kk][j] = S[kk][j] * alpha + k[kk] * delta;  o = sum_kk S'[kk][j] * q[kk]
// The decayed value is recomputed in pass 2 rather than stored in pass 1: the same rounding
// (one multiply), one store fewer. Returns o[j].
LOCKSTEP_HD inline float DeltaColumnStep(const float* s_prev, float* s_cur, int ld, const float* q,
                                         const float* k, float v, float alpha, float beta, int dk) {
  float m = 0.0f;
  for (int kk = 0; kk < dk; ++kk) {
    const float s = s_prev[static_cast<std::ptrdiff_t>(kk) * ld] * alpha;
    m = m + s * k[kk];
  }
  const float delta = beta * (v - m);
  float o = 0.0f;
  for (int kk = 0; kk < dk; ++kk) {
    const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(kk) * ld;
    const float s = s_prev[at] * alpha + k[kk] * delta;
    s_cur[at] = s;
    o = o + s * q[kk];
  }
  return o;
}

// DeltaColumnStep with the entering column held in `col` (registers in the device kernel): the
// same operations in the same order, so the same bits; col leaves holding the new column, and it
// is also stored to s_cur (row stride ld) when s_cur != nullptr. Reading the state once per
// window instead of twice per step is the point (GdnRecurrent, gdn.cu).
template <int kDk>
LOCKSTEP_HD inline float DeltaColumnStepHeld(float (&col)[kDk], float* s_cur, int ld,
                                             const float* q, const float* k, float v, float alpha,
                                             float beta) {
  float m = 0.0f;
  LOCKSTEP_UNROLL
  for (int kk = 0; kk < kDk; ++kk) {
    const float s = col[kk] * alpha;
    m = m + s * k[kk];
  }
  const float delta = beta * (v - m);
  float o = 0.0f;
  LOCKSTEP_UNROLL
  for (int kk = 0; kk < kDk; ++kk) {
    const float s = col[kk] * alpha + k[kk] * delta;
    col[kk] = s;
    if (s_cur != nullptr) s_cur[static_cast<std::ptrdiff_t>(kk) * ld] = s;
    o = o + s * q[kk];
  }
  return o;
}

// ---- MoE (cpu/moe.cpp) ----

// Router argmax order: higher probability first, lower expert id on ties; id < 0 is "none".
LOCKSTEP_HD inline bool RouteBetter(float pa, int a, float pb, int b) {
  if (a < 0) return false;
  if (b < 0) return true;
  return pa > pb || (pa == pb && a < b);
}
LOCKSTEP_HD inline float SwiGlu(float g, float u) { return Silu(g) * u; }
// out[t] accumulation over ranks in rank order, from 0.
LOCKSTEP_HD inline float CombineRank(float acc, float w, float y) { return acc + w * y; }
// out += sigmoid(x . gate_w) * sh, with gate = Sigmoid(dot) computed once per row.
LOCKSTEP_HD inline float SharedGateAddElem(float o, float gate, float s) { return o + gate * s; }

}  // namespace lockstep::cuda::km

#if defined(__CUDACC__)
// ---- device-only helpers shared by the .cu files ----
namespace lockstep::cuda::km {

#if defined(LOCKSTEP_CUDA_EMU) && !defined(__CUDA_ARCH__)
// On the CPU emulator (tests/cuda_emu, never a product build) a warp's lanes are fibers that
// switch at every shuffle: the five shuffles of a butterfly were five switches per lane, most of
// CI's emulated time. There the lanes' values are gathered at one warp barrier
// (emu::WarpGather) and each lane runs the butterfly's steps on the host (ButterflyLane: the same
// operations, operands in the same order), bitwise the shuffles
// (EmuWarp.GatheredButterfliesAreBitwiseTheShuffles). The router's butterflies keep the shuffles.
__device__ inline float WarpCombine(float v) {
  float all[kWarp];
  const int lane = emu::WarpGather(&v, 1, all);
  return ButterflyLane(all, lane, CombineStep);
}
__device__ inline float WarpAbsMax(float v) {
  float all[kWarp];
  const int lane = emu::WarpGather(&v, 1, all);
  return ButterflyLane(all, lane, AbsMaxCombine);
}
// out[r] = WarpCombine(acc[r]) for r < R, with one gather for all R.
template <int R>
__device__ inline void WarpCombineRows(const float* acc, float* out) {
  float all[R * kWarp];
  const int lane = emu::WarpGather(acc, R, all);
  for (int r = 0; r < R; ++r) out[r] = ButterflyLane(all + r * kWarp, lane, CombineStep);
}
#else
// The butterfly of CombineLanes on real lanes: every lane returns the same bits.
__device__ inline float WarpCombine(float v) {
  for (int off = kWarp / 2; off > 0; off >>= 1)
    v = CombineStep(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Max over the warp with AbsMaxCombine (exact, any order).
__device__ inline float WarpAbsMax(float v) {
  for (int off = kWarp / 2; off > 0; off >>= 1)
    v = AbsMaxCombine(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// out[r] = WarpCombine(acc[r]) for r < R.
template <int R>
__device__ inline void WarpCombineRows(const float* acc, float* out) {
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = WarpCombine(acc[r]);
}
#endif

// True when p is aligned to `bytes`.
__device__ __host__ inline bool Aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Weight elements [4g, 4g+4) as f32: one float4 load, or one 8-byte load of four bf16 values
// (element 4g in the low half of .x: little-endian), each widened exactly.
__device__ inline float4 LoadWeight4(const float* w, int g) {
  return reinterpret_cast<const float4*>(w)[g];
}
__device__ inline float4 LoadWeight4(const std::uint16_t* w, int g) {
  const uint2 b = reinterpret_cast<const uint2*>(w)[g];
  float4 v;
  v.x = Bf16ToF32(static_cast<std::uint16_t>(b.x & 0xffffu));
  v.y = Bf16ToF32(static_cast<std::uint16_t>(b.x >> 16));
  v.z = Bf16ToF32(static_cast<std::uint16_t>(b.y & 0xffffu));
  v.w = Bf16ToF32(static_cast<std::uint16_t>(b.y >> 16));
  return v;
}
// The byte alignment LoadWeight4 needs.
template <typename WT>
inline constexpr std::size_t kWeightVecAlign = 4 * sizeof(WT);

// out[r] = x[r] . w (n elements) for R rows, all lanes of the calling warp participating; every
// lane returns the results. vec: n % 4 == 0, every x[r] 16-byte aligned and w aligned to
// kWeightVecAlign<WT>, so each lane loads four elements of each operand per chunk; that path runs
// exactly LaneAccumRows' sequence. w (f32, or bf16 bits) is read once for the R rows. Plain loads
// (no __ldg): x may alias the caller's output (norms in place) and w may be host-mapped memory.
template <int R, typename WT = float>
__device__ inline void WarpDotRows(const float* const* x, const WT* w, int n, bool vec, int lane,
                                   float* out) {
  float acc[R];
  if (vec) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    const int n4 = n / kLaneVec;
#pragma unroll 2
    for (int g = lane; g < n4; g += kWarp) {
      const float4 wv = LoadWeight4(w, g);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 xv = reinterpret_cast<const float4*>(x[r])[g];
        acc[r] = LaneStep4(acc[r], xv.x, xv.y, xv.z, xv.w, wv.x, wv.y, wv.z, wv.w);
      }
    }
  } else {
    LaneAccumRows<R, WT>(x, w, n, lane, acc);
  }
  WarpCombineRows<R>(acc, out);
}

// One pass of n <= R rows starting at t0 (slots past n repeat row t0 and are not stored).
// wu (RowsMatmulMulti's SwiGLU pair, warp-uniform): y = silu(x . w) * (x . wu).
template <int R, typename WT>
__device__ inline void RowsPass(const float* x, int n_in, int t0, int n, const WT* w, bool vec,
                                int lane, float* y, int ldy, int o, const WT* wu = nullptr) {
  const float* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    rows[r] = x + static_cast<std::size_t>(t0 + (r < n ? r : 0)) * static_cast<std::size_t>(n_in);
  float out[R];
  WarpDotRows<R, WT>(rows, w, n_in, vec, lane, out);
  if (wu != nullptr) {
    float up[R];
    WarpDotRows<R, WT>(rows, wu, n_in, vec, lane, up);
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = SiluMulElem(out[r], up[r]);
  }
  // Lane r stores row r (every lane holds every result): n stores in parallel, not n from lane 0.
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (lane == r && r < n)
      y[static_cast<std::size_t>(t0 + r) * static_cast<std::size_t>(ldy) +
        static_cast<std::size_t>(o)] = out[r];
}

// Output row o of y[T, ldy] = x[T, n_in] . W^T (w = W's row o; with wu, the SwiGLU pair) for all
// T rows: passes of RowGroupSize rows in order, so a row's bits never depend on T.
template <typename WT>
__device__ inline void RowsAllPasses(const float* x, int T, int n_in, const WT* w, bool vec,
                                     int lane, float* y, int ldy, int o, const WT* wu = nullptr) {
  for (int t0 = 0; t0 < T;) {
    const int n = RowGroupSize(T - t0);
    WithPassWidth(n,
                  [&]<int R>() { RowsPass<R, WT>(x, n_in, t0, n, w, vec, lane, y, ldy, o, wu); });
    t0 += n;
  }
}

}  // namespace lockstep::cuda::km
#endif  // __CUDACC__

// ---- gdn chunked ----
// The chunked form of the gated delta rule (gdn.cu GdnChunked; cpu::GatedDeltaChunked, MODEL.md
// 3.7), one element at a time, for one chunk of n <= C rows of one value head. gam[i] is the
// inclusive running sum of the chunk's log decays (in row order, from 0); Gamma = exp(gam). Each
// sum below runs over its index in increasing order, one add per term, so a result depends only
// on the reduced length (never on the launch). The per-row scalings are the CPU's: a row is
// multiplied by its scale before the product, e.g. (k * (beta * Gamma)). Strides are in floats.
namespace lockstep::cuda::km {

inline constexpr int kGdnMaxChunk = 64;  // GdnChunked: chunk <= 64 (shared memory of 2 C x C tiles)

// sum_{t < n} a[t * sa] * b[t * sb].
LOCKSTEP_HD inline float GdnChunkDot(const float* a, std::ptrdiff_t sa, const float* b,
                                     std::ptrdiff_t sb, int n) {
  float s = 0.0f;
  for (int t = 0; t < n; ++t) s = s + a[t * sa] * b[t * sb];
  return s;
}
// -A[i][m] = -beta_i * exp(gam_i - gam_m) * <k_i, k_m> for m < i (strictly lower), kk = <k_i, k_m>.
LOCKSTEP_HD inline float GdnChunkNegA(float beta_i, float gam_i, float gam_m, float kk) {
  return -beta_i * ::expf(gam_i - gam_m) * kk;
}
// ((Q K^T) .* D)[i][m] = <q_i, k_m> * exp(gam_i - gam_m) for m <= i (0 above the diagonal).
LOCKSTEP_HD inline float GdnChunkMaskedQk(float qk, float gam_i, float gam_m) {
  return qk * ::expf(gam_i - gam_m);
}
// Forward substitution for Tm = (I + A)^-1, entry (i, m) with m < i, rows in increasing order:
// x_row = row i of X = -A, tm = the rows < i of Tm (final; row l at tm + l * ld):
//   Tm[i][m] = X[i][m] + sum_{l = m+1}^{i-1} X[i][l] * Tm[l][m]
// (the CPU's row + row * Tm[:i, :i] without its zero terms: Tm[l][m] = 0 for l <= m there).
LOCKSTEP_HD inline float GdnChunkTmEntry(const float* x_row, const float* tm, int ld, int i,
                                         int m) {
  float s = 0.0f;
  for (int l = m + 1; l < i; ++l) s = s + x_row[l] * tm[static_cast<std::ptrdiff_t>(l) * ld + m];
  return x_row[m] + s;
}
// Row i of Tm diag(scale) X, one column: sum_{m <= i} tm_row[m] * (x[m * ldx] * scale[m]), with
// Tm[i][i] = 1 in tm_row. U = Tm diag(beta) V (scale beta), W = Tm diag(beta Gamma) K (scale
// beta * Gamma).
LOCKSTEP_HD inline float GdnChunkTriApply(const float* tm_row, const float* x, std::ptrdiff_t ldx,
                                          const float* scale, int i) {
  float s = 0.0f;
  for (int m = 0; m <= i; ++m) s = s + tm_row[m] * (x[m * ldx] * scale[m]);
  return s;
}
// Delta[i][c] = U[i][c] - sum_kk W[i][kk] * S0[kk][c]; s_col = &S0[0][c], rows lds apart.
LOCKSTEP_HD inline float GdnChunkDelta(float u, const float* w_row, const float* s_col,
                                       std::ptrdiff_t lds, int dk) {
  return u - GdnChunkDot(w_row, 1, s_col, lds, dk);
}
// O[i][c] = sum_kk (q_i[kk] * Gamma_i) * S0[kk][c] + sum_{m <= i} QKm[i][m] * Delta[m][c]
// (the two sums formed separately, then added).
LOCKSTEP_HD inline float GdnChunkOut(const float* q_row, float gamma_i, const float* s_col,
                                     std::ptrdiff_t lds, int dk, const float* qk_row,
                                     const float* d_col, std::ptrdiff_t ldd, int i) {
  float a = 0.0f;
  for (int kk = 0; kk < dk; ++kk) a = a + (q_row[kk] * gamma_i) * s_col[kk * lds];
  float b = 0.0f;
  for (int m = 0; m <= i; ++m) b = b + qk_row[m] * d_col[m * ldd];
  return a + b;
}
// S_end[kk][c] = S0[kk][c] * Gamma_last + sum_{i < n} (k_i[kk] * kdec[i]) * Delta[i][c], with
// kdec[i] = exp(gam_last - gam_i); k_col = &K[0][kk] (rows ldk apart), d_col = &Delta[0][c].
LOCKSTEP_HD inline float GdnChunkState(float s, float gamma_last, const float* k_col,
                                       std::ptrdiff_t ldk, const float* kdec, const float* d_col,
                                       std::ptrdiff_t ldd, int n) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = acc + (k_col[i * ldk] * kdec[i]) * d_col[i * ldd];
  return s * gamma_last + acc;
}

}  // namespace lockstep::cuda::km
