// Partial NeoX RoPE in place (cpu::Rope::Apply's device twin).
//
// Layout: one thread per rotated pair (t, head, i < R/2); it computes phi = float(p0 + t) *
// inv_freq[i] and cos / sin itself (the same f32 angle the CPU forms; cosf / sinf are CUDA's,
// within 2 ulp of the host's). Dims [R, D) are not touched.
//
// Determinism: each element is a pure function of its own inputs; no reductions, no atomics.
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kThreads = 256;

// x f32 [T, n_heads, head_dim] with row stride ld; inv_freq f32 [half].
__global__ void __launch_bounds__(kThreads)
    RopeKernel(float* __restrict__ x, int T, int ld, int n_heads, int head_dim, int half,
               const float* __restrict__ inv_freq, Pos pos) {
  const int p0 = pos.Get();
  const std::int64_t total = static_cast<std::int64_t>(T) * n_heads * half;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const std::int64_t th = idx / half;
    const int h = static_cast<int>(th % n_heads);
    const int t = static_cast<int>(th / n_heads);
    const float phi = km::RopeAngle(p0 + t, inv_freq[i]);
    const float cs = ::cosf(phi), sn = ::sinf(phi);
    float* v = x + static_cast<std::size_t>(t) * static_cast<std::size_t>(ld) +
               static_cast<std::size_t>(h) * static_cast<std::size_t>(head_dim);
    float ra, rb;
    km::RopeRotate(v[i], v[i + half], cs, sn, &ra, &rb);
    v[i] = ra;
    v[i + half] = rb;
  }
}

}  // namespace

void RopeApply(float* x, int T, int ld, int n_heads, int head_dim, int rotary_dim,
               const float* inv_freq, Pos p0, cudaStream_t s) {
  const int half = rotary_dim / 2;
  if (T <= 0 || n_heads <= 0 || half <= 0) return;
  const std::int64_t total = static_cast<std::int64_t>(T) * n_heads * half;
  const std::int64_t want = (total + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 ? want : 65535);
  RopeKernel<<<blocks, kThreads, 0, s>>>(x, T, ld, n_heads, head_dim, half, inv_freq, p0);
}

}  // namespace lockstep::cuda
