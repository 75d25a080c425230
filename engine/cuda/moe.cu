// Sparse MoE pieces (cpu/moe.cpp MoeForward's device twins): router top-k, expert-major grouping,
// routed expert products, rank-order combine and the gated shared expert.
//
// Determinism: routing is per token (exact max / argmax trees, the f32 softmax sum sequential in
// expert order like the CPU); grouping is integer counting (exact in any order) laid out in the
// CPU's slot order; expert products use the batch-invariant warp dot per (slot, output row), so a
// slot's result does not depend on which or how many other slots share its expert; combine sums
// ranks in rank order. No atomics anywhere.
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGroupThreads = 512;
constexpr int kMoeWarps = 4;  // output rows per expert block

// logits f32 [T, E] -> idx int32 [T, k], wts f32 [T, k]; one block per token.
__global__ void __launch_bounds__(km::kRouteThreads)
    RouteKernel(const float* __restrict__ logits, int E, int k, bool norm, int* __restrict__ idx,
                float* __restrict__ wts, int* __restrict__ idx_host) {
  __shared__ float probs[km::kMaxExperts];
  __shared__ unsigned char taken[km::kMaxExperts];
  __shared__ float red_p[km::kRouteThreads];
  __shared__ int red_i[km::kRouteThreads];
  __shared__ float sum_s;
  const int tid = static_cast<int>(threadIdx.x);
  const std::size_t t = blockIdx.x;
  const float* lg = logits + t * static_cast<std::size_t>(E);
  int* out_i = idx + t * static_cast<std::size_t>(k);
  float* out_w = wts + t * static_cast<std::size_t>(k);

  // Max (exact in any order), then the exponentials.
  float mx = -INFINITY;
  for (int e = tid; e < E; e += km::kRouteThreads) mx = km::MaxStep(mx, lg[e]);
  red_p[tid] = mx;
  __syncthreads();
  for (int s = km::kRouteThreads / 2; s > 0; s >>= 1) {
    if (tid < s) red_p[tid] = km::MaxStep(red_p[tid], red_p[tid + s]);
    __syncthreads();
  }
  mx = red_p[0];
  for (int e = tid; e < E; e += km::kRouteThreads) {
    probs[e] = km::SoftmaxExp(lg[e], mx);
    taken[e] = 0;
  }
  __syncthreads();
  // The f32 sum runs in expert order in one thread: the CPU's exact sequence (E <= 4096 adds).
  if (tid == 0) {
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum = sum + probs[e];
    sum_s = sum;
  }
  __syncthreads();
  const float sum = sum_s;
  for (int e = tid; e < E; e += km::kRouteThreads) probs[e] = probs[e] / sum;
  __syncthreads();

  // k argmax passes over the untaken experts; (prob desc, id asc) is a total order, so the tree
  // finds the CPU's pick (the lowest id among the maxima) whatever the partition.
  for (int r = 0; r < k; ++r) {
    float bp = 0.0f;
    int bi = -1;
    for (int e = tid; e < E; e += km::kRouteThreads)
      if (!taken[e] && km::RouteBetter(probs[e], e, bp, bi)) {
        bp = probs[e];
        bi = e;
      }
    red_p[tid] = bp;
    red_i[tid] = bi;
    __syncthreads();
    for (int s = km::kRouteThreads / 2; s > 0; s >>= 1) {
      if (tid < s && km::RouteBetter(red_p[tid + s], red_i[tid + s], red_p[tid], red_i[tid])) {
        red_p[tid] = red_p[tid + s];
        red_i[tid] = red_i[tid + s];
      }
      __syncthreads();
    }
    if (tid == 0) {
      const int best = red_i[0];
      taken[best] = 1;
      out_i[r] = best;
      out_w[r] = probs[best];
      if (idx_host != nullptr)
        idx_host[t * static_cast<std::size_t>(k) + static_cast<std::size_t>(r)] = best;
    }
    __syncthreads();
  }
  // Renormalisation by the selected mass, summed in rank order like the CPU.
  if (tid == 0 && norm) {
    float sel = 0.0f;
    for (int r = 0; r < k; ++r) sel = sel + out_w[r];
    for (int r = 0; r < k; ++r) out_w[r] = out_w[r] / sel;
  }
}

// Expert-major grouping of the n slots in idx, by a block of NT threads (all of them call it);
// cnt: (E + 1) ints, scan_c / scan_a: NT ints of shared memory. Integer counting and scans: the
// same numbers for any NT.
template <int NT>
__device__ inline void GroupBody(const int* idx, int n, int E, int* slot_of, int* first,
                                 int* active, int* n_active, int* cnt, int* scan_c, int* scan_a) {
  const int tid = static_cast<int>(threadIdx.x);
  // 1. Per-expert slot counts (thread e scans every slot: exact, no atomics).
  for (int e = tid; e < E; e += NT) {
    int c = 0;
    for (int s = 0; s < n; ++s) c += idx[s] == e ? 1 : 0;
    cnt[e] = c;
  }
  __syncthreads();
  // 2. Exclusive prefix sums of counts and of "expert is active" over contiguous segments of
  //    experts, one segment per thread, then a Hillis-Steele scan of the segment totals (integer:
  //    exact, so any scan order gives the same numbers).
  const int seg = (E + NT - 1) / NT;
  const int e0 = tid * seg < E ? tid * seg : E, e1 = e0 + seg < E ? e0 + seg : E;
  int tc = 0, ta = 0;
  for (int e = e0; e < e1; ++e) {
    tc += cnt[e];
    ta += cnt[e] > 0 ? 1 : 0;
  }
  scan_c[tid] = tc;
  scan_a[tid] = ta;
  __syncthreads();
  for (int off = 1; off < NT; off <<= 1) {
    const int vc = tid >= off ? scan_c[tid - off] : 0, va = tid >= off ? scan_a[tid - off] : 0;
    __syncthreads();
    scan_c[tid] += vc;
    scan_a[tid] += va;
    __syncthreads();
  }
  int run = scan_c[tid] - tc, na = scan_a[tid] - ta;
  for (int e = e0; e < e1; ++e) {
    const int c = cnt[e];
    first[e] = run;
    if (c > 0) active[na++] = e;
    run += c;
  }
  const int total_active = scan_a[NT - 1];
  if (tid == NT - 1) {
    first[E] = scan_c[NT - 1];
    *n_active = total_active;
  }
  for (int a = total_active + tid; a < n; a += NT) active[a] = -1;
  __syncthreads();  // cnt is overwritten below with the segment starts
  for (int e = e0; e < e1; ++e) cnt[e] = first[e];
  __syncthreads();
  // 3. Slots of expert e in ascending slot order (t then r), like the CPU's loop.
  for (int e = tid; e < E; e += NT) {
    int pos = cnt[e];
    if (cnt[e] == (e + 1 < E ? cnt[e + 1] : scan_c[NT - 1])) continue;
    for (int s = 0; s < n; ++s)
      if (idx[s] == e) slot_of[pos++] = s;
  }
}

// One block of kGroupThreads. Dynamic shared memory: (E + 1) ints of counts.
__global__ void __launch_bounds__(kGroupThreads)
    GroupKernel(const int* __restrict__ idx, int n, int E, int* __restrict__ slot_of,
                int* __restrict__ first, int* __restrict__ active, int* __restrict__ n_active) {
  extern __shared__ int cnt[];  // [E + 1]
  __shared__ int scan_c[kGroupThreads];
  __shared__ int scan_a[kGroupThreads];
  GroupBody<kGroupThreads>(idx, n, E, slot_of, first, active, n_active, cnt, scan_c, scan_a);
}

// Routing and grouping of a window of up to kRouteWarpRows tokens in one block, for E <=
// kRouteWarpMaxExperts: warp w routes token w, then the block groups the T*k slots
// (GroupBody). Each warp runs RouteKernel's arithmetic with warp operations: the max (exact, any
// order), the exponentials, the f32 sum in expert order (every lane runs the same sequence, so
// no broadcast is needed), probs = e / sum, and k argmax passes under RouteBetter's total order,
// so the picks, weights and ids are RouteKernel's for any finite logits.
constexpr int kRouteWarpRows = km::kMaxRowsPerPass;  // 16: any verify window
constexpr int kRouteWarpMaxExperts = 512;            // 16 experts per lane: its taken mask
constexpr int kRouteGroupThreads = kRouteWarpRows * km::kWarp;
static_assert(kRouteWarpMaxExperts <= 32 * km::kWarp, "taken mask of 32 bits per lane");

__device__ inline void RouteRowWarp(const float* lg, int E, int k, bool norm, int* out_i,
                                    float* out_w, int* host_i, float* probs, int lane) {
  float mx = -INFINITY;
  for (int e = lane; e < E; e += km::kWarp) mx = km::MaxStep(mx, lg[e]);
  for (int off = km::kWarp / 2; off > 0; off >>= 1)
    mx = km::MaxStep(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  for (int e = lane; e < E; e += km::kWarp) probs[e] = km::SoftmaxExp(lg[e], mx);
  __syncwarp();  // every lane reads every exponential below
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum = sum + probs[e];
  // k passes: each lane's best untaken expert among its own (e = lane + 32 j), then a butterfly
  // under the total order; the owner marks the pick taken (bit j of its mask).
  unsigned taken = 0;
  for (int r = 0; r < k; ++r) {
    float bp = 0.0f;
    int bi = -1;
    for (int j = 0, e = lane; e < E; ++j, e += km::kWarp) {
      const float p = probs[e] / sum;
      if (!(taken >> j & 1u) && km::RouteBetter(p, e, bp, bi)) {
        bp = p;
        bi = e;
      }
    }
    for (int off = km::kWarp / 2; off > 0; off >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (km::RouteBetter(op, oi, bp, bi)) {
        bp = op;
        bi = oi;
      }
    }
    if (bi % km::kWarp == lane) taken |= 1u << (bi / km::kWarp);
    if (lane == 0) {
      out_i[r] = bi;
      out_w[r] = bp;
      if (host_i != nullptr) host_i[r] = bi;
    }
  }
  if (lane == 0 && norm) {
    float sel = 0.0f;
    for (int r = 0; r < k; ++r) sel = sel + out_w[r];
    for (int r = 0; r < k; ++r) out_w[r] = out_w[r] / sel;
  }
}

// One block of kRouteGroupThreads. Dynamic shared memory: (E + 1) ints of counts.
__global__ void __launch_bounds__(kRouteGroupThreads)
    RouteGroupKernel(const float* __restrict__ logits, int T, int E, int k, bool norm,
                     int* __restrict__ idx, float* __restrict__ wts, int* __restrict__ idx_host,
                     int* __restrict__ slot_of, int* __restrict__ first, int* __restrict__ active,
                     int* __restrict__ n_active) {
  __shared__ float probs[kRouteWarpRows * kRouteWarpMaxExperts];
  __shared__ int scan_c[kRouteGroupThreads];
  __shared__ int scan_a[kRouteGroupThreads];
  extern __shared__ int cnt[];  // [E + 1]
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp,
            w = static_cast<int>(threadIdx.x) / km::kWarp;
  if (w < T) {
    const std::size_t tk = static_cast<std::size_t>(w) * static_cast<std::size_t>(k);
    RouteRowWarp(logits + static_cast<std::size_t>(w) * static_cast<std::size_t>(E), E, k, norm,
                 idx + tk, wts + tk, idx_host != nullptr ? idx_host + tk : nullptr,
                 probs + w * kRouteWarpMaxExperts, lane);
  }
  __syncthreads();  // lane 0 of each warp wrote its ids (global memory): visible after the barrier
  GroupBody<kRouteGroupThreads>(idx, T * k, E, slot_of, first, active, n_active, cnt, scan_c,
                                scan_a);
}

// The active expert of this block, or -1 when the block is past n_active.
__device__ inline int BlockExpert(const int* active, const int* n_active) {
  const int a = static_cast<int>(blockIdx.x);
  return a < *n_active ? active[a] : -1;
}

// One pass of n <= R slots starting at i0 (slots past n repeat slot i0 and are not stored).
template <int R, typename WT>
__device__ inline void GateUpPass(const float* x, int H, int I, int k, const int* slot_of, int i0,
                                  int n, const WT* wg, const WT* wu, bool vec, int lane, int o,
                                  float* act) {
  const float* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    rows[r] = x + static_cast<std::size_t>(slot_of[i0 + (r < n ? r : 0)] / k) *
                      static_cast<std::size_t>(H);
  float gv[R], uv[R];
  km::WarpDotRows<R, WT>(rows, wg, H, vec, lane, gv);
  km::WarpDotRows<R, WT>(rows, wu, H, vec, lane, uv);
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (lane == r && r < n)
      act[static_cast<std::size_t>(i0 + r) * static_cast<std::size_t>(I) +
          static_cast<std::size_t>(o)] = km::SwiGlu(gv[r], uv[r]);
}

// x f32 [T, H]; gate_w / up_w [E] -> WT [I, H] (f32 or bf16 bits); act f32 [T*k, I] by slot
// position. Grid (max_active, ceil(I / kMoeWarps)); warp per output row o.
template <typename WT>
__global__ void __launch_bounds__(kMoeWarps* km::kWarp)
    GateUpKernel(const float* __restrict__ x, int H, int I, int k, const int* __restrict__ slot_of,
                 const int* __restrict__ first, const int* __restrict__ active,
                 const int* __restrict__ n_active, const void* const* __restrict__ gate_w,
                 const void* const* __restrict__ up_w, float* __restrict__ act) {
  const int e = BlockExpert(active, n_active);
  if (e < 0) return;
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int o =
      static_cast<int>(blockIdx.y) * kMoeWarps + static_cast<int>(threadIdx.x) / km::kWarp;
  if (o >= I) return;
  const WT* wg =
      static_cast<const WT*>(gate_w[e]) + static_cast<std::size_t>(o) * static_cast<std::size_t>(H);
  const WT* wu =
      static_cast<const WT*>(up_w[e]) + static_cast<std::size_t>(o) * static_cast<std::size_t>(H);
  const bool vec = H % 4 == 0 && km::Aligned(x, 16) && km::Aligned(wg, km::kWeightVecAlign<WT>) &&
                   km::Aligned(wu, km::kWeightVecAlign<WT>);
  const int s0 = first[e], s1 = first[e + 1];
  for (int i0 = s0; i0 < s1;) {
    const int n = km::RowGroupSize(s1 - i0);
    km::WithPassWidth(n, [&]<int R>() {
      GateUpPass<R, WT>(x, H, I, k, slot_of, i0, n, wg, wu, vec, lane, o, act);
    });
    i0 += n;
  }
}

template <int R, typename WT>
__device__ inline void DownPass(const float* act, int H, int I, const int* slot_of, int i0, int n,
                                const WT* wd, bool vec, int lane, int o, float* ranked) {
  const float* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    rows[r] = act + static_cast<std::size_t>(i0 + (r < n ? r : 0)) * static_cast<std::size_t>(I);
  float y[R];
  km::WarpDotRows<R, WT>(rows, wd, I, vec, lane, y);
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (lane == r && r < n)
      ranked[static_cast<std::size_t>(slot_of[i0 + r]) * static_cast<std::size_t>(H) +
             static_cast<std::size_t>(o)] = y[r];
}

// act f32 [T*k, I] by slot position; down_w [E] -> WT [H, I]; ranked f32 [T*k, H] by t*k + r.
// Grid (max_active [+ 1 for `dense`], ceil(H / kMoeWarps)); warp per output row o. Four blocks
// per SM: the dense path's code took sm_90 from 128 to 150 registers (3 blocks); the bound keeps
// the routed product's occupancy at the cost of ~30 bytes of spills (unmeasured trade).
template <typename WT>
__global__ void __launch_bounds__(kMoeWarps* km::kWarp, 4)
    DownKernel(const float* __restrict__ act, int H, int I, const int* __restrict__ slot_of,
               const int* __restrict__ first, const int* __restrict__ active,
               const int* __restrict__ n_active, const void* const* __restrict__ down_w,
               float* __restrict__ ranked, DenseDown dense) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int o =
      static_cast<int>(blockIdx.y) * kMoeWarps + static_cast<int>(threadIdx.x) / km::kWarp;
  if (dense.w != nullptr && static_cast<int>(blockIdx.x) == static_cast<int>(gridDim.x) - 1) {
    // The last column of blocks: the dense product, row o as RowsMatmulKernel computes it.
    if (o >= H) return;
    const WT* w = static_cast<const WT*>(dense.w) +
                  static_cast<std::size_t>(o) * static_cast<std::size_t>(dense.I);
    const bool vec =
        dense.I % 4 == 0 && km::Aligned(dense.act, 16) && km::Aligned(w, km::kWeightVecAlign<WT>);
    km::RowsAllPasses(dense.act, dense.T, dense.I, w, vec, lane, dense.y, H, o);
    return;
  }
  const int e = BlockExpert(active, n_active);
  if (e < 0) return;
  if (o >= H) return;
  const WT* wd =
      static_cast<const WT*>(down_w[e]) + static_cast<std::size_t>(o) * static_cast<std::size_t>(I);
  const bool vec = I % 4 == 0 && km::Aligned(act, 16) && km::Aligned(wd, km::kWeightVecAlign<WT>);
  const int s0 = first[e], s1 = first[e + 1];
  for (int i0 = s0; i0 < s1;) {
    const int n = km::RowGroupSize(s1 - i0);
    km::WithPassWidth(
        n, [&]<int R>() { DownPass<R, WT>(act, H, I, slot_of, i0, n, wd, vec, lane, o, ranked); });
    i0 += n;
  }
}

// ranked f32 [T, k, H], wts f32 [T, k] -> out f32 [T, H]; one thread per output element.
__global__ void __launch_bounds__(kThreads)
    CombineKernel(const float* __restrict__ ranked, const float* __restrict__ wts, int T, int k,
                  int H, float* __restrict__ out) {
  const std::int64_t total = static_cast<std::int64_t>(T) * H;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = idx / H, i = idx - t * H;
    float acc = 0.0f;
    for (int r = 0; r < k; ++r) {
      const std::int64_t tr = t * k + r;
      acc = km::CombineRank(acc, wts[tr], ranked[tr * H + i]);
    }
    out[idx] = acc;
  }
}

// The shared expert's gate of row xr, sigmoid(xr . gate_w), for every thread of the block: warp 0
// computes the batch-invariant warp dot and passes the gate through *slot (shared memory).
// Contains a barrier: every thread of the block calls it.
__device__ inline float BlockRowGate(const float* xr, const float* __restrict__ gate_w, int H,
                                     bool vec, float* slot) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < km::kWarp) {
    float dot;
    km::WarpDotRows<1>(&xr, gate_w, H, vec, tid, &dot);
    if (tid == 0) *slot = km::Sigmoid(dot);
  }
  __syncthreads();
  return *slot;
}

// x, sh, out f32 [T, H], gate_w f32 [H]; one block per row t.
__global__ void __launch_bounds__(kThreads)
    SharedGateKernel(const float* __restrict__ x, const float* __restrict__ gate_w,
                     const float* __restrict__ sh, int H, float* __restrict__ out, bool vec) {
  __shared__ float gate_s;
  const int tid = static_cast<int>(threadIdx.x);
  const std::size_t row = static_cast<std::size_t>(blockIdx.x) * static_cast<std::size_t>(H);
  const float gate = BlockRowGate(x + row, gate_w, H, vec, &gate_s);
  for (int i = tid; i < H; i += kThreads)
    out[row + static_cast<std::size_t>(i)] = km::SharedGateAddElem(
        out[row + static_cast<std::size_t>(i)], gate, sh[row + static_cast<std::size_t>(i)]);
}

// The end of an MoE layer in one launch, one block per row t: MoeCombine, SharedGateAdd (when
// sh), AddInPlace into the residual and, when norm_w, the next layer's input RmsNormZc, each
// with its kernel's operations in its order, so the bits are the four launches':
//   o = sum_r wts[t, r] * ranked[t, r] (rank order, from 0); o += sigmoid(x[t] . gate_w) * sh[t];
//   hid[t] += o; y[t] = RmsNormZc(hid[t]) with weight norm_w.
// Warp 0 computes the gate dot (BlockRowGate, as SharedGateAdd) and, after a barrier (the other
// threads' hid writes are then visible to it), the row's sum of squares (RmsNormZc's warp dot).
__global__ void __launch_bounds__(kThreads)
    MoeEpilogueKernel(const float* __restrict__ ranked, const float* __restrict__ wts, int k, int H,
                      const float* __restrict__ x, const float* __restrict__ gate_w,
                      const float* __restrict__ sh, float* hid, const float* __restrict__ norm_w,
                      float eps, float* __restrict__ y, bool vec_gate, bool vec_norm) {
  __shared__ float bcast;
  const int tid = static_cast<int>(threadIdx.x);
  const std::size_t t = blockIdx.x, row = t * static_cast<std::size_t>(H);
  const float gate = sh != nullptr ? BlockRowGate(x + row, gate_w, H, vec_gate, &bcast) : 0.0f;
  float* hr = hid + row;
  for (int i = tid; i < H; i += kThreads) {
    float acc = 0.0f;
    for (int r = 0; r < k; ++r) {
      const std::size_t tr = t * static_cast<std::size_t>(k) + static_cast<std::size_t>(r);
      acc = km::CombineRank(acc, wts[tr],
                            ranked[tr * static_cast<std::size_t>(H) + static_cast<std::size_t>(i)]);
    }
    if (sh != nullptr)
      acc = km::SharedGateAddElem(acc, gate, sh[row + static_cast<std::size_t>(i)]);
    hr[i] = km::AddElem(hr[i], acc);
  }
  if (norm_w == nullptr) return;
  __syncthreads();  // the whole row is written (and every thread has read the gate from bcast)
  if (tid < km::kWarp) {
    const float* xc = hr;
    float ss;
    km::WarpDotRows<1>(&xc, xc, H, vec_norm, tid, &ss);
    if (tid == 0) bcast = km::RmsInv(ss, H, eps);
  }
  __syncthreads();
  const float r = bcast;
  for (int i = tid; i < H; i += kThreads)
    y[row + static_cast<std::size_t>(i)] = km::RmsNormZcElem(hr[i], r, norm_w[i]);
}

unsigned GridFor(std::int64_t total) {
  const std::int64_t want = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(want < 65535 ? want : 65535);
}

}  // namespace

void RouteTopK(const float* logits, int T, int n_experts, int k, bool norm, int* idx, float* wts,
               int* idx_host, cudaStream_t s) {
  if (T <= 0 || n_experts <= 0 || k <= 0) return;
  RouteKernel<<<static_cast<unsigned>(T), km::kRouteThreads, 0, s>>>(logits, n_experts, k, norm,
                                                                     idx, wts, idx_host);
}

void GroupByExpert(const int* idx, int T, int k, int n_experts, int* slot_of, int* first,
                   int* active, int* n_active, cudaStream_t s) {
  if (n_experts <= 0) return;
  const int n = T > 0 && k > 0 ? T * k : 0;
  const std::size_t smem = (static_cast<std::size_t>(n_experts) + 1) * sizeof(int);
  GroupKernel<<<1, kGroupThreads, smem, s>>>(idx, n, n_experts, slot_of, first, active, n_active);
}

bool RouteAndGroupFused(int T, int n_experts, int k) {
  return T >= 1 && T <= kRouteWarpRows && n_experts >= 1 && n_experts <= kRouteWarpMaxExperts &&
         k >= 1 && k <= n_experts;
}

void RouteAndGroup(const float* logits, int T, int n_experts, int k, bool norm, int* idx,
                   float* wts, int* idx_host, int* slot_of, int* first, int* active, int* n_active,
                   cudaStream_t s) {
  if (!RouteAndGroupFused(T, n_experts, k)) {
    RouteTopK(logits, T, n_experts, k, norm, idx, wts, idx_host, s);
    GroupByExpert(idx, T, k, n_experts, slot_of, first, active, n_active, s);
    return;
  }
  const std::size_t smem = (static_cast<std::size_t>(n_experts) + 1) * sizeof(int);
  RouteGroupKernel<<<1, kRouteGroupThreads, smem, s>>>(logits, T, n_experts, k, norm, idx, wts,
                                                       idx_host, slot_of, first, active, n_active);
}

void ExpertGateUp(const float* x, int H, int I, int k, const int* slot_of, const int* first,
                  const int* active, const int* n_active, int max_active, const void* const* gate_w,
                  const void* const* up_w, bool bf16, float* act, cudaStream_t s) {
  if (max_active <= 0 || H <= 0 || I <= 0) return;
  const dim3 grid(static_cast<unsigned>(max_active),
                  static_cast<unsigned>((I + kMoeWarps - 1) / kMoeWarps));
  if (bf16) {
    GateUpKernel<std::uint16_t><<<grid, kMoeWarps * km::kWarp, 0, s>>>(
        x, H, I, k, slot_of, first, active, n_active, gate_w, up_w, act);
  } else {
    GateUpKernel<float><<<grid, kMoeWarps * km::kWarp, 0, s>>>(x, H, I, k, slot_of, first, active,
                                                               n_active, gate_w, up_w, act);
  }
}

void ExpertDown(const float* act, int H, int I, const int* slot_of, const int* first,
                const int* active, const int* n_active, int max_active, const void* const* down_w,
                bool bf16, float* ranked, cudaStream_t s, DenseDown dense) {
  if (dense.T <= 0 || dense.I <= 0) dense.w = nullptr;
  if (max_active <= 0 || I <= 0) max_active = 0;  // no routed product; the dense one may remain
  if (H <= 0 || (max_active == 0 && dense.w == nullptr)) return;
  const dim3 grid(static_cast<unsigned>(max_active + (dense.w != nullptr ? 1 : 0)),
                  static_cast<unsigned>((H + kMoeWarps - 1) / kMoeWarps));
  if (bf16) {
    DownKernel<std::uint16_t><<<grid, kMoeWarps * km::kWarp, 0, s>>>(
        act, H, I, slot_of, first, active, n_active, down_w, ranked, dense);
  } else {
    DownKernel<float><<<grid, kMoeWarps * km::kWarp, 0, s>>>(act, H, I, slot_of, first, active,
                                                             n_active, down_w, ranked, dense);
  }
}

void MoeCombine(const float* ranked, const float* wts, int T, int k, int H, float* out,
                cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  CombineKernel<<<GridFor(static_cast<std::int64_t>(T) * H), kThreads, 0, s>>>(ranked, wts, T, k, H,
                                                                               out);
}

void SharedGateAdd(const float* x, const float* gate_w, const float* sh, int T, int H, float* out,
                   cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  const bool vec = H % 4 == 0 && km::Aligned(x, 16) && km::Aligned(gate_w, 16);
  SharedGateKernel<<<static_cast<unsigned>(T), kThreads, 0, s>>>(x, gate_w, sh, H, out, vec);
}

void MoeEpilogue(const float* ranked, const float* wts, int T, int k, int H, const float* x,
                 const float* gate_w, const float* sh, float* hid, const float* norm_w, float eps,
                 float* y, cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  const bool vec_gate =
      sh != nullptr && H % 4 == 0 && km::Aligned(x, 16) && km::Aligned(gate_w, 16);
  const bool vec_norm = H % 4 == 0 && km::Aligned(hid, 16);
  MoeEpilogueKernel<<<static_cast<unsigned>(T), kThreads, 0, s>>>(
      ranked, wts, k, H, x, gate_w, sh, hid, norm_w, eps, y, vec_gate, vec_norm);
}

}  // namespace lockstep::cuda
