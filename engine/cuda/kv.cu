// K/V cache stores and fault-injection scaling (KvCache::StoreRow / ScaleRows' device twins).
//
// KvStore layout: one warp per (row t, kv head, K or V). f32 copies; bf16 rounds each element
// (km::F32ToBf16, the integer steps of dtype.cpp); int8 takes the warp's max |x| (exact in any
// order), scale = max / 127, codes = nearbyint(x / scale) (km::Int8Code, dtype.cpp's steps).
//
// Determinism: every stored element and scale is a pure function of its own (row, head) slice;
// the max is order-independent; no atomics. The stored bits equal KvCache's.
#include "cuda/kernel_math.h"
#include "cuda/ops.h"

namespace lockstep::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 256;

// k, v f32 [T, Hkv, D]; caches [rows, Hkv, D] of kv_dtype; scales f32 [rows, Hkv] (int8 only).
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    KvStoreKernel(const float* __restrict__ k, const float* __restrict__ v, int T, Pos pos0,
                  int n_heads_kv, int D, int kv_dtype, void* __restrict__ k_cache,
                  void* __restrict__ v_cache, float* __restrict__ k_scales,
                  float* __restrict__ v_scales) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int item =
      static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / km::kWarp;
  if (item >= 2 * T * n_heads_kv) return;
  const int row0 = pos0.Get();
  const int which = item % 2, th = item / 2;  // th = t * Hkv + h
  const int t = th / n_heads_kv, h = th - t * n_heads_kv;
  const std::size_t ud = static_cast<std::size_t>(D);
  const float* src = (which == 0 ? k : v) + static_cast<std::size_t>(th) * ud;
  const std::size_t rh = static_cast<std::size_t>(row0 + t) * static_cast<std::size_t>(n_heads_kv) +
                         static_cast<std::size_t>(h);
  const std::size_t dst = rh * ud;
  void* cache = which == 0 ? k_cache : v_cache;
  if (kv_dtype == 0) {
    float* d = static_cast<float*>(cache) + dst;
    for (int i = lane; i < D; i += km::kWarp) d[i] = src[i];
  } else if (kv_dtype == 1) {
    std::uint16_t* d = static_cast<std::uint16_t*>(cache) + dst;
    for (int i = lane; i < D; i += km::kWarp) d[i] = km::F32ToBf16(src[i]);
  } else {
    float amax = 0.0f;
    for (int i = lane; i < D; i += km::kWarp) amax = km::AbsMaxStep(amax, src[i]);
    amax = km::WarpAbsMax(amax);
    const float scale = km::Int8Scale(amax);
    std::int8_t* d = static_cast<std::int8_t*>(cache) + dst;
    for (int i = lane; i < D; i += km::kWarp) d[i] = km::Int8Code(src[i], scale);
    if (lane == 0) (which == 0 ? k_scales : v_scales)[rh] = scale;
  }
}

// f32 / bf16: one thread per element of rows [row0, row0 + n); int8: one thread per (row, head)
// scale. `cache` is the K or V array, `scales` its scales.
__global__ void __launch_bounds__(kThreads)
    KvScaleKernel(std::int64_t row_begin, std::int64_t count, int kv_dtype,
                  void* __restrict__ cache, float* __restrict__ scales, float factor) {
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < count; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t at = row_begin + idx;
    if (kv_dtype == 0) {
      float* d = static_cast<float*>(cache);
      d[at] = km::ScaleElem(d[at], factor);
    } else if (kv_dtype == 1) {
      std::uint16_t* d = static_cast<std::uint16_t*>(cache);
      d[at] = km::F32ToBf16(km::ScaleElem(km::Bf16ToF32(d[at]), factor));
    } else {
      scales[at] = km::ScaleElem(scales[at], factor);
    }
  }
}

}  // namespace

void KvStore(const float* k, const float* v, int T, Pos row0, int n_heads_kv, int head_dim,
             int kv_dtype, void* k_cache, void* v_cache, float* k_scales, float* v_scales,
             cudaStream_t s) {
  if (T <= 0 || n_heads_kv <= 0 || head_dim <= 0) return;
  const int items = 2 * T * n_heads_kv;
  const unsigned blocks = static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  KvStoreKernel<<<blocks, kWarpsPerBlock * km::kWarp, 0, s>>>(
      k, v, T, row0, n_heads_kv, head_dim, kv_dtype, k_cache, v_cache, k_scales, v_scales);
}

void KvScaleRows(int which, int row0, int n, int n_heads_kv, int head_dim, int kv_dtype,
                 void* k_cache, void* v_cache, float* k_scales, float* v_scales, float factor,
                 cudaStream_t s) {
  if (n <= 0 || n_heads_kv <= 0 || head_dim <= 0) return;
  // int8 scales the (row, head) scales; the others every element of the rows.
  const std::int64_t per_row =
      kv_dtype == 2 ? n_heads_kv : static_cast<std::int64_t>(n_heads_kv) * head_dim;
  const std::int64_t count = per_row * n, begin = per_row * row0;
  const std::int64_t want = (count + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 ? want : 65535);
  KvScaleKernel<<<blocks, kThreads, 0, s>>>(begin, count, kv_dtype, which == 0 ? k_cache : v_cache,
                                            which == 0 ? k_scales : v_scales, factor);
}

}  // namespace lockstep::cuda
