// Gated DeltaNet pieces (cpu/gdn.cpp GdnForward's device twins): projection split, causal conv +
// SiLU, q/k l2 norms, the recurrent delta rule (verify windows) and its chunked form (prefill,
// cpu::GatedDeltaChunked's twin, chunk 64).
//
// Determinism: split and conv are pure per-element functions; the l2 norms use the batch-
// invariant warp dot; the recurrence gives each thread one state column for all T steps and runs
// the steps in order, with exactly cpu::GatedDeltaStep's operations for that column (held in
// registers for Dk <= 128, RecurrentHeldKernel; re-read from memory otherwise). The chunked
// form runs one block per value head and the chunks in order; inside a chunk every element of
// every intermediate (Tm, W, Delta, O, the state) is computed by one thread with kernel_math.h's
// sequential sums (index increasing), so the bits depend on the chunk size and the reduced
// lengths only, never on the block size or the grid (the thread map only spreads elements). It
// differs from the CPU's Eigen products in summation order (NRMSE ~1e-7), not in the algorithm.
// No atomics, no order that depends on T or the grid.
#include "cuda/kernel_math.h"
#include "cuda/ops.h"
#include "util/check.h"

namespace lockstep::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = 4;
constexpr int kRecThreads = 128;  // GdnRecurrent block: one thread per value column (Dv = 128)
constexpr int kHeldThreads = km::kWarp;  // GdnRecurrent held-column block: one warp of columns
constexpr int kChunkThreads = 256;       // GdnChunked block
// GdnChunked value columns per block (kAuto): Qwen3-Next's Dv = 128 gives a head 4 blocks, each
// ~0.4 of the one-block chunk's work (phases 1-3 are repeated per block, 4-6 divided).
constexpr int kChunkSlice = 32;
// GdnChunked's dynamic shared memory, (2 C^2 + 5 C) floats, stays within the 48 KiB a launch gets
// without cudaFuncSetAttribute for every chunk C <= kGdnMaxChunk.
static_assert((2 * km::kGdnMaxChunk * km::kGdnMaxChunk + 5 * km::kGdnMaxChunk) * 4 <= 48 * 1024);
static_assert(kGdnPrefillChunk >= 1 && kGdnPrefillChunk <= km::kGdnMaxChunk);

unsigned GridFor(std::int64_t total) {
  const std::int64_t want = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(want < 65535 ? want : 65535);
}

// P f32 [T, qkvz_dim], B f32 [T, 2*Hv] -> win rows [K-1, K-1+T) f32 [.., conv_dim], Z f32
// [T, Hv, Dv], beta, g f32 [T, Hv]. One thread per element of the (qkvz_dim + Hv)-wide virtual row:
// columns < qkvz_dim move one projected value, the last Hv compute beta and g of a value head.
__global__ void __launch_bounds__(kThreads)
    GdnSplitKernel(const float* __restrict__ P, const float* __restrict__ B, int T, int hk, int hv,
                   int dk, int dv, int conv_kernel, const float* __restrict__ a_log,
                   const float* __restrict__ dt_bias, const float* __restrict__ conv_state,
                   float* __restrict__ win, float* __restrict__ Z, float* __restrict__ beta,
                   float* __restrict__ g) {
  const int r = hv / hk;
  const int qkvz = 2 * hk * dk + 2 * hv * dv, conv_dim = 2 * hk * dk + hv * dv;
  const int width = qkvz + hv;
  const std::int64_t rows_total = static_cast<std::int64_t>(T) * width;
  // Past the rows: win rows [0, K-1) = the conv state (a copy, one element per index).
  const std::int64_t total = rows_total + static_cast<std::int64_t>(conv_kernel - 1) * conv_dim;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (idx >= rows_total) {
      win[idx - rows_total] = conv_state[idx - rows_total];
      continue;
    }
    const int t = static_cast<int>(idx / width),
              c = static_cast<int>(idx - static_cast<std::int64_t>(t) * width);
    if (c < qkvz) {
      const float val = P[static_cast<std::size_t>(t) * static_cast<std::size_t>(qkvz) +
                          static_cast<std::size_t>(c)];
      const km::SplitDest d = km::GdnSplitDest(c, hk, dk, dv, r);
      if (d.to_z) {
        Z[static_cast<std::size_t>(t) * static_cast<std::size_t>(hv * dv) +
          static_cast<std::size_t>(d.col)] = val;
      } else {
        win[static_cast<std::size_t>(conv_kernel - 1 + t) * static_cast<std::size_t>(conv_dim) +
            static_cast<std::size_t>(d.col)] = val;
      }
    } else {
      const int j = c - qkvz;
      const float* brow = B + static_cast<std::size_t>(t) * static_cast<std::size_t>(2 * hv);
      const std::size_t th =
          static_cast<std::size_t>(t) * static_cast<std::size_t>(hv) + static_cast<std::size_t>(j);
      beta[th] = km::GdnBeta(brow[km::GdnBaColumn(j, r, false)]);
      g[th] = km::GdnDecay(brow[km::GdnBaColumn(j, r, true)], a_log[j], dt_bias[j]);
    }
  }
}

// win f32 [K-1+T, C], weight f32 [C, K] -> U f32 [T, C]; one thread per output element. With
// steps [T, K-1, C] (verify): the thread of (t, ch) also stores block t's column ch, win rows
// [t+1, t+K) (the conv state after step t; rows its conv reads).
__global__ void __launch_bounds__(kThreads)
    ConvKernel(const float* __restrict__ win, int T, int C, int K, const float* __restrict__ weight,
               float* __restrict__ U, float* __restrict__ steps) {
  const std::int64_t total = static_cast<std::int64_t>(T) * C;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(idx / C),
              ch = static_cast<int>(idx - static_cast<std::int64_t>(t) * C);
    U[idx] = km::ConvSiluAt(win, C, K, weight, t, ch);
    if (steps != nullptr) {
      float* st = steps + static_cast<std::int64_t>(t) * (K - 1) * C + ch;
      for (int j = 0; j < K - 1; ++j)
        st[static_cast<std::int64_t>(j) * C] = win[static_cast<std::int64_t>(t + 1 + j) * C + ch];
    }
  }
}

// GdnSplitKernel and ConvKernel (with steps) in one launch, for verify windows: the conv reads
// its window straight from the conv state (rows u < K-1) and from P (row u - (K-1), the column
// km::GdnSplitSource maps the channel to), so no window is written. One thread per element of
// the virtual row [conv_dim outputs | Hv*Dv Z values | Hv beta / g pairs] of each t; every stored
// value is the two kernels' (the same element functions on the same values).
__global__ void __launch_bounds__(kThreads)
    GdnSplitConvKernel(const float* __restrict__ P, const float* __restrict__ B, int T, int hk,
                       int hv, int dk, int dv, int K, const float* __restrict__ a_log,
                       const float* __restrict__ dt_bias, const float* __restrict__ conv_state,
                       const float* __restrict__ weight, float* __restrict__ U,
                       float* __restrict__ steps, float* __restrict__ Z, float* __restrict__ beta,
                       float* __restrict__ g) {
  const int r = hv / hk;
  const int qkvz = 2 * hk * dk + 2 * hv * dv, C = 2 * hk * dk + hv * dv, nz = hv * dv;
  const int width = C + nz + hv;
  const std::int64_t total = static_cast<std::int64_t>(T) * width;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(idx / width),
              c = static_cast<int>(idx - static_cast<std::int64_t>(t) * width);
    const std::size_t prow = static_cast<std::size_t>(t) * static_cast<std::size_t>(qkvz);
    if (c < C) {
      const int src = km::GdnSplitSource(false, c, hk, dk, dv, r);
      auto at = [&](int u) {
        return u < K - 1
                   ? conv_state[static_cast<std::size_t>(u) * static_cast<std::size_t>(C) +
                                static_cast<std::size_t>(c)]
                   : P[static_cast<std::size_t>(u - (K - 1)) * static_cast<std::size_t>(qkvz) +
                       static_cast<std::size_t>(src)];
      };
      U[static_cast<std::size_t>(t) * static_cast<std::size_t>(C) + static_cast<std::size_t>(c)] =
          km::ConvSiluOf(weight + static_cast<std::size_t>(c) * static_cast<std::size_t>(K), K, t,
                         at);
      float* st = steps + static_cast<std::int64_t>(t) * (K - 1) * C + c;
      for (int j = 0; j < K - 1; ++j) st[static_cast<std::int64_t>(j) * C] = at(t + 1 + j);
    } else if (c < C + nz) {
      const int zc = c - C;
      Z[static_cast<std::size_t>(t) * static_cast<std::size_t>(nz) + static_cast<std::size_t>(zc)] =
          P[prow + static_cast<std::size_t>(km::GdnSplitSource(true, zc, hk, dk, dv, r))];
    } else {
      const int j = c - C - nz;
      const float* brow = B + static_cast<std::size_t>(t) * static_cast<std::size_t>(2 * hv);
      const std::size_t th =
          static_cast<std::size_t>(t) * static_cast<std::size_t>(hv) + static_cast<std::size_t>(j);
      beta[th] = km::GdnBeta(brow[km::GdnBaColumn(j, r, false)]);
      g[th] = km::GdnDecay(brow[km::GdnBaColumn(j, r, true)], a_log[j], dt_bias[j]);
    }
  }
}

// U f32 [T, conv_dim] -> qh, kh f32 [T, Hk, Dk]; one warp per (t, key head, q or k).
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    QkNormKernel(const float* __restrict__ U, int T, int hk, int dk, int conv_dim,
                 float* __restrict__ qh, float* __restrict__ kh, bool vec) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int item =
      static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / km::kWarp;
  if (item >= 2 * T * hk) return;
  const int is_k = item % 2, tg = item / 2;  // tg = t * Hk + gi
  const int t = tg / hk, gi = tg - t * hk;
  const float* x = U + static_cast<std::size_t>(t) * static_cast<std::size_t>(conv_dim) +
                   static_cast<std::size_t>(is_k * hk * dk + gi * dk);
  float* out = (is_k ? kh : qh) + static_cast<std::size_t>(tg) * static_cast<std::size_t>(dk);
  float ss;
  km::WarpDotRows<1>(&x, x, dk, vec, lane, &ss);
  const float r = km::L2Inv(ss, 1e-6f);
  const float qscale = km::GdnQScale(dk);
  for (int i = lane; i < dk; i += km::kWarp) {
    const float y = km::L2NormElem(x[i], r);
    out[i] = is_k ? y : y * qscale;
  }
}

// One block per value head j; thread c owns columns c, c + kRecThreads, ... of S[j] for all T
// steps. Per step, q and k of the key head are broadcast through shared memory (dynamic:
// 2 * Dk floats); the entering state is read from `prev` and the new one written to `cur`
// (verify: distinct step slots; prefill: both S0, in place).
__global__ void __launch_bounds__(kRecThreads)
    RecurrentKernel(float* S0, float* steps, const float* __restrict__ qh,
                    const float* __restrict__ kh, const float* __restrict__ U,
                    const float* __restrict__ g, const float* __restrict__ beta, int T, int hk,
                    int hv, int dk, int dv, int conv_dim, float* __restrict__ O) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* ks = smem + dk;
  const int tid = static_cast<int>(threadIdx.x);
  const int j = static_cast<int>(blockIdx.x), gi = j / (hv / hk);
  const std::size_t s_head = static_cast<std::size_t>(dk) * static_cast<std::size_t>(dv);
  const std::size_t s_all = static_cast<std::size_t>(hv) * s_head;
  const std::size_t v_col = static_cast<std::size_t>(2 * hk * dk) +
                            static_cast<std::size_t>(j) * static_cast<std::size_t>(dv);
  for (int t = 0; t < T; ++t) {
    const std::size_t tg = (static_cast<std::size_t>(t) * static_cast<std::size_t>(hk) +
                            static_cast<std::size_t>(gi)) *
                           static_cast<std::size_t>(dk);
    for (int i = tid; i < dk; i += kRecThreads) {
      qs[i] = qh[tg + static_cast<std::size_t>(i)];
      ks[i] = kh[tg + static_cast<std::size_t>(i)];
    }
    __syncthreads();
    const std::size_t th =
        static_cast<std::size_t>(t) * static_cast<std::size_t>(hv) + static_cast<std::size_t>(j);
    const float alpha = km::GdnAlpha(g[th]), b = beta[th];
    const float* prev;
    float* cur;
    if (steps != nullptr) {
      prev = (t == 0 ? S0 : steps + static_cast<std::size_t>(t - 1) * s_all) +
             static_cast<std::size_t>(j) * s_head;
      cur = steps + static_cast<std::size_t>(t) * s_all + static_cast<std::size_t>(j) * s_head;
    } else {
      prev = S0 + static_cast<std::size_t>(j) * s_head;
      cur = S0 + static_cast<std::size_t>(j) * s_head;
    }
    const float* vrow =
        U + static_cast<std::size_t>(t) * static_cast<std::size_t>(conv_dim) + v_col;
    for (int c = tid; c < dv; c += kRecThreads)
      O[th * static_cast<std::size_t>(dv) + static_cast<std::size_t>(c)] =
          km::DeltaColumnStep(prev + c, cur + c, dv, qs, ks, vrow[c], alpha, b, dk);
    __syncthreads();  // q / k of the next step overwrite the shared arrays
  }
}

// The held-column form of RecurrentKernel for Dk in kGdnHeldDk (ops.h): thread x of block
// (j, y) owns column y * kHeldThreads + x of S[j] and keeps it in kDk registers for all T steps,
// so the state is read once per launch (RecurrentKernel reads it twice per step: a verify window
// of T steps moved (2T + T) column loads and stores, now 1 + T) and stored once per step
// (verify) or once after the last step (prefill, in place). One-warp blocks spread a head's
// columns over Dv / 32 blocks (the generic kernel runs one block per head: 32 blocks on a
// 132-SM device for Qwen3-Next's 32 value heads). Each column's operations are
// DeltaColumnStep's (DeltaColumnStepHeld), so the bits are RecurrentKernel's.
//
// qh == nullptr: q and k come straight from the conv output U (columns gi * Dk and key_dim +
// gi * Dk of row t) and the block normalises them per step exactly as QkNormKernel does (the
// block is one warp: the same warp dot, the same element ops), so a verify window needs no
// GdnQkNorm launch; every block of the key head repeats those 2 Dk-element norms.
template <int kDk>
__global__ void __launch_bounds__(kHeldThreads)
    RecurrentHeldKernel(float* S0, float* steps, const float* __restrict__ qh,
                        const float* __restrict__ kh, const float* __restrict__ U,
                        const float* __restrict__ g, const float* __restrict__ beta, int T, int hk,
                        int hv, int dv, int conv_dim, float* __restrict__ O, bool vec_norm) {
  __shared__ float qs[kDk];
  __shared__ float ks[kDk];
  const int tid = static_cast<int>(threadIdx.x);
  const int j = static_cast<int>(blockIdx.x), gi = j / (hv / hk);
  const int c = static_cast<int>(blockIdx.y) * kHeldThreads + tid;
  const bool live = c < dv;
  const std::size_t s_head = static_cast<std::size_t>(kDk) * static_cast<std::size_t>(dv);
  const std::size_t s_all = static_cast<std::size_t>(hv) * s_head;
  const std::size_t at = static_cast<std::size_t>(j) * s_head + static_cast<std::size_t>(c);
  const std::size_t v_col = static_cast<std::size_t>(2 * hk * kDk) +
                            static_cast<std::size_t>(j) * static_cast<std::size_t>(dv) +
                            static_cast<std::size_t>(c);
  float col[kDk];
  if (live) {
    LOCKSTEP_UNROLL
    for (int kk = 0; kk < kDk; ++kk)
      col[kk] = S0[at + static_cast<std::size_t>(kk) * static_cast<std::size_t>(dv)];
  }
  for (int t = 0; t < T; ++t) {
    const std::size_t tg = (static_cast<std::size_t>(t) * static_cast<std::size_t>(hk) +
                            static_cast<std::size_t>(gi)) *
                           static_cast<std::size_t>(kDk);
    if (qh != nullptr) {
      for (int i = tid; i < kDk; i += kHeldThreads) {
        qs[i] = qh[tg + static_cast<std::size_t>(i)];
        ks[i] = kh[tg + static_cast<std::size_t>(i)];
      }
    } else {
      const float* urow = U + static_cast<std::size_t>(t) * static_cast<std::size_t>(conv_dim) +
                          static_cast<std::size_t>(gi) * static_cast<std::size_t>(kDk);
      for (int is_k = 0; is_k < 2; ++is_k) {
        const float* xr = urow + static_cast<std::size_t>(is_k * hk * kDk);
        float ss;
        km::WarpDotRows<1>(&xr, xr, kDk, vec_norm, tid, &ss);
        const float r = km::L2Inv(ss, 1e-6f);
        const float qscale = km::GdnQScale(kDk);
        float* dst = is_k ? ks : qs;
        for (int i = tid; i < kDk; i += kHeldThreads) {
          const float y = km::L2NormElem(xr[i], r);
          dst[i] = is_k ? y : y * qscale;
        }
      }
    }
    __syncthreads();
    if (live) {
      const std::size_t th =
          static_cast<std::size_t>(t) * static_cast<std::size_t>(hv) + static_cast<std::size_t>(j);
      float* cur = steps != nullptr ? steps + static_cast<std::size_t>(t) * s_all + at : nullptr;
      const float v = U[static_cast<std::size_t>(t) * static_cast<std::size_t>(conv_dim) + v_col];
      O[th * static_cast<std::size_t>(dv) + static_cast<std::size_t>(c)] =
          km::DeltaColumnStepHeld<kDk>(col, cur, dv, qs, ks, v, km::GdnAlpha(g[th]), beta[th]);
    }
    __syncthreads();  // q / k of the next step overwrite the shared arrays
  }
  if (steps == nullptr && live) {
    LOCKSTEP_UNROLL
    for (int kk = 0; kk < kDk; ++kk)
      S0[at + static_cast<std::size_t>(kk) * static_cast<std::size_t>(dv)] = col[kk];
  }
}

template <int kDk>
void LaunchHeld(float* S0, float* steps, const float* qh, const float* kh, const float* U,
                const float* g, const float* beta, int T, int hk, int hv, int dv, int conv_dim,
                float* O, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(hv),
                  static_cast<unsigned>((dv + kHeldThreads - 1) / kHeldThreads));
  const bool vec_norm =
      conv_dim % 4 == 0 && km::Aligned(U, 16);  // GdnQkNorm's rule (Dk % 4 == 0 here)
  RecurrentHeldKernel<kDk><<<grid, kHeldThreads, 0, s>>>(S0, steps, qh, kh, U, g, beta, T, hk, hv,
                                                         dv, conv_dim, O, vec_norm);
}

// The chunked form (MODEL.md 3.7, cpu::GatedDeltaChunked): one block per value head j, its
// chunks of C rows in order (the state is the only thing carried between chunks). Per chunk of
// n rows, phases separated by __syncthreads (each output element is one thread's, computed with
// the sequential sums of kernel_math.h's "gdn chunked" section; the element -> thread map only
// spreads the work):
//   1. gam = running sum of g (thread 0, in order); Gamma, beta*Gamma, exp(gam_last - gam);
//      X = -A (strictly lower, <k_i, k_m> dots) and Tm's unit diagonal.
//   2. forward substitution, row i = 1 .. n-1 after row i-1 (the CPU's recurrence).
//   3. W = Tm diag(beta Gamma) K -> scratch; QKm = (Q K^T) .* D over X (no longer needed).
//   4. Delta = Tm diag(beta) V - W S0 -> scratch.
//   5. O = diag(Gamma) Q S0 + QKm Delta.
//   6. S0 <- Gamma_last S0 + (K .* exp(gam_last - gam))^T Delta, in place.
// Block (j, y) owns value columns [y * slice, (y + 1) * slice) of head j in phases 4-6 (they
// read and write those columns only); phases 1-3 do not involve the columns, and every block of
// the head computes them, with the same bits.
// Shared (dynamic): X and Tm [C, C] (row stride C), gam, beta*Gamma, Gamma, exp(gam_last - gam)
// and beta [C]. Scratch of block (j, y): W [C, Dk] then Delta [C, Dv] (columns of the slice).
__global__ void __launch_bounds__(kChunkThreads)
    ChunkedKernel(float* __restrict__ S0, const float* __restrict__ qh,
                  const float* __restrict__ kh, const float* __restrict__ U,
                  const float* __restrict__ g, const float* __restrict__ beta, int T, int hk,
                  int hv, int dk, int dv, int conv_dim, int chunk, int slice,
                  float* __restrict__ scratch, float* __restrict__ O) {
  extern __shared__ float smem[];
  const int C = chunk;
  float* X = smem;        // -A, then the masked Q K^T
  float* Tm = X + C * C;  // (I + A)^-1
  float* gam = Tm + C * C;
  float* bgam = gam + C;  // beta * Gamma
  float* gmm = bgam + C;  // Gamma = exp(gam)
  float* kdec = gmm + C;  // exp(gam_last - gam)
  float* bet = kdec + C;  // beta
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  const int j = static_cast<int>(blockIdx.x), gi = j / (hv / hk);
  const std::ptrdiff_t ldk = static_cast<std::ptrdiff_t>(hk) * dk;  // row stride of qh / kh
  const std::ptrdiff_t ldv = conv_dim, lds = dv;
  float* S = S0 + static_cast<std::size_t>(j) * static_cast<std::size_t>(dk) *
                      static_cast<std::size_t>(dv);
  const int c_lo = static_cast<int>(blockIdx.y) * slice;
  const int ns = dv - c_lo < slice ? dv - c_lo : slice;  // columns of this block
  const std::size_t blk = static_cast<std::size_t>(j) * gridDim.y + blockIdx.y;
  float* W = scratch + blk * static_cast<std::size_t>(C) * static_cast<std::size_t>(dk + dv);
  float* Dl = W + static_cast<std::size_t>(C) * static_cast<std::size_t>(dk);
  for (int c0 = 0; c0 < T; c0 += C) {
    const int n = T - c0 < C ? T - c0 : C;
    const float* Kc =
        kh + static_cast<std::ptrdiff_t>(c0) * ldk + static_cast<std::ptrdiff_t>(gi) * dk;
    const float* Qc =
        qh + static_cast<std::ptrdiff_t>(c0) * ldk + static_cast<std::ptrdiff_t>(gi) * dk;
    const float* Vc =
        U + static_cast<std::ptrdiff_t>(c0) * ldv + 2 * ldk + static_cast<std::ptrdiff_t>(j) * dv;
    const float* gc = g + static_cast<std::ptrdiff_t>(c0) * hv + j;  // row i at gc[i * hv]
    const float* bc = beta + static_cast<std::ptrdiff_t>(c0) * hv + j;
    // 1. decays, -A, unit diagonal.
    if (tid == 0) {
      float acc = 0.0f;
      for (int i = 0; i < n; ++i) gam[i] = (acc = acc + gc[static_cast<std::ptrdiff_t>(i) * hv]);
    }
    __syncthreads();
    for (int i = tid; i < n; i += nt) {
      const float b = bc[static_cast<std::ptrdiff_t>(i) * hv], G = ::expf(gam[i]);
      bet[i] = b;
      gmm[i] = G;
      bgam[i] = b * G;
      kdec[i] = ::expf(gam[n - 1] - gam[i]);
      Tm[i * C + i] = 1.0f;
    }
    for (int e = tid; e < n * n; e += nt) {
      const int i = e / n, m = e - i * n;
      if (m < i)
        X[i * C + m] = km::GdnChunkNegA(bc[static_cast<std::ptrdiff_t>(i) * hv], gam[i], gam[m],
                                        km::GdnChunkDot(Kc + i * ldk, 1, Kc + m * ldk, 1, dk));
    }
    __syncthreads();
    // 2. Tm rows below the diagonal, in order.
    for (int i = 1; i < n; ++i) {
      for (int m = tid; m < i; m += nt) Tm[i * C + m] = km::GdnChunkTmEntry(X + i * C, Tm, C, i, m);
      __syncthreads();
    }
    // 3. W, masked Q K^T.
    for (int e = tid; e < n * dk; e += nt) {
      const int i = e / dk, kk = e - i * dk;
      W[e] = km::GdnChunkTriApply(Tm + i * C, Kc + kk, ldk, bgam, i);
    }
    for (int e = tid; e < n * n; e += nt) {
      const int i = e / n, m = e - i * n;
      if (m <= i)
        X[i * C + m] = km::GdnChunkMaskedQk(km::GdnChunkDot(Qc + i * ldk, 1, Kc + m * ldk, 1, dk),
                                            gam[i], gam[m]);
    }
    __syncthreads();
    // 4. Delta = U - W S0.
    for (int e = tid; e < n * ns; e += nt) {
      const int i = e / ns, c = c_lo + (e - i * ns);
      const float u = km::GdnChunkTriApply(Tm + i * C, Vc + c, ldv, bet, i);
      Dl[i * dv + c] =
          km::GdnChunkDelta(u, W + static_cast<std::ptrdiff_t>(i) * dk, S + c, lds, dk);
    }
    __syncthreads();
    // 5. Outputs of the chunk's rows.
    for (int e = tid; e < n * ns; e += nt) {
      const int i = e / ns, c = c_lo + (e - i * ns);
      O[(static_cast<std::size_t>(c0 + i) * static_cast<std::size_t>(hv) +
         static_cast<std::size_t>(j)) *
            static_cast<std::size_t>(dv) +
        static_cast<std::size_t>(c)] =
          km::GdnChunkOut(Qc + i * ldk, gmm[i], S + c, lds, dk, X + i * C, Dl + c, lds, i);
    }
    __syncthreads();  // every read of S0 is done
    // 6. The state after the chunk's last row.
    for (int e = tid; e < dk * ns; e += nt) {
      const int kk = e / ns, c = c_lo + (e - kk * ns);
      float& s_kc = S[kk * dv + c];
      s_kc = km::GdnChunkState(s_kc, gmm[n - 1], Kc + kk, ldk, kdec, Dl + c, lds, n);
    }
    __syncthreads();  // the next chunk reads S and overwrites the shared arrays and scratch
  }
}

}  // namespace

void GdnSplit(const float* P, const float* B, int T, int n_k_heads, int n_v_heads, int k_head_dim,
              int v_head_dim, int conv_kernel, const float* a_log, const float* dt_bias,
              const float* conv_state, float* win, float* Z, float* beta, float* g,
              cudaStream_t s) {
  if (T <= 0 || n_k_heads <= 0 || n_v_heads <= 0) return;
  const std::int64_t width = 2 * static_cast<std::int64_t>(n_k_heads) * k_head_dim +
                             2 * static_cast<std::int64_t>(n_v_heads) * v_head_dim + n_v_heads;
  const std::int64_t conv_dim = 2 * static_cast<std::int64_t>(n_k_heads) * k_head_dim +
                                static_cast<std::int64_t>(n_v_heads) * v_head_dim;
  GdnSplitKernel<<<GridFor(T * width + (conv_kernel - 1) * conv_dim), kThreads, 0, s>>>(
      P, B, T, n_k_heads, n_v_heads, k_head_dim, v_head_dim, conv_kernel, a_log, dt_bias,
      conv_state, win, Z, beta, g);
}

void GdnSplitConv(const float* P, const float* B, int T, int n_k_heads, int n_v_heads,
                  int k_head_dim, int v_head_dim, int conv_kernel, const float* a_log,
                  const float* dt_bias, const float* conv_state, const float* weight, float* U,
                  float* steps, float* Z, float* beta, float* g, cudaStream_t s) {
  if (T <= 0 || n_k_heads <= 0 || n_v_heads <= 0 || conv_kernel <= 0) return;
  const std::int64_t width = 2 * static_cast<std::int64_t>(n_k_heads) * k_head_dim +
                             2 * static_cast<std::int64_t>(n_v_heads) * v_head_dim + n_v_heads;
  GdnSplitConvKernel<<<GridFor(T * width), kThreads, 0, s>>>(
      P, B, T, n_k_heads, n_v_heads, k_head_dim, v_head_dim, conv_kernel, a_log, dt_bias,
      conv_state, weight, U, steps, Z, beta, g);
}

void CausalConvSilu(const float* win, int T, int C, int K, const float* weight, float* U,
                    cudaStream_t s, float* steps) {
  if (T <= 0 || C <= 0) return;
  if (K <= 1) steps = nullptr;  // no state rows
  ConvKernel<<<GridFor(static_cast<std::int64_t>(T) * C), kThreads, 0, s>>>(win, T, C, K, weight, U,
                                                                            steps);
}

void GdnQkNorm(const float* U, int T, int n_k_heads, int k_head_dim, int conv_dim, float* qh,
               float* kh, cudaStream_t s) {
  if (T <= 0 || n_k_heads <= 0 || k_head_dim <= 0) return;
  const int items = 2 * T * n_k_heads;
  const bool vec = k_head_dim % 4 == 0 && conv_dim % 4 == 0 && km::Aligned(U, 16);
  QkNormKernel<<<static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock),
                 kWarpsPerBlock * km::kWarp, 0, s>>>(U, T, n_k_heads, k_head_dim, conv_dim, qh, kh,
                                                     vec);
}

void GdnRecurrent(float* S0, float* steps, const float* qh, const float* kh, const float* U,
                  const float* g, const float* beta, int T, int n_k_heads, int n_v_heads,
                  int k_head_dim, int v_head_dim, int conv_dim, float* O, cudaStream_t s,
                  GdnBlocks blocks) {
  if (T <= 0 || n_v_heads <= 0) return;
  if (blocks == GdnBlocks::kAuto && GdnRecurrentHoldsColumns(k_head_dim)) {
    const int hk = n_k_heads, hv = n_v_heads, dv = v_head_dim;
    switch (k_head_dim) {
      case 16:
        return LaunchHeld<16>(S0, steps, qh, kh, U, g, beta, T, hk, hv, dv, conv_dim, O, s);
      case 32:
        return LaunchHeld<32>(S0, steps, qh, kh, U, g, beta, T, hk, hv, dv, conv_dim, O, s);
      case 64:
        return LaunchHeld<64>(S0, steps, qh, kh, U, g, beta, T, hk, hv, dv, conv_dim, O, s);
      default:
        return LaunchHeld<128>(S0, steps, qh, kh, U, g, beta, T, hk, hv, dv, conv_dim, O, s);
    }
  }
  LOCKSTEP_CHECK(qh != nullptr && kh != nullptr)
      << "GdnRecurrent: q / k from U need the held form (Dk 16-128)";
  const std::size_t smem = 2 * static_cast<std::size_t>(k_head_dim) * sizeof(float);
  RecurrentKernel<<<static_cast<unsigned>(n_v_heads), kRecThreads, smem, s>>>(
      S0, steps, qh, kh, U, g, beta, T, n_k_heads, n_v_heads, k_head_dim, v_head_dim, conv_dim, O);
}

bool GdnRecurrentHoldsColumns(int k_head_dim) {
  return k_head_dim == 16 || k_head_dim == 32 || k_head_dim == 64 || k_head_dim == 128;
}

int GdnChunkedSlices(int v_head_dim, GdnBlocks blocks) {
  if (blocks == GdnBlocks::kOnePerHead || v_head_dim <= kChunkSlice) return 1;
  return (v_head_dim + kChunkSlice - 1) / kChunkSlice;
}

std::size_t GdnChunkedScratchFloats(int n_v_heads, int k_head_dim, int v_head_dim, int chunk,
                                    GdnBlocks blocks) {
  return static_cast<std::size_t>(n_v_heads) *
         static_cast<std::size_t>(GdnChunkedSlices(v_head_dim, blocks)) *
         static_cast<std::size_t>(chunk) *
         (static_cast<std::size_t>(k_head_dim) + static_cast<std::size_t>(v_head_dim));
}

void GdnChunked(float* S0, const float* qh, const float* kh, const float* U, const float* g,
                const float* beta, int T, int n_k_heads, int n_v_heads, int k_head_dim,
                int v_head_dim, int conv_dim, int chunk, float* scratch, float* O, cudaStream_t s,
                GdnBlocks blocks) {
  if (T <= 0 || n_v_heads <= 0) return;
  const std::size_t smem = (2 * static_cast<std::size_t>(chunk) * static_cast<std::size_t>(chunk) +
                            5 * static_cast<std::size_t>(chunk)) *
                           sizeof(float);
  const int slices = GdnChunkedSlices(v_head_dim, blocks);
  const int slice = (v_head_dim + slices - 1) / slices;
  const dim3 grid(static_cast<unsigned>(n_v_heads), static_cast<unsigned>(slices));
  ChunkedKernel<<<grid, kChunkThreads, smem, s>>>(S0, qh, kh, U, g, beta, T, n_k_heads, n_v_heads,
                                                  k_head_dim, v_head_dim, conv_dim, chunk, slice,
                                                  scratch, O);
}

}  // namespace lockstep::cuda
