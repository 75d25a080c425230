// Loading checkpoints: every bad-input case is a clear error (exit 2) naming the problem, never
// a crash; sharded checkpoints, both config styles and mixed-dtype files load to the same model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/safetensors.h"
#include "lockstep/engine/synthetic.h"
#include "lockstep/engine/weights.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// Copies tiny's checkpoint into a new folder, letting `edit` change the tensor list first.
std::string Rewrite(const std::string& name,
                    const std::function<void(std::vector<TensorToWrite>&)>& edit,
                    const std::string& config_override = "") {
  const std::string src = test::ModelDir("tiny");
  auto f = SafetensorsFile::Open(src + "/model.safetensors");
  EXPECT_TRUE(f.ok());
  std::vector<TensorToWrite> ts;
  for (const auto& t : (*f)->tensors())
    ts.push_back({t.name, t.dtype, t.shape, {t.data, t.nbytes}});
  edit(ts);
  std::string dir = test::NewDir(name);
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", ts).ok());
  std::string cfg = config_override;
  if (cfg.empty()) cfg = *ReadFile(src + "/config.json");
  EXPECT_TRUE(WriteFileAtomic(dir + "/config.json", cfg).ok());
  return dir;
}

void ExpectLoadError(const std::string& dir, Status::Code code, const std::string& needle) {
  auto w = ModelWeights::Load(dir);
  ASSERT_FALSE(w.ok()) << dir;
  EXPECT_EQ(w.status().code(), code) << w.status().ToString();
  EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status().message();
  // The CLI turns it into exit 2 with the same message, never a crash.
  auto r = test::RunLockstep("generate --model " + dir + " --prompt hi --max-new 1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST(Loader, MissingTensor) {
  auto dir = Rewrite("missing", [](auto& ts) {
    std::erase_if(ts, [](const TensorToWrite& t) {
      return t.name == "model.layers.3.self_attn.k_norm.weight";
    });
  });
  ExpectLoadError(dir, Status::Code::kNotFound, "model.layers.3.self_attn.k_norm.weight");
}

TEST(Loader, WrongShape) {
  auto dir = Rewrite("shape", [](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.1.mlp.gate.weight") {
        t.shape = {t.shape[1], t.shape[0]};  // transposed
      }
  });
  ExpectLoadError(dir, Status::Code::kCorruption,
                  "model.layers.1.mlp.gate.weight': expected shape [8, 64], got [64, 8]");
}

TEST(Loader, WrongDtype) {
  std::vector<std::byte> codes;
  auto dir = Rewrite("dtype", [&](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.norm.weight") {
        codes.assign(static_cast<std::size_t>(t.shape[0]), std::byte{1});
        t.dtype = DType::kI8;
        t.data = codes;
      }
  });
  ExpectLoadError(dir, Status::Code::kCorruption,
                  "model.norm.weight': expected f32, bf16 or f16, got int8");
}

TEST(Loader, CorruptFiles) {
  const std::string src = test::ModelDir("tiny");
  auto bytes = *ReadFile(src + "/model.safetensors");
  auto cfg = *ReadFile(src + "/config.json");
  auto make = [&](const std::string& name, const std::string& content) {
    std::string d = test::NewDir(name);
    EXPECT_TRUE(WriteFileAtomic(d + "/model.safetensors", content).ok());
    EXPECT_TRUE(WriteFileAtomic(d + "/config.json", cfg).ok());
    return d;
  };
  // Truncated inside the data section.
  ExpectLoadError(make("trunc", bytes.substr(0, bytes.size() / 2)), Status::Code::kCorruption,
                  "model.safetensors");
  // Truncated inside the header.
  ExpectLoadError(make("trunc-hdr", bytes.substr(0, 100)), Status::Code::kCorruption,
                  "model.safetensors");
  // Bad header JSON: break the opening brace.
  std::string bad = bytes;
  bad[8] = '[';
  ExpectLoadError(make("badjson", bad), Status::Code::kCorruption, "model.safetensors");
  // Unknown dtype.
  std::string unk = bytes;
  auto pos = unk.find("\"F32\"");
  ASSERT_NE(pos, std::string::npos);
  unk.replace(pos, 5, "\"Q7X\"");
  ExpectLoadError(make("unkdtype", unk), Status::Code::kCorruption, "Q7X");
  // Header length pointing past the end of the file.
  std::string longhdr = bytes;
  longhdr[6] = '\x7f';
  ExpectLoadError(make("hdrlen", longhdr), Status::Code::kCorruption, "model.safetensors");
  // Missing config.json / empty folder.
  std::string empty = test::NewDir("empty");
  auto r = test::RunLockstep("generate --model " + empty + " --prompt hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
}

// Logits of the first few windows for a fixed prompt.
std::vector<float> FirstLogits(const ModelWeights& w) {
  EngineConfig c;
  c.threads = 2;
  c.max_new = 4;
  c.ignore_eos = true;
  auto e = Engine::Create(c, w);
  EXPECT_TRUE(e.ok());
  std::vector<float> out;
  GenerateHooks hooks;
  hooks.on_window = [&](int, int T, const float* l) {
    out.insert(out.end(), l, l + T * w.config.n_vocab);
  };
  std::vector<std::int32_t> prompt{1, 50, 200, 7, 99, 3};
  EXPECT_TRUE(Generate(**e, prompt, &hooks).ok());
  return out;
}

TEST(Loader, ShardedCheckpointWithIndex) {
  const std::string src = test::ModelDir("tiny");
  auto f = SafetensorsFile::Open(src + "/model.safetensors");
  ASSERT_TRUE(f.ok());
  std::vector<TensorToWrite> a, b;
  std::string map = "{\"metadata\": {}, \"weight_map\": {";
  bool first = true;
  for (const auto& t : (*f)->tensors()) {
    bool in_a = t.name < "model.layers.4";
    (in_a ? a : b).push_back({t.name, t.dtype, t.shape, {t.data, t.nbytes}});
    map += std::string(first ? "" : ",") + "\"" + t.name + "\": \"" +
           (in_a ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") + "\"";
    first = false;
  }
  map += "}}";
  std::string d = test::NewDir("sharded");
  ASSERT_TRUE(WriteSafetensors(d + "/model-00001-of-00002.safetensors", a).ok());
  ASSERT_TRUE(WriteSafetensors(d + "/model-00002-of-00002.safetensors", b).ok());
  ASSERT_TRUE(WriteFileAtomic(d + "/model.safetensors.index.json", map).ok());
  ASSERT_TRUE(WriteFileAtomic(d + "/config.json", *ReadFile(src + "/config.json")).ok());
  auto w = ModelWeights::Load(d);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->files.size(), 2u);
  EXPECT_TRUE(test::BitwiseEqual(FirstLogits(**w), FirstLogits(test::Model("tiny"))));
}

TEST(Loader, NewerConfigStyleLoadsTheSameModel) {
  auto cfg = *ReadFile(test::ModelDir("tiny") + "/config.json");
  // full_attention_interval -> layer_types; top-level rope -> rope_parameters.
  auto rep = [&](const std::string& from, const std::string& to) {
    auto p = cfg.find(from);
    ASSERT_NE(p, std::string::npos) << from;
    cfg.replace(p, from.size(), to);
  };
  rep("\"full_attention_interval\": 4,",
      "\"layer_types\": "
      "[\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\","
      "\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\"],");
  rep("\"partial_rotary_factor\": 0.25,",
      "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000.0, "
      "\"partial_rotary_factor\": 0.25},");
  rep("\"rope_theta\": 10000000.0,", "");
  auto dir = Rewrite(
      "newstyle", [](auto&) {}, cfg);
  auto w = ModelWeights::Load(dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(test::BitwiseEqual(FirstLogits(**w), FirstLogits(test::Model("tiny"))));
}

TEST(Loader, Bf16AndF16CheckpointsWithF32Tensors) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SyntheticOptions o;
    o.preset = "tiny";
    o.seed = 7;
    o.dtype = dt;
    std::string d = test::NewDir("lowp");
    ASSERT_TRUE(WriteSyntheticModel(o, d).ok());
    auto f = SafetensorsFile::Open(d + "/model.safetensors");
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->Find("model.layers.0.linear_attn.A_log")->dtype, DType::kF32);
    EXPECT_EQ((*f)->Find("model.layers.0.linear_attn.in_proj_qkvz.weight")->dtype, dt);
    auto w = ModelWeights::Load(d);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    // Weights kept in the storage dtype and widened exactly: every value is representable in it.
    const Mat& m = (*w)->layers[0].gdn.in_proj_qkvz;
    EXPECT_EQ(m.type, dt == DType::kBF16 ? WeightType::kBF16 : WeightType::kF16);
    std::vector<float> row0(static_cast<std::size_t>(m.cols));
    m.RowToF32(0, row0.data());
    for (int i = 0; i < m.cols; ++i) {
      float x = row0[static_cast<std::size_t>(i)];
      EXPECT_EQ(x, dt == DType::kBF16 ? round_to_bf16(x) : f16_to_f32(f32_to_f16(x)));
    }
    auto l = FirstLogits(**w), ref = FirstLogits(test::Model("tiny"));
    EXPECT_LT(test::Nrmse(ref, l), 0.1) << "low-precision weights stay close to f32";
    EXPECT_GT(test::Nrmse(ref, l), 0.0);
  }
}

TEST(Loader, MtpIsOptional) {
  SyntheticOptions o;
  o.preset = "tiny";
  o.seed = 7;
  o.with_mtp = false;
  std::string d = test::NewDir("nomtp");
  ASSERT_TRUE(WriteSyntheticModel(o, d).ok());
  auto w = ModelWeights::Load(d);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_FALSE((*w)->mtp.present);
  EXPECT_TRUE(test::Model("tiny").mtp.present);
  EXPECT_TRUE(test::BitwiseEqual(FirstLogits(**w), FirstLogits(test::Model("tiny"))));
}

// A preset cut in depth and breadth keeps its widths, follows the layer pattern (full attention
// every 4th layer) and loads; counts the config cannot hold are errors, not models.
TEST(Loader, PresetCutInDepthAndBreadthKeepsItsWidths) {
  SyntheticOptions o;
  o.preset = "small";
  o.seed = 7;
  o.n_layers = 5, o.n_experts = 6, o.n_experts_used = 3, o.n_vocab = 300;
  o.with_mtp = false;
  std::string d = test::NewDir("cut");
  ASSERT_TRUE(WriteSyntheticModel(o, d).ok());
  auto w = ModelWeights::Load(d);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ModelConfig& c = (*w)->config;
  const ModelConfig small = *SyntheticConfig("small");
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_experts, 6);
  EXPECT_EQ(c.n_experts_used, 3);
  EXPECT_EQ(c.n_vocab, 300);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{299});
  EXPECT_EQ(c.n_embd, small.n_embd);
  EXPECT_EQ(c.head_dim, small.head_dim);
  EXPECT_EQ(c.moe_ffn, small.moe_ffn);
  ASSERT_EQ(c.layer_types.size(), 5u);
  EXPECT_EQ(c.layer_types[3], LayerType::kFullAttention);
  EXPECT_EQ(c.layer_types[4], LayerType::kLinearAttention);
  EXPECT_EQ((*w)->layers[0].ffn_moe.experts.size(), 6u);
  for (auto bad : {std::pair{0, -1}, std::pair{7, 0}}) {
    SyntheticOptions b = o;
    b.n_layers = bad.second;
    b.n_experts_used = bad.first;
    const Status st = WriteSyntheticModel(b, test::NewDir("cut-bad"));
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  }
}

}  // namespace
}  // namespace lockstep
