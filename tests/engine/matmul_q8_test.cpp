// The 8-bit products of quant_dot = ggml (cpu/matmul_q8.h): the vector form is bitwise the
// portable definition, every row's bits are independent of the row count, the thread count and
// the product kind, and the arithmetic is ggml's (its own vec_dot on the same blocks, through the
// prebuilt libggml-cpu of the llama.cpp component, differs only by the order of f32 sums).
#include "cpu/matmul_q8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "engine/ggml_lib.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/thread_pool.h"
#include "test_util.h"

#if defined(LOCKSTEP_TEST_GGML_DIR)
#include <ggml-cpu.h>
#endif

namespace lockstep {
namespace {

using cpu::Matmul;
using cpu::MatmulKind;

// Random block bytes with f16 scales of a sane size at the offsets each type keeps them (the
// integer fields take every value, edge ones included).
const std::map<WeightType, std::vector<int>>& ScaleOffsets() {
  static const std::map<WeightType, std::vector<int>> m = {
      {WeightType::kQ8_0, {0}},   {WeightType::kQ4_0, {0}},    {WeightType::kQ5_0, {0}},
      {WeightType::kIQ4_NL, {0}}, {WeightType::kQ4_K, {0, 2}}, {WeightType::kQ5_K, {0, 2}},
      {WeightType::kQ6_K, {208}}, {WeightType::kIQ4_XS, {0}}};
  return m;
}

struct Blocks {
  std::vector<std::byte> bytes;
  Mat m;
};

Blocks RandomBlocks(WeightType t, int rows, int cols, std::uint64_t seed) {
  Blocks b;
  b.m.type = t;
  b.m.rows = rows;
  b.m.cols = cols;
  b.bytes.resize(b.m.bytes());
  std::mt19937_64 rng(seed);
  for (std::byte& x : b.bytes) x = static_cast<std::byte>(rng());
  const std::size_t bb = weight_block_bytes(t);
  for (std::size_t b0 = 0; b0 < b.bytes.size(); b0 += bb)
    for (int o : ScaleOffsets().at(t)) {
      const float v = std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
      const std::uint16_t h = f32_to_f16(v);
      std::memcpy(b.bytes.data() + b0 + static_cast<std::size_t>(o), &h, 2);
    }
  b.m.data = b.bytes.data();
  return b;
}

// Column counts: K types multiples of 256 (1, 3 and 9 blocks); 32-element types also an odd
// block count (the last pair half empty) and more than one group of 16 blocks.
std::vector<int> ColsFor(WeightType t) {
  if (weight_block_elems(t) == 256) return {256, 768, 2304};
  return {32, 288, 1184, 2048};
}

std::vector<float> Product(MatmulKind kind, const std::vector<float>& x, int n, const Mat& w,
                           ThreadPool* pool) {
  std::vector<float> y(static_cast<std::size_t>(n) * static_cast<std::size_t>(w.rows));
  Matmul(kind, x.data(), n, w, y.data(), pool);
  return y;
}

struct PortableScope {
  PortableScope() { cpu::q8::UsePortableForTest(true); }
  ~PortableScope() { cpu::q8::UsePortableForTest(false); }
};

TEST(Q8Matmul, VectorFormIsThePortableDefinitionBitwise) {
  ThreadPool pool(2);
  for (const auto& [t, offsets] : ScaleOffsets()) {
    (void)offsets;
    for (int cols : ColsFor(t)) {
      const Blocks w = RandomBlocks(t, 21, cols, 7u + static_cast<std::uint64_t>(cols));
      for (int n : {1, 3, 8, 9, 17}) {
        const std::vector<float> x = test::Random(static_cast<std::size_t>(n) * cols, 90u + n);
        const std::vector<float> got = Product(MatmulKind::kInvariantQ8, x, n, w.m, &pool);
        std::vector<float> want;
        {
          PortableScope portable;
          want = Product(MatmulKind::kInvariantQ8, x, n, w.m, nullptr);
        }
        EXPECT_TRUE(test::BitwiseEqual(got, want))
            << weight_type_name(t) << " cols=" << cols << " rows=" << n;
      }
    }
  }
}

TEST(Q8Matmul, EachRowsBitsAreIndependentOfRowCountThreadsAndKind) {
  ThreadPool pool(3);
  for (const auto& [t, offsets] : ScaleOffsets()) {
    (void)offsets;
    const int cols = weight_block_elems(t) == 256 ? 768 : 1184;
    const Blocks w = RandomBlocks(t, 19, cols, 11);
    const int n = 13;
    const std::vector<float> x = test::Random(static_cast<std::size_t>(n) * cols, 5);
    const std::vector<float> all = Product(MatmulKind::kInvariantQ8, x, n, w.m, &pool);
    EXPECT_TRUE(test::BitwiseEqual(all, Product(MatmulKind::kGemmQ8, x, n, w.m, nullptr)))
        << weight_type_name(t) << ": kGemmQ8 is the same product";
    for (int r = 0; r < n; ++r) {
      const std::vector<float> one(x.begin() + r * cols, x.begin() + (r + 1) * cols);
      const std::vector<float> y = Product(MatmulKind::kInvariantQ8, one, 1, w.m, nullptr);
      const std::vector<float> row(all.begin() + r * w.m.rows, all.begin() + (r + 1) * w.m.rows);
      EXPECT_TRUE(test::BitwiseEqual(y, row)) << weight_type_name(t) << " row " << r;
    }
  }
}

// The 8-bit path rounds x, so it is close to the exact product but not equal; a weight type
// without an 8-bit kernel (Q4_1 here) keeps the exact product bitwise.
TEST(Q8Matmul, CloseToTheExactProductAndExactWhereNoKernel) {
  for (const auto& [t, offsets] : ScaleOffsets()) {
    (void)offsets;
    const int cols = weight_block_elems(t) == 256 ? 2304 : 2048;
    const Blocks w = RandomBlocks(t, 16, cols, 3);
    const std::vector<float> x = test::Random(static_cast<std::size_t>(2) * cols, 6);
    const std::vector<float> q = Product(MatmulKind::kInvariantQ8, x, 2, w.m, nullptr);
    const std::vector<float> e = Product(MatmulKind::kInvariant, x, 2, w.m, nullptr);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < q.size(); ++i) {
      num += (q[i] - e[i]) * (q[i] - e[i]);
      den += e[i] * e[i];
    }
    const double nrmse = std::sqrt(num / den);
    EXPECT_LT(nrmse, 2e-2) << weight_type_name(t);
    EXPECT_GT(nrmse, 0.0) << weight_type_name(t) << ": x was not rounded";
  }
  Mat m;
  m.type = WeightType::kQ4_1;
  m.rows = 8;
  m.cols = 256;
  std::vector<std::byte> bytes(m.bytes(), std::byte{0x11});
  m.data = bytes.data();
  const std::vector<float> x = test::Random(256, 8);
  EXPECT_FALSE(cpu::q8::HasKernel(m));
  EXPECT_TRUE(test::BitwiseEqual(Product(MatmulKind::kInvariantQ8, x, 1, m, nullptr),
                                 Product(MatmulKind::kInvariant, x, 1, m, nullptr)));
}

// A bf16 / f16 weight has no 8-bit kernel: with the Q8 kinds it takes x rounded to its own type
// (ggml's vec_dot_type for it) into the exact product, for both kinds.
TEST(Q8Matmul, SixteenBitWeightsTakeXRoundedToTheirType) {
  for (WeightType t : {WeightType::kBF16, WeightType::kF16}) {
    SCOPED_TRACE(std::string(weight_type_name(t)));
    const int rows = 12, cols = 200, n = 3;
    Mat m;
    m.type = t;
    m.rows = rows;
    m.cols = cols;
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows) * cols);
    const std::vector<float> wv = test::Random(bits.size(), 21);
    for (std::size_t i = 0; i < bits.size(); ++i)
      bits[i] = t == WeightType::kBF16 ? f32_to_bf16(wv[i]) : f32_to_f16(wv[i]);
    m.data = bits.data();
    std::vector<float> x = test::Random(static_cast<std::size_t>(n) * cols, 22);
    // Exact ties of the bf16 rounding (odd and even kept halves) throughout; in row 1 FLT_MAX
    // (rounds to Inf) and subnormal ties, in row 2 one NaN whose payload lives in the low half
    // (alone: another NaN or Inf in its row would hide how it was rounded).
    for (std::size_t i = 0; i < x.size(); i += 7)
      x[i] = std::bit_cast<float>((std::bit_cast<std::uint32_t>(x[i]) & 0xffff0000u) | 0x8000u);
    const std::uint32_t specials[] = {0x7f7fffffu, 0x00008000u, 0x80018000u, 0x00017fffu};
    for (std::size_t k = 0; k < std::size(specials); ++k)
      x[cols + 3 + 11 * k] = std::bit_cast<float>(specials[k]);
    x[2 * cols + 5] = std::bit_cast<float>(0x7f800001u);
    std::vector<float> xr(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      xr[i] = t == WeightType::kBF16 ? round_to_bf16(x[i]) : f16_to_f32(f32_to_f16(x[i]));
    EXPECT_FALSE(cpu::q8::HasKernel(m));
    const std::vector<float> want = Product(MatmulKind::kInvariant, xr, n, m, nullptr);
    EXPECT_TRUE(test::BitwiseEqual(Product(MatmulKind::kInvariantQ8, x, n, m, nullptr), want));
    EXPECT_TRUE(test::BitwiseEqual(Product(MatmulKind::kGemmQ8, x, n, m, nullptr),
                                   Product(MatmulKind::kGemm, xr, n, m, nullptr)));
    EXPECT_FALSE(test::BitwiseEqual(Product(MatmulKind::kInvariant, x, n, m, nullptr), want))
        << "x's rounding changed nothing: the test cannot tell";
  }
}

#if defined(LOCKSTEP_TEST_GGML_DIR)
// ggml's CPU type traits (from_float into the vec_dot type, vec_dot) from the AVX2 variant of the
// prebuilt libggml-cpu (any x86-64-v3 machine runs it).
struct GgmlCpu {
  const ggml_type_traits_cpu* (*traits)(ggml_type) = nullptr;
  std::string error;
  static const GgmlCpu& Get() {
    static const GgmlCpu g = [] {
      GgmlCpu c;
      c.error = test::GgmlUnavailable();
      if (!c.error.empty()) return c;
      const char* env = std::getenv("LOCKSTEP_LLAMACPP_DIR");  // env: LOCKSTEP_LLAMACPP_DIR
      const std::string dir = (env && *env ? std::string(env) : LOCKSTEP_TEST_GGML_DIR) + "/lib";
      void* h = ::dlopen((dir + "/libggml-cpu-haswell.so").c_str(), RTLD_NOW | RTLD_LOCAL);
      auto* init = h ? reinterpret_cast<void (*)()>(::dlsym(h, "ggml_cpu_init")) : nullptr;
      c.traits = h ? reinterpret_cast<const ggml_type_traits_cpu* (*)(ggml_type)>(
                         ::dlsym(h, "ggml_get_type_traits_cpu"))
                   : nullptr;
      if (init == nullptr || c.traits == nullptr) {
        c.error = "no ggml_get_type_traits_cpu in " + dir + "/libggml-cpu-haswell.so";
        return c;
      }
      init();
      return c;
    }();
    return g;
  }
};
#endif

// ggml's vec_dot of each weight row with x rounded by ggml's own from_float: the same integers
// (x rounded the same way, the same block formulas), so the two differ only by the order of
// the f32 sums: within 1e-5 of the sum of the magnitudes. A wrong scale index, nibble order,
// offset or rounding shows as an error of the size of a weight times x.
TEST(Q8Matmul, AgreesWithGgmlsVecDotToTheOrderOfSums) {
#if defined(LOCKSTEP_TEST_GGML_DIR)
  const GgmlCpu& g = GgmlCpu::Get();
  if (!g.error.empty()) GTEST_SKIP() << g.error;
  for (const auto& [t, offsets] : ScaleOffsets()) {
    (void)offsets;
    const auto* tr = g.traits(static_cast<ggml_type>(weight_type_ggml_id(t)));
    ASSERT_TRUE(tr != nullptr && tr->vec_dot != nullptr) << weight_type_name(t);
    const auto* vt = g.traits(tr->vec_dot_type);
    ASSERT_TRUE(vt != nullptr && vt->from_float != nullptr) << weight_type_name(t);
    for (int cols : ColsFor(t)) {
      const Blocks w = RandomBlocks(t, 24, cols, 100u + static_cast<std::uint64_t>(cols));
      const std::vector<float> x = test::Random(static_cast<std::size_t>(cols), 77u + cols);
      const std::vector<float> ours = Product(MatmulKind::kInvariantQ8, x, 1, w.m, nullptr);
      std::vector<std::byte> xq(static_cast<std::size_t>(cols) * 4 + 1024);
      vt->from_float(x.data(), xq.data(), cols);
      std::vector<float> wide(static_cast<std::size_t>(cols));
      for (int o = 0; o < w.m.rows; ++o) {
        float theirs = 0.0f;
        tr->vec_dot(cols, &theirs, 0, w.m.row_ptr(o), 0, xq.data(), 0, 1);
        w.m.RowToF32(o, wide.data());
        double mag = 0;
        for (int i = 0; i < cols; ++i) mag += std::fabs(static_cast<double>(wide[i]) * x[i]);
        EXPECT_NEAR(ours[o], theirs, 1e-5 * mag + 1e-30)
            << weight_type_name(t) << " cols=" << cols << " row " << o;
      }
    }
  }
#else
  GTEST_SKIP() << test::GgmlUnavailable();
#endif
}

}  // namespace
}  // namespace lockstep
