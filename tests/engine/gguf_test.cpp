// GGUF checkpoints (issue 26, Must show 3 and 4): the synthetic model written in llama.cpp's
// qwen3next layout loads to the same tokens and bitwise the same state as its safetensors
// original; quantised files run bitwise like their dequantised weights in f32; malformed files are
// each a one-line exit-2 error naming the problem, never a crash.
#include "lockstep/engine/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>

#include "engine/gguf_test_util.h"
#include "engine/state_digest.h"
#include "lockstep/engine/safetensors.h"
#include "lockstep/engine/synthetic.h"
#include "model/tensor_source.h"
#include "test_util.h"

namespace lockstep {
namespace {

using test::DequantisedCopy;
using test::ExpectSameRun;
using test::Init;

// F32 and BF16 GGUF files of the same synthetic weights: the same tokens and every state item
// bitwise (the derived ssm_a and 1 + w norms are read back to the exact values, see gguf.cpp).
TEST(Gguf, FloatFilesEqualSafetensors) {
  for (const char* args : {"--preset tiny --seed 7", "--preset small --seed 3 --dtype bf16"}) {
    const std::string st = Init(args, "gguf-st"),
                      gg = Init(std::string(args) + " --format gguf", "gguf-gg");
    auto w = ModelWeights::Load(gg + "/model.gguf");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ((*w)->format, "gguf");
    EXPECT_TRUE((*w)->mtp.present);
    ExpectSameRun(st, gg + "/model.gguf", args);
  }
}

// Q8_0 / Q4_K / Q6_K: the engine dequantises in registers in the same accumulation order as the
// f32 kernels, so a quantised model runs bitwise like its dequantised weights stored as f32
// (gguf_reference_test.cpp checks both against the float64 reference, with its own dequantiser).
TEST(Gguf, QuantisedFilesEqualTheirDequantisedWeights) {
  const std::string st = Init("--preset tiny --seed 5 --vocab 512", "gguf-q-st");
  for (const char* q : {"q8_0", "q4_k", "q6_k"}) {
    // tiny's widths (64) are not whole 256-blocks: a --layers cut of `small` (hidden 512) is.
    const std::string base = std::string(q) == "q8_0" ? "--preset tiny --seed 5 --vocab 512"
                                                      : "--preset small --seed 5 --layers 4";
    const std::string names = std::string(q) == "q8_0" ? st : Init(base, "gguf-q-st2");
    const std::string gg = Init(base + " --format gguf --quant " + q, "gguf-q");
    auto w = ModelWeights::Load(gg + "/model.gguf");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(weight_type_name((*w)->layers[0].ffn_moe.experts[0].up.type), q);
    ExpectSameRun(gg + "/model.gguf", DequantisedCopy(gg + "/model.gguf", names), q);
  }
}

// A quantisation no matrix of the model can take (tiny's rows are 64 wide, K blocks hold 256)
// would write a float file under a quantised name: exit 2 naming the block size, no file left
// (issue 43; it used to write the unquantised file and exit 0).
TEST(Gguf, AQuantisationNoMatrixCanTakeIsRefused) {
  for (const char* q : {"q4_k", "q6_k"}) {
    const std::string dir = test::NewDir(std::string("gguf-noquant-") + q);
    auto r = test::RunLockstep("model init --preset tiny --format gguf --quant " + std::string(q) +
                               " --out " + dir + "/m");
    EXPECT_EQ(r.exit_code, 2) << q << ": " << r.err;
    EXPECT_NE(r.err.find("multiple of 256"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir + "/m/model.gguf")) << q;
  }
}

// A split set (NAME-00001-of-00002.gguf ...) loads like the single file: the tensors of one
// model spread over two files, the metadata in the first.
TEST(Gguf, SplitSetLoads) {
  const std::string gg = Init("--preset tiny --seed 7 --format gguf", "gguf-split");
  auto f = GgufFile::Open(gg + "/model.gguf");
  ASSERT_TRUE(f.ok());
  std::vector<GgufTensorToWrite> part[2];
  std::size_t i = 0;
  for (const GgufTensor& t : (*f)->tensors()) {
    GgufTensorToWrite w{t.name, static_cast<GgmlType>(t.type), t.ne,
                        std::vector<std::byte>(t.data, t.data + t.nbytes)};
    part[i++ % 2].push_back(std::move(w));
  }
  std::map<std::string, GgufValue> kv((*f)->kv().begin(), (*f)->kv().end());
  kv["split.count"] = {std::uint64_t{2}, 4};
  const std::string a = gg + "/m-00001-of-00002.gguf", b = gg + "/m-00002-of-00002.gguf";
  ASSERT_TRUE(WriteGguf(a, kv, part[0]).ok());
  ASSERT_TRUE(WriteGguf(b, {{"split.count", {std::uint64_t{2}, 4}}}, part[1]).ok());
  auto one = ModelWeights::Load(gg + "/model.gguf");
  auto two = ModelWeights::Load(a);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ((*two)->files.size(), 2u);
  const test::DigestRun r1 = test::GenerateDigests(**one, gg),
                        r2 = test::GenerateDigests(**two, gg);
  EXPECT_EQ(r1.tokens, r2.tokens);
  EXPECT_EQ(r1.items, r2.items);
  auto second = ModelWeights::Load(b);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("named by its first file"), std::string::npos);
}

// Issue 43: hyper-parameters of the wrong type or missing are refused naming the key (they
// loaded silently with other outputs, or defaulted), and metadata arrays are bounded.
TEST(Gguf, WrongTypedOrMissingHyperparametersAreRefusedNamingTheKey) {
  const std::string gg = Init("--preset tiny --seed 7 --format gguf", "gguf-typed");
  auto f = GgufFile::Open(gg + "/model.gguf");
  ASSERT_TRUE(f.ok());
  std::vector<GgufTensorToWrite> tensors;
  for (const GgufTensor& t : (*f)->tensors())
    tensors.push_back({t.name, static_cast<GgmlType>(t.type), t.ne,
                       std::vector<std::byte>(t.data, t.data + t.nbytes)});
  const std::map<std::string, GgufValue> base((*f)->kv().begin(), (*f)->kv().end());
  ASSERT_TRUE(ModelWeights::Load(gg + "/model.gguf").ok());  // lockstep's own file loads
  const std::string eps = "qwen3next.attention.layer_norm_rms_epsilon";
  const std::string theta = "qwen3next.rope.freq_base", blocks = "qwen3next.block_count";
  struct Case {
    std::string key;
    std::optional<GgufValue> value;  // nullopt: removed
    std::string expect;              // in the message besides the key
  };
  const Case cases[] = {{eps, GgufValue{std::int64_t{0}, 5}, "stored as i32"},
                        {theta, GgufValue{std::uint64_t{10000}, 4}, "stored as u32"},
                        {blocks, GgufValue{4.0, 6}, "stored as f32"},
                        {"qwen3next.expert_count", GgufValue{std::string("8"), 8}, "string"},
                        {eps, std::nullopt, "missing"},
                        {theta, std::nullopt, "missing"}};
  for (const Case& c : cases) {
    std::map<std::string, GgufValue> kv = base;
    if (c.value)
      kv[c.key] = *c.value;
    else
      kv.erase(c.key);
    const std::string path = gg + "/bad.gguf";
    ASSERT_TRUE(WriteGguf(path, kv, tensors).ok());
    auto w = ModelWeights::Load(path);
    ASSERT_FALSE(w.ok()) << c.key;
    const std::string m = w.status().ToString();
    EXPECT_NE(m.find(c.key), std::string::npos) << m;
    EXPECT_NE(m.find(c.expect), std::string::npos) << m;
    EXPECT_TRUE(w.status().code() == Status::Code::kInvalidArgument ||
                w.status().code() == Status::Code::kCorruption)
        << m;
  }
}

TEST(Gguf, A16MiElementMetadataArrayIsRefusedByTheCap) {
  // The file: one unused u8 array of 16 Mi elements (it took 1.63 GB and 8 s).
  std::vector<std::byte> b;
  auto put = [&b](const void* p, std::size_t n) {
    const auto* c = static_cast<const std::byte*>(p);
    b.insert(b.end(), c, c + n);
  };
  const std::uint32_t version = 3, array = 9, u8 = 0;
  const std::uint64_t n_tensors = 0, n_kv = 1, n = std::uint64_t{16} << 20;
  const std::string key = "junk.array";
  const std::uint64_t key_len = key.size();
  put("GGUF", 4);
  put(&version, 4);
  put(&n_tensors, 8);
  put(&n_kv, 8);
  put(&key_len, 8);
  put(key.data(), key.size());
  put(&array, 4);
  put(&u8, 4);
  put(&n, 8);
  b.resize(b.size() + n);
  auto f = GgufFile::FromMemory(b, "junk.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Status::Code::kCorruption);
  EXPECT_NE(f.status().message().find("metadata arrays hold more than"), std::string::npos)
      << f.status().ToString();
}

}  // namespace
}  // namespace lockstep
