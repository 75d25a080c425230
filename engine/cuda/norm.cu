// Row normalisations (cpu/norm.cpp's device twins): zero-centred RMSNorm and gated RMSNorm.
//
// Layout: one warp per row. The sum of squares is the batch-invariant dot product x . x
// (km::WarpDotRows<1>, the same lane order as RowsMatmul), then each lane scales its elements.
//
// Determinism: a row's result depends only on that row (fixed lane order over n, fixed butterfly),
// never on `rows`, the grid or the block; no atomics.
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// x row r at x + r*ldx, y row r at y + r*ldy (may alias x: every element is read for the sum
// before the butterfly, and each lane reads x[i] before writing y[i]). w f32 [n].
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    RmsNormZcKernel(const float* x, int ldx, int rows, int n, const float* __restrict__ w,
                    float eps, float* y, int ldy, bool vec) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int row =
      static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / km::kWarp;
  if (row >= rows) return;
  const float* xr = x + static_cast<std::size_t>(row) * static_cast<std::size_t>(ldx);
  float* yr = y + static_cast<std::size_t>(row) * static_cast<std::size_t>(ldy);
  float ss;
  km::WarpDotRows<1>(&xr, xr, n, vec, lane, &ss);
  const float r = km::RmsInv(ss, n, eps);
  for (int i = lane; i < n; i += km::kWarp) yr[i] = km::RmsNormZcElem(xr[i], r, w[i]);
}

// hid row r += add row r, then y row r = RmsNormZc(hid row r) (AddInPlace + RmsNormZc in one
// launch). Each lane adds and scales exactly the elements it sums in WarpDotRows (chunks of four
// at 4 * lane + 128 k, in the vector and the scalar path alike), so no lane reads an element
// another lane wrote and no barrier is needed; the values and the sum are the two kernels'.
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    AddRmsNormZcKernel(float* hid, const float* __restrict__ add, int rows, int n,
                       const float* __restrict__ w, float eps, float* __restrict__ y, bool vec) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int row =
      static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / km::kWarp;
  if (row >= rows) return;
  const std::size_t off = static_cast<std::size_t>(row) * static_cast<std::size_t>(n);
  float* xr = hid + off;
  for (int b = km::kLaneVec * lane; b < n; b += km::kChunk)
    for (int c = 0; c < km::kLaneVec && b + c < n; ++c)
      xr[b + c] = km::AddElem(xr[b + c], add[off + b + c]);
  const float* xc = xr;
  float ss;
  km::WarpDotRows<1>(&xc, xc, n, vec, lane, &ss);
  const float r = km::RmsInv(ss, n, eps);
  for (int b = km::kLaneVec * lane; b < n; b += km::kChunk)
    for (int c = 0; c < km::kLaneVec && b + c < n; ++c)
      y[off + b + c] = km::RmsNormZcElem(xr[b + c], r, w[b + c]);
}

// x, z, y f32 [rows, n] contiguous; w f32 [n].
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    GatedRmsNormKernel(const float* x, const float* __restrict__ z, int rows, int n,
                       const float* __restrict__ w, float eps, float* y, bool vec) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int row =
      static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / km::kWarp;
  if (row >= rows) return;
  const std::size_t off = static_cast<std::size_t>(row) * static_cast<std::size_t>(n);
  const float* xr = x + off;
  float ss;
  km::WarpDotRows<1>(&xr, xr, n, vec, lane, &ss);
  const float r = km::RmsInv(ss, n, eps);
  for (int i = lane; i < n; i += km::kWarp)
    y[off + static_cast<std::size_t>(i)] =
        km::GatedRmsNormElem(xr[i], r, w[i], z[off + static_cast<std::size_t>(i)]);
}

unsigned Blocks(int rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void RmsNormZc(const float* x, int ldx, int rows, int n, const float* w, float eps, float* y,
               int ldy, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && ldx % 4 == 0 && km::Aligned(x, 16);
  RmsNormZcKernel<<<Blocks(rows), kWarpsPerBlock * km::kWarp, 0, s>>>(x, ldx, rows, n, w, eps, y,
                                                                      ldy, vec);
}

void AddRmsNormZc(float* hid, const float* add, int rows, int n, const float* w, float eps,
                  float* y, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && km::Aligned(hid, 16);
  AddRmsNormZcKernel<<<Blocks(rows), kWarpsPerBlock * km::kWarp, 0, s>>>(hid, add, rows, n, w, eps,
                                                                         y, vec);
}

void GatedRmsNorm(const float* x, const float* z, int rows, int n, const float* w, float eps,
                  float* y, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && km::Aligned(x, 16);
  GatedRmsNormKernel<<<Blocks(rows), kWarpsPerBlock * km::kWarp, 0, s>>>(x, z, rows, n, w, eps, y,
                                                                         vec);
}

}  // namespace lockstep::cuda
