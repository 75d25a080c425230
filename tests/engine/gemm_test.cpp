// The prefill GEMM (engine/cpu/gemm.h) gives bitwise Eigen's `Y = X * W^T` on the widened
// weights, for every weight type and every shape class that reaches a different part of it:
// tiles of 8 and 4 columns and single columns, W rows in full 48-row panels and the remainder
// that goes to Eigen's kernel, reductions split into several of Eigen's kc blocks, W rows split
// into several of Eigen's mc blocks and into several of the own kernel's packed blocks, tails of
// the 16-wide packing transposes, and the shapes Eigen sends elsewhere (tiny, T == 1, N == 1).
#include "cpu/gemm.h"

#include <gtest/gtest.h>

// Eigen's AVX-512 transpose (its packing, instantiated here by the reference product) trips GCC
// 12's -Wuninitialized on the intrinsics' undefined pass-through operand.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/quant.h"
#include "lockstep/engine/thread_pool.h"
#include "test_util.h"

namespace lockstep {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct TypedMat {
  std::vector<std::byte> bytes;
  std::vector<float> wide;  // the f32 values the stored weights widen / dequantise to
  Mat m;
};

TypedMat MakeMat(WeightType t, int rows, int cols, std::uint64_t seed) {
  TypedMat r;
  const std::vector<float> v = test::Random(static_cast<std::size_t>(rows) * cols, seed);
  r.m.rows = rows;
  r.m.cols = cols;
  r.m.type = t;
  r.bytes.resize(r.m.bytes());
  for (int i = 0; i < rows; ++i) {
    const float* src = v.data() + static_cast<std::size_t>(i) * cols;
    std::byte* dst = r.bytes.data() + static_cast<std::size_t>(i) * r.m.row_bytes();
    if (weight_block_elems(t) > 1) {
      QuantizeRow(t, src, static_cast<std::size_t>(cols), dst);
      continue;
    }
    for (int j = 0; j < cols; ++j) {
      if (t == WeightType::kF32) {
        std::memcpy(dst + 4 * j, src + j, 4);
        continue;
      }
      const std::uint16_t h = t == WeightType::kBF16 ? f32_to_bf16(src[j]) : f32_to_f16(src[j]);
      std::memcpy(dst + 2 * j, &h, 2);
    }
  }
  r.m.data = r.bytes.data();
  r.wide.resize(static_cast<std::size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i)
    r.m.RowToF32(i, r.wide.data() + static_cast<std::size_t>(i) * cols);
  return r;
}

// Eigen's own product on the widened weights: the contract.
std::vector<float> EigenProduct(const std::vector<float>& x, int T, const TypedMat& w) {
  std::vector<float> y(static_cast<std::size_t>(T) * w.m.rows);
  Eigen::Map<const RowMat> X(x.data(), T, w.m.cols);
  Eigen::Map<const RowMat> W(w.wide.data(), w.m.rows, w.m.cols);
  Eigen::Map<RowMat> Y(y.data(), T, w.m.rows);
  Y.noalias() = X * W.transpose();
  return y;
}

std::vector<float> Rows(const std::vector<float>& x, int T, const TypedMat& w) {
  std::vector<float> y(static_cast<std::size_t>(T) * w.m.rows, -7.0f);
  cpu::GemmRows(x.data(), T, w.m, 0, w.m.rows, y.data(), w.m.rows);
  return y;
}

// Eigen's blocking for the shape (as gemm.cpp computes it), to pick shapes that split.
struct Split {
  long kc, mc;
};
Split EigenSplit(int T, int N, int K) {
  Eigen::internal::gemm_blocking_space<Eigen::RowMajor, float, float, Eigen::Dynamic,
                                       Eigen::Dynamic, Eigen::Dynamic>
      b(T, N, K, 1, true);
  return {static_cast<long>(b.kc()), static_cast<long>(b.mc())};
}

struct Shape {
  int T, N, K;
};

std::string Name(WeightType t, const Shape& s) {
  return std::string(weight_type_name(t)) + " T=" + std::to_string(s.T) +
         " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
}

TEST(Gemm, BitwiseEigenForEveryShapeClass) {
  // T: 8-column tiles, a 4-column tile, 1, 2 and 3 single columns (T % 4), one column. N:
  // remainders of the 48-row panel (Eigen's 2-, 1-, half- and quarter-packet rows and scalar rows),
  // several own packed blocks. K: transposes' tails (K % 16), one and several kc blocks.
  const std::vector<Shape> shapes = {
      {2, 3, 5},        {1, 50, 70},      {9, 1, 40},      {4, 48, 16},      {5, 49, 33},
      {8, 96, 64},      {12, 97, 100},    {13, 143, 129},  {16, 64, 64},     {17, 200, 300},
      {33, 257, 300},   {64, 300, 2048},  {64, 1500, 520}, {37, 1500, 4100}, {160, 512, 2048},
      {161, 2048, 512}, {512, 448, 1024}, {30, 4001, 96},  {7, 143, 64},     {19, 96, 520}};
  for (WeightType t : {WeightType::kF32, WeightType::kBF16, WeightType::kF16}) {
    for (const Shape& s : shapes) {
      const TypedMat w = MakeMat(t, s.N, s.K, 100u + static_cast<unsigned>(s.N + s.K));
      const std::vector<float> x = test::Random(static_cast<std::size_t>(s.T) * s.K, 3u + s.T);
      EXPECT_TRUE(test::BitwiseEqual(Rows(x, s.T, w), EigenProduct(x, s.T, w))) << Name(t, s);
    }
  }
}

TEST(Gemm, QuantisedTypesGiveEigenOnTheDequantisedWeights) {
  const std::vector<Shape> shapes = {{5, 33, 512}, {17, 70, 768}, {64, 300, 2048}, {40, 97, 256}};
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_K, WeightType::kQ6_K}) {
    for (const Shape& s : shapes) {
      const TypedMat w = MakeMat(t, s.N, s.K, 7u + static_cast<unsigned>(s.N));
      const std::vector<float> x = test::Random(static_cast<std::size_t>(s.T) * s.K, 11u);
      EXPECT_TRUE(test::BitwiseEqual(Rows(x, s.T, w), EigenProduct(x, s.T, w))) << Name(t, s);
    }
  }
}

// Output rows split over several of Eigen's mc blocks (Eigen splits W's rows when the reduction
// fits one kc block and X is narrow; its blocks are whole 48-row panels, the last one carries the
// remainder rows that go to Eigen's kernel). And a reduction split into several kc blocks.
TEST(Gemm, SplitsRowsAndReductionLikeEigen) {
  for (const Shape& s : std::vector<Shape>{{24, 2000, 512}, {100, 1001, 300}, {7, 3333, 400}}) {
    const Split sp = EigenSplit(s.T, s.N, s.K);
    EXPECT_LT(sp.mc, s.N) << Name(WeightType::kBF16, s) << ": no row split";
    const TypedMat w = MakeMat(WeightType::kBF16, s.N, s.K, 5);
    const std::vector<float> x = test::Random(static_cast<std::size_t>(s.T) * s.K, 6);
    EXPECT_TRUE(test::BitwiseEqual(Rows(x, s.T, w), EigenProduct(x, s.T, w)))
        << Name(WeightType::kBF16, s) << " mc=" << sp.mc;
  }
  const Shape s{37, 1500, 4100};
  EXPECT_LT(EigenSplit(s.T, s.N, s.K).kc, s.K) << "no reduction split";
  const TypedMat w = MakeMat(WeightType::kF16, s.N, s.K, 15);
  const std::vector<float> x = test::Random(static_cast<std::size_t>(s.T) * s.K, 16);
  EXPECT_TRUE(test::BitwiseEqual(Rows(x, s.T, w), EigenProduct(x, s.T, w)))
      << Name(WeightType::kF16, s);
}

// One row of X (the head of a prefill's last token) through the blocked widening: the bits of
// Eigen's matrix-vector product over the whole range, whatever the row count and length.
TEST(Gemm, OneRowEqualsEigensMatrixVectorProduct) {
  for (const Shape& s : std::vector<Shape>{{1, 1000, 2048},
                                           {1, 257, 100},
                                           {1, 3001, 37},
                                           {1, 7, 5},
                                           {1, 129, 8200},
                                           {1, 65, 30},
                                           {1, 9, 14},
                                           {1, 64, 512}}) {
    for (WeightType t : {WeightType::kBF16, WeightType::kF16}) {
      const TypedMat w = MakeMat(t, s.N, s.K, 21u + static_cast<unsigned>(s.N));
      const std::vector<float> x = test::Random(static_cast<std::size_t>(s.K), 22u);
      EXPECT_TRUE(test::BitwiseEqual(Rows(x, 1, w), EigenProduct(x, 1, w))) << Name(t, s);
    }
  }
}

// Matmul(kGemm) splits W's rows between threads: per range, the own kernel gives the bits of the
// Eigen implementation it replaced (GemmImpl::kEigen, the reference kept for this).
TEST(Gemm, OwnAndEigenImplementationsAgreeUnderThreads) {
  ThreadPool pool(3);
  for (WeightType t : {WeightType::kF32, WeightType::kBF16}) {
    // {1, 303, 30}: one row of X, three ranges of 101 W rows: each odd last row
    // takes Eigen's single-row path (half and quarter packets), two in the middle of W.
    for (const Shape& s :
         std::vector<Shape>{{64, 700, 512}, {19, 1100, 1000}, {512, 300, 96}, {1, 303, 30}}) {
      const TypedMat w = MakeMat(t, s.N, s.K, 9);
      const std::vector<float> x = test::Random(static_cast<std::size_t>(s.T) * s.K, 10);
      std::vector<float> own(static_cast<std::size_t>(s.T) * s.N), ref = own;
      cpu::Matmul(cpu::MatmulKind::kGemm, x.data(), s.T, w.m, own.data(), &pool);
      cpu::SetGemmImpl(cpu::GemmImpl::kEigen);
      cpu::Matmul(cpu::MatmulKind::kGemm, x.data(), s.T, w.m, ref.data(), &pool);
      cpu::SetGemmImpl(cpu::GemmImpl::kOwn);
      EXPECT_TRUE(test::BitwiseEqual(own, ref)) << Name(t, s);
    }
  }
}

// A strided destination (ldy > N, as the stages' fused projections write): the columns outside
// the range are left alone.
TEST(Gemm, WritesOnlyItsColumnsOfAStridedDestination) {
  const TypedMat w = MakeMat(WeightType::kBF16, 150, 200, 4);
  const int T = 21, ld = 170, ob = 10, oe = 140;
  const std::vector<float> x = test::Random(static_cast<std::size_t>(T) * 200, 8);
  std::vector<float> y(static_cast<std::size_t>(T) * ld, 5.0f);
  cpu::GemmRows(x.data(), T, w.m, ob, oe, y.data() + 3, ld);
  TypedMat sub = w;  // rows [ob, oe) alone, as the range's own product
  sub.m.rows = oe - ob;
  sub.m.data = w.bytes.data() + static_cast<std::size_t>(ob) * w.m.row_bytes();
  sub.wide.assign(w.wide.begin() + static_cast<std::ptrdiff_t>(ob) * 200,
                  w.wide.begin() + static_cast<std::ptrdiff_t>(oe) * 200);
  const std::vector<float> part = EigenProduct(x, T, sub);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < ld; ++c) {
      const float got = y[static_cast<std::size_t>(t) * ld + c];
      const int o = c - 3;
      if (o < 0 || o >= oe - ob) {
        ASSERT_EQ(got, 5.0f) << "t=" << t << " c=" << c;
      } else {
        ASSERT_EQ(std::memcmp(&got, &part[static_cast<std::size_t>(t) * (oe - ob) + o], 4), 0)
            << "t=" << t << " o=" << o;
      }
    }
}

}  // namespace
}  // namespace lockstep
