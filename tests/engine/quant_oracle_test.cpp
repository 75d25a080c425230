// The dequantisation of every ggml block type lockstep reads (quant.h) against ggml's own
// to_float from the prebuilt libggml-base (tests/engine/ggml_lib.h), bitwise, on >= 10,000
// blocks per type: seeded random blocks with the f16 scales set to edge values (0, -0, the
// smallest and largest subnormal, the largest finite, its negative, +-inf, quiet and signalling
// NaN) in one block of four, and real tensors quantised by ggml_quantize_chunk (odd row counts
// included). Random blocks reach every lattice grid entry of the i-quants, so this checks
// quant_grids.h entry by entry too. F16 and BF16: every one of the 65,536 codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "engine/gguf_test_util.h"
#include "ggml_lib.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/gguf.h"
#include "lockstep/engine/quant.h"
#include "lockstep/engine/splitmix.h"
#include "lockstep/engine/weights.h"

namespace lockstep {
namespace {

// Offsets of the f16 scales in one block (IQ1_M keeps its d in the top nibbles of four words).
std::vector<int> HalfOffsets(WeightType t) {
  switch (t) {
    case WeightType::kQ4_1:
    case WeightType::kQ5_1:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
      return {0, 2};
    case WeightType::kQ2_K:
      return {80, 82};
    case WeightType::kQ3_K:
      return {108};
    case WeightType::kQ6_K:
      return {208};
    case WeightType::kTQ1_0:
      return {52};
    case WeightType::kTQ2_0:
      return {64};
    case WeightType::kIQ1_M:
      return {};
    default:
      return {0};
  }
}

constexpr std::uint16_t kEdgeHalves[] = {0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0xFBFF,
                                         0x7C00, 0xFC00, 0x7E00, 0x7D01, 0x3C00, 0x0400};

void PutEdgeScale(WeightType t, std::byte* b, std::uint16_t h) {
  if (t == WeightType::kIQ1_M) {  // d's nibbles are the top 4 bits of the words at 48..55
    for (int k = 0; k < 4; ++k) {
      std::uint16_t w;
      std::memcpy(&w, b + 48 + 2 * k, 2);
      w = static_cast<std::uint16_t>((w & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12));
      std::memcpy(b + 48 + 2 * k, &w, 2);
    }
    return;
  }
  for (int off : HalfOffsets(t)) std::memcpy(b + off, &h, 2);
}

std::vector<std::byte> RandomBlocks(WeightType t, int n, std::uint64_t seed) {
  const std::size_t bb = weight_block_bytes(t);
  std::vector<std::byte> out(bb * static_cast<std::size_t>(n));
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < out.size(); i += 8) {
    s = SplitMix64(s);
    std::memcpy(out.data() + i, &s, std::min<std::size_t>(8, out.size() - i));
  }
  for (int i = 0; i < n; i += 4) {  // one block in four: an edge scale
    s = SplitMix64(s);
    PutEdgeScale(t, out.data() + bb * static_cast<std::size_t>(i),
                 kEdgeHalves[s % std::size(kEdgeHalves)]);
  }
  return out;
}

std::uint32_t Bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Dequantises n blocks both ways; returns the number of blocks that differ (first few reported).
int CompareBlocks(WeightType t, const std::byte* blocks, int n, const std::string& what) {
#if defined(LOCKSTEP_TEST_GGML_DIR)
  const auto* tr =
      test::GgmlLib::Get().get_type_traits(static_cast<ggml_type>(weight_type_ggml_id(t)));
  EXPECT_TRUE(tr != nullptr && tr->to_float != nullptr) << weight_type_name(t);
  if (tr == nullptr || tr->to_float == nullptr) return n;
  EXPECT_EQ(static_cast<std::size_t>(tr->type_size), weight_block_bytes(t));
  EXPECT_EQ(tr->blck_size, weight_block_elems(t));
  const int be = weight_block_elems(t);
  const std::size_t bb = weight_block_bytes(t);
  std::vector<float> want(static_cast<std::size_t>(n) * be), got(want.size());
  tr->to_float(blocks, want.data(), static_cast<std::int64_t>(want.size()));
  for (int i = 0; i < n; ++i)
    DequantizeBlock(t, blocks + bb * static_cast<std::size_t>(i), got.data() + be * i);
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const std::size_t o = static_cast<std::size_t>(be) * i;
    if (std::memcmp(want.data() + o, got.data() + o, sizeof(float) * be) == 0) continue;
    if (++bad <= 3)
      for (int j = 0; j < be; ++j)
        if (Bits(want[o + j]) != Bits(got[o + j])) {
          ADD_FAILURE() << weight_type_name(t) << " " << what << ": block " << i << " element " << j
                        << ": ggml " << want[o + j] << " (0x" << std::hex << Bits(want[o + j])
                        << "), lockstep " << std::dec << got[o + j] << " (0x" << std::hex
                        << Bits(got[o + j]) << ")";
          break;
        }
  }
  return bad;
#else
  (void)t, (void)blocks, (void)what;
  return n;
#endif
}

std::vector<WeightType> BlockTypes() {
  std::vector<WeightType> out;
  for (int i = 0; i < kWeightTypeCount; ++i)
    if (weight_block_elems(static_cast<WeightType>(i)) > 1)
      out.push_back(static_cast<WeightType>(i));
  return out;
}

#define LOCKSTEP_NEED_GGML()                                              \
  do {                                                                    \
    const std::string why = test::GgmlUnavailable();                      \
    if (!why.empty()) GTEST_SKIP() << "ggml oracle unavailable: " << why; \
  } while (0)

TEST(QuantOracle, RandomBlocksWithEdgeScalesEqualGgml) {
  LOCKSTEP_NEED_GGML();
  const std::vector<WeightType> types = BlockTypes();
  ASSERT_EQ(types.size(), 21u);  // every block type of weights.h
  for (WeightType t : types) {
    constexpr int kBlocks = 10000;
    const auto blocks = RandomBlocks(t, kBlocks, 0x39 + static_cast<std::uint64_t>(t));
    EXPECT_EQ(CompareBlocks(t, blocks.data(), kBlocks, "random"), 0)
        << weight_type_name(t) << ": blocks differ from ggml's to_float";
  }
}

#if defined(LOCKSTEP_TEST_GGML_DIR)
// Rows of values like a trained matrix's (a Gaussian with a few outliers), quantised by ggml.
std::vector<std::byte> GgmlQuantised(WeightType t, int rows, int cols, std::uint64_t seed) {
  const auto& lib = test::GgmlLib::Get();
  std::vector<float> x(static_cast<std::size_t>(rows) * cols);
  std::uint64_t s = seed;
  for (float& v : x) {
    s = SplitMix64(s);
    const double u1 = (static_cast<double>(s >> 11) + 0.5) / 9007199254740992.0;
    s = SplitMix64(s);
    const double u2 = static_cast<double>(s >> 11) / 9007199254740992.0;
    v = static_cast<float>(0.02 * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    if ((s & 1023) == 0) v *= 40;
  }
  const auto gt = static_cast<ggml_type>(weight_type_ggml_id(t));
  std::vector<float> imatrix(static_cast<std::size_t>(cols), 1.0f);
  const float* im = lib.requires_imatrix(gt) ? imatrix.data() : nullptr;
  std::vector<std::byte> out(static_cast<std::size_t>(rows) * (cols / weight_block_elems(t)) *
                             weight_block_bytes(t));
  const std::size_t n = lib.quantize_chunk(gt, x.data(), out.data(), 0, rows, cols, im);
  EXPECT_EQ(n, out.size()) << weight_type_name(t);
  return out;
}
#endif

TEST(QuantOracle, GgmlQuantisedTensorsEqualGgml) {
  LOCKSTEP_NEED_GGML();
#if defined(LOCKSTEP_TEST_GGML_DIR)
  for (WeightType t : BlockTypes()) {
    const int be = weight_block_elems(t);
    // 256-wide rows (one K block) and an odd shape: 7 blocks per row, 37 rows.
    for (auto [rows, cols] : {std::pair{12, 1024}, std::pair{13, 7 * be}}) {
      const auto q = GgmlQuantised(t, rows, cols, 0x51 + static_cast<std::uint64_t>(t));
      const int n = rows * (cols / be);
      EXPECT_EQ(CompareBlocks(t, q.data(), n, "ggml-quantised"), 0)
          << weight_type_name(t) << " [" << rows << ", " << cols << "]";
    }
  }
#endif
}

TEST(QuantOracle, FloatTypesEqualGgmlOnEveryCode) {
  LOCKSTEP_NEED_GGML();
#if defined(LOCKSTEP_TEST_GGML_DIR)
  std::vector<std::uint16_t> codes(65536);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint16_t>(i);
  for (WeightType t : {WeightType::kF16, WeightType::kBF16}) {
    const auto* tr =
        test::GgmlLib::Get().get_type_traits(static_cast<ggml_type>(weight_type_ggml_id(t)));
    ASSERT_TRUE(tr != nullptr && tr->to_float != nullptr) << weight_type_name(t);
    std::vector<float> want(codes.size()), got(codes.size());
    tr->to_float(codes.data(), want.data(), static_cast<std::int64_t>(codes.size()));
    Mat m;
    m.type = t;
    m.rows = 1;
    m.cols = static_cast<int>(codes.size());
    m.data = codes.data();
    m.RowToF32(0, got.data());
    // ggml's f16 widening quiets a signalling NaN (sets the top mantissa bit); lockstep's keeps
    // the payload as is (dtype.h). Every product the kernels make quiets it anyway, so the
    // dequantised weights' products agree; the 2 x 511 signalling codes are compared quieted.
    int bad = 0, snan = 0;
    for (std::size_t i = 0; i < codes.size(); ++i) {
      const bool is_snan =
          t == WeightType::kF16 && (i & 0x7C00) == 0x7C00 && (i & 0x03FF) != 0 && (i & 0x0200) == 0;
      const std::uint32_t g = is_snan ? (Bits(got[i]) | 0x00400000u) : Bits(got[i]);
      snan += is_snan;
      if (Bits(want[i]) != g && ++bad <= 3)
        ADD_FAILURE() << weight_type_name(t) << " code 0x" << std::hex << i << ": ggml 0x"
                      << Bits(want[i]) << ", lockstep 0x" << Bits(got[i]);
    }
    EXPECT_EQ(snan, t == WeightType::kF16 ? 1022 : 0);
    EXPECT_EQ(bad, 0) << weight_type_name(t);
  }
#endif
}

// Must show 2: llama.cpp's own mixes of `small` (llama_model_quantize from the f32 GGUF, as
// llama-quantize makes them) load, mixing types per tensor (Q4_K_M: attn_qkv Q5_K beside
// attn_gate Q4_K; the 128-wide expert rows fall back to Q5_0 / Q8_0 / IQ4_NL), and run bitwise
// like the same weights dequantised to f32: the same greedy tokens and every state item,
// logits included. Every quantised tensor of each file is also checked block by block against
// ggml's to_float (the real tensors of the oracle).
TEST(QuantOracle, LlamaCppMixesOfSmallLoadAndRunLikeTheirF32Copies) {
  LOCKSTEP_NEED_GGML();
#if defined(LOCKSTEP_TEST_GGML_DIR)
  const std::string base = "--preset small --seed 5 --layers 4 --experts 8";
  const std::string names = test::Init(base + " --dtype f32", "llq-st");
  const std::string f32 = test::Init(base + " --dtype f32 --format gguf", "llq-gg");
  struct Mix {
    const char* name;
    llama_ftype ftype;
  };
  const Mix mixes[] = {{"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M},
                       {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},
                       {"IQ4_XS", LLAMA_FTYPE_MOSTLY_IQ4_XS}, {"IQ3_S", LLAMA_FTYPE_MOSTLY_IQ3_S}};
  const auto& lib = test::GgmlLib::Get();
  for (const Mix& m : mixes) {
    const std::string out = test::NewDir(std::string("llq-") + m.name) + "/model.gguf";
    llama_model_quantize_params p = lib.quantize_default_params();
    p.nthread = 2;
    p.ftype = m.ftype;
    ASSERT_EQ(lib.model_quantize((f32 + "/model.gguf").c_str(), out.c_str(), &p), 0u) << m.name;
    auto file = GgufFile::Open(out);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    std::map<std::string, int> types;
    std::size_t blocks = 0;
    for (const GgufTensor& t : (*file)->tensors()) {
      ++types[GgmlTypeName(t.type)];
      const auto wt = WeightTypeOfGgml(t.type);
      ASSERT_TRUE(wt.has_value()) << m.name << ": " << t.name << " " << GgmlTypeName(t.type);
      if (weight_block_elems(*wt) == 1) continue;
      const int n = static_cast<int>(t.nbytes / weight_block_bytes(*wt));
      blocks += static_cast<std::size_t>(n);
      EXPECT_EQ(CompareBlocks(*wt, t.data, n, std::string(m.name) + " " + t.name), 0);
    }
    std::string mix;
    for (const auto& [k, v] : types) mix += k + " x" + std::to_string(v) + " ";
    EXPECT_GE(types.size(), 3u) << m.name << ": " << mix;  // F32 vectors and >= 2 block types
    EXPECT_GT(blocks, 10000u) << m.name;
    std::cout << m.name << ": " << mix << "(" << blocks << " blocks)\n";
    test::ExpectSameRun(out, test::DequantisedCopy(out, names), m.name);
  }
#endif
}

}  // namespace
}  // namespace lockstep
