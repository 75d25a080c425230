// ModelConfig (both HF config styles) and EngineConfig (canonical JSON, strict parsing).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/synthetic.h"
#include "test_util.h"

namespace lockstep {
namespace {

const char* const& k80B = test::k80BConfigJson;

TEST(ModelConfig, Parses80BRelease) {
  auto c = ModelConfig::FromJsonText(k80B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->n_layers, 48);
  EXPECT_EQ(c->rotary_dim, 64);
  EXPECT_EQ(c->n_full_attention_layers(), 12);
  EXPECT_TRUE(c->is_full_attention(3));
  EXPECT_FALSE(c->is_full_attention(4));
  EXPECT_TRUE(c->is_full_attention(47));
  EXPECT_EQ(c->conv_dim(), 8192);
  EXPECT_EQ(c->qkvz_dim(), 12288);
  EXPECT_TRUE(c->is_moe(0));
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{151645});
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e7);
}

TEST(ModelConfig, NewerStyleLayerTypesAndRopeParameters) {
  std::string j = k80B;
  auto cut = [&](const std::string& what, const std::string& with) {
    auto pos = j.find(what);
    ASSERT_NE(pos, std::string::npos) << what;
    j.replace(pos, what.size(), with);
  };
  cut(R"("partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_scaling": null,)",
      R"("rope_parameters": {"rope_type": "default", "rope_theta": 5000000, "partial_rotary_factor": 0.5},)");
  std::string types = "[";
  for (int i = 0; i < 48; ++i)
    types += std::string(i ? "," : "") + (i % 2 ? "\"full_attention\"" : "\"linear_attention\"");
  cut(R"("full_attention_interval": 4,)", "\"layer_types\": " + types + "],");
  auto c = ModelConfig::FromJsonText(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e6);
  EXPECT_EQ(c->rotary_dim, 128);
  EXPECT_TRUE(c->is_full_attention(1));
  EXPECT_FALSE(c->is_full_attention(2));
}

TEST(ModelConfig, ClearErrors) {
  std::string j = k80B;
  j.replace(j.find("\"hidden_size\": 2048,"), 20, "");
  auto c = ModelConfig::FromJsonText(j, "m/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().exit_code(), 2);
  EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("m/config.json"), std::string::npos);

  auto bad_json = ModelConfig::FromJsonText("{\"vocab_size\": ", "cfg");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_EQ(bad_json.status().code(), Status::Code::kCorruption);

  std::string wrong_type = k80B;
  wrong_type.replace(wrong_type.find("\"num_experts\": 512"), 18, "\"num_experts\": \"many\"");
  auto wt = ModelConfig::FromJsonText(wrong_type, "cfg");
  ASSERT_FALSE(wt.ok());
  EXPECT_NE(wt.status().message().find("num_experts"), std::string::npos);

  std::string other = k80B;
  other.replace(other.find("qwen3_next"), 10, "llama");
  EXPECT_EQ(ModelConfig::FromJsonText(other, "cfg").status().code(), Status::Code::kNotSupported);
}

// Issue 43, Must show 4: every out-of-range hyperparameter of config.json is one exit-2 refusal
// naming its key (table-driven; the 80B release's config with one value replaced).
TEST(ModelConfig, OutOfRangeValuesAreRefusedNamingTheKey) {
  struct Case {
    const char* key;  // JSON pointer into the config ("/rope_parameters/rope_theta")
    nlohmann::json value;
    const char* named;  // in the message
  };
  const std::vector<Case> cases = {
      {"/partial_rotary_factor", -1, "partial_rotary_factor"},
      {"/partial_rotary_factor", 0, "partial_rotary_factor"},
      {"/partial_rotary_factor", 1.5, "partial_rotary_factor"},
      {"/partial_rotary_factor", 0.001, "partial_rotary_factor"},  // 0 rotary dims
      {"/rope_theta", 0, "rope_theta"},
      {"/rope_theta", -10000, "rope_theta"},
      {"/rms_norm_eps", 0, "rms_norm_eps"},
      {"/rms_norm_eps", -1e-6, "rms_norm_eps"},
      {"/rms_norm_eps", 1, "rms_norm_eps"},
      {"/head_dim", 0, "head_dim"},
      {"/head_dim", 1024, "head_dim"},
      {"/num_key_value_heads", 3, "num_key_value_heads"},
      {"/num_key_value_heads", 32, "num_key_value_heads"},
      {"/linear_num_key_heads", 12, "linear_num_key_heads"},
      {"/linear_conv_kernel_dim", 0, "linear_conv_kernel_dim"},
      {"/linear_conv_kernel_dim", 64, "linear_conv_kernel_dim"},
      {"/linear_key_head_dim", 4096, "linear_key_head_dim"},
      {"/num_experts", 8192, "num_experts"},
      {"/num_experts_per_tok", 600, "num_experts_per_tok"},
      {"/num_experts_per_tok", 0, "num_experts_per_tok"},
      {"/moe_intermediate_size", 0, "moe_intermediate_size"},
      {"/decoder_sparse_step", 0, "decoder_sparse_step"},
      {"/mlp_only_layers", nlohmann::json::array({48}), "mlp_only_layers"},
      {"/mlp_only_layers", nlohmann::json::array({-1}), "mlp_only_layers"},
      {"/bos_token_id", 151936, "bos_token_id"},
      {"/eos_token_id", 200000, "eos_token_id"},
      {"/full_attention_interval", 0, "full_attention_interval"},
      {"/vocab_size", 0, "vocab_size"},
      {"/num_hidden_layers", -4, "num_hidden_layers"},
      {"/num_nextn_predict_layers", 2, "MTP"},
  };
  ASSERT_GE(cases.size(), 20u);
  for (const Case& c : cases) {
    nlohmann::json j = nlohmann::json::parse(k80B);
    j[nlohmann::json::json_pointer(c.key)] = c.value;
    auto r = ModelConfig::FromJsonText(j.dump(), "m/config.json");
    ASSERT_FALSE(r.ok()) << c.key << " = " << c.value.dump() << " was accepted";
    EXPECT_EQ(r.status().exit_code(), 2) << c.key << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.named), std::string::npos)
        << c.key << ": " << r.status().message();
  }
  // The newer spelling is checked under its own name.
  nlohmann::json nested = nlohmann::json::parse(k80B);
  nested.erase("rope_theta");
  nested.erase("partial_rotary_factor");
  nested["rope_parameters"] = {{"rope_theta", -1.0}, {"partial_rotary_factor", 0.25}};
  auto r = ModelConfig::FromJsonText(nested.dump(), "m/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rope_parameters.rope_theta"), std::string::npos)
      << r.status().message();
}

// The same refusal through the CLI: exit 2 with the key, never "internal error" (issue 43:
// partial_rotary_factor -1 exited 3 with vector::_M_default_append).
TEST(ModelConfig, CliRefusesANegativeRotaryFactor) {
  const std::string dir = test::NewDir("bad-rotary");
  auto init = test::RunLockstep("model init --preset tiny --seed 7 --out " + dir);
  ASSERT_EQ(init.exit_code, 0) << init.err;
  auto text = ReadFile(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  j["partial_rotary_factor"] = -1;
  ASSERT_TRUE(WriteFileAtomic(dir + "/config.json", j.dump()).ok());
  auto r = test::RunLockstep("generate --model " + dir + " --prompt abc --max-new 2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("partial_rotary_factor"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}

TEST(ModelConfig, RoundTripsThroughToJson) {
  for (const auto& p : SyntheticPresets()) {
    auto c = SyntheticConfig(p);
    ASSERT_TRUE(c.ok());
    auto back = ModelConfig::FromJsonText(c->ToJson(), p);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->ToJson(), c->ToJson());
    EXPECT_EQ(back->layer_types, c->layer_types);
  }
}

TEST(EngineConfig, CanonicalJsonRoundTripAndStrictKeys) {
  EngineConfig c;
  c.model = "m";
  c.split = {12, 24, 36};
  c.kv_dtype = DType::kI8;
  c.pcie_frac = 0.55;
  c.seed = 20261018;
  std::string j = c.ToJson();
  EXPECT_LT(j.find("\"backend\""), j.find("\"kv_dtype\"")) << "keys are sorted";
  auto back = EngineConfig::FromJson(j, "cfg");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), j);
  auto unknown = EngineConfig::FromJson(R"({"spec_k": 4})", "cfg");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown key 'spec_k'"), std::string::npos);
  auto wrong = EngineConfig::FromJson(R"({"stages": "four"})", "cfg");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("stages"), std::string::npos);
}

// The option table (EngineOptions()) is the one list: keys and flags unique, one-line docs, and
// ToJson / FromJson cover exactly its keys.
TEST(EngineConfig, OptionTableIsTheOneList) {
  std::set<std::string> keys, flags;
  for (const EngineOption& o : EngineOptions()) {
    EXPECT_TRUE(keys.insert(std::string(o.key)).second) << "key listed twice: " << o.key;
    EXPECT_TRUE(flags.insert(std::string(o.flag)).second) << "flag listed twice: " << o.flag;
    EXPECT_EQ(o.flag.substr(0, 2), "--") << o.flag;
    EXPECT_FALSE(o.doc.empty()) << o.key;
    EXPECT_EQ(o.doc.find('\n'), std::string_view::npos) << o.key << ": docs are one line";
  }
  // ToJson covers every key, except that an omit_default option is left out at its default.
  std::set<std::string> omitted;
  for (const EngineOption& o : EngineOptions())
    if (o.omit_default) omitted.insert(std::string(o.key));
  const auto j = nlohmann::json::parse(EngineConfig{}.ToJson());
  std::set<std::string> json_keys;
  for (auto it = j.begin(); it != j.end(); ++it) json_keys.insert(it.key());
  for (const std::string& k : omitted) EXPECT_EQ(json_keys.count(k), 0u) << k;
  json_keys.insert(omitted.begin(), omitted.end());
  EXPECT_EQ(json_keys, keys);
}

// The penalties (issue 42) are left out of the config while neutral, so every earlier export's
// /config (and its digest) is unchanged; set, they are written and read back, and range-checked.
TEST(EngineConfig, PenaltiesOnlyInTheJsonWhenSet) {
  const std::string plain = EngineConfig{}.ToJson();
  for (const char* k : {"presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n"})
    EXPECT_EQ(plain.find(k), std::string::npos) << k;
  EngineConfig c;
  c.frequency_penalty = 0.5;
  c.repeat_last_n = -1;
  const auto j = nlohmann::json::parse(c.ToJson());
  EXPECT_EQ(j.at("frequency_penalty"), 0.5);
  EXPECT_EQ(j.at("repeat_last_n"), -1);
  EXPECT_FALSE(j.contains("presence_penalty"));
  auto back = EngineConfig::FromJson(c.ToJson(), "cfg");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, c);
  for (const char* bad : {R"({"presence_penalty": 2.5})", R"({"frequency_penalty": -3})",
                          R"({"repeat_penalty": 0})", R"({"repeat_last_n": -2})"}) {
    auto r = EngineConfig::FromJson(bad, "cfg");
    ASSERT_FALSE(r.ok()) << bad;
    const std::string m = r.status().message();
    EXPECT_TRUE(m.find("penalty") != std::string::npos || m.find("last-n") != std::string::npos)
        << m;
  }
}

// quant_dot: absent from the JSON at its default (the exports of exact runs keep their /config
// bytes), "ggml" round-trips, other values and ggml on the cuda backend are refused naming the
// flag.
TEST(EngineConfig, QuantDotOnlyInTheJsonWhenSetAndCpuOnly) {
  EXPECT_EQ(EngineConfig{}.ToJson().find("quant_dot"), std::string::npos);
  EngineConfig c;
  c.quant_dot = "ggml";
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_EQ(nlohmann::json::parse(c.ToJson()).at("quant_dot"), "ggml");
  auto back = EngineConfig::FromJson(c.ToJson(), "cfg");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, c);
  c.quant_dot = "int8";
  EXPECT_NE(c.Validate().ToString().find("--quant-dot"), std::string::npos);
  c.quant_dot = "ggml";
  c.backend = "cuda";
  const std::string m = c.Validate().ToString();
  EXPECT_NE(m.find("--quant-dot"), std::string::npos) << m;
  EXPECT_NE(m.find("cpu"), std::string::npos) << m;
}

// Each special spelling reads back what it prints (help shows the default through `format`).
TEST(EngineConfig, OptionParseReadsWhatFormatPrints) {
  EngineConfig c;
  c.devices = {2, 0};
  c.split = {3, 6, 9};
  c.expert_cache = 7;
  c.kv_dtype = DType::kBF16;
  c.mtp = false;
  for (const EngineConfig& from : {EngineConfig{}, c}) {
    for (const EngineOption& o : EngineOptions()) {
      if (!o.parse) continue;
      EngineConfig back;
      const std::string text = FormatEngineOption(o, from);
      ASSERT_TRUE(o.parse(o, text, back).ok()) << o.flag << " '" << text << "'";
      EXPECT_EQ(FormatEngineOption(o, back), text) << o.flag;
    }
  }
  const EngineOption* mtp = nullptr;
  for (const EngineOption& o : EngineOptions())
    if (o.key == "mtp") mtp = &o;
  ASSERT_NE(mtp, nullptr);
  EngineConfig d;
  auto bad = mtp->parse(*mtp, "maybe", d);
  EXPECT_EQ(bad.message(), "--mtp: expected on or off, got 'maybe'");
}

// FromJson names the key and the expected type for every option (an object fits none).
TEST(EngineConfig, FromJsonNamesTheKeyOfEveryBadValue) {
  for (const EngineOption& o : EngineOptions()) {
    const std::string key(o.key);
    auto r = EngineConfig::FromJson("{\"" + key + "\": {}}", "cfg.json");
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_EQ(r.status().exit_code(), 2);
    EXPECT_NE(r.status().message().find("cfg.json: key '" + key + "': expected "),
              std::string::npos)
        << r.status().message();
  }
  auto kv = EngineConfig::FromJson(R"({"kv_dtype": "int4"})", "cfg.json");
  EXPECT_EQ(kv.status().message(),
            "cfg.json: key 'kv_dtype': expected f32, bf16 or int8, got 'int4'");
}

TEST(EngineConfig, SplitValidation) {
  auto m = SyntheticConfig("seed48");
  ASSERT_TRUE(m.ok());
  EngineConfig c;
  c.split = {12, 24, 36};
  auto b = c.StageBoundaries(*m);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int>{0, 12, 24, 36, 48}));
  c.split = {};
  EXPECT_EQ(*c.StageBoundaries(*m), (std::vector<int>{0, 12, 24, 36, 48}));
  c.split = {12, 12, 36};
  EXPECT_FALSE(c.StageBoundaries(*m).ok());
  c.split = {12, 24, 48};
  EXPECT_FALSE(c.StageBoundaries(*m).ok());
  c.split = {12, 24};
  EXPECT_FALSE(c.Validate().ok());
  EXPECT_FALSE(ParseIntList("12,,24", "--split").ok());
  EXPECT_FALSE(ParseIntList("12,x", "--split").ok());
}

TEST(EngineConfig, ExpertResidency) {
  EngineConfig c;
  c.pcie_frac = 0.55;
  EXPECT_EQ(c.ResidentExperts(32), 14);  // 32 - round(17.6)
  c.expert_cache = 20;
  EXPECT_EQ(c.ResidentExperts(32), 20);
  c.expert_cache = 99;
  EXPECT_EQ(c.ResidentExperts(32), 32);
}

}  // namespace
}  // namespace lockstep
