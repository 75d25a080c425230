// Elementwise ops and the embedding gather.
//
// Layout: grid-stride loops over int64 element counts, the grid capped at 65535 blocks (any grid
// gives the same results: each element is computed by exactly one thread from its own inputs).
//
// Determinism: pure per-element functions (kernel_math.h bodies); no reductions, no atomics.
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(std::int64_t total) {
  const std::int64_t want = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(want < 65535 ? want : 65535);
}

#define LOCKSTEP_GRID_STRIDE(idx, n)                                                        \
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       idx < (n); idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

// embed f32 [vocab, H], tokens int32 [T] -> out f32 [T, H].
__global__ void __launch_bounds__(kThreads)
    EmbedKernel(const float* __restrict__ embed, const int* __restrict__ tokens, int T, int H,
                float* __restrict__ out) {
  const std::int64_t n = static_cast<std::int64_t>(T) * H;
  LOCKSTEP_GRID_STRIDE(idx, n) {
    const std::int64_t t = idx / H, i = idx - t * H;
    out[idx] = embed[static_cast<std::int64_t>(tokens[t]) * H + i];
  }
}

// x f32 [n] += y f32 [n].
__global__ void __launch_bounds__(kThreads)
    AddKernel(float* __restrict__ x, const float* __restrict__ y, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(idx, n) x[idx] = km::AddElem(x[idx], y[idx]);
}

// g f32 [n] = silu(g) * u f32 [n].
__global__ void __launch_bounds__(kThreads)
    SiluMulKernel(float* __restrict__ g, const float* __restrict__ u, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(idx, n) g[idx] = km::SiluMulElem(g[idx], u[idx]);
}

// x f32 [n] *= sigmoid(gate f32 [n]).
__global__ void __launch_bounds__(kThreads)
    MulSigmoidKernel(float* __restrict__ x, const float* __restrict__ gate, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(idx, n) x[idx] = km::MulSigmoidElem(x[idx], gate[idx]);
}

// x f32 [n] *= factor.
__global__ void __launch_bounds__(kThreads)
    ScaleKernel(float* __restrict__ x, std::int64_t n, float factor) {
  LOCKSTEP_GRID_STRIDE(idx, n) x[idx] = km::ScaleElem(x[idx], factor);
}

// *dst = value: the step's position written on the stream, in order with the kernels that read it
// (a stream-ordered host copy would need its own pinned slot per step).
__global__ void __launch_bounds__(1) SetIntKernel(int* __restrict__ dst, int value) {
  *dst = value;
}

#undef LOCKSTEP_GRID_STRIDE

}  // namespace

void EmbedRows(const float* embed, const int* tokens, int T, int H, float* out, cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  EmbedKernel<<<GridFor(static_cast<std::int64_t>(T) * H), kThreads, 0, s>>>(embed, tokens, T, H,
                                                                             out);
}

void AddInPlace(float* x, const float* y, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  AddKernel<<<GridFor(n), kThreads, 0, s>>>(x, y, n);
}

void SiluMul(float* g, const float* u, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  SiluMulKernel<<<GridFor(n), kThreads, 0, s>>>(g, u, n);
}

void MulSigmoid(float* x, const float* gate, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  MulSigmoidKernel<<<GridFor(n), kThreads, 0, s>>>(x, gate, n);
}

void Scale(float* x, std::int64_t n, float factor, cudaStream_t s) {
  if (n <= 0) return;
  ScaleKernel<<<GridFor(n), kThreads, 0, s>>>(x, n, factor);
}

void SetInt(int* dst, int value, cudaStream_t s) { SetIntKernel<<<1, 1, 0, s>>>(dst, value); }

}  // namespace lockstep::cuda
