// The vector SiLU (engine/cpu/activation.h) against norm.h's scalar form, bit for bit: its exp
// against the C library's expf on a dense sweep of all float bit patterns and on the edges of
// glibc's fast path, and each activation row (any length, slow-path lanes among fast ones).
#include "cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/norm.h"

namespace lockstep::cpu {
namespace {

std::uint32_t BitsOf(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Bitwise mismatches of ExpForTest against std::exp over `x` (reports the first few).
std::uint64_t ExpMismatches(const std::vector<float>& x) {
  std::vector<float> got(x.size());
  ExpForTest(x.data(), x.size(), got.data());
  std::uint64_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    if (BitsOf(got[i]) == BitsOf(want)) continue;
    if (++bad <= 5)
      ADD_FAILURE() << "exp(" << std::hexfloat << x[i] << ") = " << got[i] << ", libm " << want;
  }
  return bad;
}

TEST(VectorExp, EqualsLibmOnADenseSweepOfAllFloats) {
  // Every 61st bit pattern (70 million, both signs, every exponent; the stride is odd, so the
  // low mantissa bits take every value), or all 2^32 with LOCKSTEP_EXHAUSTIVE_EXP=1 (~25 s).
  const char* all = std::getenv("LOCKSTEP_EXHAUSTIVE_EXP");  // env: LOCKSTEP_EXHAUSTIVE_EXP
  const std::uint64_t stride = all != nullptr && std::string(all) == "1" ? 1 : 61;
  constexpr std::size_t kBatch = 1 << 20;
  std::vector<float> x;
  x.reserve(kBatch);
  std::uint64_t bad = 0, n = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += stride) {
    x.push_back(FromBits(static_cast<std::uint32_t>(u)));
    if (x.size() == kBatch) {
      bad += ExpMismatches(x);
      n += x.size();
      x.clear();
    }
  }
  bad += ExpMismatches(x);
  n += x.size();
  EXPECT_EQ(bad, 0u) << "of " << n << " inputs";
}

// The inputs on glibc's fast path whose double result before the rounding to float lies nearest
// a rounding midpoint (within 64 double ulps; and the 6 nearest for each of the 32 table
// entries), found by a scan of all 2^32 floats: the inputs where a change of the arithmetic first
// changes a float. (r = x N / ln 2 - k rounded apart instead of fused fails here; a table entry,
// C2 or the last fma off by one ulp changes no float of the 2^32, by the same scan.)
constexpr std::uint32_t kHard[] = {
    0x337ffffc, 0x337ffffd, 0x337ffffe, 0x337fffff, 0x33800000, 0x33800001, 0x343ffffe, 0x343fffff,
    0x349ffffe, 0x34dffffd, 0x352ffffc, 0x356ffff9, 0x35a7fff9, 0x35f7fff1, 0x3653ffea, 0x367bffe1,
    0x3695ffea, 0x36fdffc1, 0x3734ffc0, 0x377eff81, 0x37a57f95, 0x37ff7f01, 0x387ebe05, 0x38fddc11,
    0x390c0d9b, 0x3998e24b, 0x39d20d3a, 0x39e6ab02, 0x3a29cdeb, 0x3b0b4517, 0x3b37991a, 0x3b50125a,
    0x3b8f4138, 0x3ba3afaa, 0x3bf4a127, 0x3c4804ea, 0x3c76fcc3, 0x3ce389de, 0x3d0f39ba, 0x3d103181,
    0x3d38df42, 0x3d40e5ad, 0x3d6a7d06, 0x3d7451e8, 0x3d8932e8, 0x3d91e449, 0x3d985c09, 0x3db6b915,
    0x3dc42683, 0x3ddf9748, 0x3de3542c, 0x3de3ae1b, 0x3df0cb95, 0x3e0249d4, 0x3e054ef2, 0x3e1a4b0c,
    0x3e3133ff, 0x3e3584ea, 0x3e456321, 0x3e5f140a, 0x3e6d8716, 0x3e72b052, 0x3e73ade2, 0x3eae9b61,
    0x3eb71f7d, 0x3ee08eed, 0x3f0471bf, 0x3f069eb5, 0x3f1f426e, 0x3f4564d1, 0x3f560a4e, 0x3f585eaf,
    0x3f6a744d, 0x3f7b6790, 0x3f7ee9a2, 0x3f8368c6, 0x3fa1e2a9, 0x3fbe11a6, 0x3fc69648, 0x3fd158cb,
    0x3fe39b58, 0x3feb128d, 0x400d98c7, 0x40143eb5, 0x401dd368, 0x401f2492, 0x4023638a, 0x404089d7,
    0x40543eed, 0x4070cda3, 0x4077f870, 0x40949292, 0x40a19937, 0x40a63bf9, 0x40c12c37, 0x40caa6b2,
    0x40d1be8d, 0x40e56d41, 0x4100aaf7, 0x4101b1d5, 0x41220a30, 0x412fac45, 0x4133c6f3, 0x413ac15d,
    0x41575733, 0x418eb76d, 0x418f2126, 0x4193842a, 0x4197276c, 0x419934a6, 0x41a41529, 0x41bbacc7,
    0x41c56f9e, 0x41e132f7, 0x41f8271c, 0x4202422f, 0x4204aae2, 0x422a4e6c, 0x42360afc, 0x4263ef73,
    0x42831275, 0x429f0d5f, 0x42a95241, 0xb2fffffd, 0xb2fffffe, 0xb2ffffff, 0xb3000000, 0xb3000001,
    0xb3000002, 0xb3c00000, 0xb3c00001, 0xb4200001, 0xb4600002, 0xb4b00002, 0xb5480005, 0xb59c0006,
    0xb5d4000b, 0xb616000b, 0xb6b50020, 0xb6e90035, 0xb70b8026, 0xb7c9c09f, 0xb7f4c0ea, 0xb8ca127e,
    0xb8df930d, 0xb921cb32, 0xb971ef25, 0xb97dbfdc, 0xb9a56aae, 0xb9bc64aa, 0xb9cf1678, 0xb9d65737,
    0xb9fbab76, 0xba253b54, 0xba493dc5, 0xba921bd7, 0xba981b96, 0xbab8080f, 0xbac75bcb, 0xbb378639,
    0xbb57a63b, 0xbbd8ac3c, 0xbbe861b2, 0xbc3f2901, 0xbc70a558, 0xbcd1fedf, 0xbce54441, 0xbd1c78ff,
    0xbd3e69a5, 0xbd45ef0a, 0xbd7273a8, 0xbd76e220, 0xbd833972, 0xbda5dfd0, 0xbdb00cc8, 0xbdbd5053,
    0xbe14c82c, 0xbe250180, 0xbe3de352, 0xbe47be83, 0xbe4de67d, 0xbe5af815, 0xbe70ef75, 0xbe7c1f1d,
    0xbe7cac57, 0xbe8517e8, 0xbea692d9, 0xbeae4609, 0xbeb7bdad, 0xbebbf550, 0xbec797f6, 0xbecef5ae,
    0xbed8f81b, 0xbedf5f85, 0xbee25732, 0xbefa473e, 0xbf0031d8, 0xbf0fa174, 0xbf149674, 0xbf24e0b2,
    0xbf2c2441, 0xbf5f57e4, 0xbf6659e0, 0xbf67ad81, 0xbf80c3c5, 0xbf9464d2, 0xbf96fe1f, 0xbfb60b44,
    0xbfb85397, 0xbfb9d144, 0xbfbf6735, 0xbfc1ceaf, 0xbfc3ac15, 0xbfda1fbf, 0xbfdd1b2c, 0xbfde3004,
    0xbfe0255a, 0xc00a6809, 0xc01e1b2f, 0xc020dc72, 0xc0492d22, 0xc0541940, 0xc068da36, 0xc06d2e68,
    0xc072e77f, 0xc07c182d, 0xc0809842, 0xc09cbb0f, 0xc09fdf32, 0xc0cadb19, 0xc0ce29de, 0xc0d7626b,
    0xc0f82e2d, 0xc1185f39, 0xc13a4a45, 0xc13d9d63, 0xc16d23fb, 0xc1798dc1, 0xc17a67ea, 0xc17a8a27,
    0xc17bf999, 0xc1ba55c7, 0xc1bc688a, 0xc1c471b1, 0xc1ce6a28, 0xc1d2107a, 0xc1e05ba8, 0xc1f3af50,
    0xc20db7b4, 0xc21b02a2, 0xc22156c9, 0xc22d7bb8, 0xc238c045, 0xc23dd581, 0xc251ceec, 0xc2633f4c,
    0xc2682a83, 0xc26a11da, 0xc26c2e63, 0xc2772609, 0xc27c65d9,
};

TEST(VectorExp, EqualsLibmAtTheEdges) {
  std::vector<float> x;
  for (std::uint32_t u : kHard) x.push_back(FromBits(u));
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f,
                  -0.0f,
                  inf,
                  -inf,
                  std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::signaling_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min(),
                  -std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::lowest(),
                  88.0f,
                  -88.0f,
                  0x1.62e42ep6f,
                  0x1.62e430p6f,
                  -0x1.9fe368p6f,
                  -0x1.9fe36ap6f,
                  -0x1.9d1d9ep6f,
                  -0x1.9d1da0p6f,
                  1.0f,
                  -1.0f})
    x.push_back(v);
  // Around glibc's fast-path bound (top 12 bits 0x42a / 0x42b) on both signs, every pattern.
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t u = 0x42a00000u - 4096; u < 0x42c00000u + 4096; ++u)
      x.push_back(FromBits(sign | u));
  // Near the points where x N / ln 2 is half an integer (k's rounding ties), every k of the fast
  // path (x in [-104, 89]).
  for (int k = -4810; k <= 4110; ++k) {
    const float c = static_cast<float>((k + 0.5) * 0.69314718055994530942 / 32.0);
    for (int d = -8; d <= 8; ++d)
      x.push_back(FromBits(static_cast<std::uint32_t>(static_cast<std::int64_t>(BitsOf(c)) + d)));
  }
  EXPECT_EQ(ExpMismatches(x), 0u);
}

// Rows of every length 0..80 and a long one, seeded values with slow-path lanes (|x| > 85, inf,
// NaN) among the fast ones: each form equals its scalar expression bitwise.
TEST(VectorSilu, RowsEqualTheScalarFormBitwise) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const float specials[] = {90.0f,
                            -90.0f,
                            200.0f,
                            -1e30f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -0.0f,
                            0.0f};
  auto row = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = rng() % 13 == 0 ? specials[rng() % std::size(specials)] : normal(rng);
    return v;
  };
  auto same = [](const std::vector<float>& a, const std::vector<float>& b, const char* what,
                 std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      if (BitsOf(a[i]) != BitsOf(b[i]))
        return ::testing::AssertionFailure() << what << " n=" << n << " i=" << i << ": "
                                             << std::hexfloat << a[i] << " vs " << b[i];
    return ::testing::AssertionSuccess();
  };
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 80; ++n) lengths.push_back(n);
  lengths.push_back(8192 + 7);
  for (std::size_t n : lengths) {
    const std::vector<float> x = row(n), z = row(n), w = row(n), u = row(n);
    const float r = 0.37f;
    std::vector<float> got = x, want(n);
    SiluInPlace(got.data(), n);
    for (std::size_t i = 0; i < n; ++i) want[i] = Silu(x[i]);
    ASSERT_TRUE(same(got, want, "SiluInPlace", n));
    got = x;
    SiluMulInPlace(got.data(), u.data(), n);
    for (std::size_t i = 0; i < n; ++i) want[i] = Silu(x[i]) * u[i];
    ASSERT_TRUE(same(got, want, "SiluMulInPlace", n));
    got = x;
    ExpShiftedInPlace(got.data(), n, 1.75f);
    for (std::size_t i = 0; i < n; ++i) want[i] = std::exp(x[i] - 1.75f);
    ASSERT_TRUE(same(got, want, "ExpShiftedInPlace", n));
    GatedScale(x.data(), z.data(), w.data(), r, n, got.data());
    for (std::size_t i = 0; i < n; ++i) want[i] = x[i] * r * w[i] * Silu(z[i]);
    ASSERT_TRUE(same(got, want, "GatedScale", n));
  }
}

}  // namespace
}  // namespace lockstep::cpu
