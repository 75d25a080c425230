// Tests for compare/metrics.{h,cpp}: hand-computed NRMSE, zero-reference and NaN/Inf rules,
// bitwise difference counts across blocks, bf16 and int8 inputs, KL identities (identical and
// shifted logits, a two-class example), top-1 ties, random data against independent float64
// references written here, and Merge against a single pass.
#include "lockstep/compare/metrics.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "compare/reference_metrics.h"

namespace lockstep {
namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr float kInff = std::numeric_limits<float>::infinity();

// ---- test-only float64 references ----

struct RefF32 {
  double nrmse = 0.0;
  double max_abs = 0.0;
  std::uint64_t n_diff = 0;
  std::int64_t first_diff = -1;
};

// Straight loop in long double (wider than the f64 under test on x86): NRMSE of finite inputs.
RefF32 ReferenceF32(const std::vector<float>& a, const std::vector<float>& b) {
  RefF32 r;
  long double num = 0.0L, den = 0.0L;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) {
      if (r.first_diff < 0) r.first_diff = static_cast<std::int64_t>(i);
      ++r.n_diff;
    }
    const long double d = static_cast<long double>(a[i]) - static_cast<long double>(b[i]);
    num += d * d;
    den += static_cast<long double>(a[i]) * static_cast<long double>(a[i]);
    r.max_abs = std::max(r.max_abs, static_cast<double>(std::fabs(d)));
  }
  r.nrmse = static_cast<double>(std::sqrt(num / den));
  return r;
}

using test::ReferenceKl;

std::vector<float> Normal(std::size_t n, float sigma, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<float> Perturbed(const std::vector<float>& a, float sigma, std::uint32_t seed) {
  std::vector<float> b = Normal(a.size(), sigma, seed);
  for (std::size_t i = 0; i < a.size(); ++i) b[i] += a[i];
  return b;
}

void ExpectSameBits(const DiffStats& x, const DiffStats& y) {
  EXPECT_EQ(std::bit_cast<std::uint64_t>(x.nrmse), std::bit_cast<std::uint64_t>(y.nrmse));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(x.max_abs), std::bit_cast<std::uint64_t>(y.max_abs));
  EXPECT_EQ(x.n_diff, y.n_diff);
  EXPECT_EQ(x.first_diff, y.first_diff);
  EXPECT_EQ(x.non_finite, y.non_finite);
  EXPECT_EQ(x.n, y.n);
  EXPECT_EQ(x.code_diff, y.code_diff);
  EXPECT_EQ(x.first_code_diff, y.first_code_diff);
}

// ---- NRMSE / F32Accumulator ----

TEST(Metrics, HandComputedNrmse) {
  const float a[] = {3.0f, 4.0f}, b[] = {3.0f, 4.5f};
  const DiffStats s = CompareF32(a, b, 2);
  EXPECT_NEAR(s.nrmse, 0.1, 1e-15);  // sqrt(0.25 / 25)
  EXPECT_EQ(s.max_abs, 0.5);
  EXPECT_EQ(s.n_diff, 1u);
  EXPECT_EQ(s.first_diff, 1);
  EXPECT_EQ(s.n, 2u);
  EXPECT_FALSE(s.non_finite);
  EXPECT_EQ(s.code_diff, 0u);
  EXPECT_EQ(s.first_code_diff, -1);
}

TEST(Metrics, IdenticalIsZero) {
  const std::vector<float> a = Normal(1001, 1.0f, 1);
  const DiffStats s = CompareF32(a.data(), a.data(), a.size());
  EXPECT_EQ(s.nrmse, 0.0);
  EXPECT_EQ(s.max_abs, 0.0);
  EXPECT_EQ(s.n_diff, 0u);
  EXPECT_EQ(s.first_diff, -1);
}

TEST(Metrics, ZeroReference) {
  const float z[] = {0.0f, 0.0f, 0.0f}, nz[] = {0.0f, 1e-30f, 0.0f};
  EXPECT_EQ(CompareF32(z, z, 3).nrmse, 0.0);
  const DiffStats s = CompareF32(z, nz, 3);
  EXPECT_EQ(s.nrmse, std::numeric_limits<double>::infinity());
  EXPECT_FALSE(
      s.non_finite);  // an infinite NRMSE from finite data is a result, not a NaN/Inf input
  EXPECT_EQ(s.first_diff, 1);
  EXPECT_EQ(CompareF32(z, z, 0).nrmse, 0.0);  // empty: both sums zero
}

TEST(Metrics, SignedZeroIsABitwiseDiffButNoError) {
  const float a[] = {0.0f, -0.0f, 1.0f}, b[] = {-0.0f, 0.0f, 1.0f};
  const DiffStats s = CompareF32(a, b, 3);
  EXPECT_EQ(s.nrmse, 0.0);
  EXPECT_EQ(s.max_abs, 0.0);
  EXPECT_EQ(s.n_diff, 2u);
  EXPECT_EQ(s.first_diff, 0);
  // All-zero reference with a -0.0 in b: both sums are zero -> 0, not inf.
  const float z[] = {0.0f, 0.0f};
  const float nz[] = {-0.0f, 0.0f};
  EXPECT_EQ(CompareF32(z, nz, 2).nrmse, 0.0);
}

TEST(Metrics, NonFiniteFailsTheItem) {
  for (const float bad : {kNaNf, kInff, -kInff}) {
    for (int side = 0; side < 2; ++side) {
      std::vector<float> a = Normal(50, 1.0f, 2), b = a;
      b[40] += 0.25f;
      (side == 0 ? a : b)[17] = bad;
      const DiffStats s = CompareF32(a.data(), b.data(), a.size());
      EXPECT_TRUE(s.non_finite) << bad << " side " << side;
      EXPECT_TRUE(std::isnan(s.nrmse));
      EXPECT_EQ(s.n_diff, 2u);
      EXPECT_EQ(s.first_diff, 17);
      // max_abs over the finite pairs only
      EXPECT_EQ(s.max_abs, std::fabs(static_cast<double>(a[40]) - static_cast<double>(b[40])));
    }
  }
  // The same NaN on both sides: no bitwise difference, still non-finite.
  const float a[] = {1.0f, kNaNf}, b[] = {1.0f, kNaNf};
  const DiffStats s = CompareF32(a, b, 2);
  EXPECT_TRUE(s.non_finite);
  EXPECT_EQ(s.n_diff, 0u);
  EXPECT_TRUE(std::isnan(s.nrmse));
  // A non-finite block poisons the whole item, whatever comes after.
  F32Accumulator acc;
  acc.Add(a, b, 2);
  const float c[] = {1.0f, 2.0f};
  acc.Add(c, c, 2);
  EXPECT_TRUE(acc.Finish().non_finite);
  EXPECT_TRUE(std::isnan(acc.Finish().nrmse));
}

TEST(Metrics, DiffCountsAcrossBlocks) {
  // Blocks of odd sizes and one larger than the internal diff chunk (4096).
  const std::vector<std::size_t> sizes = {5, 37, 16, 10000, 3, 1};
  std::size_t n = 0;
  for (auto s : sizes) n += s;
  std::vector<float> a = Normal(n, 1.0f, 3), b = a;
  const std::vector<std::size_t> diffs = {44, 45, 58, 4200, 8300, 10057, 10061};
  for (auto i : diffs) b[i] = std::nextafter(b[i], 100.0f);
  F32Accumulator acc;
  std::size_t off = 0;
  for (auto s : sizes) {
    acc.Add(a.data() + off, b.data() + off, s);
    off += s;
  }
  const DiffStats s = acc.Finish();
  EXPECT_EQ(s.n, n);
  EXPECT_EQ(s.n_diff, diffs.size());
  EXPECT_EQ(s.first_diff, 44);
  const RefF32 ref = ReferenceF32(a, b);
  EXPECT_NEAR(s.nrmse, ref.nrmse, 1e-12 * ref.nrmse);
  EXPECT_EQ(s.max_abs, ref.max_abs);
  // First diff inside a later 4096-element chunk of one block.
  std::vector<float> c = a;
  c[2 * 4096 + 5] = -c[2 * 4096 + 5];
  const DiffStats t = CompareF32(a.data(), c.data(), c.size());
  EXPECT_EQ(t.first_diff, 2 * 4096 + 5);
  EXPECT_EQ(t.n_diff, 1u);
}

TEST(Metrics, FirstIndexOffsetsAndMerge) {
  const std::vector<float> a = Normal(100003, 1.0f, 4);
  std::vector<float> b = Perturbed(a, 1e-3f, 5);
  const std::size_t cuts[] = {0, 777, 50000, 100003};
  F32Accumulator single;
  F32Accumulator parts[3] = {F32Accumulator(0), F32Accumulator(777), F32Accumulator(50000)};
  for (int k = 0; k < 3; ++k) {
    const std::size_t lo = cuts[k], n = cuts[k + 1] - cuts[k];
    single.Add(a.data() + lo, b.data() + lo, n);
    parts[k].Add(a.data() + lo, b.data() + lo, n);
  }
  F32Accumulator merged = parts[0];
  merged.Merge(parts[1]);
  merged.Merge(parts[2]);
  ExpectSameBits(merged.Finish(), single.Finish());
  // first_diff is the minimum whatever the merge order; only the last bits of the sums may move.
  std::vector<float> c = a;
  c[60000] = 7.0f;
  c[800] = 7.0f;
  F32Accumulator p1(777), p2(50000);
  p1.Add(a.data() + 777, c.data() + 777, 50000 - 777);
  p2.Add(a.data() + 50000, c.data() + 50000, 100003 - 50000);
  p2.Merge(p1);
  EXPECT_EQ(p2.Finish().first_diff, 800);
  EXPECT_EQ(p2.Finish().n_diff, 2u);
}

TEST(Metrics, RandomAgainstFloat64Reference) {
  // 10^7 elements (40 MB per side): one block, and the same data in 1 MiB row blocks.
  const std::size_t n = 10'000'000;
  const std::vector<float> a = Normal(n, 3.0f, 6);
  const std::vector<float> b = Perturbed(a, 1e-4f, 7);
  const RefF32 ref = ReferenceF32(a, b);
  const DiffStats s = CompareF32(a.data(), b.data(), n);
  EXPECT_LE(std::fabs(s.nrmse - ref.nrmse), 1e-6 * ref.nrmse);
  EXPECT_LE(std::fabs(s.nrmse - ref.nrmse), 1e-12 * ref.nrmse);  // what f64 sums actually give
  EXPECT_EQ(s.max_abs, ref.max_abs);
  EXPECT_EQ(s.n_diff, ref.n_diff);
  EXPECT_EQ(s.first_diff, ref.first_diff);
  F32Accumulator acc;
  for (std::size_t i = 0; i < n; i += 262144)
    acc.Add(a.data() + i, b.data() + i, std::min<std::size_t>(262144, n - i));
  const DiffStats t = acc.Finish();
  EXPECT_LE(std::fabs(t.nrmse - ref.nrmse), 1e-12 * ref.nrmse);
  EXPECT_EQ(t.n_diff, ref.n_diff);
  EXPECT_EQ(t.max_abs, ref.max_abs);
}

TEST(Metrics, NaiveF32AccumulationIsNotEnough) {
  // Why the accumulation is f64: a single f32 sum of 10^7 squares is off by far more than 1e-6.
  const std::size_t n = 10'000'000;
  const std::vector<float> a = Normal(n, 1.0f, 8);
  const std::vector<float> b = Perturbed(a, 1e-2f, 9);
  float num = 0.0f, den = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = a[i] - b[i];
    num += d * d;
    den += a[i] * a[i];
  }
  const double naive = std::sqrt(static_cast<double>(num) / static_cast<double>(den));
  const double ref = ReferenceF32(a, b).nrmse;
  EXPECT_GT(std::fabs(naive - ref) / ref, 1e-6);
  EXPECT_LE(std::fabs(CompareF32(a.data(), b.data(), n).nrmse - ref) / ref, 1e-12);
}

// ---- bf16 ----

TEST(Metrics, Bf16HandComputed) {
  // 1.0, 2.0 vs 1.0, 3.0: nrmse = sqrt(1 / 5)
  const std::uint16_t a[] = {0x3f80, 0x4000}, b[] = {0x3f80, 0x4040};
  F32Accumulator acc;
  acc.AddBf16(a, b, 2);
  const DiffStats s = acc.Finish();
  EXPECT_NEAR(s.nrmse, std::sqrt(0.2), 1e-15);
  EXPECT_EQ(s.max_abs, 1.0);
  EXPECT_EQ(s.n_diff, 1u);
  EXPECT_EQ(s.first_diff, 1);
  // -0 vs +0 codes differ bitwise; a NaN code fails the item.
  const std::uint16_t z[] = {0x0000, 0x7fc0}, nz[] = {0x8000, 0x3f80};
  F32Accumulator acc2;
  acc2.AddBf16(z, nz, 2);
  const DiffStats t = acc2.Finish();
  EXPECT_TRUE(t.non_finite);
  EXPECT_EQ(t.n_diff, 2u);
  EXPECT_EQ(t.max_abs, 0.0);
}

TEST(Metrics, Bf16MatchesWidenedF32Bitwise) {
  // Same lane structure, so the bf16 path and the f32 path over the widened values agree in
  // every bit (odd length: exercises the padded tail).
  const std::size_t n = 12345;
  std::mt19937 rng(10);
  std::vector<std::uint16_t> a(n), b(n);
  std::vector<float> fa(n), fb(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<std::uint16_t>(0x3c00 + rng() % 0x0800);  // finite values around 2^-7 .. 2^9
    b[i] = rng() % 7 == 0 ? static_cast<std::uint16_t>(a[i] ^ 1u) : a[i];
    fa[i] = std::bit_cast<float>(std::uint32_t{a[i]} << 16);
    fb[i] = std::bit_cast<float>(std::uint32_t{b[i]} << 16);
  }
  F32Accumulator acc;
  acc.AddBf16(a.data(), b.data(), n);
  ExpectSameBits(acc.Finish(), CompareF32(fa.data(), fb.data(), n));
}

// ---- int8 ----

TEST(Metrics, Int8EqualCodesDifferentScales) {
  // Codes equal, scales 0.5 vs 0.25: every value differs by exactly half of it -> nrmse 0.5.
  const std::int8_t codes[] = {1, -2, 3, -4, 5, 6};
  const float sa[] = {0.5f, 0.5f}, sb[] = {0.25f, 0.25f};
  F32Accumulator acc;
  acc.AddInt8(codes, sa, codes, sb, 1, 2, 3);
  const DiffStats s = acc.Finish();
  EXPECT_EQ(s.code_diff, 0u);
  EXPECT_EQ(s.first_code_diff, -1);
  EXPECT_EQ(s.n_diff, 6u);
  EXPECT_EQ(s.first_diff, 0);
  EXPECT_NEAR(s.nrmse, 0.5, 1e-15);
  EXPECT_EQ(s.max_abs, 1.5);  // code 6: 3.0 vs 1.5
}

TEST(Metrics, Int8HandComputed) {
  // rows 2, heads 2, head_dim 2; scales [row, head].
  const std::int8_t a[] = {10, 20, /**/ -5, 0, /**/ 1, 2, /**/ 3, 4};
  const std::int8_t b[] = {10, 20, /**/ -5, 1, /**/ 1, 2, /**/ 3, 2};
  const float sa[] = {0.5f, 2.0f, 1.0f, 0.25f};
  const float sb[] = {0.5f, 2.0f, 1.0f, 0.25f};
  // values a: 5 10 -10 0 1 2 0.75 1;  b: 5 10 -10 2 1 2 0.75 0.5
  // sum d^2 = 4 + 0.25; sum a^2 = 25 + 100 + 100 + 0 + 1 + 4 + 0.5625 + 1 = 231.5625
  F32Accumulator acc;
  acc.AddInt8(a, sa, b, sb, 2, 2, 2);
  const DiffStats s = acc.Finish();
  EXPECT_EQ(s.code_diff, 2u);
  EXPECT_EQ(s.first_code_diff, 3);
  EXPECT_EQ(s.n_diff, 2u);
  EXPECT_EQ(s.first_diff, 3);
  EXPECT_EQ(s.max_abs, 2.0);
  EXPECT_NEAR(s.nrmse, std::sqrt(4.25 / 231.5625), 1e-15);
  EXPECT_EQ(s.n, 8u);
  // A second block: indices continue.
  acc.AddInt8(a, sa, b, sb, 2, 2, 2);
  EXPECT_EQ(acc.Finish().code_diff, 4u);
  EXPECT_EQ(acc.Finish().first_code_diff, 3);
  // A non-finite scale fails the item.
  const float bad[] = {0.5f, kNaNf, 1.0f, 0.25f};
  F32Accumulator acc2;
  acc2.AddInt8(a, sa, b, bad, 2, 2, 2);
  EXPECT_TRUE(acc2.Finish().non_finite);
  EXPECT_EQ(acc2.Finish().max_abs, 0.5);  // element 3 (difference 2) is NaN on the b side now
}

TEST(Metrics, Int8MatchesDequantizedF32Bitwise) {
  // Odd head_dim, more values than one internal dequantization chunk (2048).
  const std::size_t rows = 37, heads = 7, head_dim = 13, n = rows * heads * head_dim;
  std::mt19937 rng(11);
  std::vector<std::int8_t> a(n), b(n);
  std::vector<float> sa(rows * heads), sb(rows * heads), fa(n), fb(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<std::int8_t>(static_cast<int>(rng() % 255) - 127);
    b[i] = rng() % 11 == 0 ? static_cast<std::int8_t>(a[i] / 2) : a[i];
  }
  for (std::size_t g = 0; g < rows * heads; ++g) {
    sa[g] = static_cast<float>(rng() % 1000 + 1) * 1e-4f;
    sb[g] = g % 5 == 0 ? sa[g] * 1.001f : sa[g];
  }
  std::uint64_t code_diff = 0;
  std::int64_t first_code = -1;
  for (std::size_t i = 0; i < n; ++i) {
    fa[i] = static_cast<float>(a[i]) * sa[i / head_dim];
    fb[i] = static_cast<float>(b[i]) * sb[i / head_dim];
    if (a[i] != b[i]) {
      ++code_diff;
      if (first_code < 0) first_code = static_cast<std::int64_t>(i);
    }
  }
  F32Accumulator acc;
  acc.AddInt8(a.data(), sa.data(), b.data(), sb.data(), rows, heads, head_dim);
  DiffStats want = CompareF32(fa.data(), fb.data(), n);
  want.code_diff = code_diff;
  want.first_code_diff = first_code;
  ExpectSameBits(acc.Finish(), want);
  EXPECT_GT(code_diff, 0u);
}

// ---- KL ----

TEST(Metrics, KlIdenticalIsExactlyZero) {
  const std::size_t cols = 151936;
  const std::vector<float> a = Normal(3 * cols, 4.0f, 12);
  const KlStats k = CompareLogits(a.data(), a.data(), 3, cols);
  EXPECT_EQ(k.kl_max, 0.0);
  EXPECT_EQ(k.kl_mean, 0.0);
  EXPECT_EQ(k.top1_agree, 3u);
  EXPECT_EQ(k.rows, 3u);
  EXPECT_FALSE(k.non_finite);
}

TEST(Metrics, KlShiftInvariance) {
  // Logits on a 2^-10 grid in [-16, 16], shifted by 3: the shifted values are exact in f32.
  const std::size_t cols = 50021;
  std::mt19937 rng(13);
  std::vector<float> a(2 * cols), b(2 * cols);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(static_cast<int>(rng() % 32768) - 16384) / 1024.0f;
    b[i] = a[i] + (i < cols ? 3.0f : -5.5f);
  }
  const KlStats k = CompareLogits(a.data(), b.data(), 2, cols);
  EXPECT_LT(std::fabs(k.kl_max), 1e-12);
  EXPECT_LT(std::fabs(k.kl_mean), 1e-12);
  EXPECT_EQ(k.top1_agree, 2u);
}

TEST(Metrics, KlTwoClasses) {
  const float a[] = {0.0f, 0.0f};
  const float b[] = {static_cast<float>(std::log(3.0)), 0.0f};
  // p = (.5, .5), q = (.75, .25): KL = .5 ln(.5/.75) + .5 ln(.5/.25) = .5 ln(4/3)
  const KlStats k = CompareLogits(a, b, 1, 2);
  EXPECT_NEAR(k.kl_max, 0.5 * std::log(4.0 / 3.0), 1e-7);  // b0 is log 3 rounded to f32
  const long double b0 = static_cast<long double>(b[0]);
  const long double q0 = std::exp(b0) / (std::exp(b0) + 1.0L);
  const double exact =
      static_cast<double>(0.5L * std::log(0.5L / q0) + 0.5L * std::log(0.5L / (1.0L - q0)));
  EXPECT_NEAR(k.kl_max, exact, 1e-6 * exact);
  EXPECT_EQ(k.kl_mean, k.kl_max);
  EXPECT_EQ(k.top1_agree, 1u);  // a ties: lowest index 0; b: 0
}

TEST(Metrics, KlTop1Ties) {
  // Row 0: a ties at 1 and 2 -> 1; b ties at 0, 2, 3 -> 0: disagree.
  // Row 1: -0.0 ties with +0.0 -> index 0 on both sides: agree.
  const float a[] = {1, 5, 5, 2, -0.0f, 0.0f, -1, -2};
  const float b[] = {5, 1, 5, 5, 0.0f, -0.0f, -3, -1};
  const KlStats k = CompareLogits(a, b, 2, 4);
  EXPECT_EQ(k.top1_agree, 1u);
  // Ties across vector lanes and the scalar tail (cols 40: lanes 0..31, tail 32..39).
  auto argmax_agrees = [](std::vector<float> x, std::vector<float> y) {
    return CompareLogits(x.data(), y.data(), 1, x.size()).top1_agree == 1;
  };
  std::vector<float> x(40, 0.0f), y(40, 0.0f);
  x[14] = x[17] = 9.0f;  // the lower index sits in the higher lane (14 vs 1): 14
  y[14] = 9.0f;
  EXPECT_TRUE(argmax_agrees(x, y));
  y[14] = 0.0f;
  y[17] = 9.0f;
  EXPECT_FALSE(argmax_agrees(x, y));
  std::vector<float> z(40, 0.0f);
  z[35] = z[3] = z[20] = 9.0f;  // lane 3, lane 4 and the scalar tail: 3
  std::vector<float> w(40, 0.0f);
  w[3] = 9.0f;
  EXPECT_TRUE(argmax_agrees(z, w));
  std::vector<float> t(40, 0.0f);
  t[33] = 9.0f;  // only in the tail
  std::vector<float> u(40, 0.0f);
  u[33] = 8.0f;
  EXPECT_TRUE(argmax_agrees(t, u));
  std::vector<float> v(40, 1.0f);  // all equal: 0
  u.assign(40, 0.0f);
  u[0] = 1.0f;
  EXPECT_TRUE(argmax_agrees(v, u));
}

TEST(Metrics, KlRandomAgainstFloat64Reference) {
  // Vocabulary 151936 (= 16 * 9496, no tail) and 151939 (a padded tail of 3).
  for (const std::size_t cols : {std::size_t{151936}, std::size_t{151939}}) {
    const std::size_t rows = 4;
    const std::vector<float> a = Normal(rows * cols, 3.0f, 14);
    std::vector<float> b(a.size());
    const std::vector<float> unrelated = Normal(rows * cols, 3.0f, 15);
    const std::vector<float> noise = Normal(rows * cols, 1.0f, 16);
    // Row 0: unrelated (KL ~ 8); row 1: noise 0.1 (KL ~ 5e-3); row 2: noise 1e-3 (KL ~ 4e-7); row
    // 3: noise 1e-5 on logits shifted by 7 (KL ~ 5e-11).
    const float sigma[] = {0.0f, 0.1f, 1e-3f, 1e-5f};
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < cols; ++i) {
        const std::size_t k = r * cols + i;
        b[k] = r == 0 ? unrelated[k] : a[k] + sigma[r] * noise[k] + (r == 3 ? 7.0f : 0.0f);
      }
    double sum = 0.0, mx = 0.0;
    for (std::size_t r = 0; r < rows; ++r) {
      const double ref = ReferenceKl(a.data() + r * cols, b.data() + r * cols, cols);
      const KlStats one = CompareLogits(a.data() + r * cols, b.data() + r * cols, 1, cols);
      EXPECT_LE(std::fabs(one.kl_max - ref), 1e-4 * ref)
          << "row " << r << " ref " << ref << " got " << one.kl_max;
      EXPECT_LE(std::fabs(one.kl_max - ref), 1e-5 * ref) << "row " << r;  // margin actually reached
      sum += ref;
      mx = std::max(mx, ref);
    }
    const KlStats k = CompareLogits(a.data(), b.data(), rows, cols);
    EXPECT_NEAR(k.kl_max, mx, 1e-4 * mx);
    EXPECT_NEAR(k.kl_mean, sum / rows, 1e-4 * sum / rows);
    EXPECT_EQ(k.rows, rows);
  }
}

TEST(Metrics, KlHardCases) {
  const std::size_t cols = 151936;
  const std::vector<float> a = Normal(cols, 1.0f, 17);
  std::size_t am = 0;
  for (std::size_t i = 1; i < cols; ++i)
    if (a[i] > a[am]) am = i;
  auto check = [&](const std::vector<float>& b, const char* what) {
    const double ref = ReferenceKl(a.data(), b.data(), cols);
    const double got = CompareLogits(a.data(), b.data(), 1, cols).kl_max;
    EXPECT_LE(std::fabs(got - ref), 1e-5 * ref) << what << ": ref " << ref << " got " << got;
  };
  // Only the argmax moves: the maxima no longer line up (the row is re-centred).
  std::vector<float> b = a;
  b[am] -= 1.0f;
  check(b, "argmax lowered");
  // Where p is negligible, q gets a large mass.
  b = a;
  b[(am + 1) % cols] = a[am] + 30.0f;
  check(b, "q spike");
  // Where q is negligible, p has its maximum.
  b = a;
  b[am] = -60.0f;
  check(b, "q hole");
  // A large mask on the b side (finite, very negative), and on both.
  b = a;
  for (std::size_t i = 0; i < cols; i += 3) b[i] = -1e30f;
  check(b, "b masked");
  std::vector<float> a2 = a;
  for (std::size_t i = 0; i < cols; i += 3) a2[i] = b[i];
  const double ref2 = ReferenceKl(a2.data(), b.data(), cols);
  EXPECT_NEAR(CompareLogits(a2.data(), b.data(), 1, cols).kl_max, 0.0, 1e-12);
  EXPECT_EQ(ref2, 0.0);
}

TEST(Metrics, KlExtremeFiniteLogits) {
  // Differences past FLT_MAX leave the f32 fast path; the f64 fallback gives KL = 6e38.
  const float a[] = {3e38f, -3e38f}, b[] = {-3e38f, 3e38f};
  const KlStats k = CompareLogits(a, b, 1, 2);
  EXPECT_FALSE(k.non_finite);
  EXPECT_NEAR(k.kl_max, 6e38, 1e-6 * 6e38);
  EXPECT_EQ(k.top1_agree, 0u);
}

TEST(Metrics, KlNonFiniteRow) {
  const std::size_t cols = 100;
  std::vector<float> a = Normal(3 * cols, 1.0f, 18), b = a;
  b[cols + 50] = kNaNf;
  KlStats k = CompareLogits(a.data(), b.data(), 3, cols);
  EXPECT_TRUE(k.non_finite);
  EXPECT_TRUE(std::isnan(k.kl_max));
  EXPECT_TRUE(std::isnan(k.kl_mean));
  EXPECT_EQ(k.top1_agree, 2u);  // the NaN row does not vote
  EXPECT_EQ(k.rows, 3u);
  b[cols + 50] = a[cols + 50];
  a[2 * cols + 99] = -kInff;  // in the scalar tail of the max pass
  k = CompareLogits(a.data(), b.data(), 3, cols);
  EXPECT_TRUE(k.non_finite);
  EXPECT_EQ(k.top1_agree, 2u);
  EXPECT_FALSE(CompareLogits(a.data(), b.data(), 2, cols).non_finite);
}

TEST(Metrics, KlMergeEqualsSinglePass) {
  const std::size_t rows = 10, cols = 1003;
  const std::vector<float> a = Normal(rows * cols, 2.0f, 19);
  const std::vector<float> b = Perturbed(a, 0.05f, 20);
  const std::size_t cuts[] = {0, 3, 4, 10};
  KlAccumulator single, merged;
  for (int k = 0; k < 3; ++k) {
    const std::size_t r0 = cuts[k], n = cuts[k + 1] - cuts[k];
    single.AddRows(a.data() + r0 * cols, b.data() + r0 * cols, n, cols);
    KlAccumulator part;
    part.AddRows(a.data() + r0 * cols, b.data() + r0 * cols, n, cols);
    if (k == 0) {
      merged = part;
    } else {
      merged.Merge(part);
    }
  }
  const KlStats s = single.Finish(), m = merged.Finish();
  EXPECT_EQ(std::bit_cast<std::uint64_t>(s.kl_mean), std::bit_cast<std::uint64_t>(m.kl_mean));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(s.kl_max), std::bit_cast<std::uint64_t>(m.kl_max));
  EXPECT_EQ(s.top1_agree, m.top1_agree);
  EXPECT_EQ(s.rows, rows);
  EXPECT_EQ(m.rows, rows);
  // One block equals the per-row references.
  double sum = 0.0;
  for (std::size_t r = 0; r < rows; ++r)
    sum += ReferenceKl(a.data() + r * cols, b.data() + r * cols, cols);
  EXPECT_NEAR(CompareLogits(a.data(), b.data(), rows, cols).kl_mean, sum / rows, 1e-5 * sum / rows);
}

TEST(Metrics, KlEmpty) {
  const KlStats k = CompareLogits(nullptr, nullptr, 0, 10);
  EXPECT_EQ(k.rows, 0u);
  EXPECT_EQ(k.kl_mean, 0.0);
  EXPECT_FALSE(k.non_finite);
}

}  // namespace
}  // namespace lockstep
