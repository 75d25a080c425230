// Bit-exact tests for engine/dtype.{h,cpp}: bf16 / f16 rounding tables, exhaustive roundtrips,
// random inputs against an independent double-precision reference (and against the CPU's F16C
// instructions where the build has them), the volatile-flag path that caught the g++ 12.2
// masked-truncation miscompile, and int8 row quantisation tables.
#include "lockstep/engine/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace lockstep {
namespace {

std::uint32_t Bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float FromBits(std::uint32_t u) { return std::bit_cast<float>(u); }
bool IsNanBits(std::uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

std::string Hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// ---- test-only references (double precision, independent of the integer tricks) ----

// Nearest bf16 of a non-NaN f32 pattern, ties to even, computed by comparing the distances to
// the two candidates in double (exact: f32 values and their midpoints are doubles).
std::uint16_t RefBf16(std::uint32_t u) {
  const std::uint32_t lo = u & 0xffff0000u;  // truncation: same sign, smaller magnitude
  if (lo == u) return static_cast<std::uint16_t>(lo >> 16);
  const std::uint32_t hi = lo + 0x10000u;  // next magnitude; may be the Inf pattern
  const double x = FromBits(u);
  const double dlo = FromBits(lo);
  // Overflow follows IEEE: round as if the exponent were unbounded, so "Inf" sits at 2^128.
  const double dhi = (hi & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), x)
                                                       : static_cast<double>(FromBits(hi));
  const double d_lo = std::fabs(x - dlo);
  const double d_hi = std::fabs(dhi - x);
  std::uint32_t pick;
  if (d_lo < d_hi) {
    pick = lo;
  } else if (d_hi < d_lo) {
    pick = hi;
  } else {
    pick = ((lo >> 16) & 1u) == 0u ? lo : hi;
  }
  return static_cast<std::uint16_t>(pick >> 16);
}

// Value of every non-negative finite f16 code, plus 2^16 standing in for Inf (0x7c00), built
// from first principles (not from f16_to_f32).
const std::vector<double>& HalfValues() {
  static const std::vector<double> table = [] {
    std::vector<double> v;
    for (std::uint32_t h = 0; h <= 0x7c00u; ++h) {
      const std::uint32_t e = h >> 10;
      const std::uint32_t m = h & 0x3ffu;
      if (e == 0) {
        v.push_back(std::ldexp(static_cast<double>(m), -24));
      } else {
        v.push_back(std::ldexp(1.0 + static_cast<double>(m) / 1024.0, static_cast<int>(e) - 15));
      }
    }
    return v;
  }();
  return table;
}

// Nearest f16 of a non-NaN f32 pattern, ties to even, by search in HalfValues().
std::uint16_t RefF16(std::uint32_t u) {
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const double ax = std::fabs(static_cast<double>(FromBits(u)));
  const auto& t = HalfValues();
  if (ax >= t.back()) return static_cast<std::uint16_t>(sign | 0x7c00u);
  const auto it = std::upper_bound(t.begin(), t.end(), ax);  // first > ax; it != begin
  const auto hi = static_cast<std::uint32_t>(it - t.begin());
  const std::uint32_t lo = hi - 1;
  std::uint32_t pick;
  const double d_lo = ax - t[lo];
  const double d_hi = t[hi] - ax;
  if (d_lo < d_hi) {
    pick = lo;
  } else if (d_hi < d_lo) {
    pick = hi;
  } else {
    pick = (lo & 1u) == 0u ? lo : hi;
  }
  return static_cast<std::uint16_t>(sign | pick);
}

// ---- names ----

TEST(DtypeTest, SizesAndSafetensorsNamesRoundtrip) {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI8,
                       DType::kU8,  DType::kI32, DType::kI64,  DType::kBool};
  const std::size_t sizes[] = {4, 2, 2, 8, 1, 1, 4, 8, 1};
  for (std::size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(dtype_size(all[i]), sizes[i]) << dtype_name(all[i]);
    const auto back = dtype_from_safetensors(dtype_safetensors_name(all[i]));
    ASSERT_TRUE(back.has_value()) << dtype_safetensors_name(all[i]);
    EXPECT_EQ(*back, all[i]);
  }
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_name(DType::kI8), "int8");
  EXPECT_FALSE(dtype_from_safetensors("Q7").has_value());
  EXPECT_FALSE(dtype_from_safetensors("bf16").has_value());  // names are case-sensitive
  EXPECT_FALSE(dtype_from_safetensors("").has_value());
}

// ---- bf16 ----

struct NarrowCase {
  std::uint32_t f32;
  std::uint16_t want;
  const char* what;
};

TEST(Bf16Test, RoundingTable) {
  const NarrowCase cases[] = {
      {0x3f800000u, 0x3f80u, "1.0 exact"},
      {0x3f808000u, 0x3f80u, "tie, lower neighbour even -> down"},
      {0x3f818000u, 0x3f82u, "tie, lower neighbour odd -> up"},
      {0xbf808000u, 0xbf80u, "negative tie -> down (even)"},
      {0xbf818000u, 0xbf82u, "negative tie -> up (even)"},
      {0x3f807fffu, 0x3f80u, "just below half ulp"},
      {0x3f808001u, 0x3f81u, "just above half ulp"},
      {0x3f81ffffu, 0x3f82u, "just below next value"},
      {0x3fffffffu, 0x4000u, "mantissa carry bumps the exponent"},
      {0x7f7f0000u, 0x7f7fu, "max finite bf16"},
      {0x7f7f7fffu, 0x7f7fu, "just below half ulp of max finite"},
      {0x7f7f8000u, 0x7f80u, "tie at max finite (odd) -> Inf"},
      {0x7f7fffffu, 0x7f80u, "f32 max finite overflows to Inf"},
      {0xff7fffffu, 0xff80u, "-f32 max finite overflows to -Inf"},
      {0x00000000u, 0x0000u, "+0"},
      {0x80000000u, 0x8000u, "-0"},
      {0x7f800000u, 0x7f80u, "+Inf"},
      {0xff800000u, 0xff80u, "-Inf"},
      {0x7fc00000u, 0x7fc0u, "quiet NaN"},
      {0xffc00000u, 0xffc0u, "negative quiet NaN keeps sign"},
      {0x7f800001u, 0x7fc0u, "signalling NaN, payload only in low bits -> quiet, not Inf"},
      {0xff800001u, 0xffc0u, "negative signalling NaN -> negative quiet NaN"},
      {0x7fa00000u, 0x7fe0u, "NaN top payload bits kept, quiet bit set"},
      {0x7fffffffu, 0x7fffu, "all-ones NaN"},
      {0x00000001u, 0x0000u, "smallest f32 subnormal -> +0"},
      {0x80000001u, 0x8000u, "negative smallest subnormal -> -0"},
      {0x00008000u, 0x0000u, "subnormal tie -> even (0)"},
      {0x00018000u, 0x0002u, "subnormal tie -> even (2)"},
      {0x00008001u, 0x0001u, "subnormal just above half"},
      {0x00010000u, 0x0001u, "smallest bf16 subnormal exact"},
      {0x007fffffu, 0x0080u, "largest f32 subnormal rounds up to smallest normal"},
      {0x00400000u, 0x0040u, "f32 subnormal exact in bf16"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(f32_to_bf16(FromBits(c.f32)), c.want) << c.what << " (" << Hex(c.f32) << ")";
    if (!IsNanBits(c.f32)) {
      EXPECT_EQ(RefBf16(c.f32), c.want) << "reference disagrees with table: " << c.what;
    }
  }
}

TEST(Bf16Test, WideningIsExact) {
  EXPECT_EQ(Bits(bf16_to_f32(0x3f80u)), 0x3f800000u);
  EXPECT_EQ(Bits(bf16_to_f32(0x8000u)), 0x80000000u);
  EXPECT_EQ(Bits(bf16_to_f32(0x0001u)), 0x00010000u);
  EXPECT_EQ(Bits(bf16_to_f32(0x7f80u)), 0x7f800000u);
  EXPECT_EQ(Bits(bf16_to_f32(0xff81u)), 0xff810000u);  // NaN payload widened verbatim
  EXPECT_EQ(bf16_to_f32(0x4049u), 3.140625f);
  EXPECT_EQ(round_to_bf16(3.14159265f), 3.140625f);
}

TEST(Bf16Test, ExhaustiveRoundtrip) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto code = static_cast<std::uint16_t>(b);
    const float f = bf16_to_f32(code);
    const std::uint16_t back = f32_to_bf16(f);
    if ((b & 0x7fffu) > 0x7f80u) {
      ASSERT_TRUE(std::isnan(f)) << Hex(b);
      ASSERT_GT(back & 0x7fffu, 0x7f80u) << "NaN must stay NaN: " << Hex(b);
      ASSERT_EQ(back, b | 0x0040u) << "NaN is quieted, sign and payload kept: " << Hex(b);
    } else {
      ASSERT_EQ(back, code) << Hex(b);
    }
  }
}

TEST(Bf16Test, RandomPatternsMatchReference) {
  std::mt19937 rng(20240611u);
  std::uniform_int_distribution<std::uint32_t> dist;
  for (int i = 0; i < 2000000; ++i) {
    const std::uint32_t u = dist(rng);
    if (IsNanBits(u)) continue;
    ASSERT_EQ(f32_to_bf16(FromBits(u)), RefBf16(u)) << Hex(u);
  }
}

// ---- f16 ----

TEST(F16Test, RoundingTable) {
  const NarrowCase cases[] = {
      {0x3f800000u, 0x3c00u, "1.0"},
      {0x3f801000u, 0x3c00u, "tie 1 + 2^-11 -> even (down)"},
      {0x3f803000u, 0x3c02u, "tie 1 + 3*2^-11 -> even (up)"},
      {0x3f800fffu, 0x3c00u, "just below half ulp"},
      {0x3f801001u, 0x3c01u, "just above half ulp"},
      {0xbf803000u, 0xbc02u, "negative tie -> even"},
      {0x477fe000u, 0x7bffu, "65504 max finite"},
      {0x477fef00u, 0x7bffu, "65519 rounds to 65504"},
      {0x477fefffu, 0x7bffu, "just below 65520 rounds to 65504"},
      {0x477ff000u, 0x7c00u, "65520 (tie, odd max) rounds to Inf"},
      {0xc77ff000u, 0xfc00u, "-65520 rounds to -Inf"},
      {0x47800000u, 0x7c00u, "65536 -> Inf"},
      {0x7f7fffffu, 0x7c00u, "f32 max -> Inf"},
      {0x7f800000u, 0x7c00u, "+Inf"},
      {0xff800000u, 0xfc00u, "-Inf"},
      {0x00000000u, 0x0000u, "+0"},
      {0x80000000u, 0x8000u, "-0"},
      {0x33800000u, 0x0001u, "2^-24 smallest subnormal"},
      {0xb3800000u, 0x8001u, "-2^-24"},
      {0x33000000u, 0x0000u, "2^-25 tie with zero -> 0 (even)"},
      {0xb3000000u, 0x8000u, "-2^-25 -> -0"},
      {0x33000001u, 0x0001u, "just above 2^-25 -> 2^-24"},
      {0x32ffffffu, 0x0000u, "just below 2^-25 -> 0"},
      {0x33c00000u, 0x0002u, "1.5 * 2^-24 tie -> 2 (even)"},
      {0x34200000u, 0x0002u, "2.5 * 2^-24 tie -> 2 (even)"},
      {0x34600000u, 0x0004u, "3.5 * 2^-24 tie -> 4 (even)"},
      {0x387fc000u, 0x03ffu, "largest subnormal 1023 * 2^-24"},
      {0x387fe000u, 0x0400u, "1023.5 * 2^-24 tie -> smallest normal (even)"},
      {0x38800000u, 0x0400u, "2^-14 smallest normal"},
      {0x38000000u, 0x0200u, "2^-15 subnormal exact"},
      {0x00000001u, 0x0000u, "f32 subnormal -> +0"},
      {0x80000001u, 0x8000u, "negative f32 subnormal -> -0"},
      {0x7fc00000u, 0x7e00u, "quiet NaN"},
      {0xffc00000u, 0xfe00u, "negative quiet NaN keeps sign"},
      {0x7f800001u, 0x7e00u, "signalling NaN with low payload -> quiet, not Inf"},
      {0x7fa00000u, 0x7f00u, "NaN top payload bits kept"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(f32_to_f16(FromBits(c.f32)), c.want) << c.what << " (" << Hex(c.f32) << ")";
    if (!IsNanBits(c.f32)) {
      EXPECT_EQ(RefF16(c.f32), c.want) << "reference disagrees with table: " << c.what;
    }
  }
  // The decimal spellings from the spec, through the compiler's own decimal -> float parsing.
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bffu);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bffu);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00u);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001u);
}

TEST(F16Test, WideningTable) {
  const std::pair<std::uint16_t, std::uint32_t> cases[] = {
      {0x0000u, 0x00000000u}, {0x8000u, 0x80000000u}, {0x0001u, 0x33800000u},
      {0x8001u, 0xb3800000u}, {0x0002u, 0x34000000u}, {0x0003u, 0x34400000u},
      {0x0200u, 0x38000000u}, {0x03ffu, 0x387fc000u}, {0x0400u, 0x38800000u},
      {0x3c00u, 0x3f800000u}, {0x3c01u, 0x3f802000u}, {0x7bffu, 0x477fe000u},
      {0x7c00u, 0x7f800000u}, {0xfc00u, 0xff800000u}, {0x7e00u, 0x7fc00000u},
      {0xfe00u, 0xffc00000u}, {0x7c01u, 0x7f802000u},  // signalling NaN payload verbatim
  };
  for (const auto& [h, want] : cases) {
    EXPECT_EQ(Bits(f16_to_f32(h)), want) << Hex(h);
  }
  EXPECT_EQ(f16_to_f32(0x7bffu), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001u), std::ldexp(1.0f, -24));
}

TEST(F16Test, ExhaustiveRoundtripAndValues) {
  const auto& t = HalfValues();
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto code = static_cast<std::uint16_t>(h);
    const float f = f16_to_f32(code);
    const std::uint16_t back = f32_to_f16(f);
    if ((h & 0x7fffu) > 0x7c00u) {
      ASSERT_TRUE(std::isnan(f)) << Hex(h);
      ASSERT_GT(back & 0x7fffu, 0x7c00u) << "NaN must stay NaN: " << Hex(h);
      ASSERT_EQ(back, h | 0x0200u) << "NaN is quieted, sign and payload kept: " << Hex(h);
      continue;
    }
    ASSERT_EQ(back, code) << Hex(h);
    if ((h & 0x7fffu) < 0x7c00u) {  // finite: value matches the first-principles table
      const double want = (h & 0x8000u) != 0u ? -t[h & 0x7fffu] : t[h & 0x7fffu];
      ASSERT_EQ(static_cast<double>(f), want) << Hex(h);
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0u) << Hex(h);
    } else {
      ASSERT_TRUE(std::isinf(f)) << Hex(h);
    }
  }
}

TEST(F16Test, RandomPatternsMatchReference) {
  std::mt19937 rng(7u);
  std::uniform_int_distribution<std::uint32_t> dist;
  // Half the draws are concentrated on the f16 range (|x| in [2^-26, 2^17)) where all the
  // interesting rounding happens; the rest are arbitrary patterns.
  std::uniform_int_distribution<std::uint32_t> near(0x32800000u, 0x48000000u);
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t u = (i & 1) != 0 ? dist(rng) : (near(rng) | (dist(rng) & 0x80000000u));
    if (IsNanBits(u)) continue;
    ASSERT_EQ(f32_to_f16(FromBits(u)), RefF16(u)) << Hex(u);
  }
}

#if defined(__F16C__)
// Cross-check against the CPU's own conversion (vcvtps2ph, round to nearest even). Hardware NaN
// quieting also matches ours for the quiet bit and sign; payload handling is not compared.
TEST(F16Test, MatchesF16CHardware) {
  std::mt19937 rng(11u);
  std::uniform_int_distribution<std::uint32_t> dist;
  std::uniform_int_distribution<std::uint32_t> near(0x32800000u, 0x48000000u);
  for (int i = 0; i < 1000000; ++i) {
    const std::uint32_t u = (i & 1) != 0 ? dist(rng) : (near(rng) | (dist(rng) & 0x80000000u));
    if (IsNanBits(u)) continue;
    const __m128i h = _mm_cvtps_ph(_mm_set1_ps(FromBits(u)), _MM_FROUND_TO_NEAREST_INT);
    const auto hw = static_cast<std::uint16_t>(_mm_extract_epi16(h, 0));
    ASSERT_EQ(f32_to_f16(FromBits(u)), hw) << Hex(u);
  }
}
#endif

// ---- the g++ 12.2 masked-truncation miscompile ----
//
// g++ 12.2 at -O1+ compiled `if (flag) v = bit_cast<float>(bit_cast<uint32_t>(v) & 0xffff0000u)`
// so that the unmasked value survived. The conversions must give the right bits when selected
// by a runtime flag the optimiser cannot see through.

TEST(DtypeTest, VolatileFlagPathBf16) {
  volatile int flag = 1;
  volatile int off = 0;
  std::mt19937 rng(99u);
  std::uniform_int_distribution<std::uint32_t> dist;
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t u = dist(rng);
    if (IsNanBits(u)) continue;
    float v = FromBits(u);
    if (flag) v = round_to_bf16(v);
    ASSERT_EQ(Bits(v), static_cast<std::uint32_t>(RefBf16(u)) << 16) << Hex(u);
    ASSERT_EQ(Bits(v) & 0x0000ffffu, 0u) << "low half must be cleared: " << Hex(u);
    float w = FromBits(u);
    if (off) w = round_to_bf16(w);
    ASSERT_EQ(Bits(w), u) << "unselected path must keep the input: " << Hex(u);
  }
}

TEST(DtypeTest, VolatileFlagPathF16) {
  volatile int flag = 1;
  std::mt19937 rng(98u);
  std::uniform_int_distribution<std::uint32_t> near(0x32800000u, 0x47800000u);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t u = near(rng) | ((i & 1) != 0 ? 0x80000000u : 0u);
    float v = FromBits(u);
    if (flag) v = f16_to_f32(f32_to_f16(v));
    ASSERT_EQ(f32_to_f16(v), RefF16(u)) << Hex(u);
    ASSERT_EQ(Bits(v), Bits(f16_to_f32(RefF16(u)))) << Hex(u);
  }
}

// A row-wise loop (like a kernel's epilogue) with the flag checked per element.
TEST(DtypeTest, VolatileFlagPathRowLoop) {
  volatile bool flag = true;
  std::vector<float> row(4096);
  std::mt19937 rng(5u);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (auto& x : row) x = nd(rng);
  std::vector<float> out(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) {
    float v = row[i] * 1.0009765625f;  // non-trivial low bits
    if (flag) v = round_to_bf16(v);
    out[i] = v;
  }
  for (std::size_t i = 0; i < row.size(); ++i) {
    const std::uint32_t u = Bits(row[i] * 1.0009765625f);
    ASSERT_EQ(Bits(out[i]), static_cast<std::uint32_t>(RefBf16(u)) << 16) << i;
  }
}

// ---- bulk conversion ----

TEST(DtypeTest, ConvertToF32UnalignedSources) {
  // Place the source at an odd offset so every element load is unaligned.
  const std::uint16_t bf[] = {0x3f80u, 0xc000u, 0x0001u, 0x7f80u};
  const std::uint16_t hf[] = {0x3c00u, 0xc000u, 0x0001u, 0x7c00u};
  const float ff[] = {1.0f, -2.0f, 0.5f, 3.0f};
  const double df[] = {1.0, -2.0, 0.1, 1e300};
  std::vector<unsigned char> buf(64);
  float out[4];

  std::memcpy(buf.data() + 1, bf, sizeof bf);
  ASSERT_TRUE(convert_to_f32(DType::kBF16, buf.data() + 1, 4, out));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Bits(out[i]), Bits(bf16_to_f32(bf[i])));

  std::memcpy(buf.data() + 3, hf, sizeof hf);
  ASSERT_TRUE(convert_to_f32(DType::kF16, buf.data() + 3, 4, out));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Bits(out[i]), Bits(f16_to_f32(hf[i])));

  std::memcpy(buf.data() + 5, ff, sizeof ff);
  ASSERT_TRUE(convert_to_f32(DType::kF32, buf.data() + 5, 4, out));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Bits(out[i]), Bits(ff[i]));

  std::memcpy(buf.data() + 7, df, sizeof df);
  ASSERT_TRUE(convert_to_f32(DType::kF64, buf.data() + 7, 4, out));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.1f);
  EXPECT_TRUE(std::isinf(out[3]));

  EXPECT_TRUE(convert_to_f32(DType::kBF16, buf.data(), 0, out));
  EXPECT_FALSE(convert_to_f32(DType::kI8, buf.data(), 4, out));
  EXPECT_FALSE(convert_to_f32(DType::kI32, buf.data(), 4, out));
  EXPECT_FALSE(convert_to_f32(DType::kBool, buf.data(), 4, out));
}

// ---- int8 quantisation ----

struct QuantCase {
  const char* what;
  std::vector<float> x;
  float scale;
  std::vector<std::int8_t> codes;
  std::vector<float> deq;
};

TEST(Int8QuantTest, Table) {
  const QuantCase cases[] = {
      {"exact .5 ties go to even (scale 1)",
       {127.0f, 0.5f, 1.5f, 2.5f, -2.5f},
       1.0f,
       {127, 0, 2, 2, -2},
       {127.0f, 0.0f, 2.0f, 2.0f, -2.0f}},
      {"negative max defines the scale (scale 2)",
       {-254.0f, 1.0f, 3.0f, -127.0f, 5.0f},
       2.0f,
       {-127, 0, 2, -64, 2},
       {-254.0f, 0.0f, 4.0f, -128.0f, 4.0f}},
      {"scale 0.5, ties in both signs",
       {63.5f, 0.25f, 0.75f, -1.25f, -0.75f},
       0.5f,
       {127, 0, 2, -2, -2},
       {63.5f, 0.0f, 1.0f, -1.0f, -1.0f}},
      {"all-zero row (incl. -0)", {0.0f, -0.0f, 0.0f}, 0.0f, {0, 0, 0}, {0.0f, 0.0f, 0.0f}},
      {"single element", {-3.0f}, 3.0f / 127.0f, {-127}, {-127.0f * (3.0f / 127.0f)}},
      {"empty row", {}, 0.0f, {}, {}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<std::int8_t> codes(c.x.size(), 99);
    const float scale = quantize_int8_row(c.x.data(), c.x.size(), codes.data());
    EXPECT_EQ(Bits(scale), Bits(c.scale));
    EXPECT_EQ(codes, c.codes);
    std::vector<float> deq(codes.size(), -1.0f);
    dequantize_int8_row(codes.data(), scale, codes.size(), deq.data());
    ASSERT_EQ(deq.size(), c.deq.size());
    for (std::size_t i = 0; i < deq.size(); ++i) {
      EXPECT_EQ(deq[i], c.deq[i]) << i;
    }
  }
}

TEST(Int8QuantTest, UnderflowingScaleActsLikeZeroRow) {
  const float x[] = {std::numeric_limits<float>::denorm_min(), 0.0f};
  std::int8_t codes[2] = {5, 5};
  EXPECT_EQ(quantize_int8_row(x, 2, codes), 0.0f);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(Int8QuantTest, RandomRowsBoundError) {
  std::mt19937 rng(3u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int r = 0; r < 200; ++r) {
    std::vector<float> x(256);
    for (auto& v : x) v = nd(rng) * static_cast<float>(1 + r);
    std::vector<std::int8_t> codes(x.size());
    const float scale = quantize_int8_row(x.data(), x.size(), codes.data());
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    ASSERT_EQ(scale, amax / 127.0f);
    std::vector<float> deq(x.size());
    dequantize_int8_row(codes.data(), scale, x.size(), deq.data());
    bool hit_max = false;
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_GE(codes[i], -127);
      ASSERT_LE(codes[i], 127);
      hit_max = hit_max || codes[i] == 127 || codes[i] == -127;
      // The code is the nearest integer to x/scale, so the error is at most half a step (plus
      // a couple of ulps from the division and the multiply).
      ASSERT_LE(std::fabs(deq[i] - x[i]), 0.5f * scale * (1.0f + 1e-4f)) << i;
      ASSERT_EQ(static_cast<float>(codes[i]), std::nearbyint(x[i] / scale)) << i;
    }
    ASSERT_TRUE(hit_max);
  }
}

}  // namespace
}  // namespace lockstep
