// x rounded to 8 bits the ways ggml rounds activations (matmul_q8.h, QuantRows): the portable
// functions are the definition, the AVX-512 ones give the same bytes (tests/engine/matmul_q8_test).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "cpu/matmul_q8.h"
#include "lockstep/engine/dtype.h"

namespace lockstep::cpu::q8 {

namespace {

#if defined(LOCKSTEP_Q8_SIMD)
inline __m512i Load64(const void* p) { return _mm512_loadu_si512(p); }
#endif

// ---- x rounded to 8 bits ----

void Sums(QuantRows::Format& f, std::size_t at, std::size_t n) {
  for (std::size_t i = at; i < at + n; i += 4)
    f.n[i / 4] = -128 * (f.q[i] + f.q[i + 1] + f.q[i + 2] + f.q[i + 3]);
}

// A super-block of x's integers `nat` (natural order) into the 256 format at `at`: lane order
// (byte k of lane l of chunk c, at 64c + 4l + k, is element 16l + 4c + k), -128 * each lane's sum
// and the sums per 32 (natural sub-blocks). A transpose of 4-byte groups: cheap beside the
// products (x is one row of a few thousand elements per product).
void LaneOrder(const std::int8_t* nat, std::size_t at, QuantRows::Format& f) {
  std::int8_t* q = f.q.data() + at;
  for (int l = 0; l < 16; ++l) {
    std::int32_t s = 0;
    for (int c = 0; c < 4; ++c) {
      std::memcpy(q + 64 * c + 4 * l, nat + 16 * l + 4 * c, 4);
      for (int k = 0; k < 4; ++k) s += nat[16 * l + 4 * c + k];
    }
    f.n[at / 16 + static_cast<std::size_t>(l)] = -128 * s;
  }
  for (int j = 0; j < 8; ++j) {
    std::int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += nat[32 * j + i];
    f.bsum[at / 32 + static_cast<std::size_t>(j)] = s;
  }
}

// ggml's Q8_0 as its x86 build rounds (quantize_row_q8_0): d = amax / 127 kept as f16, each
// element x * (127 / amax) to the nearest integer (ties to even).
void Quantise32(const float* x, std::size_t at, QuantRows::Format& f) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  f.d[at / 32] = f16_to_f32(f32_to_f16(d));
  for (int j = 0; j < 32; ++j) f.q[at + j] = static_cast<std::int8_t>(std::nearbyint(x[j] * id));
  Sums(f, at, 32);
}

// A super-block of x's integers into the bx format (IQ4_XS) at `at`: byte k of lane l of chunk
// c at 64c + 4l + k is element Iq4XsElement(l, c, k), n = -128 * each lane's sum.
void Iq4Order(const std::int8_t* nat, std::size_t at, QuantRows::Format& f) {
  std::int8_t* q = f.q.data() + at;
  for (int l = 0; l < 16; ++l) {
    std::int32_t s = 0;
    for (int c = 0; c < 4; ++c)
      for (int k = 0; k < 4; ++k) {
        const std::int8_t v = nat[Iq4XsElement(l, c, k)];
        q[64 * c + 4 * l + k] = v;
        s += v;
      }
    f.n[at / 16 + static_cast<std::size_t>(l)] = -128 * s;
  }
}

// ggml's Q8_K (quantize_row_q8_K_ref): the element of largest magnitude sets iscale = -127 / max,
// each element nearest(iscale * x) capped at 127, d = 1 / iscale; the integers into `nat` in
// natural order, d returned (the formats order them: LaneOrder, Iq4Order).
float Round256(const float* x, std::int8_t* nat) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 256; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  std::memset(nat, 0, 256);
  if (amax == 0.0f) return 0.0f;
  const float iscale = -127.0f / max;
  for (int j = 0; j < 256; ++j)
    nat[j] = static_cast<std::int8_t>(std::min(127.0f, std::nearbyint(iscale * x[j])));
  return 1.0f / iscale;
}

#if defined(LOCKSTEP_Q8_SIMD)
// GCC 12's AVX-512 intrinsics pass an uninitialised `__Y = __Y` operand as their merge source
// (_mm512_undefined_*), and -Wuninitialized fires on it once inlined into these loops: a known
// false positive of the headers, silenced for these functions only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// The same roundings with AVX-512 (the portable functions above are the definition; tests hold the
// two to the same bytes): max of |x| is exact in any order, x * id and its conversion to the
// nearest integer (ties to even, the default rounding) are the same operations per element.
inline __m512 Abs(__m512 v) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), v); }

// Lane max through memory: GCC 12's _mm512_reduce_* trip -Werror=uninitialized on their
// undefined pass-through operands. Max is exact in any order.
inline float MaxLanes(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float m = t[0];
  for (int i = 1; i < 16; ++i) m = std::max(m, t[i]);
  return m;
}

// -128 * the sums of 4 consecutive q: vpdpbusd of 1s (unsigned) with q (signed).
inline void SimdSums(const std::int8_t* q, std::int32_t* n4, int n) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int i = 0; i < n; i += 64) {
    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, Load64(q + i));
    _mm512_storeu_si512(n4 + i / 4,
                        _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 7)));
  }
}

// Two blocks of 32 per call (64 elements; the row's last odd block goes through Quantise32).
void Quantise32Pair(const float* x, std::size_t at, QuantRows::Format& f) {
  for (int b = 0; b < 2; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    // NaN elements passed over, as the scalar loop does (max_ps returns its second operand).
    const float amax =
        MaxLanes(_mm512_max_ps(Abs(v1), _mm512_max_ps(Abs(v0), _mm512_setzero_ps())));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    f.d[at / 32 + static_cast<std::size_t>(b)] = f16_to_f32(f32_to_f16(d));
    const __m512 m = _mm512_set1_ps(id);
    std::int8_t* q = f.q.data() + at + 32 * static_cast<std::size_t>(b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, m))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, m))));
  }
  SimdSums(f.q.data() + at, f.n.data() + at / 4, 64);
}

// LaneOrder's transpose and sums with vector operations (the same bytes and sums): chunk c's lane l
// is dword 4l + c of the natural order (two vpermt2d and an insert per chunk), a lane's sum comes
// from vpdpbusd of 1s, a sub-block's sum from its two lanes.
void LaneOrderSimd(const std::int8_t* nat, std::size_t at, QuantRows::Format& f) {
  const __m512i z[4] = {Load64(nat), Load64(nat + 64), Load64(nat + 128), Load64(nat + 192)};
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i sum = _mm512_setzero_si512();
  std::int8_t* q = f.q.data() + at;
  for (int c = 0; c < 4; ++c) {
    // lanes l < 4 from the first source (dword 4l + c), 4 <= l < 8 from the second
    const __m512i idx =
        _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0),
                         _mm512_set1_epi32(c));
    const __m512i lo = _mm512_permutex2var_epi32(z[0], idx, z[1]);
    const __m512i hi = _mm512_permutex2var_epi32(z[2], idx, z[3]);
    const __m512i chunk = _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1);
    _mm512_storeu_si512(q + 64 * c, chunk);
    sum = _mm512_dpbusd_epi32(sum, ones, chunk);
  }
  _mm512_storeu_si512(f.n.data() + at / 16,
                      _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
  const __m512i pairs = _mm512_add_epi32(sum, _mm512_srli_epi64(sum, 32));  // even lanes
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(f.bsum.data() + at / 32),
                      _mm512_cvtepi64_epi32(pairs));
}

// Iq4Order with vector operations (the same bytes and sums): chunk c's lane l is dword 8s + 4(c %
// 2) + 2(l % 2) + c / 2 of the natural order (s = Iq4XsSub(l)): sub-blocks 0-3 from the first two
// registers, 4-7 (the lanes with l % 4 >= 2) from the last two, by one vpermt2d each and a blend.
// x's rounding took 1.07% of an IQ4_XS decode with the scalar form's 256 moves, 0.51% so (perf).
void Iq4OrderSimd(const std::int8_t* nat, std::size_t at, QuantRows::Format& f) {
  alignas(64) static constexpr auto kIdx = [] {
    std::array<std::array<std::int32_t, 16>, 4> a{};
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 16; ++l)
        a[static_cast<std::size_t>(c)][static_cast<std::size_t>(l)] =
            (Iq4XsElement(l, c, 0) / 4) & 31;
    return a;
  }();
  const __m512i z[4] = {Load64(nat), Load64(nat + 64), Load64(nat + 128), Load64(nat + 192)};
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i sum = _mm512_setzero_si512();
  std::int8_t* q = f.q.data() + at;
  for (int c = 0; c < 4; ++c) {
    const __m512i idx = Load64(kIdx[static_cast<std::size_t>(c)].data());
    const __m512i chunk =
        _mm512_mask_blend_epi32(0xCCCC, _mm512_permutex2var_epi32(z[0], idx, z[1]),
                                _mm512_permutex2var_epi32(z[2], idx, z[3]));
    _mm512_storeu_si512(q + 64 * c, chunk);
    sum = _mm512_dpbusd_epi32(sum, ones, chunk);
  }
  _mm512_storeu_si512(f.n.data() + at / 16,
                      _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
}

float Round256Simd(const float* x, std::int8_t* q) {
  __m512 v[16], mx = _mm512_setzero_ps();
  for (int i = 0; i < 16; ++i) {
    v[i] = _mm512_loadu_ps(x + 16 * i);
    mx = _mm512_max_ps(Abs(v[i]), mx);  // a NaN element is passed over, as the scalar loop does
  }
  const float amax = MaxLanes(mx);
  if (amax == 0.0f) {
    std::memset(q, 0, 256);
    return 0.0f;
  }
  float max = 0.0f;  // the first element of the largest magnitude, with its sign
  for (int i = 0; i < 16; ++i)
    if (const __mmask16 k = _mm512_cmp_ps_mask(Abs(v[i]), _mm512_set1_ps(amax), _CMP_EQ_OQ)) {
      max = x[16 * i + __builtin_ctz(k)];
      break;
    }
  const float iscale = -127.0f / max;
  const __m512 m = _mm512_set1_ps(iscale);
  for (int i = 0; i < 16; ++i) {
    const __m512i qi =
        _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v[i], m)), _mm512_set1_epi32(127));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * i), _mm512_cvtsepi32_epi8(qi));
  }
  return 1.0f / iscale;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

bool IsK(WeightType t) {
  return t == WeightType::kQ4_K || t == WeightType::kQ5_K || t == WeightType::kQ6_K ||
         t == WeightType::kIQ4_XS;
}

void NeedFormats(const Mat& w, bool& b32, bool& b256, bool& bx) {
  if (w.parts != nullptr) {
    for (int i = 0; i < w.n_parts; ++i) NeedFormats(w.parts[i].m, b32, b256, bx);
    return;
  }
  (w.type == WeightType::kIQ4_XS ? bx : IsK(w.type) ? b256 : b32) = true;
}

// 64 bytes of padding after each buffer: a 32-element row's odd last block is read as a pair.
void Resize(QuantRows::Format& f, std::size_t n, int block, bool bsum) {
  f.q.resize(n + 64);
  f.n.resize(n / (block == 256 ? 16 : 4) + 16);
  f.d.resize(n / static_cast<std::size_t>(block) + 16);
  f.bsum.resize(bsum ? n / 32 : 0);
}

}  // namespace

void Quantise(const float* x, int n_rows, const Mat& w, QuantRows& q) {
  bool b32 = false, b256 = false, bx = false;
  NeedFormats(w, b32, b256, bx);
  q.rows = n_rows;
  q.cols = w.cols;
  const std::size_t n = static_cast<std::size_t>(n_rows) * static_cast<std::size_t>(w.cols);
  if (b32) Resize(q.b32, n, 32, false);
  if (b256) Resize(q.b256, n, 256, true);
  if (bx) Resize(q.bx, n, 256, false);
  bool simd = false;
#if defined(LOCKSTEP_Q8_SIMD)
  simd = !detail::g_portable;
  if (simd) {
    const std::size_t cols = static_cast<std::size_t>(w.cols);
    for (std::size_t r = 0; b32 && r < n; r += cols) {
      std::size_t at = r;
      for (; at + 64 <= r + cols; at += 64) Quantise32Pair(x + at, at, q.b32);
      if (at < r + cols) Quantise32(x + at, at, q.b32);
    }
  }
#endif
  if (!simd)
    for (std::size_t at = 0; b32 && at < n; at += 32) Quantise32(x + at, at, q.b32);
  // The 256 and bx formats share each super-block's rounding and differ in its order.
  using Round = float (*)(const float*, std::int8_t*);
  using Order = void (*)(const std::int8_t*, std::size_t, QuantRows::Format&);
  Round round = Round256;
  Order lanes = LaneOrder, iq4 = Iq4Order;
#if defined(LOCKSTEP_Q8_SIMD)
  if (simd) {
    round = Round256Simd;
    lanes = LaneOrderSimd;
    iq4 = Iq4OrderSimd;
  }
#endif
  const std::pair<QuantRows::Format*, Order> formats[] = {{b256 ? &q.b256 : nullptr, lanes},
                                                          {bx ? &q.bx : nullptr, iq4}};
  for (std::size_t at = 0; (b256 || bx) && at < n; at += 256) {
    alignas(64) std::int8_t nat[256];
    const float d = round(x + at, nat);
    for (const auto& [f, order] : formats)
      if (f != nullptr) {
        f->d[at / 256] = d;
        order(nat, at, *f);
      }
  }
}

}  // namespace lockstep::cpu::q8
