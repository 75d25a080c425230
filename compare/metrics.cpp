// Metrics kernels. Two goals shape the code (issue "comparator", Must show 5): NRMSE over data in
// memory at the memory-read bandwidth of one core, and KL over 151,936-wide logit rows at >= 2,000
// rows/s per core, both accurate against a float64 reference.
//
// The vector code uses GCC/Clang vector extensions instead of intrinsics: one source for every x86
// level (xmm, ymm or zmm, whatever the build targets) with lane-wise IEEE arithmetic, and
// -ffp-contract=off keeps a*b+c unfused, so the results are the same bits on every build (checked:
// g++ and clang at x86-64, x86-64-v3 and AVX-512). The lane structure is part of the definition:
// element i of a block (or a row) is summed into lane i % 16 (F32, in partial sums of 4096
// elements) or i % 16 then i % 8 (KL, f32 blocks into f64 lanes) in index order, the lanes are
// reduced in a fixed tree, and tails are padded to a full vector with neutral values rather than
// run through a scalar copy of the arithmetic. Intrinsics appear only where they give the same
// bits as the generic code (a widening conversion, a lane-mask test).
#include "lockstep/compare/metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// Vector values only pass between functions of this file (anonymous namespace, inlined), so the
// note that their calling convention differs without AVX / AVX-512 does not apply (g++ and clang).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace lockstep {

// Reduced sums of one block, as F32Accumulator::Commit adds them.
struct detail::F32BlockSums {
  double sq_diff = 0.0;
  double sq_ref = 0.0;
  double max_abs = 0.0;
  std::uint64_t n = 0;
  std::uint64_t n_diff = 0;
  std::int64_t first_diff = -1;  // within the block
  std::uint64_t code_diff = 0;
  std::int64_t first_code_diff = -1;
  bool non_finite = false;
};

namespace {

using F32x8 = float __attribute__((vector_size(32)));
using U32x8 = std::uint32_t __attribute__((vector_size(32)));
using I32x8 = std::int32_t __attribute__((vector_size(32)));
using U16x8 = std::uint16_t __attribute__((vector_size(16)));
using F64x8 = double __attribute__((vector_size(64)));
using U64x8 = std::uint64_t __attribute__((vector_size(64)));
using F32x16 = float __attribute__((vector_size(64)));
using I32x16 = std::int32_t __attribute__((vector_size(64)));
using U32x16 = std::uint32_t __attribute__((vector_size(64)));

template <class V>
[[gnu::always_inline]] inline V Load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class V, class T>
[[gnu::always_inline]] inline V Splat(T x) {
  V v;
  for (std::size_t k = 0; k < sizeof v / sizeof x; ++k) v[k] = x;
  return v;
}

[[gnu::always_inline]] inline F64x8 Widen(const F32x8& v) {
#if defined(__AVX512F__)
  // g++ 12 tuned for znver splits the generic conversion into four 256-bit instructions. (The
  // zero-masked form: the plain one trips -Wmaybe-uninitialized inside g++'s avx512fintrin.h.)
  return std::bit_cast<F64x8>(_mm512_maskz_cvtps_pd(0xff, std::bit_cast<__m256>(v)));
#else
  return __builtin_convertvector(v, F64x8);
#endif
}
[[gnu::always_inline]] inline F32x8 Lo(const F32x16& v) {
  return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
}
[[gnu::always_inline]] inline F32x8 Hi(const F32x16& v) {
  return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
}

// Bit k set when lane k of a comparison result is set.
[[gnu::always_inline]] inline unsigned LaneBits(const I32x16& m) {
#if defined(__AVX512F__)
  const auto v = std::bit_cast<__m512i>(m);
  return _mm512_test_epi32_mask(v, v);
#elif defined(__AVX2__)
  const auto lo = static_cast<unsigned>(
      _mm256_movemask_ps(std::bit_cast<__m256>(Lo(std::bit_cast<F32x16>(m)))));
  const auto hi = static_cast<unsigned>(
      _mm256_movemask_ps(std::bit_cast<__m256>(Hi(std::bit_cast<F32x16>(m)))));
  return lo | hi << 8;
#else
  unsigned bits = 0;
  for (int k = 0; k < 16; ++k) bits |= (m[k] != 0 ? 1u : 0u) << k;
  return bits;
#endif
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

void KeepFirst(std::int64_t& first, std::int64_t candidate) {
  if (candidate >= 0 && (first < 0 || candidate < first)) first = candidate;
}

// ---- F32: sum (a-b)^2, sum a^2, max |a-b|, bitwise differences ----

constexpr std::size_t kStep = 16;  // elements per iteration: two 8-lane f64 halves
constexpr std::size_t kChunk =
    4096;  // elements per partial sum (and per read of the diff counters)

// Element sources: 8 f32 bit patterns at a time (plus one, for scans). A bf16 code widens to f32
// exactly by << 16, and two codes differ exactly when their widened patterns do.
struct F32Src {
  const float* p;
  [[gnu::always_inline]] U32x8 Bits8(std::size_t i) const { return Load<U32x8>(p + i); }
  std::uint32_t Bits(std::size_t i) const { return std::bit_cast<std::uint32_t>(p[i]); }
};
struct Bf16Src {
  const std::uint16_t* p;
  [[gnu::always_inline]] U32x8 Bits8(std::size_t i) const {
    return __builtin_convertvector(Load<U16x8>(p + i), U32x8) << 16;
  }
  std::uint32_t Bits(std::size_t i) const { return std::uint32_t{p[i]} << 16; }
};

// Lane sums of one block, fed in pieces whose lengths are multiples of kStep (except the last).
// Each kChunk elements of the block (counted from its start, whatever the pieces) are summed into
// fresh lanes and then added to the block's lanes: one long sequential sum per lane drifts by
// ~1e-12 relative over 10^7 elements, two levels of short ones stay near 1e-15.
class F32Lanes {
 public:
  template <class Src>
  void Feed(const Src& a, const Src& b, std::size_t n) {
    std::size_t i = 0;
    const std::size_t n_vec = n - n % kStep;
    while (i < n_vec) {
      const std::size_t begin = i, end = std::min(n_vec, i + (kChunk - (n_ + i) % kChunk));
      // Locals, so that the lanes stay in registers (the loads could alias the members).
      I32x8 diff = {};  // minus the count of differing elements, per lane
      F64x8 d0 = chunk_sq_diff_[0], d1 = chunk_sq_diff_[1], r0 = chunk_sq_ref_[0],
            r1 = chunk_sq_ref_[1];
      F64x8 m = max_abs_;
      for (; i < end; i += kStep) {
        Step(a.Bits8(i), b.Bits8(i), d0, r0, m, diff);
        Step(a.Bits8(i + 8), b.Bits8(i + 8), d1, r1, m, diff);
      }
      chunk_sq_diff_[0] = d0;
      chunk_sq_diff_[1] = d1;
      chunk_sq_ref_[0] = r0;
      chunk_sq_ref_[1] = r1;
      max_abs_ = m;
      CountDiffs(diff, a, b, begin, end);
      if ((n_ + end) % kChunk == 0) {
        for (int h = 0; h < 2; ++h) {
          sq_diff_[h] += chunk_sq_diff_[h];
          sq_ref_[h] += chunk_sq_ref_[h];
          chunk_sq_diff_[h] = chunk_sq_ref_[h] = F64x8{};
        }
      }
    }
    if (i < n) {
      // Zero padding adds +0 to every sum and no difference.
      std::uint32_t ta[kStep] = {}, tb[kStep] = {};
      for (std::size_t k = 0; i + k < n; ++k) {
        ta[k] = a.Bits(i + k);
        tb[k] = b.Bits(i + k);
      }
      I32x8 diff = {};
      Step(Load<U32x8>(ta), Load<U32x8>(tb), chunk_sq_diff_[0], chunk_sq_ref_[0], max_abs_, diff);
      Step(Load<U32x8>(ta + 8), Load<U32x8>(tb + 8), chunk_sq_diff_[1], chunk_sq_ref_[1], max_abs_,
           diff);
      CountDiffs(diff, a, b, i, n);
    }
    n_ += n;
  }

  detail::F32BlockSums Sums() const {
    detail::F32BlockSums s;
    s.sq_diff = Reduce16(sq_diff_[0] + chunk_sq_diff_[0], sq_diff_[1] + chunk_sq_diff_[1]);
    s.sq_ref = Reduce16(sq_ref_[0] + chunk_sq_ref_[0], sq_ref_[1] + chunk_sq_ref_[1]);
    for (int k = 0; k < 8; ++k) s.max_abs = std::max(s.max_abs, max_abs_[k]);
    s.n = n_;
    s.n_diff = n_diff_;
    s.first_diff = first_diff_;
    // Squares of finite f32 values and of their differences cannot overflow f64, so a non-finite
    // sum means a NaN or an Inf in the input (sq_ref for a, sq_diff for b).
    s.non_finite = !std::isfinite(s.sq_diff) || !std::isfinite(s.sq_ref);
    return s;
  }

 private:
  [[gnu::always_inline]] static void Step(const U32x8& ua, const U32x8& ub, F64x8& sq_diff,
                                          F64x8& sq_ref, F64x8& max_abs, I32x8& diff) {
    diff += ua != ub;
    const F64x8 da = Widen(std::bit_cast<F32x8>(ua));
    const F64x8 db = Widen(std::bit_cast<F32x8>(ub));
    const F64x8 d = da - db;
    sq_diff += d * d;
    sq_ref += da * da;
    const F64x8 ad = std::bit_cast<F64x8>(std::bit_cast<U64x8>(d) & 0x7fffffffffffffffull);
    max_abs = ad > max_abs ? ad : max_abs;
  }

  template <class Src>
  void CountDiffs(const I32x8& diff, const Src& a, const Src& b, std::size_t begin,
                  std::size_t end) {
    std::int64_t count = 0;
    for (int k = 0; k < 8; ++k) count -= diff[k];
    n_diff_ += static_cast<std::uint64_t>(count);
    if (count == 0 || first_diff_ >= 0) return;
    for (std::size_t j = begin; j < end; ++j) {
      if (a.Bits(j) != b.Bits(j)) {
        first_diff_ = static_cast<std::int64_t>(n_ + j);
        return;
      }
    }
  }

  // Lane k of lo is lane k, of hi lane 8 + k; pairwise tree.
  static double Reduce16(const F64x8& lo, const F64x8& hi) {
    const F64x8 v = lo + hi;
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  }

  F64x8 chunk_sq_diff_[2] = {};
  F64x8 chunk_sq_ref_[2] = {};
  F64x8 sq_diff_[2] = {};
  F64x8 sq_ref_[2] = {};
  F64x8 max_abs_ = {};
  std::uint64_t n_ = 0;
  std::uint64_t n_diff_ = 0;
  std::int64_t first_diff_ = -1;
};

// Slow path for a block with NaN/Inf: max |a-b| over the pairs where both are finite.
template <class Pair>
double MaxAbsFinite(std::size_t n, Pair pair) {
  double m = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto [x, y] = pair(i);
    if (!std::isfinite(x) || !std::isfinite(y)) continue;
    m = std::max(m, std::fabs(static_cast<double>(x) - static_cast<double>(y)));
  }
  return m;
}

constexpr std::size_t kDequantChunk =
    2048;  // int8 values dequantized at a time (a multiple of kStep)

// ---- KL ----
//
// Per row, with u_i = x_i - max(x) and delta_i = (x_i - y_i) - c for a constant c (initially
// max(x) - max(y), so that delta is ~0 where the rows agree), e_i = exp(u_i), p_i = e_i / Zx:
//
//   KL = sum p_i delta_i + log(sum p_i exp(-delta_i))           (exact for any c)
//      = R/Zx + (log1p(t) - t),  t = (R - S1)/Zx,  S1 = sum e_i delta_i,  R = sum e_i r(delta_i),
//   r(d) = exp(-d) - 1 + d >= 0 (= d^2/2 - d^3/6 + ..., a polynomial for |d| < kTau; directly
//   exp(u_i - delta_i) - e_i + e_i delta_i otherwise, which is q's unnormalised weight and
//   cannot overflow because u_i - delta_i ~ y_i - max(y) <= 0).
//
// Why this form: the f32 exp errs by ~1e-7 in e_i, but e_i only weights the terms; the log-ratio
// enters through delta (exact: an f32 TwoSum) and r (relative accuracy), so the error stays
// relative to KL however small KL is, and identical or exactly shifted rows give exactly 0. The
// first-order terms in S1 cancel analytically instead of numerically. When t is large the row is
// far from identical and KL = S1/Zx + log(W/Zx), W = sum exp(u_i - delta_i), is accurate.
// The error of R reaches KL amplified by 1 + (S1/Zx)^2 / (2 KL), so a row whose weighted mean of
// delta is off-centre (S1/Zx)^2 > 16 KL is run once more with c moved by S1/Zx.
//
// Sums: f32 lanes over blocks of kKlBlock steps (8 terms per lane: < 5e-7 relative), added into
// f64 lanes. The f32 exp (16 lanes), these blocks, and skipping the polynomial or the second exp
// when no lane needs it keep the cost near 1 ns per column on one core (~6,000 rows/s of 151,936).

constexpr float kExpLo =
    -87.0f;  // below: exp() taken as 0 (e^-87 = 1.6e-38; normal f32 ends at 1.2e-38)
constexpr float kTau = 0.5f;  // |delta| below: r(delta) by its series
constexpr std::size_t kKlBlock = 8;

// exp(x) in f32 for x <= 88, Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-7 polynomial;
// ~1-2 ulp. Inputs below kExpLo give 0.
[[gnu::always_inline]] inline F32x16 ExpF32(const F32x16& x_in) {
  const F32x16 lo = Splat<F32x16>(kExpLo), zero = {};
  const I32x16 underflow = x_in < lo;
  const F32x16 x = underflow ? lo : x_in;
  // Round to nearest even by the 1.5 * 2^23 trick (|x log2 e| < 2^22).
  const F32x16 magic = Splat<F32x16>(12582912.0f);
  const F32x16 n = (x * 1.44269504088896341f + magic) - magic;
  F32x16 r = x - n * 0.693359375f;  // ln2 split: n * 0.693359375 is exact for |n| <= 128
  r = r - n * -2.12194440e-4f;
  const F32x16 z = r * r;
  F32x16 p = Splat<F32x16>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F32x16 y = (p * z + r) + 1.0f;
  const I32x16 e = __builtin_convertvector(n, I32x16);
  const F32x16 scale = std::bit_cast<F32x16>((e + 127) << 23);  // 2^n, n in [-126, 127]
  return underflow ? zero : y * scale;
}

struct KlLanes {
  F64x8 zx = {}, s1 = {}, r = {}, w = {};  // f64 lanes: i % 8
};
struct KlBlock {
  F32x16 zx = {}, s1 = {}, r = {}, w = {};  // f32 lanes of the current block: i % 16
  void AddTo(KlLanes& s) const {
    s.zx += Widen(Lo(zx));
    s.zx += Widen(Hi(zx));
    s.s1 += Widen(Lo(s1));
    s.s1 += Widen(Hi(s1));
    s.r += Widen(Lo(r));
    s.r += Widen(Hi(r));
    s.w += Widen(Lo(w));
    s.w += Widen(Hi(w));
  }
};

// One 16-element step of the KL sums. kTail: lanes at and after `valid` contribute +0.
template <bool kTail>
[[gnu::always_inline]] inline void KlStep(const F32x16& x, const F32x16& y, float mx, float c,
                                          int valid, KlBlock& s) {
  const F32x16 zero = {};
  const F32x16 u = x - mx;
  // delta = (x - y) - c with x - y as an exact sum (TwoSum); delta ~ 0 makes x - y ~ c, and then
  // s - c is exact (Sterbenz), so delta is correct to the last bit or two however large c is.
  const F32x16 sum = x - y;
  const F32x16 bv = sum - x;
  const F32x16 err = (x - (sum - bv)) - (y + bv);
  const F32x16 d = (sum - c) + err;
  F32x16 e = ExpF32(u);
  F32x16 ed = e * d;
  const F32x16 ad = std::bit_cast<F32x16>(std::bit_cast<U32x16>(d) & 0x7fffffffu);
  const I32x16 big = ad >= kTau;
  const unsigned big_bits = LaneBits(big);
  // Only the lanes each branch selects need it; the result does not depend on what is skipped.
  F32x16 r_small = {}, w_small = {}, r_big = {}, w_big = {};
  if (big_bits != 0xffffu) {
    // r(d)/d^2 = sum_k (-d)^k / (k+2)!, k <= 7: truncation < 1e-8 relative for |d| < 0.5.
    F32x16 p = Splat<F32x16>(-1.0f / 362880.0f);
    p = p * d + 1.0f / 40320.0f;
    p = p * d + -1.0f / 5040.0f;
    p = p * d + 1.0f / 720.0f;
    p = p * d + -1.0f / 120.0f;
    p = p * d + 1.0f / 24.0f;
    p = p * d + -1.0f / 6.0f;
    p = p * d + 0.5f;
    r_small = e * ((d * d) * p);
    w_small = (e - ed) + r_small;
  }
  if (big_bits != 0) {
    w_big = ExpF32(u - d);
    r_big = (w_big - e) + ed;
  }
  F32x16 r = big ? r_big : r_small;
  F32x16 w = big ? w_big : w_small;
  if constexpr (kTail) {
    const I32x16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const I32x16 keep = lane < valid;
    e = keep ? e : zero;
    ed = keep ? ed : zero;
    r = keep ? r : zero;
    w = keep ? w : zero;
  }
  s.zx += e;
  s.s1 += ed;
  s.r += r;
  s.w += w;
}

double Reduce8(const F64x8& v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// log1p(t) - t without cancellation for small t.
double Log1pMinusX(double t) {
  if (std::fabs(t) < 1e-3)
    return t * t * (-0.5 + t * (1.0 / 3.0 + t * (-0.25 + t * (0.2 + t * (-1.0 / 6.0)))));
  return std::log1p(t) - t;
}

struct RowMax {
  float m = -std::numeric_limits<float>::infinity();
  std::size_t arg = 0;
};

// Max and argmax (lowest index on ties) of both rows, and whether both are all finite.
bool MaxArgmax(const float* x, const float* y, std::size_t cols, RowMax& mx, RowMax& my) {
  std::size_t i = 0;
  bool finite = true;
  if (cols >= 16 && cols <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    const F32x16 neg_inf = Splat<F32x16>(-std::numeric_limits<float>::infinity());
    F32x16 vx = neg_inf, vy = neg_inf, bad = {};
    I32x16 ix = {}, iy = {};
    I32x16 idx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    // Strict > keeps each lane's first occurrence of its maximum.
    for (; i + 16 <= cols; i += 16) {
      const F32x16 X = Load<F32x16>(x + i), Y = Load<F32x16>(y + i);
      bad += (X - X) + (Y - Y);  // NaN as soon as one element is NaN or Inf
      const I32x16 gx = X > vx, gy = Y > vy;
      vx = gx ? X : vx;
      ix = gx ? idx : ix;
      vy = gy ? Y : vy;
      iy = gy ? idx : iy;
      idx += 16;
    }
    for (int k = 0; k < 16; ++k) {
      if (bad[k] != 0.0f) finite = false;
      const auto ux = static_cast<std::size_t>(ix[k]), uy = static_cast<std::size_t>(iy[k]);
      if (vx[k] > mx.m || (vx[k] == mx.m && ux < mx.arg)) mx = {vx[k], ux};
      if (vy[k] > my.m || (vy[k] == my.m && uy < my.arg)) my = {vy[k], uy};
    }
  }
  for (; i < cols; ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) finite = false;
    if (x[i] > mx.m) mx = {x[i], i};
    if (y[i] > my.m) my = {y[i], i};
  }
  return finite;
}

// Plain f64 evaluation (the previous implementation), for finite rows whose range overflows the
// f32 fast path (|x_i - y_i| near FLT_MAX).
double KlRowF64(const float* x, const float* y, std::size_t cols, double mx, double my) {
  double zx = 0.0, zy = 0.0;
  for (std::size_t i = 0; i < cols; ++i) {
    zx += std::exp(static_cast<double>(x[i]) - mx);
    zy += std::exp(static_cast<double>(y[i]) - my);
  }
  const double lzx = std::log(zx), lzy = std::log(zy);
  double kl = 0.0;
  for (std::size_t i = 0; i < cols; ++i) {
    const double lpx = static_cast<double>(x[i]) - mx - lzx;
    const double lpy = static_cast<double>(y[i]) - my - lzy;
    kl += std::exp(lpx) * (lpx - lpy);
  }
  return kl;
}

struct RowKl {
  double kl = 0.0;
  bool finite = true;
  bool top1 = true;
};

RowKl KlRow(const float* x, const float* y, std::size_t cols) {
  RowKl out;
  if (cols == 0) return out;
  RowMax mx, my;
  out.finite = MaxArgmax(x, y, cols, mx, my);
  if (!out.finite) return out;
  out.top1 = mx.arg == my.arg;
  float c = mx.m - my.m;
  const std::size_t n_vec = cols - cols % 16;
  double kl = kNaN;
  for (int pass = 0; pass < 2; ++pass) {
    KlLanes s;
    for (std::size_t b = 0; b < n_vec; b += 16 * kKlBlock) {
      KlBlock blk;
      const std::size_t end = std::min(n_vec, b + 16 * kKlBlock);
      for (std::size_t i = b; i < end; i += 16)
        KlStep<false>(Load<F32x16>(x + i), Load<F32x16>(y + i), mx.m, c, 16, blk);
      blk.AddTo(s);
    }
    if (n_vec < cols) {
      // Padding with the maxima keeps every lane finite; KlStep zeroes its terms.
      float tx[16], ty[16];
      std::fill(tx, tx + 16, mx.m);
      std::fill(ty, ty + 16, my.m);
      std::copy(x + n_vec, x + cols, tx);
      std::copy(y + n_vec, y + cols, ty);
      KlBlock blk;
      KlStep<true>(Load<F32x16>(tx), Load<F32x16>(ty), mx.m, c, static_cast<int>(cols - n_vec),
                   blk);
      blk.AddTo(s);
    }
    const double zx = Reduce8(s.zx), s1 = Reduce8(s.s1), r = Reduce8(s.r), w = Reduce8(s.w);
    if (!std::isfinite(zx + s1 + r + w) || !(zx >= 1.0) || !(w > 0.0))
      break;  // kl stays NaN: slow path
    const double d1 = s1 / zx;
    const double t = (r - s1) / zx;
    kl = std::fabs(t) < 0.5 ? r / zx + Log1pMinusX(t) : d1 + std::log(w / zx);
    if (!(d1 * d1 > 16.0 * kl) || !(std::fabs(d1) < 16.0)) break;
    c += static_cast<float>(d1);
  }
  if (!std::isfinite(kl)) kl = KlRowF64(x, y, cols, mx.m, my.m);
  out.kl = kl < 0.0 ? 0.0 : kl;  // rounding can leave a hair below zero; KL >= 0
  return out;
}

}  // namespace

// ---- F32Accumulator ----

void F32Accumulator::Add(const float* a, const float* b, std::size_t n) {
  F32Lanes lanes;
  lanes.Feed(F32Src{a}, F32Src{b}, n);
  detail::F32BlockSums s = lanes.Sums();
  if (s.non_finite)
    s.max_abs = MaxAbsFinite(n, [&](std::size_t i) { return std::pair{a[i], b[i]}; });
  Commit(s);
}

void F32Accumulator::AddBf16(const std::uint16_t* a, const std::uint16_t* b, std::size_t n) {
  F32Lanes lanes;
  const Bf16Src sa{a}, sb{b};
  lanes.Feed(sa, sb, n);
  detail::F32BlockSums s = lanes.Sums();
  if (s.non_finite) {
    s.max_abs = MaxAbsFinite(n, [&](std::size_t i) {
      return std::pair{std::bit_cast<float>(sa.Bits(i)), std::bit_cast<float>(sb.Bits(i))};
    });
  }
  Commit(s);
}

void F32Accumulator::AddInt8(const std::int8_t* a, const float* a_scale, const std::int8_t* b,
                             const float* b_scale, std::size_t rows, std::size_t heads,
                             std::size_t head_dim) {
  const std::size_t segments = rows * heads;
  F32Lanes lanes;
  std::uint64_t code_diff = 0;
  std::int64_t first_code_diff = -1;
  alignas(64) float va[kDequantChunk];
  alignas(64) float vb[kDequantChunk];
  std::size_t fill = 0;
  for (std::size_t g = 0; g < segments; ++g) {
    const float sa = a_scale[g], sb = b_scale[g];
    const std::int8_t* ca = a + g * head_dim;
    const std::int8_t* cb = b + g * head_dim;
    std::uint32_t seg_diff = 0;
    for (std::size_t j = 0; j < head_dim;) {
      const std::size_t take = std::min(head_dim - j, kDequantChunk - fill);
      for (std::size_t k = 0; k < take; ++k) {
        va[fill + k] = static_cast<float>(ca[j + k]) * sa;  // as dequantize_int8_row
        vb[fill + k] = static_cast<float>(cb[j + k]) * sb;
        seg_diff += ca[j + k] != cb[j + k];
      }
      fill += take;
      j += take;
      if (fill == kDequantChunk) {
        lanes.Feed(F32Src{va}, F32Src{vb}, fill);
        fill = 0;
      }
    }
    code_diff += seg_diff;
    if (seg_diff != 0 && first_code_diff < 0) {
      std::size_t j = 0;
      while (ca[j] == cb[j]) ++j;
      first_code_diff = static_cast<std::int64_t>(g * head_dim + j);
    }
  }
  if (fill > 0) lanes.Feed(F32Src{va}, F32Src{vb}, fill);
  detail::F32BlockSums s = lanes.Sums();
  s.code_diff = code_diff;
  s.first_code_diff = first_code_diff;
  if (s.non_finite) {
    s.max_abs = MaxAbsFinite(segments * head_dim, [&](std::size_t i) {
      const std::size_t g = i / head_dim;
      return std::pair{static_cast<float>(a[i]) * a_scale[g],
                       static_cast<float>(b[i]) * b_scale[g]};
    });
  }
  Commit(s);
}

void F32Accumulator::Commit(const detail::F32BlockSums& s) {
  const auto base = static_cast<std::int64_t>(first_index_ + n_);
  sum_sq_diff_ += s.sq_diff;
  sum_sq_ref_ += s.sq_ref;
  max_abs_ = std::max(max_abs_, s.max_abs);
  n_diff_ += s.n_diff;
  if (s.first_diff >= 0) KeepFirst(first_diff_, base + s.first_diff);
  code_diff_ += s.code_diff;
  if (s.first_code_diff >= 0) KeepFirst(first_code_diff_, base + s.first_code_diff);
  non_finite_ = non_finite_ || s.non_finite;
  n_ += s.n;
}

void F32Accumulator::Merge(const F32Accumulator& o) {
  sum_sq_diff_ += o.sum_sq_diff_;
  sum_sq_ref_ += o.sum_sq_ref_;
  max_abs_ = std::max(max_abs_, o.max_abs_);
  n_diff_ += o.n_diff_;
  KeepFirst(first_diff_, o.first_diff_);
  code_diff_ += o.code_diff_;
  KeepFirst(first_code_diff_, o.first_code_diff_);
  non_finite_ = non_finite_ || o.non_finite_;
  n_ += o.n_;
}

DiffStats F32Accumulator::Finish() const {
  DiffStats s;
  s.n = n_;
  s.max_abs = max_abs_;
  s.n_diff = n_diff_;
  s.first_diff = first_diff_;
  s.code_diff = code_diff_;
  s.first_code_diff = first_code_diff_;
  s.non_finite = non_finite_;
  if (non_finite_) {
    s.nrmse = kNaN;
  } else if (sum_sq_ref_ == 0.0) {
    s.nrmse = sum_sq_diff_ == 0.0 ? 0.0 : kInf;
  } else {
    s.nrmse = std::sqrt(sum_sq_diff_ / sum_sq_ref_);
  }
  return s;
}

DiffStats CompareF32(const float* a, const float* b, std::size_t n) {
  F32Accumulator acc;
  acc.Add(a, b, n);
  return acc.Finish();
}

// ---- KlAccumulator ----

void KlAccumulator::AddRows(const float* a, const float* b, std::size_t rows, std::size_t cols) {
  double block = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    const RowKl k = KlRow(a + r * cols, b + r * cols, cols);
    if (!k.finite) {
      non_finite_ = true;
      continue;
    }
    block += k.kl;
    kl_max_ = std::max(kl_max_, k.kl);
    if (k.top1) ++top1_agree_;
  }
  sum_kl_ += block;
  rows_ += rows;
}

void KlAccumulator::Merge(const KlAccumulator& o) {
  sum_kl_ += o.sum_kl_;
  kl_max_ = std::max(kl_max_, o.kl_max_);
  top1_agree_ += o.top1_agree_;
  rows_ += o.rows_;
  non_finite_ = non_finite_ || o.non_finite_;
}

KlStats KlAccumulator::Finish() const {
  KlStats k;
  k.rows = rows_;
  k.top1_agree = top1_agree_;
  k.non_finite = non_finite_;
  k.kl_max = kl_max_;
  k.kl_mean = rows_ ? sum_kl_ / static_cast<double>(rows_) : 0.0;
  if (non_finite_) k.kl_max = k.kl_mean = kNaN;
  return k;
}

KlStats CompareLogits(const float* a, const float* b, std::size_t rows, std::size_t cols) {
  KlAccumulator acc;
  acc.AddRows(a, b, rows, cols);
  return acc.Finish();
}

}  // namespace lockstep
