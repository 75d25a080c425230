#include "cpu/activation.h"

#include <cmath>
#include <cstdint>

#include "cpu/norm.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#define LOCKSTEP_VEXP 1
#endif

namespace lockstep::cpu {

namespace {

#if defined(LOCKSTEP_VEXP)

// glibc's __exp2f_data as its expf reads it (e_exp2f_data.c, EXP2F_TABLE_BITS 5): the table
// entry i is 2^(i/32) as a double's bits minus i << 47; N / ln 2; the polynomial; the shift
// that rounds to an integer.
alignas(64) constexpr std::uint64_t kTab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
constexpr std::uint64_t kInvLn2N = 0x40471547652b82fe;  // 32 / ln 2
constexpr std::uint64_t kC0 = 0x3ebc6af84b912394, kC1 = 0x3f2ebfce50fac4f3,
                        kC2 = 0x3f962e42ff0c52d6;
constexpr std::uint64_t kShift = 0x4338000000000000;  // 0x1.8p52

inline __m512d Bits(std::uint64_t b) {
  return _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<long long>(b)));
}
inline __m512i TabLoad(int q) { return _mm512_load_si512(kTab + 8 * q); }

// expf of 8 floats on glibc's fast path, step for step as __expf_fma: z = x N / ln 2 rounded to
// the integer k by the shift, r = x N / ln 2 - k (fused), s = 2^(k/N) from the table and k's
// high bits, y = s (C0 r^3 + C1 r^2 + C2 r + 1) as its three fmas, then rounded to float.
inline __m256 Exp8(__m256 x) {
  const __m512d xd = _mm512_cvtps_pd(x);
  const __m512d inv = Bits(kInvLn2N), shift = Bits(kShift);
  const __m512d kds = _mm512_fmadd_pd(inv, xd, shift);
  const __m512i ki = _mm512_castpd_si512(kds);
  const __m512d kd = _mm512_sub_pd(kds, shift);
  const __m512d r = _mm512_fmsub_pd(inv, xd, kd);
  const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
  const __m512i lo = _mm512_permutex2var_epi64(TabLoad(0), idx, TabLoad(1));
  const __m512i hi = _mm512_permutex2var_epi64(TabLoad(2), idx, TabLoad(3));
  const __mmask8 upper = _mm512_test_epi64_mask(idx, _mm512_set1_epi64(16));
  const __m512i t =
      _mm512_add_epi64(_mm512_mask_blend_epi64(upper, lo, hi), _mm512_slli_epi64(ki, 47));
  const __m512d s = _mm512_castsi512_pd(t);
  const __m512d z = _mm512_fmadd_pd(r, Bits(kC0), Bits(kC1));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(r, Bits(kC2), _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(z, r2, y);
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

// expf of 16 floats: the lanes glibc takes off its fast path (top 12 bits of |x| above 0x42a:
// |x| >= ~85.3, inf, NaN) by the scalar call itself.
inline __m512 Exp16(__m512 x) {
  const __m512i top =
      _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7ff));
  const __mmask16 slow = _mm512_cmpgt_epu32_mask(top, _mm512_set1_epi32(0x42a));
  const __m256 lo = Exp8(_mm512_castps512_ps256(x));
  const __m256 hi = Exp8(_mm512_extractf32x8_ps(x, 1));
  __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  if (slow != 0) {
    alignas(64) float xs[16], es[16];
    _mm512_store_ps(xs, x);
    _mm512_store_ps(es, e);
    for (int l = 0; l < 16; ++l)
      if ((slow >> l) & 1) es[l] = std::exp(xs[l]);
    e = _mm512_load_ps(es);
  }
  return e;
}

// Silu(x) = x / (1 + exp(-x)) as norm.h's scalar form: the same float add and division.
inline __m512 Silu16(__m512 x) {
  const __m512 e = Exp16(
      _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

#endif  // LOCKSTEP_VEXP

}  // namespace

void SiluInPlace(float* x, std::size_t n) {
  std::size_t i = 0;
#if defined(LOCKSTEP_VEXP)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, Silu16(_mm512_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = Silu(x[i]);
}

void SiluMulInPlace(float* g, const float* u, std::size_t n) {
  std::size_t i = 0;
#if defined(LOCKSTEP_VEXP)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(g + i, _mm512_mul_ps(Silu16(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
#endif
  for (; i < n; ++i) g[i] = Silu(g[i]) * u[i];
}

void GatedScale(const float* x, const float* z, const float* w, float r, std::size_t n, float* y) {
  std::size_t i = 0;
#if defined(LOCKSTEP_VEXP)
  const __m512 rv = _mm512_set1_ps(r);
  for (; i + 16 <= n; i += 16) {
    const __m512 xrw =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), rv), _mm512_loadu_ps(w + i));
    _mm512_storeu_ps(y + i, _mm512_mul_ps(xrw, Silu16(_mm512_loadu_ps(z + i))));
  }
#endif
  for (; i < n; ++i) y[i] = x[i] * r * w[i] * Silu(z[i]);
}

void ExpShiftedInPlace(float* x, std::size_t n, float shift) {
  std::size_t i = 0;
#if defined(LOCKSTEP_VEXP)
  const __m512 sv = _mm512_set1_ps(shift);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(x + i, Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), sv)));
#endif
  for (; i < n; ++i) x[i] = std::exp(x[i] - shift);
}

void ExpForTest(const float* x, std::size_t n, float* out) {
  std::size_t i = 0;
#if defined(LOCKSTEP_VEXP)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, Exp16(_mm512_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) out[i] = std::exp(x[i]);
}

}  // namespace lockstep::cpu
