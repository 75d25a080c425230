// RowsMatmul: the batch-invariant product of decode steps and verify windows (cpu::Matmul
// kInvariant's device twin). See ops.h for the contract and kernel_math.h for the arithmetic.
//
// Layout: one warp per output row o. The warp walks the T input rows in passes of up to 16 rows
// (kernel_math.h RowGroupSize / RowPassWidth); in a pass each lane loads four elements of W's row
// o per 128-element chunk and applies them to every row of the pass, so the weight row is read
// once per pass (once in total for T <= 16: decode and every verify window of the speculative
// drafts) and the memory traffic is W's bytes.
//
// Determinism: y[t, o] is LanePartial over n_in followed by the fixed butterfly, whatever T, the
// pass the row lands in, the grid or the block size; no atomics. Bitwise batch-invariant.
//
// Weights are f32 or bf16 bits (a stage whose matrices are all bf16 values keeps them as bf16:
// half the bytes, the same f32 operations on the same values, so the same bits).
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;  // 4 output rows per block: many blocks even for small n_out

// x f32 [T, n_in], W f32 or bf16 [n_out, n_in], y f32 [T, ldy]. Grid: ceil(n_out / kWarpsPerBlock).
template <typename WT>
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    RowsMatmulKernel(const float* __restrict__ x, int T, const WT* __restrict__ W, int n_out,
                     int n_in, float* __restrict__ y, int ldy, bool vec) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int o =
      static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / km::kWarp;
  if (o >= n_out) return;  // the whole warp leaves together (shuffles stay full-warp)
  const WT* w = W + static_cast<std::size_t>(o) * static_cast<std::size_t>(n_in);
  km::RowsAllPasses(x, T, n_in, w, vec, lane, y, ldy, o);
}

// Up to three products of the same x in one launch (RowsMatmulMulti): block b belongs to product
// j for b in [first1, first2) -> 1, [first2, ..) -> 2, else 0; within it the warp computes output
// row o exactly as RowsMatmulKernel does (same passes, same order), so the bits are the same.
// Wu_j: product j is a SwiGLU pair (RowsProduct::W_up).
template <typename WT>
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    RowsMatmul3Kernel(const float* __restrict__ x, int T, int n_in, bool vec,
                      const WT* __restrict__ W0, int n0, float* __restrict__ y0, int ldy0,
                      const WT* __restrict__ W1, int n1, float* __restrict__ y1, int ldy1,
                      const WT* __restrict__ W2, int n2, float* __restrict__ y2, int ldy2,
                      int first1, int first2, const WT* __restrict__ Wu0,
                      const WT* __restrict__ Wu1, const WT* __restrict__ Wu2) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int b = static_cast<int>(blockIdx.x);
  const int j = b >= first2 ? 2 : b >= first1 ? 1 : 0;
  const WT* W = j == 0 ? W0 : j == 1 ? W1 : W2;
  const WT* Wu = j == 0 ? Wu0 : j == 1 ? Wu1 : Wu2;
  float* y = j == 0 ? y0 : j == 1 ? y1 : y2;
  const int n_out = j == 0 ? n0 : j == 1 ? n1 : n2;
  const int ldy = j == 0 ? ldy0 : j == 1 ? ldy1 : ldy2;
  const int o = (b - (j == 0   ? 0
                      : j == 1 ? first1
                               : first2)) *
                    kWarpsPerBlock +
                static_cast<int>(threadIdx.x) / km::kWarp;
  if (o >= n_out) return;  // the whole warp leaves together
  const std::size_t row = static_cast<std::size_t>(o) * static_cast<std::size_t>(n_in);
  const WT* w = W + row;
  const WT* wu = Wu != nullptr ? Wu + row : nullptr;
  km::RowsAllPasses(x, T, n_in, w, vec, lane, y, ldy, o, wu);
}

// bf16 bits [n] -> f32 [n] (exact); a grid-stride loop.
__global__ void __launch_bounds__(256) WidenBf16Kernel(const std::uint16_t* __restrict__ src,
                                                       std::int64_t n, float* __restrict__ dst) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = km::Bf16ToF32(src[i]);
}

template <typename WT>
void LaunchRows(const float* x, int T, const WT* W, int n_out, int n_in, float* y, int ldy,
                cudaStream_t s) {
  if (T <= 0 || n_out <= 0 || n_in <= 0) return;
  // Vector loads only when every row start is aligned; otherwise the scalar path (same bits,
  // slower).
  const bool vec = n_in % 4 == 0 && km::Aligned(x, 16) && km::Aligned(W, km::kWeightVecAlign<WT>);
  const unsigned blocks = static_cast<unsigned>((n_out + kWarpsPerBlock - 1) / kWarpsPerBlock);
  RowsMatmulKernel<WT>
      <<<blocks, kWarpsPerBlock * km::kWarp, 0, s>>>(x, T, W, n_out, n_in, y, ldy, vec);
}

unsigned BlocksFor(int n_out) {
  return static_cast<unsigned>((n_out + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

template <typename WT>
void LaunchRows3(const float* x, int T, int n_in, const RowsProduct<WT>* p, int n, cudaStream_t s) {
  if (T <= 0 || n_in <= 0 || n <= 0) return;
  RowsProduct<WT> q[3] = {p[0], n > 1 ? p[1] : RowsProduct<WT>{}, n > 2 ? p[2] : RowsProduct<WT>{}};
  bool vec = n_in % 4 == 0 && km::Aligned(x, 16);
  for (int i = 0; i < n; ++i)
    vec = vec && km::Aligned(q[i].W, km::kWeightVecAlign<WT>) &&
          km::Aligned(q[i].W_up, km::kWeightVecAlign<WT>);
  const unsigned b0 = BlocksFor(q[0].n_out), b1 = BlocksFor(q[1].n_out), b2 = BlocksFor(q[2].n_out);
  if (b0 + b1 + b2 == 0) return;
  RowsMatmul3Kernel<WT><<<b0 + b1 + b2, kWarpsPerBlock * km::kWarp, 0, s>>>(
      x, T, n_in, vec, q[0].W, q[0].n_out, q[0].y, q[0].ldy, q[1].W, q[1].n_out, q[1].y, q[1].ldy,
      q[2].W, q[2].n_out, q[2].y, q[2].ldy, static_cast<int>(b0), static_cast<int>(b0 + b1),
      q[0].W_up, q[1].W_up, q[2].W_up);
}

}  // namespace

void RowsMatmulMulti(const float* x, int T, int n_in, const RowsProduct<float>* p, int n,
                     cudaStream_t s) {
  LaunchRows3(x, T, n_in, p, n, s);
}

void RowsMatmulMulti(const float* x, int T, int n_in, const RowsProduct<std::uint16_t>* p, int n,
                     cudaStream_t s) {
  LaunchRows3(x, T, n_in, p, n, s);
}

void RowsMatmul(const float* x, int T, const float* W, int n_out, int n_in, float* y, int ldy,
                cudaStream_t s) {
  LaunchRows(x, T, W, n_out, n_in, y, ldy, s);
}

void RowsMatmul(const float* x, int T, const std::uint16_t* W, int n_out, int n_in, float* y,
                int ldy, cudaStream_t s) {
  LaunchRows(x, T, W, n_out, n_in, y, ldy, s);
}

// At most 1024 blocks of 256 threads: about one wave on an H200 (132 SMs x 8 blocks) or an A100,
// each thread looping over its elements; a matrix of 25M elements had 65535 blocks before, which
// only added block scheduling on a GPU and cost the CPU emulator one fiber per element (8 s of a
// `wide-lite` test's prefill).
void WidenBf16(const std::uint16_t* src, std::int64_t n, float* dst, cudaStream_t s) {
  if (n <= 0) return;
  const std::int64_t want = (n + 255) / 256;
  WidenBf16Kernel<<<static_cast<unsigned>(want < 1024 ? want : 1024), 256, 0, s>>>(src, n, dst);
}

}  // namespace lockstep::cuda
