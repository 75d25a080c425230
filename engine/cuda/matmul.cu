// RowsMatmul: the batch-invariant product of decode steps and verify windows (cpu::Matmul
// kInvariant's device twin). See ops.h for the contract and kernel_math.h for the arithmetic.
//
// Layout: one warp per output row o. The warp walks the T input rows in passes of 8, 4, 2, 1 rows
// (kernel_math.h RowGroupSize); in a pass each lane loads one float4 of W's row o per 128-element
// chunk and applies it to every row of the pass, so the weight row is read once per pass (once in
// total for T <= 8, the decode and small-verify case) and the memory traffic is W's bytes.
//
// Determinism: y[t, o] is LanePartial over n_in followed by the fixed butterfly, whatever T, the
// pass the row lands in, the grid or the block size; no atomics. Bitwise batch-invariant.
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;  // 4 output rows per block: many blocks even for small n_out

template <int R>
__device__ inline void RowsPass(const float* x, int n_in, int t0, const float* w, bool vec,
                                int lane, float* y, int ldy, int o) {
  const float* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    rows[r] = x + static_cast<std::size_t>(t0 + r) * static_cast<std::size_t>(n_in);
  float out[R];
  km::WarpDotRows<R>(rows, w, n_in, vec, lane, out);
  // Lane r stores row r (every lane holds every result): R stores in parallel, not R from lane 0.
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (lane == r)
      y[static_cast<std::size_t>(t0 + r) * static_cast<std::size_t>(ldy) +
        static_cast<std::size_t>(o)] = out[r];
}

// x f32 [T, n_in], W f32 [n_out, n_in], y f32 [T, ldy]. Grid: ceil(n_out / kWarpsPerBlock).
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    RowsMatmulKernel(const float* __restrict__ x, int T, const float* __restrict__ W, int n_out,
                     int n_in, float* __restrict__ y, int ldy, bool vec) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int o =
      static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / km::kWarp;
  if (o >= n_out) return;  // the whole warp leaves together (shuffles stay full-warp)
  const float* w = W + static_cast<std::size_t>(o) * static_cast<std::size_t>(n_in);
  int t0 = 0;
  while (t0 < T) {
    const int g = km::RowGroupSize(T - t0);
    if (g == 8) {
      RowsPass<8>(x, n_in, t0, w, vec, lane, y, ldy, o);
    } else if (g == 4) {
      RowsPass<4>(x, n_in, t0, w, vec, lane, y, ldy, o);
    } else if (g == 2) {
      RowsPass<2>(x, n_in, t0, w, vec, lane, y, ldy, o);
    } else {
      RowsPass<1>(x, n_in, t0, w, vec, lane, y, ldy, o);
    }
    t0 += g;
  }
}

}  // namespace

void RowsMatmul(const float* x, int T, const float* W, int n_out, int n_in, float* y, int ldy,
                cudaStream_t s) {
  if (T <= 0 || n_out <= 0 || n_in <= 0) return;
  // float4 path only when every row start is 16-byte aligned; otherwise the scalar path (same
  // bits, slower).
  const bool vec = n_in % 4 == 0 && km::Aligned(x, 16) && km::Aligned(W, 16);
  const unsigned blocks = static_cast<unsigned>((n_out + kWarpsPerBlock - 1) / kWarpsPerBlock);
  RowsMatmulKernel<<<blocks, kWarpsPerBlock * km::kWarp, 0, s>>>(x, T, W, n_out, n_in, y, ldy, vec);
}

}  // namespace lockstep::cuda
