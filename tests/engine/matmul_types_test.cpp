// Weights kept in their stored type (weights.h): both matmul kinds give bitwise the result of the
// same product on an f32 copy of the widened / dequantised weights, for every shape class Eigen
// treats differently (tiny coefficient-based products, T == 1 and N == 1 matrix-vector products,
// reductions longer than Eigen's kc block, row counts past its mc block, remainders of its
// micro-kernel tiles) and for 1 and 3 threads.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/quant.h"
#include "lockstep/engine/thread_pool.h"
#include "test_util.h"

namespace lockstep {
namespace {

using cpu::Matmul;
using cpu::MatmulKind;
using cpu::MatmulRowsRange;

// A matrix of `type` with random values, its bytes and its f32 widening.
struct TypedMat {
  std::vector<std::byte> bytes;
  std::vector<float> wide;
  Mat m;
  Mat f32;
};

TypedMat MakeMat(WeightType t, int rows, int cols, std::uint64_t seed) {
  TypedMat r;
  const std::vector<float> v = test::Random(static_cast<std::size_t>(rows) * cols, seed);
  Mat m;
  m.rows = rows;
  m.cols = cols;
  m.type = t;
  r.bytes.resize(m.bytes());
  for (int i = 0; i < rows; ++i) {
    const float* src = v.data() + static_cast<std::size_t>(i) * cols;
    std::byte* dst = r.bytes.data() + static_cast<std::size_t>(i) * m.row_bytes();
    for (int j = 0; j < cols; ++j) {
      if (t == WeightType::kF32) std::memcpy(dst + 4 * j, src + j, 4);
      const std::uint16_t h = t == WeightType::kBF16 ? f32_to_bf16(src[j]) : f32_to_f16(src[j]);
      if (t == WeightType::kBF16 || t == WeightType::kF16) std::memcpy(dst + 2 * j, &h, 2);
    }
    if (weight_block_elems(t) > 1) QuantizeRow(t, src, static_cast<std::size_t>(cols), dst);
  }
  m.data = r.bytes.data();
  r.m = m;
  r.wide.resize(static_cast<std::size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i) m.RowToF32(i, r.wide.data() + static_cast<std::size_t>(i) * cols);
  r.f32 = m;
  r.f32.type = WeightType::kF32;
  r.f32.data = r.wide.data();
  return r;
}

struct Shape {
  int T, out, in;
};

// Every shape class of the GEMM (see the file comment); `in` multiples of 256 where block types
// need them.
std::vector<Shape> Shapes(bool blocks) {
  if (blocks) return {{1, 7, 256}, {2, 1, 256}, {5, 33, 512}, {17, 70, 768}, {64, 300, 2048}};
  return {{1, 1, 1},      {2, 3, 5},      {3, 4, 9},       {1, 50, 70},
          {9, 1, 40},     {4, 20, 33},    {7, 129, 100},   {16, 64, 64},
          {33, 257, 300}, {64, 96, 2048}, {128, 700, 512}, {5, 40, 3000}};
}

void ExpectSame(WeightType t, MatmulKind kind, int threads) {
  ThreadPool pool(threads);
  for (const Shape& s : Shapes(weight_block_elems(t) > 1)) {
    const TypedMat w = MakeMat(t, s.out, s.in, 11u + static_cast<unsigned>(s.out));
    const std::vector<float> x = test::Random(static_cast<std::size_t>(s.T) * s.in, 5);
    std::vector<float> got(static_cast<std::size_t>(s.T) * s.out, -1.0f), ref = got;
    Matmul(kind, x.data(), s.T, w.m, got.data(), threads > 1 ? &pool : nullptr);
    Matmul(kind, x.data(), s.T, w.f32, ref.data(), threads > 1 ? &pool : nullptr);
    EXPECT_TRUE(test::BitwiseEqual(got, ref))
        << weight_type_name(t) << " kind " << static_cast<int>(kind) << " T=" << s.T
        << " out=" << s.out << " in=" << s.in << " threads=" << threads;
    if (kind == MatmulKind::kInvariant && s.out > 2) {
      const int ob = 1, oe = s.out - 1;
      std::vector<float> a(static_cast<std::size_t>(s.T) * (oe - ob)), b = a;
      MatmulRowsRange(MatmulKind::kInvariant, x.data(), s.T, w.m, ob, oe, a.data(), oe - ob);
      MatmulRowsRange(MatmulKind::kInvariant, x.data(), s.T, w.f32, ob, oe, b.data(), oe - ob);
      EXPECT_TRUE(test::BitwiseEqual(a, b)) << weight_type_name(t) << " rows range";
    }
  }
}

TEST(MatmulTypes, Bf16EqualsWidenedF32) {
  for (MatmulKind k : {MatmulKind::kInvariant, MatmulKind::kGemm})
    for (int th : {1, 3}) ExpectSame(WeightType::kBF16, k, th);
}

TEST(MatmulTypes, F16EqualsWidenedF32) {
  for (MatmulKind k : {MatmulKind::kInvariant, MatmulKind::kGemm})
    for (int th : {1, 3}) ExpectSame(WeightType::kF16, k, th);
}

TEST(MatmulTypes, BlockTypesEqualDequantisedF32) {
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_K, WeightType::kQ6_K})
    for (MatmulKind k : {MatmulKind::kInvariant, MatmulKind::kGemm})
      for (int th : {1, 3}) ExpectSame(t, k, th);
}

// Every other block type (issue 39) through the same kernels, 3 threads.
TEST(MatmulTypes, EveryBlockTypeEqualsDequantisedF32) {
  int n = 0;
  for (int i = 0; i < kWeightTypeCount; ++i) {
    const auto t = static_cast<WeightType>(i);
    if (weight_block_elems(t) == 1 || t == WeightType::kQ8_0 || t == WeightType::kQ4_K ||
        t == WeightType::kQ6_K)
      continue;
    ++n;
    for (MatmulKind k : {MatmulKind::kInvariant, MatmulKind::kGemm}) ExpectSame(t, k, 3);
  }
  EXPECT_EQ(n, 18);
}

// MatmulRowsRange (a row range of an invariant product on the calling thread, what the MoE's split
// items run) gives Matmul's columns bitwise for both invariant kinds, the 8-bit kernels' types,
// a type without one (Q2_K) and bf16 (rounded x under kInvariantQ8), and writes only its range.
TEST(MatmulTypes, RowsRangeIsMatmulsColumns) {
  ThreadPool pool(2);
  for (WeightType t : {WeightType::kF32, WeightType::kBF16, WeightType::kQ8_0, WeightType::kQ4_K,
                       WeightType::kQ6_K, WeightType::kIQ4_XS, WeightType::kQ2_K}) {
    const int out = 37, in = 512;
    const TypedMat w = MakeMat(t, out, in, 90u + static_cast<unsigned>(t));
    for (MatmulKind kind : {MatmulKind::kInvariant, MatmulKind::kInvariantQ8})
      for (int T : {1, 2, 9}) {
        const std::vector<float> x = test::Random(static_cast<std::size_t>(T) * in, 3u + T);
        std::vector<float> whole(static_cast<std::size_t>(T) * out);
        Matmul(kind, x.data(), T, w.m, whole.data(), &pool);
        for (auto [ob, oe] : {std::pair{0, out}, std::pair{1, out - 1}, std::pair{18, out}}) {
          const int ldy = out + 3;  // y points at column ob of rows ldy apart
          std::vector<float> y(static_cast<std::size_t>(T) * ldy, -777.0f);
          MatmulRowsRange(kind, x.data(), T, w.m, ob, oe, y.data() + ob, ldy);
          for (int r = 0; r < T; ++r)
            for (int o = 0; o < ldy; ++o) {
              const float v = y[static_cast<std::size_t>(r) * ldy + o];
              if (o >= ob && o < oe)
                EXPECT_EQ(std::memcmp(&v, &whole[static_cast<std::size_t>(r) * out + o], 4), 0)
                    << weight_type_name(t) << " kind " << static_cast<int>(kind) << " T=" << T
                    << " [" << ob << "," << oe << ") row " << r << " col " << o;
              else
                EXPECT_EQ(v, -777.0f) << weight_type_name(t) << " wrote col " << o;
            }
        }
      }
  }
}

// Blocks of random bytes (every code, every scale and min bit pattern, every Q5 high bit) with
// finite f16 scales: the invariant product (which dequantises in registers for the common types,
// engine/cpu/quant_src.h) equals the product on the scalar dequantisation (quant.h's
// DequantizeChunk32, checked against ggml by QuantOracle.*), for 1..9 rows and 2 threads.
TEST(MatmulTypes, RandomBlockBytesEqualTheScalarDequantisation) {
  // Where each type keeps its f16 scales (d, and dmin / m where it has one).
  const std::map<WeightType, std::vector<int>> halves = {
      {WeightType::kQ8_0, {0}},   {WeightType::kQ4_0, {0}},    {WeightType::kQ4_1, {0, 2}},
      {WeightType::kQ5_0, {0}},   {WeightType::kQ5_1, {0, 2}}, {WeightType::kQ2_K, {80, 82}},
      {WeightType::kQ3_K, {108}}, {WeightType::kQ4_K, {0, 2}}, {WeightType::kQ5_K, {0, 2}},
      {WeightType::kQ6_K, {208}}, {WeightType::kIQ4_NL, {0}},  {WeightType::kIQ4_XS, {0}}};
  ThreadPool pool(2);
  std::mt19937_64 rng(2026);
  for (const auto& [t, at] : halves) {
    const int rows = 37, cols = 768;
    Mat m;
    m.type = t;
    m.rows = rows;
    m.cols = cols;
    std::vector<std::byte> bytes(m.bytes());
    for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
    const std::size_t bb = weight_block_bytes(t);
    for (std::size_t b0 = 0; b0 < bytes.size(); b0 += bb)
      for (int o : at) {
        const float v = std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
        const std::uint16_t h = f32_to_f16(v);
        std::memcpy(bytes.data() + b0 + static_cast<std::size_t>(o), &h, 2);
      }
    m.data = bytes.data();
    std::vector<float> wide(static_cast<std::size_t>(rows) * cols);
    for (int r = 0; r < rows; ++r) m.RowToF32(r, wide.data() + static_cast<std::size_t>(r) * cols);
    Mat f = m;
    f.type = WeightType::kF32;
    f.data = wide.data();
    for (int T = 1; T <= 9; ++T) {
      const std::vector<float> x = test::Random(static_cast<std::size_t>(T) * cols, 40u + T);
      std::vector<float> got(static_cast<std::size_t>(T) * rows), ref = got;
      Matmul(MatmulKind::kInvariant, x.data(), T, m, got.data(), &pool);
      Matmul(MatmulKind::kInvariant, x.data(), T, f, ref.data(), &pool);
      EXPECT_TRUE(test::BitwiseEqual(got, ref)) << weight_type_name(t) << " T=" << T;
    }
  }
}

// kInvariant's contract (matmul.h) written out in scalars: lane l accumulates x[i] * w[i] for
// i % 32 == l in increasing i (a tail zero-padded to 32), then lanes combine as (l, l+16),
// (l, l+8), then 4 + 4, 2 + 2, 1 + 1. The kernels (register widths, rows per block, in-register
// reductions) must give these bits for every row count and every length, alone or in a block.
float ScalarLaneDot(const float* x, const float* w, int n) {
  float lane[32] = {};
  for (int i = 0; i < n; ++i) lane[i % 32] += x[i] * w[i];
  for (int i = n; i % 32 != 0; ++i) lane[i % 32] += 0.0f * 0.0f;
  float a[16], b[8], c[4];
  for (int l = 0; l < 16; ++l) a[l] = lane[l] + lane[l + 16];
  for (int l = 0; l < 8; ++l) b[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) c[l] = b[l] + b[l + 4];
  const float d0 = c[0] + c[2], d1 = c[1] + c[3];
  return d0 + d1;
}

TEST(MatmulTypes, InvariantFollowsTheScalarLaneOrder) {
  ThreadPool pool(2);
  for (WeightType t : {WeightType::kF32, WeightType::kBF16, WeightType::kF16, WeightType::kQ8_0}) {
    const bool blocks = weight_block_elems(t) > 1;
    for (int in : blocks ? std::vector<int>{256, 512} : std::vector<int>{1, 31, 32, 33, 100, 512}) {
      const int out = 9;
      const TypedMat w = MakeMat(t, out, in, 40u + static_cast<unsigned>(in));
      for (int T = 1; T <= 19; ++T) {
        const std::vector<float> x = test::Random(static_cast<std::size_t>(T) * in, 7u + T);
        std::vector<float> got(static_cast<std::size_t>(T) * out), ref = got;
        Matmul(MatmulKind::kInvariant, x.data(), T, w.m, got.data(), T % 2 ? &pool : nullptr);
        for (int r = 0; r < T; ++r)
          for (int o = 0; o < out; ++o)
            ref[static_cast<std::size_t>(r) * out + o] =
                ScalarLaneDot(x.data() + static_cast<std::size_t>(r) * in,
                              w.wide.data() + static_cast<std::size_t>(o) * in, in);
        EXPECT_TRUE(test::BitwiseEqual(got, ref))
            << weight_type_name(t) << " T=" << T << " in=" << in;
      }
    }
  }
}

// The kGemm widening path must give the bits of Eigen's own product: shapes large enough to
// split the reduction (K > kc) and the output rows (N > mc) on every machine.
TEST(MatmulTypes, GemmSplitsLikeEigen) {
  const TypedMat w = MakeMat(WeightType::kBF16, 1500, 4100, 3);
  const std::vector<float> x = test::Random(static_cast<std::size_t>(37) * 4100, 9);
  std::vector<float> got(static_cast<std::size_t>(37) * 1500), ref = got;
  Matmul(MatmulKind::kGemm, x.data(), 37, w.m, got.data(), nullptr);
  Matmul(MatmulKind::kGemm, x.data(), 37, w.f32, ref.data(), nullptr);
  EXPECT_TRUE(test::BitwiseEqual(got, ref));
}

// Dequantised values follow quant.h's formulas (checked on hand-made blocks).
TEST(MatmulTypes, BlockLayouts) {
  // Q8_0: d = 0.5, q = l - 16.
  std::byte q8[kQ8_0Bytes];
  const std::uint16_t half = f32_to_f16(0.5f);
  std::memcpy(q8, &half, 2);
  for (int l = 0; l < 32; ++l) q8[2 + l] = static_cast<std::byte>(static_cast<std::int8_t>(l - 16));
  float out[256];
  DequantizeBlock(WeightType::kQ8_0, q8, out);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(out[l], 0.5f * static_cast<float>(l - 16));
  // Q4_K: d = 1, dmin = 1; sub-block j has scale j + 1 and min 2 j (sub-blocks 4..7 use the
  // split 4 + 2 bit encoding, with top bits that differ between scale and min); every q = 3.
  std::byte q4[kQ4_KBytes] = {};
  const std::uint16_t one = f32_to_f16(1.0f);
  std::memcpy(q4, &one, 2);
  std::memcpy(q4 + 2, &one, 2);
  auto* sb = reinterpret_cast<std::uint8_t*>(q4 + 4);
  const int sc[8] = {1, 2, 3, 4, 21, 38, 55, 63}, mn[8] = {0, 2, 4, 6, 47, 10, 33, 5};
  for (int j = 0; j < 4; ++j) {
    sb[j] = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    sb[j + 4] = static_cast<std::uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    sb[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  for (int i = 0; i < 128; ++i) q4[16 + i] = static_cast<std::byte>(0x33);
  DequantizeBlock(WeightType::kQ4_K, q4, out);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l)
      EXPECT_EQ(out[32 * j + l], static_cast<float>(sc[j] * 3 - mn[j])) << j << " " << l;
  // Q6_K: d = 0.25, scales[s] = s - 8, element e has q = e % 64 (so q - 32 in [-32, 31]).
  std::byte q6[kQ6_KBytes] = {};
  const std::uint16_t quarter = f32_to_f16(0.25f);
  std::memcpy(q6 + 208, &quarter, 2);
  for (int s = 0; s < 16; ++s)
    q6[192 + s] = static_cast<std::byte>(static_cast<std::int8_t>(s - 8));
  auto* ql = reinterpret_cast<std::uint8_t*>(q6);
  auto* qh = reinterpret_cast<std::uint8_t*>(q6 + 128);
  for (int e = 0; e < 256; ++e) {
    const int q = e % 64, n = e / 128, j = (e % 128) / 32, l = e % 32;
    ql[64 * n + (j % 2) * 32 + l] |= static_cast<std::uint8_t>((q & 0xF) << ((j / 2) * 4));
    qh[32 * n + l] |= static_cast<std::uint8_t>((q >> 4) << (2 * j));
  }
  DequantizeBlock(WeightType::kQ6_K, q6, out);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, j = (e % 128) / 32, l = e % 32;
    const int s = 8 * n + 2 * j + l / 16;
    EXPECT_EQ(out[e], 0.25f * static_cast<float>(s - 8) * static_cast<float>(e % 64 - 32)) << e;
  }
}

// The quantisers round-trip within their step (a coarse check that the writer's blocks decode to
// the values they were made from).
TEST(MatmulTypes, QuantisersRoundTrip) {
  const std::vector<float> v = test::Random(1024, 77);
  // NRMSE bounds per type, about 1.5x what the quantisers give on these values.
  const std::map<std::string, double> tol = {
      {"q8_0", 0.01},  {"q6_k", 0.04},    {"q5_0", 0.06},    {"q5_1", 0.06},   {"q5_k", 0.06},
      {"q4_0", 0.12},  {"q4_1", 0.12},    {"q4_k", 0.15},    {"iq4_nl", 0.12}, {"iq4_xs", 0.12},
      {"q3_k", 0.3},   {"iq3_s", 0.3},    {"iq3_xxs", 0.35}, {"q2_k", 0.5},    {"iq2_s", 0.5},
      {"iq2_xs", 0.5}, {"iq2_xxs", 0.55}, {"iq1_s", 0.8},    {"iq1_m", 0.8},   {"tq1_0", 0.8},
      {"tq2_0", 0.8}};
  int n = 0;
  for (int i = 0; i < kWeightTypeCount; ++i) {
    const auto t = static_cast<WeightType>(i);
    if (weight_block_elems(t) == 1) continue;
    Mat m;
    m.type = t;
    m.rows = 1;
    m.cols = 1024;
    std::vector<std::byte> b(m.bytes());
    QuantizeRow(t, v.data(), v.size(), b.data());
    m.data = b.data();
    std::vector<float> back(1024);
    m.RowToF32(0, back.data());
    const std::string name(weight_type_name(t));
    ASSERT_TRUE(tol.count(name)) << name;
    const double e = test::Nrmse(v, back);
    EXPECT_LT(e, tol.at(name)) << name;
    std::printf("  %-8s NRMSE %.4f\n", name.c_str(), e);
    ++n;
  }
  EXPECT_EQ(n, 21);
}

}  // namespace
}  // namespace lockstep
