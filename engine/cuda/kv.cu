// K/V cache stores and fault-injection scaling (KvCache::StoreRow / ScaleRows' device twins), and
// the attention layer's input prep in one launch (AttnPrep).
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

// Stores one (row, head) slice of the cache, the warp's lanes together: value(i) gives element i
// (a pure function of i, so the int8 path may call it twice: once for the max, once for the
// codes). The element-to-lane layout is free: every stored element is a function of itself and,
// for int8, of the slice's max |x|, which is exact in any order.
template <typename Value>
__device__ inline void StoreHead(int D, int kv_dtype, void* cache, float* scales, std::size_t rh,
                                 int lane, Value value) {
  const std::size_t dst = rh * static_cast<std::size_t>(D);
  if (kv_dtype == 0) {
    float* d = static_cast<float*>(cache) + dst;
    for (int i = lane; i < D; i += km::kWarp) d[i] = value(i);
  } else if (kv_dtype == 1) {
    std::uint16_t* d = static_cast<std::uint16_t*>(cache) + dst;
    for (int i = lane; i < D; i += km::kWarp) d[i] = km::F32ToBf16(value(i));
  } else {
    float amax = 0.0f;
    for (int i = lane; i < D; i += km::kWarp) amax = km::AbsMaxStep(amax, value(i));
    amax = km::WarpAbsMax(amax);
    const float scale = km::Int8Scale(amax);
    std::int8_t* d = static_cast<std::int8_t*>(cache) + dst;
    for (int i = lane; i < D; i += km::kWarp) d[i] = km::Int8Code(value(i), scale);
    if (lane == 0) scales[rh] = scale;
  }
}

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
  StoreHead(D, kv_dtype, which == 0 ? k_cache : v_cache, which == 0 ? k_scales : v_scales, rh, lane,
            [&](int i) { return src[i]; });
}

// Element i of a head normed (zero-centred RMSNorm, inverse rms r, weight w) and rotated (partial
// NeoX RoPE at angle index i % half for i < 2 * half; later dims only normed). Both elements of a
// pair are normed from src exactly as RmsNormZcKernel writes them, then km::RopeRotate as
// RopeKernel applies it, so the value is bitwise the three kernels' (norm, rope, store).
__device__ inline float NormRopeElem(const float* src, int i, int half, float r, const float* w,
                                     const float* inv_freq, int pos) {
  if (i >= 2 * half) return km::RmsNormZcElem(src[i], r, w[i]);
  const int a = i < half ? i : i - half;
  const float phi = km::RopeAngle(pos, inv_freq[a]);
  const float cs = ::cosf(phi), sn = ::sinf(phi);
  float ra, rb;
  km::RopeRotate(km::RmsNormZcElem(src[a], r, w[a]),
                 km::RmsNormZcElem(src[a + half], r, w[a + half]), cs, sn, &ra, &rb);
  return i < half ? ra : rb;
}

// One warp per item of row t: query head h (items [0, Hq)): the q half of qg normed and rotated
// into q; kv head h K (items [Hq, Hq + Hkv)): normed, rotated and stored at cache row pos + t;
// kv head h V (the last Hkv items): stored. qg f32 [T, Hq, 2, D]; k, v f32 [T, Hkv, D]; q f32
// [T, Hq, D]. vec: D % 4 == 0 and qg, k 16-byte aligned (WarpDotRows' loads).
__global__ void __launch_bounds__(kWarpsPerBlock* km::kWarp)
    AttnPrepKernel(const float* __restrict__ qg, const float* __restrict__ k,
                   const float* __restrict__ v, int T, Pos pos0, int n_heads, int n_heads_kv, int D,
                   int half, const float* __restrict__ inv_freq, const float* __restrict__ q_norm,
                   const float* __restrict__ k_norm, float eps, int kv_dtype,
                   void* __restrict__ k_cache, void* __restrict__ v_cache,
                   float* __restrict__ k_scales, float* __restrict__ v_scales,
                   float* __restrict__ q, bool vec) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarp;
  const int item =
      static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / km::kWarp;
  const int per_row = n_heads + 2 * n_heads_kv;
  if (item >= T * per_row) return;  // the whole warp leaves together
  const int t = item / per_row, sub = item - t * per_row;
  const int pos = pos0.Get() + t;
  const std::size_t ud = static_cast<std::size_t>(D);
  const bool is_q = sub < n_heads, is_v = sub >= n_heads + n_heads_kv;
  // kv head of a K / V item; its slice of the input rows and of the cache
  const int kvh = is_q ? 0 : is_v ? sub - n_heads - n_heads_kv : sub - n_heads;
  const std::size_t tkv = static_cast<std::size_t>(t) * static_cast<std::size_t>(n_heads_kv) +
                          static_cast<std::size_t>(kvh);
  const std::size_t rh = static_cast<std::size_t>(pos) * static_cast<std::size_t>(n_heads_kv) +
                         static_cast<std::size_t>(kvh);
  if (is_v) {
    const float* src = v + tkv * ud;
    StoreHead(D, kv_dtype, v_cache, v_scales, rh, lane, [&](int i) { return src[i]; });
    return;
  }
  const float* src = is_q ? qg + (static_cast<std::size_t>(t) * static_cast<std::size_t>(n_heads) +
                                  static_cast<std::size_t>(sub)) *
                                     2 * ud
                          : k + tkv * ud;
  const float* w = is_q ? q_norm : k_norm;
  float ss;
  km::WarpDotRows<1>(&src, src, D, vec, lane, &ss);
  const float r = km::RmsInv(ss, D, eps);
  auto value = [&](int i) { return NormRopeElem(src, i, half, r, w, inv_freq, pos); };
  if (is_q) {
    float* dst = q + (static_cast<std::size_t>(t) * static_cast<std::size_t>(n_heads) +
                      static_cast<std::size_t>(sub)) *
                         ud;
    for (int i = lane; i < D; i += km::kWarp) dst[i] = value(i);
  } else {
    StoreHead(D, kv_dtype, k_cache, k_scales, rh, lane, value);
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

void AttnPrep(const float* qg, const float* k, const float* v, int T, Pos row0, int n_heads,
              int n_heads_kv, int head_dim, int rotary_dim, const float* inv_freq,
              const float* q_norm, const float* k_norm, float eps, int kv_dtype, void* k_cache,
              void* v_cache, float* k_scales, float* v_scales, float* q, cudaStream_t s) {
  if (T <= 0 || n_heads <= 0 || head_dim <= 0) return;
  const int items = T * (n_heads + 2 * n_heads_kv);
  const unsigned blocks = static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const bool vec = head_dim % 4 == 0 && km::Aligned(qg, 16) && km::Aligned(k, 16);
  AttnPrepKernel<<<blocks, kWarpsPerBlock * km::kWarp, 0, s>>>(
      qg, k, v, T, row0, n_heads, n_heads_kv, head_dim, rotary_dim / 2, inv_freq, q_norm, k_norm,
      eps, kv_dtype, k_cache, v_cache, k_scales, v_scales, q, vec);
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
