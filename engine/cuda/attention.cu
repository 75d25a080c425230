// Causal attention over the K/V cache (cpu::AttendGroup's device twin) and the q / gate split.
//
// Attention layout: one block of km::kAttnThreads threads per (query row t, query head h, context
// split j). A row whose context n_ctx = p + t + 1 fits in one split (n_ctx <= split, or no split)
// runs whole in its j = 0 block:
//   1. q goes to shared memory; warp w computes the scores of cache rows u = w, w + 8, ... with the
//      batch-invariant dot (kernel_math.h lane order over D, K dequantised on load), times scale,
//      into shared memory when the split bounds a block's range (split <= kSmemScoresMax), else
//      into the caller's global scratch (split 0: a row's whole context).
//   2. max over the scores: thread i folds rows u = i, i + 256, ... in increasing u, then a fixed
//      shared-memory tree (offsets 128, 64, ..., 1). Max is exact, so this equals the CPU's.
//   3. e_u = exp(s_u - max) written back; the f64 sum of e_u uses the same strided partials and
//      tree (order fixed by n_ctx and kAttnThreads only); inv = float(1 / sum).
//   4. output: thread i owns dims i, i + 256, ... and sums p_u * v_u[i] over u in increasing order
//      from 0 (p_u = e_u * inv staged through shared memory 256 rows at a time): the CPU's order.
// A longer row (split-context, "flash decoding") is cut into ranges [j * split, (j + 1) * split):
// block j runs steps 1-4 over its range only, relative to its own max m_j and with inv = 1 (so
// p_u = e_u exactly), and leaves m_j, l_j (the f64 sum) and acc_j[D] in the partials scratch;
// AttnCombineKernel, one block per (t, h), then rescales and adds them in increasing j
// (km::AttnRescaledSum). One block per head reads the whole context serially, which leaves a
// long-context decode (T * Hq blocks) on a handful of SMs; the splits spread it over
// T * Hq * ceil(n_ctx / split) blocks. Split launches also put the query heads of one kv head
// (up to 8) in one block, which loads each K / V element once for all of them; each head's
// arithmetic is the one-head block's, so the bits do not change (AttnHeads in ops.h).
//
// The position p may be read from device memory when the kernel runs (Pos), so the launch shape
// and the scratch never depend on it: the grid has ceil(n_ctx_max / split) splits per (t, h) and
// the blocks past a row's context return at once. The launcher runs the rows in groups whose
// global scratch (partials, and scores when not in shared memory) fits in kScratchBudgetFloats:
// a row's result does not depend on its group, and a long prefill chunk's scratch stays bounded
// (without the groups, a 2048-row chunk at 130k positions wanted T * Hq * n_ctx floats: 1 GiB
// per query head).
//
// Determinism: every reduction order depends only on n_ctx = p + t + 1, D, the split and the
// constant block size, never on T, the number of heads or the grid; no atomics. So row t's output
// is bitwise independent of how many rows are attended together (the engine's split is
// EngineConfig::cuda_attn_split, fixed for a run).
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kAttnWarps = km::kAttnThreads / km::kWarp;
// Splits up to this many positions keep a block's scores in shared memory (16 KiB).
constexpr int kSmemScoresMax = 4096;
// Global scratch of one launch (16 Mi floats, 64 MiB: one block of the stages' device arena).
constexpr std::size_t kScratchBudgetFloats = std::size_t{16} << 20;

// Element idx of a cache array of dtype KvT (0 f32, 1 bf16, 2 int8 with the (row, head) scale).
template <int KvT>
__device__ inline float LoadKv(const void* base, std::size_t idx, float scale) {
  if constexpr (KvT == 0) {
    return static_cast<const float*>(base)[idx];
  } else if constexpr (KvT == 1) {
    return km::Bf16ToF32(static_cast<const std::uint16_t*>(base)[idx]);
  } else {
    return km::Int8Dequant(static_cast<const std::int8_t*>(base)[idx], scale);
  }
}

// Elements idx..idx+3 (idx % 4 == 0, base aligned to 4 elements) in one load.
template <int KvT>
__device__ inline void LoadKv4(const void* base, std::size_t idx, float scale, float* out) {
  if constexpr (KvT == 0) {
    const float4 v = static_cast<const float4*>(base)[idx / 4];
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else if constexpr (KvT == 1) {
    const uint2 v = static_cast<const uint2*>(base)[idx / 4];  // little-endian: element 0 low half
    out[0] = km::Bf16ToF32(static_cast<std::uint16_t>(v.x & 0xffffu));
    out[1] = km::Bf16ToF32(static_cast<std::uint16_t>(v.x >> 16));
    out[2] = km::Bf16ToF32(static_cast<std::uint16_t>(v.y & 0xffffu));
    out[3] = km::Bf16ToF32(static_cast<std::uint16_t>(v.y >> 16));
  } else {
    const char4 v = static_cast<const char4*>(base)[idx / 4];
    out[0] = km::Int8Dequant(static_cast<std::int8_t>(v.x), scale);
    out[1] = km::Int8Dequant(static_cast<std::int8_t>(v.y), scale);
    out[2] = km::Int8Dequant(static_cast<std::int8_t>(v.z), scale);
    out[3] = km::Int8Dequant(static_cast<std::int8_t>(v.w), scale);
  }
}

// Floats per (t, h, split) partial: acc [D], m at [D], l (f64) in the last two floats (the stride
// is a multiple of 4, so l is 8-byte aligned when the scratch is).
__host__ __device__ inline std::size_t PartialStride(int D) {
  return (static_cast<std::size_t>(D) + 4 + 3) / 4 * 4;
}

// q f32 [T, Hq, D]; k_cache / v_cache [rows, Hkv, D] of KvT; k_scales / v_scales f32 [rows, Hkv]
// (int8 only); scores f32 [T, Hq, n_ctx_max], or nullptr: in shared memory (kG * split floats);
// o f32 [T, Hq, D]; partials f32 [T, Hq, n_split, PartialStride(D)] (unused when n_split == 1).
// A block attends kG query heads of one kv head (kG = 1: one head; kG > 1 shares each K and V
// element it loads between the heads, which the per-head layout reads kG times), with every
// head's arithmetic exactly the one-head block's. Grid: T * (Hq / kG) * n_split blocks. Dynamic
// shared memory: kG * (D + kAttnThreads [+ split]) floats.
template <int KvT, bool kVec, int kG>
__global__ void __launch_bounds__(km::kAttnThreads)
    AttentionKernel(const float* __restrict__ q, Pos pos, int n_heads, int n_heads_kv, int D,
                    const void* __restrict__ k_cache, const void* __restrict__ v_cache,
                    const float* __restrict__ k_scales, const float* __restrict__ v_scales,
                    float scale, float* __restrict__ scores, int n_ctx_max, int split, int n_split,
                    float* __restrict__ partials, float* __restrict__ o,
                    const float* __restrict__ gate, int gate_ld) {
  extern __shared__ float smem[];
  __shared__ float red_f[km::kAttnThreads];
  __shared__ double red_d[km::kAttnThreads];
  float* qs = smem;                            // [kG][D]
  float* ptile = smem + kG * D;                // [kG][kAttnThreads]
  float* ssc = ptile + kG * km::kAttnThreads;  // [kG][split] (shared-memory scores)
  const int tid = static_cast<int>(threadIdx.x), lane = tid % km::kWarp, warp = tid / km::kWarp;
  const int tb = static_cast<int>(blockIdx.x) / n_split;  // (t, head block)
  const int j = static_cast<int>(blockIdx.x) - tb * n_split;
  const int blocks_per_row = n_heads / kG;
  const int t = tb / blocks_per_row, h0 = (tb - t * blocks_per_row) * kG;
  const int th0 = t * n_heads + h0;  // (t, h) index of the block's first head
  const int kvh = h0 / (n_heads / n_heads_kv);
  const int n_ctx = pos.Get() + t + 1;
  // Whole row in block 0, or this block's range of a long row (block-uniform: every thread of a
  // block returns together, before any barrier).
  const bool whole = n_split == 1 || n_ctx <= split;
  if (whole ? j != 0 : j * split >= n_ctx) return;
  const int u0 = whole ? 0 : j * split;
  const int u1 = whole ? n_ctx : (n_ctx - u0 < split ? n_ctx : u0 + split);
  const std::size_t ud = static_cast<std::size_t>(D);
  const std::size_t row_elems = static_cast<std::size_t>(n_heads_kv) * ud;
  const std::size_t head_off = static_cast<std::size_t>(kvh) * ud;

  for (int i = tid; i < kG * D; i += km::kAttnThreads)
    qs[i] = q[static_cast<std::size_t>(th0) * ud + static_cast<std::size_t>(i)];
  __syncthreads();

  // 1. scores: head g's score u at sc(g)[u - sc0] (global: the row's [n_ctx_max]; shared: this
  //    block's range)
  const int sc0 = scores != nullptr ? 0 : u0;
  auto sc = [&](int g) -> float* {
    return scores != nullptr
               ? scores + static_cast<std::size_t>(th0 + g) * static_cast<std::size_t>(n_ctx_max)
               : ssc + static_cast<std::size_t>(g) * static_cast<std::size_t>(split);
  };
  for (int u = u0 + warp; u < u1; u += kAttnWarps) {
    const std::size_t base = static_cast<std::size_t>(u) * row_elems + head_off;
    const float ksc =
        KvT == 2 ? k_scales[static_cast<std::size_t>(u) * static_cast<std::size_t>(n_heads_kv) +
                            static_cast<std::size_t>(kvh)]
                 : 0.0f;
    float acc[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) acc[g] = 0.0f;
    if constexpr (kVec) {
      for (int c4 = lane; c4 < D / km::kLaneVec; c4 += km::kWarp) {
        float kv[4];
        LoadKv4<KvT>(k_cache, base + static_cast<std::size_t>(4 * c4), ksc, kv);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          const float* qq = qs + g * D + 4 * c4;
          acc[g] = km::LaneStep4(acc[g], qq[0], qq[1], qq[2], qq[3], kv[0], kv[1], kv[2], kv[3]);
        }
      }
    } else {
      for (int b = km::kLaneVec * lane; b < D; b += km::kChunk) {
        const int m = D - b < km::kLaneVec ? D - b : km::kLaneVec;
        for (int c = 0; c < m; ++c) {
          const float kv = LoadKv<KvT>(k_cache, base + static_cast<std::size_t>(b + c), ksc);
#pragma unroll
          for (int g = 0; g < kG; ++g) acc[g] = km::LaneStep(acc[g], qs[g * D + b + c], kv);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const float dot = km::WarpCombine(acc[g]);
      if (lane == 0) sc(g)[u - sc0] = dot * scale;
    }
  }
  __syncthreads();

  // 2. and 3., head by head: max, then exp and the f64 sum
  float mx[kG], inv[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float* sg = sc(g);
    float m = -INFINITY;
    for (int u = u0 + tid; u < u1; u += km::kAttnThreads) m = km::MaxStep(m, sg[u - sc0]);
    red_f[tid] = m;
    __syncthreads();
    for (int s = km::kAttnThreads / 2; s > 0; s >>= 1) {
      if (tid < s) red_f[tid] = km::MaxStep(red_f[tid], red_f[tid + s]);
      __syncthreads();
    }
    mx[g] = red_f[0];
    double sum = 0.0;
    for (int u = u0 + tid; u < u1; u += km::kAttnThreads) {
      const float e = km::SoftmaxExp(sg[u - sc0], mx[g]);
      sg[u - sc0] = e;
      sum = sum + static_cast<double>(e);
    }
    red_d[tid] = sum;
    __syncthreads();
    for (int s = km::kAttnThreads / 2; s > 0; s >>= 1) {
      if (tid < s) red_d[tid] = red_d[tid] + red_d[tid + s];
      __syncthreads();
    }
    // A split's p_u stays e_u (times 1.0f: exact); the combine normalises.
    inv[g] = whole ? km::SoftmaxInv(red_d[0]) : 1.0f;
    if (!whole && tid == 0) {
      float* dst =
          partials + (static_cast<std::size_t>(th0 + g) * static_cast<std::size_t>(n_split) +
                      static_cast<std::size_t>(j)) *
                         PartialStride(D);
      dst[D] = mx[g];
      *reinterpret_cast<double*>(dst + PartialStride(D) - 2) = red_d[0];
    }
    // The next head may reuse red_f / red_d at once: every thread read red_f[0] before this
    // head's first red_d barrier, and reads red_d[0] before the next head's first barrier.
  }

  // 4. output, dims tid + r * kAttnThreads of every head
  float acc[kG][km::kAttnMaxDimsPerThread];
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int r = 0; r < km::kAttnMaxDimsPerThread; ++r) acc[g][r] = 0.0f;
  for (int b0 = u0; b0 < u1; b0 += km::kAttnThreads) {
    const int nu = u1 - b0 < km::kAttnThreads ? u1 - b0 : km::kAttnThreads;
    // Thread tid wrote e_{b0+tid} in step 3 itself, so only the tile's reuse needs a barrier.
    if (tid < nu) {
#pragma unroll
      for (int g = 0; g < kG; ++g)
        ptile[g * km::kAttnThreads + tid] = sc(g)[b0 + tid - sc0] * inv[g];
    }
    __syncthreads();
    for (int uu = 0; uu < nu; ++uu) {
      const int u = b0 + uu;
      const std::size_t base = static_cast<std::size_t>(u) * row_elems + head_off;
      const float vsc =
          KvT == 2 ? v_scales[static_cast<std::size_t>(u) * static_cast<std::size_t>(n_heads_kv) +
                              static_cast<std::size_t>(kvh)]
                   : 0.0f;
#pragma unroll
      for (int r = 0; r < km::kAttnMaxDimsPerThread; ++r) {
        const int i = tid + r * km::kAttnThreads;
        if (i < D) {
          const float v = LoadKv<KvT>(v_cache, base + static_cast<std::size_t>(i), vsc);
#pragma unroll
          for (int g = 0; g < kG; ++g)
            acc[g][r] = km::AttnAccum(acc[g][r], ptile[g * km::kAttnThreads + uu], v);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float* dst =
        whole ? o + static_cast<std::size_t>(th0 + g) * ud
              : partials + (static_cast<std::size_t>(th0 + g) * static_cast<std::size_t>(n_split) +
                            static_cast<std::size_t>(j)) *
                               PartialStride(D);
    // The layer's output gate on a whole row (a split row's is applied by the combine).
    const float* gr = whole && gate != nullptr ? gate + static_cast<std::size_t>(th0 + g) *
                                                            static_cast<std::size_t>(gate_ld)
                                               : nullptr;
#pragma unroll
    for (int r = 0; r < km::kAttnMaxDimsPerThread; ++r) {
      const int i = tid + r * km::kAttnThreads;
      if (i < D) dst[i] = gr != nullptr ? km::MulSigmoidElem(acc[g][r], gr[i]) : acc[g][r];
    }
  }
}

// One block per (t, h): the long rows' split partials into o (km::AttnRescaledSum's order). Every
// thread folds m and L over the splits itself (the same sequence, so the same bits), then owns
// dims tid, tid + kAttnThreads, ...
__global__ void __launch_bounds__(km::kAttnThreads)
    AttnCombineKernel(Pos pos, int n_heads, int D, int split, int n_split,
                      const float* __restrict__ partials, float* __restrict__ o,
                      const float* __restrict__ gate, int gate_ld) {
  const int th = static_cast<int>(blockIdx.x);
  const int t = th / n_heads;
  const int n_ctx = pos.Get() + t + 1;
  if (n_ctx <= split) return;  // written whole by AttentionKernel
  const int used = (n_ctx + split - 1) / split;
  const std::size_t ps = PartialStride(D);
  const float* part =
      partials + static_cast<std::size_t>(th) * static_cast<std::size_t>(n_split) * ps;
  float M = -INFINITY;
  for (int j = 0; j < used; ++j)
    M = km::MaxStep(M, part[static_cast<std::size_t>(j) * ps + static_cast<std::size_t>(D)]);
  double L = 0.0;
  for (int j = 0; j < used; ++j) {
    const float* pj = part + static_cast<std::size_t>(j) * ps;
    L = km::AttnRescaledSum(L, *reinterpret_cast<const double*>(pj + ps - 2),
                            km::SoftmaxExp(pj[D], M));
  }
  const float inv = km::SoftmaxInv(L);
  for (int i = static_cast<int>(threadIdx.x); i < D; i += km::kAttnThreads) {
    float acc = 0.0f;
    for (int j = 0; j < used; ++j) {
      const float* pj = part + static_cast<std::size_t>(j) * ps;
      acc = km::AttnAccum(acc, km::SoftmaxExp(pj[D], M) * inv, pj[i]);
    }
    if (gate != nullptr)
      acc = km::MulSigmoidElem(
          acc, gate[static_cast<std::size_t>(th) * static_cast<std::size_t>(gate_ld) +
                    static_cast<std::size_t>(i)]);
    o[static_cast<std::size_t>(th) * static_cast<std::size_t>(D) + static_cast<std::size_t>(i)] =
        acc;
  }
}

// Grouped blocks (kG > 1) only with the one-load-per-4-elements path: every preset's head_dim is a
// multiple of 4, and each variant costs compile time (nvcc, two architectures).
template <int KvT>
void LaunchAttention(bool vec, int heads_per_block, unsigned blocks, std::size_t smem,
                     cudaStream_t s, const float* q, Pos p, int n_heads, int n_heads_kv, int D,
                     const void* k_cache, const void* v_cache, const float* k_scales,
                     const float* v_scales, float scale, float* scores, int n_ctx_max, int split,
                     int n_split, float* partials, float* o, const float* gate, int gate_ld) {
  if (!vec) {
    AttentionKernel<KvT, false, 1><<<blocks, km::kAttnThreads, smem, s>>>(
        q, p, n_heads, n_heads_kv, D, k_cache, v_cache, k_scales, v_scales, scale, scores,
        n_ctx_max, split, n_split, partials, o, gate, gate_ld);
    return;
  }
  switch (heads_per_block) {
    case 8:
      AttentionKernel<KvT, true, 8><<<blocks, km::kAttnThreads, smem, s>>>(
          q, p, n_heads, n_heads_kv, D, k_cache, v_cache, k_scales, v_scales, scale, scores,
          n_ctx_max, split, n_split, partials, o, gate, gate_ld);
      break;
    case 4:
      AttentionKernel<KvT, true, 4><<<blocks, km::kAttnThreads, smem, s>>>(
          q, p, n_heads, n_heads_kv, D, k_cache, v_cache, k_scales, v_scales, scale, scores,
          n_ctx_max, split, n_split, partials, o, gate, gate_ld);
      break;
    case 2:
      AttentionKernel<KvT, true, 2><<<blocks, km::kAttnThreads, smem, s>>>(
          q, p, n_heads, n_heads_kv, D, k_cache, v_cache, k_scales, v_scales, scale, scores,
          n_ctx_max, split, n_split, partials, o, gate, gate_ld);
      break;
    default:
      AttentionKernel<KvT, true, 1><<<blocks, km::kAttnThreads, smem, s>>>(
          q, p, n_heads, n_heads_kv, D, k_cache, v_cache, k_scales, v_scales, scale, scores,
          n_ctx_max, split, n_split, partials, o, gate, gate_ld);
  }
}

constexpr int kSplitThreads = 256;

// qg f32 [T, Hq, 2, D] -> q, gate f32 [T, Hq, D]; one thread per output element pair.
__global__ void __launch_bounds__(kSplitThreads)
    SplitQGateKernel(const float* __restrict__ qg, std::int64_t n_rows, int D,
                     float* __restrict__ q, float* __restrict__ gate) {
  const std::int64_t total = n_rows * D;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = idx / D, i = idx - row * D;
    q[idx] = qg[2 * row * D + i];
    gate[idx] = qg[(2 * row + 1) * D + i];
  }
}

}  // namespace

void SplitQGate(const float* qg, int T, int n_heads, int head_dim, float* q, float* gate,
                cudaStream_t s) {
  const std::int64_t n_rows = static_cast<std::int64_t>(T) * n_heads;
  if (n_rows <= 0 || head_dim <= 0) return;
  const std::int64_t want = (n_rows * head_dim + kSplitThreads - 1) / kSplitThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 ? want : 65535);
  SplitQGateKernel<<<blocks, kSplitThreads, 0, s>>>(qg, n_rows, head_dim, q, gate);
}

int AttentionSplits(int n_ctx_max, int split) {
  return split > 0 && n_ctx_max > split ? (n_ctx_max + split - 1) / split : 1;
}

namespace {

// Global scratch floats of one row (all heads): its scores when they do not fit in shared memory
// (rounded to 4 floats, so the partials after them stay 16-byte aligned), its split partials.
struct RowScratch {
  std::size_t scores = 0, partials = 0;
  std::size_t total() const { return scores + partials; }
};
RowScratch RowScratchOf(int n_heads, int head_dim, int n_ctx_max, int split) {
  RowScratch r;
  const std::size_t hq = static_cast<std::size_t>(n_heads);
  if (split <= 0 || split > kSmemScoresMax)
    r.scores = (hq * static_cast<std::size_t>(n_ctx_max) + 3) / 4 * 4;
  const int n_split = AttentionSplits(n_ctx_max, split);
  if (n_split > 1) r.partials = hq * static_cast<std::size_t>(n_split) * PartialStride(head_dim);
  return r;
}

// Rows of one launch: as many of T as `floats` of scratch hold, at least one.
int RowsFitting(int T, const RowScratch& r, std::size_t floats) {
  if (r.total() == 0) return T;
  const std::size_t fit = floats / r.total();
  return fit < 1 ? 1 : fit >= static_cast<std::size_t>(T) ? T : static_cast<int>(fit);
}

// Dynamic shared memory of a block of kG heads.
std::size_t SmemBytes(int kG, int head_dim, bool smem_scores, int split) {
  return static_cast<std::size_t>(kG) *
         static_cast<std::size_t>(head_dim + km::kAttnThreads + (smem_scores ? split : 0)) *
         sizeof(float);
}

}  // namespace

std::size_t AttentionScratchFloats(int T, int n_heads, int head_dim, int n_ctx_max, int split) {
  if (T <= 0 || n_heads <= 0 || head_dim <= 0) return 0;
  const RowScratch r = RowScratchOf(n_heads, head_dim, n_ctx_max, split);
  return static_cast<std::size_t>(RowsFitting(T, r, kScratchBudgetFloats)) * r.total();
}

int AttentionHeadsPerBlock(int n_heads, int n_heads_kv, int head_dim, int n_ctx_max, int split,
                           AttnHeads heads) {
  // Grouped blocks need the 4-element loads (LaunchAttention): head_dim % 4 == 0 (and, at the
  // launch, a 4-element-aligned cache).
  if (heads == AttnHeads::kOne || n_heads_kv <= 0 || n_heads % n_heads_kv != 0 || head_dim % 4 != 0)
    return 1;
  const int n_split = AttentionSplits(n_ctx_max, split);
  // Auto: only where rows are long enough to split, i.e. where the repeated K / V reads of the
  // one-head layout cost bandwidth; short rows keep the most blocks.
  if (heads == AttnHeads::kAuto && n_split == 1) return 1;
  const bool smem_scores = RowScratchOf(n_heads, head_dim, n_ctx_max, split).scores == 0;
  const int group = n_heads / n_heads_kv;
  for (int kg : {8, 4, 2})
    if (group % kg == 0 && SmemBytes(kg, head_dim, smem_scores, split) <= 48 * 1024) return kg;
  return 1;
}

void Attention(const float* q, int T, Pos p, int n_heads, int n_heads_kv, int head_dim,
               int kv_dtype, const void* k_cache, const void* v_cache, const float* k_scales,
               const float* v_scales, float scale, int n_ctx_max, int split, float* scratch,
               std::size_t scratch_floats, float* o, cudaStream_t s, AttnHeads heads,
               AttnGate gate) {
  if (T <= 0 || n_heads <= 0 || head_dim <= 0) return;
  const int n_split = AttentionSplits(n_ctx_max, split);
  const RowScratch r = RowScratchOf(n_heads, head_dim, n_ctx_max, split);
  // Rows per launch: what the caller's scratch holds (AttentionScratchFloats gives the budget's).
  const int rows_per = RowsFitting(T, r, scratch_floats);
  const bool smem_scores = r.scores == 0;
  // One load per 4 elements needs 4-element-aligned rows: D % 4 == 0 and an aligned base.
  const std::size_t elem = kv_dtype == 0 ? 4 : kv_dtype == 1 ? 2 : 1;
  const bool vec = head_dim % 4 == 0 && km::Aligned(k_cache, 4 * elem);
  const int kg =
      vec ? AttentionHeadsPerBlock(n_heads, n_heads_kv, head_dim, n_ctx_max, split, heads) : 1;
  const std::size_t smem = SmemBytes(kg, head_dim, smem_scores, split);
  const std::size_t row_q = static_cast<std::size_t>(n_heads) * static_cast<std::size_t>(head_dim);
  for (int t0 = 0; t0 < T; t0 += rows_per) {
    const int nt = T - t0 < rows_per ? T - t0 : rows_per;
    const Pos pg(p.base + t0, p.dev);
    const float* qg = q + static_cast<std::size_t>(t0) * row_q;
    float* og = o + static_cast<std::size_t>(t0) * row_q;
    const float* gg = gate.g != nullptr ? gate.g + static_cast<std::size_t>(t0) *
                                                       static_cast<std::size_t>(n_heads) *
                                                       static_cast<std::size_t>(gate.ld)
                                        : nullptr;
    float* scores = smem_scores ? nullptr : scratch;
    float* partials = n_split > 1 ? scratch + static_cast<std::size_t>(nt) * r.scores : nullptr;
    const unsigned rows = static_cast<unsigned>(nt) * static_cast<unsigned>(n_heads);
    const unsigned blocks = rows / static_cast<unsigned>(kg) * static_cast<unsigned>(n_split);
    if (kv_dtype == 0) {
      LaunchAttention<0>(vec, kg, blocks, smem, s, qg, pg, n_heads, n_heads_kv, head_dim, k_cache,
                         v_cache, k_scales, v_scales, scale, scores, n_ctx_max, split, n_split,
                         partials, og, gg, gate.ld);
    } else if (kv_dtype == 1) {
      LaunchAttention<1>(vec, kg, blocks, smem, s, qg, pg, n_heads, n_heads_kv, head_dim, k_cache,
                         v_cache, k_scales, v_scales, scale, scores, n_ctx_max, split, n_split,
                         partials, og, gg, gate.ld);
    } else {
      LaunchAttention<2>(vec, kg, blocks, smem, s, qg, pg, n_heads, n_heads_kv, head_dim, k_cache,
                         v_cache, k_scales, v_scales, scale, scores, n_ctx_max, split, n_split,
                         partials, og, gg, gate.ld);
    }
    if (n_split > 1) {
      AttnCombineKernel<<<rows, km::kAttnThreads, 0, s>>>(pg, n_heads, head_dim, split, n_split,
                                                          partials, og, gg, gate.ld);
    }
  }
}

}  // namespace lockstep::cuda
