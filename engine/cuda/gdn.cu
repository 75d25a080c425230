// Gated DeltaNet pieces (cpu/gdn.cpp GdnForward's device twins): projection split, causal conv +
// SiLU, q/k l2 norms and the recurrent delta rule.
//
// Determinism: split and conv are pure per-element functions; the l2 norms use the batch-
// invariant warp dot; the recurrence gives each thread one state column for all T steps and runs
// the steps in order, with exactly cpu::GatedDeltaStep's operations for that column. No atomics,
// no order that depends on T or the grid.
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = 4;
constexpr int kRecThreads = 128;  // GdnRecurrent block: one thread per value column (Dv = 128)

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
                   const float* __restrict__ dt_bias, float* __restrict__ win,
                   float* __restrict__ Z, float* __restrict__ beta, float* __restrict__ g) {
  const int r = hv / hk;
  const int qkvz = 2 * hk * dk + 2 * hv * dv, conv_dim = 2 * hk * dk + hv * dv;
  const int width = qkvz + hv;
  const std::int64_t total = static_cast<std::int64_t>(T) * width;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
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

// win f32 [K-1+T, C], weight f32 [C, K] -> U f32 [T, C]; one thread per output element.
__global__ void __launch_bounds__(kThreads)
    ConvKernel(const float* __restrict__ win, int T, int C, int K, const float* __restrict__ weight,
               float* __restrict__ U) {
  const std::int64_t total = static_cast<std::int64_t>(T) * C;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(idx / C),
              ch = static_cast<int>(idx - static_cast<std::int64_t>(t) * C);
    U[idx] = km::ConvSiluAt(win, C, K, weight, t, ch);
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

}  // namespace

void GdnSplit(const float* P, const float* B, int T, int n_k_heads, int n_v_heads, int k_head_dim,
              int v_head_dim, int conv_kernel, const float* a_log, const float* dt_bias, float* win,
              float* Z, float* beta, float* g, cudaStream_t s) {
  if (T <= 0 || n_k_heads <= 0 || n_v_heads <= 0) return;
  const std::int64_t width = 2 * static_cast<std::int64_t>(n_k_heads) * k_head_dim +
                             2 * static_cast<std::int64_t>(n_v_heads) * v_head_dim + n_v_heads;
  GdnSplitKernel<<<GridFor(T * width), kThreads, 0, s>>>(P, B, T, n_k_heads, n_v_heads, k_head_dim,
                                                         v_head_dim, conv_kernel, a_log, dt_bias,
                                                         win, Z, beta, g);
}

void CausalConvSilu(const float* win, int T, int C, int K, const float* weight, float* U,
                    cudaStream_t s) {
  if (T <= 0 || C <= 0) return;
  ConvKernel<<<GridFor(static_cast<std::int64_t>(T) * C), kThreads, 0, s>>>(win, T, C, K, weight,
                                                                            U);
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
                  int k_head_dim, int v_head_dim, int conv_dim, float* O, cudaStream_t s) {
  if (T <= 0 || n_v_heads <= 0) return;
  const std::size_t smem = 2 * static_cast<std::size_t>(k_head_dim) * sizeof(float);
  RecurrentKernel<<<static_cast<unsigned>(n_v_heads), kRecThreads, smem, s>>>(
      S0, steps, qh, kh, U, g, beta, T, n_k_heads, n_v_heads, k_head_dim, v_head_dim, conv_dim, O);
}

}  // namespace lockstep::cuda
