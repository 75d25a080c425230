// The port check (issue 38, item 4; compare/include/lockstep/compare/port_check.h) through the
// real binary: `lockstep diff` of a lockstep and a llama.cpp export of one request on one f32
// GGUF reports the per-(op, layer) NRMSE table at the float floor for every mapped op; a
// `perturb-op` planted in one of our ops at layer L makes L the table's first layer over the
// cross-engine threshold; different models or requests are refused (exit 2); the verdict uses
// the cross_engine profile, not the A/A defaults. Skips with the reason without the component.
#include "lockstep/compare/port_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/llamacpp/llamacpp_build.h"
#include "test_util.h"

namespace lockstep {
namespace {

#define SKIP_WITHOUT_LLAMACPP_PORT()                                            \
  do {                                                                          \
    const Status available = LlamaCppAvailable();                               \
    if (!available.ok()) GTEST_SKIP() << "llama.cpp: " << available.ToString(); \
  } while (0)

using nlohmann::json;

// `model init --preset PRESET --format gguf --dtype f32`, once per (preset, seed); PRESET may
// carry more flags ("small --layers 4").
std::string F32Gguf(int seed, const std::string& preset = "tiny") {
  static std::map<std::pair<std::string, int>, std::string> made;
  if (auto it = made.find({preset, seed}); it != made.end()) return it->second;
  const std::string dir = test::NewDir("port-gguf");
  const auto r =
      test::RunLockstep("model init --preset " + preset + " --dtype f32 --format gguf --seed " +
                        std::to_string(seed) + " --out " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  made[{preset, seed}] = dir + "/model.gguf";
  return made[{preset, seed}];
}

std::string Prompt(const std::string& ids) {
  const std::string p = test::NewDir("port-prompt") + "/p.txt";
  EXPECT_TRUE(WriteFileAtomic(p, ids + "\n").ok());
  return p;
}

// The op windows both runs digest and dump: the prefill (8 rows) and decode window 2.
constexpr const char* kOpWindows = "prefill,2";

// One engine's export of the request, with every op of kOpWindows dumped. `extra`: more flags.
std::string PortExport(const std::string& engine, const std::string& model,
                       const std::string& prompt, const std::string& extra = "") {
  const std::string out = test::NewDir("port-run") + "/" + engine + ".h5";
  std::string cmd = "generate --engine " + engine + " --model " + model + " --prompt-tokens " +
                    prompt + " --max-new 4 --threads 1 --export-windows all --export-points " +
                    "post_verify --op-digests " + kOpWindows + " --op-dump all@" + kOpWindows +
                    " --export " + out + " " + extra;
  if (engine == "llama.cpp") cmd += " --llama-kv-type f32";
  const auto r = test::RunLockstep(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.err;
  return out;
}

struct Port {
  int exit_code = -1;
  std::string out, err;
  json j;
};

Port Diff(const std::string& a, const std::string& b, const std::string& extra = "") {
  const std::string jpath = test::NewDir("port-json") + "/port.json";
  const auto r = test::RunLockstep("diff " + a + " " + b + " --json " + jpath + " " + extra);
  Port p{r.exit_code, r.out, r.err, json()};
  if (auto text = ReadFile(jpath); text.ok()) p.j = json::parse(*text, nullptr, false);
  return p;
}

// The mapped (op, layer) cells of a model of `layers` layers with full attention in every 4th:
// embed, final_norm, lm_head; in every layer attn_norm, attn_residual, ffn_norm, router_logits,
// topk, shared_expert, moe_combine, residual; q_proj, q_rope, attn_out, o_proj in a full-attention
// layer; in_proj_ba, conv, recurrence, gated_norm, out_proj in a GDN one.
constexpr int MappedCells(int layers) {
  const int attention = layers / 4;
  return 3 + layers * 8 + attention * 4 + (layers - attention) * 5;
}
constexpr int kTinyLayers = 8;
constexpr int kTinyCells = MappedCells(kTinyLayers);
static_assert(kTinyCells == 105);

const std::string& Lockstep() {
  static const std::string p = PortExport("lockstep", F32Gguf(1), Prompt("1 2 3 4 5 6 7 8"));
  return p;
}
const std::string& Llama() {
  static const std::string p = PortExport("llama.cpp", F32Gguf(1), Prompt("1 2 3 4 5 6 7 8"));
  return p;
}

// tiny (8 layers) and small in 4 layers (its widths: 512 hidden, 32 experts, 4096 vocabulary; the
// whole 16 layers are a 544 MB f32 file), f32: every mapped cell at the float floor (measured:
// worst cell 4.3e-6 on tiny; small, all 16 layers, by hand: 207 cells, worst 2.7e-6; logits
// 3-10e-7).
TEST(PortCheck, F32TableIsAtTheFloorForEveryMappedOp) {
  SKIP_WITHOUT_LLAMACPP_PORT();
  for (const auto& [preset, layers] : {std::pair{"tiny", 8}, std::pair{"small --layers 4", 4}}) {
    SCOPED_TRACE(preset);
    const std::string model = F32Gguf(1, preset);
    const std::string prompt = Prompt("1 2 3 4 5 6 7 8");
    const Port p =
        Diff(PortExport("lockstep", model, prompt), PortExport("llama.cpp", model, prompt));
    ASSERT_TRUE(p.j.is_object()) << p.out << p.err;
    EXPECT_EQ(p.exit_code, 0) << p.out << p.err;
    EXPECT_EQ(p.j["schema"], "lockstep.port");
    EXPECT_EQ(p.j["verdict"], "pass");
    EXPECT_EQ(p.j["a"]["engine"], "lockstep");
    EXPECT_EQ(p.j["b"]["engine"], "llama.cpp");
    EXPECT_EQ(p.j["thresholds"]["profile"], "cross_engine");
    const json& steps = p.j["steps"];
    EXPECT_EQ(steps["compared"], 4);
    EXPECT_EQ(steps["greedy_agree"], 4);
    for (const json& s : steps["rows"]) EXPECT_LT(s["nrmse"].get<double>(), 1e-5) << s.dump();
    const json& ops = p.j["ops"];
    const int cells = MappedCells(layers);
    ASSERT_EQ(ops["cells_compared"], cells) << p.out;
    EXPECT_EQ(ops["cells_over"], 0) << p.out;
    EXPECT_TRUE(ops["first_layer_over"].is_null());
    std::map<std::string, int> per_op;
    double worst = 0.0;
    for (const json& c : ops["cells"]) {
      const double e = c["nrmse"].get<double>();
      EXPECT_LT(e, 1e-5) << c.dump();
      // The prefill's 7 rows (the prompt's 8th is window 0's) and window 2's; final_norm and
      // lm_head only where llama.cpp outputs a row: window 2.
      const bool head = c["layer"] == -1 && c["ours"] != "embed";
      EXPECT_EQ(c["rows"].get<int>(), head ? 1 : 8) << c.dump();
      worst = std::max(worst, e);
      per_op[c["ours"].get<std::string>()]++;
    }
    EXPECT_EQ(per_op["attn_norm"], layers);
    EXPECT_EQ(per_op["residual"], layers);
    EXPECT_EQ(per_op["o_proj"] + per_op["out_proj"], layers);
    EXPECT_EQ(per_op["recurrence"], layers - layers / 4);
    EXPECT_EQ(per_op["q_rope"], layers / 4);
    EXPECT_EQ(per_op["embed"], 1);
    std::printf("port check f32 %s: %d cells, worst NRMSE %.2e\n", preset, cells, worst);
    // The human table names the ops in both engines' words.
    EXPECT_NE(p.out.find("attn_post_norm / ffn_norm"), std::string::npos) << p.out;
    EXPECT_NE(p.out.find("PASS: 4 steps, " + std::to_string(cells) + " op cells"),
              std::string::npos)
        << p.out;
  }
}

// A planted change in one of our ops at layer L: the table's first layer over threshold is L.
TEST(PortCheck, PlantedPerturbationIsTheFirstLayerOverThreshold) {
  SKIP_WITHOUT_LLAMACPP_PORT();
  struct Plant {
    const char* op;
    int layer;
  };
  // attn_norm (every layer), o_proj (full attention: layers 3 and 7), recurrence (GDN, not
  // mapped itself: seen first in that layer's gated_norm), router_logits.
  for (const Plant& pl : {Plant{"attn_norm", 1}, Plant{"o_proj", 3}, Plant{"recurrence", 5},
                          Plant{"router_logits", 6}, Plant{"attn_norm", 0}}) {
    SCOPED_TRACE(std::string(pl.op) + " layer " + std::to_string(pl.layer));
    // tiny runs 4 stages of 2 layers.
    const std::string inj = "--inject perturb-op:stage=" + std::to_string(pl.layer / 2) +
                            ":layer=" + std::to_string(pl.layer) + ":op=" + pl.op +
                            ":window=2:row=0:ulps=20000";
    const std::string a = PortExport("lockstep", F32Gguf(1), Prompt("1 2 3 4 5 6 7 8"), inj);
    const Port p = Diff(a, Llama());
    ASSERT_TRUE(p.j.is_object()) << p.out << p.err;
    EXPECT_EQ(p.exit_code, 1) << p.out;
    EXPECT_EQ(p.j["verdict"], "fail");
    const json& ops = p.j["ops"];
    EXPECT_EQ(ops["cells_compared"], kTinyCells);
    ASSERT_FALSE(ops["first_layer_over"].is_null()) << p.out;
    EXPECT_EQ(ops["first_layer_over"].get<int>(), pl.layer) << p.out;
    EXPECT_NE(p.out.find("the engines part at layer " + std::to_string(pl.layer)),
              std::string::npos)
        << p.out;
  }
}

// quant_dot = ggml is llama.cpp's arithmetic (cpu/matmul_q8.h: x rounded to 8 bits per block as
// ggml rounds it, integer dot products): on lockstep's q8_0 / q4_k / q6_k GGUFs of small (4
// layers, the router and norms f32), a one-token prompt, the mapped op cells of the prefill and
// window 2 are at the float floor against llama.cpp, where the exact products part from layer 0's
// first projection (x's rounding: ~1e-3). Measured (1-token prompt): q8_0 and q6_k 0 of 54 cells
// over 1e-5, q4_k 5; exact 52 each. Where the engines' f32 floor flips the rounding of an x
// element (one flip costs ~1e-4 in that product's rows) the later cells part: with the 8-token
// prompt (bf16 router) q8_0 has 22 cells over, from layer 2.
TEST(PortCheck, GgmlProductsAreLlamaCppsArithmeticOnQuantisedFiles) {
  SKIP_WITHOUT_LLAMACPP_PORT();
  for (const char* quant : {"q8_0", "q4_k", "q6_k"}) {
    SCOPED_TRACE(quant);
    const std::string model = F32Gguf(1, std::string("small --layers 4 --quant ") + quant);
    const std::string prompt = Prompt("5");
    const std::string llama = PortExport("llama.cpp", model, prompt);
    const Port g = Diff(PortExport("lockstep", model, prompt, "--quant-dot ggml"), llama);
    const Port e = Diff(PortExport("lockstep", model, prompt), llama);
    ASSERT_TRUE(g.j.is_object() && e.j.is_object()) << g.out << g.err << e.out << e.err;
    EXPECT_EQ(g.j["ops"]["cells_compared"], MappedCells(4));
    // Layer 0's first product (its input attn_norm-0 bitwise equal in both engines): at the floor
    // with ggml's arithmetic, x's rounding away from it without.
    auto first_product = [](const json& j) {
      for (const json& c : j["ops"]["cells"])
        if (c["ours"] == "in_proj_ba" && c["layer"] == 0) return c["nrmse"].get<double>();
      return -1.0;
    };
    EXPECT_GE(first_product(g.j), 0.0);
    EXPECT_LT(first_product(g.j), 1e-6) << g.out;
    EXPECT_GT(first_product(e.j), 1e-4) << e.out;
    // A rounding flip of x on the engines' f32 floor may part a few later cells (~1e-4 each).
    EXPECT_LE(g.j["ops"]["cells_over"].get<int>(), 6) << g.out;
    EXPECT_EQ(e.exit_code, 1) << e.out;
    EXPECT_GT(e.j["ops"]["cells_over"].get<int>(), 40) << e.out;
    EXPECT_EQ(e.j["ops"]["first_layer_over"], 0) << e.out;
    std::printf("port check %s, 1-token prompt: quant_dot ggml %d of %d cells over, exact %d\n",
                quant, g.j["ops"]["cells_over"].get<int>(), MappedCells(4),
                e.j["ops"]["cells_over"].get<int>());
  }
}

// The thresholds are the cross_engine profile: 4000 ULPs on one row of attn_norm-2 (measured:
// that cell's NRMSE 4.2e-5, window 2's logits 4.7e-5: far above the f32 floor, under the A/A
// defaults of 2e-4 and KL 1e-5) fail the port check.
TEST(PortCheck, ThresholdsAreTheCrossEngineProfile) {
  SKIP_WITHOUT_LLAMACPP_PORT();
  const std::string a =
      PortExport("lockstep", F32Gguf(1), Prompt("1 2 3 4 5 6 7 8"),
                 "--inject perturb-op:stage=1:layer=2:op=attn_norm:window=2:row=0:ulps=4000");
  const Port p = Diff(a, Llama());
  ASSERT_TRUE(p.j.is_object()) << p.out << p.err;
  EXPECT_EQ(p.j["thresholds"]["profile"], "cross_engine");
  EXPECT_EQ(p.j["thresholds"]["op_nrmse_max"].get<double>(), 1e-5);
  EXPECT_EQ(p.j["thresholds"]["logits_nrmse_max"].get<double>(), 1e-5);
  EXPECT_EQ(p.exit_code, 1) << p.out;
  EXPECT_EQ(p.j["ops"]["first_layer_over"], 2) << p.out;
  EXPECT_NE(p.out.find("profile cross_engine"), std::string::npos) << p.out;
  // Explicit thresholds replace the profile's, and the report says so.
  const Port loose = Diff(a, Llama(), "--nrmse-max 1e-1 --kl-max 1");
  EXPECT_EQ(loose.exit_code, 0) << loose.out;
  EXPECT_EQ(loose.j["thresholds"]["overridden"].size(), 2u);
}

TEST(PortCheck, DifferentModelsOrRequestsAreRefused) {
  SKIP_WITHOUT_LLAMACPP_PORT();
  const std::string other_model = PortExport("llama.cpp", F32Gguf(2), Prompt("1 2 3 4 5 6 7 8"));
  const Port m = Diff(Lockstep(), other_model);
  EXPECT_EQ(m.exit_code, 2) << m.out << m.err;
  EXPECT_NE(m.err.find("different models"), std::string::npos) << m.err;
  EXPECT_EQ(std::count(m.err.begin(), m.err.end(), '\n'), 1) << m.err;
  const std::string other_request = PortExport("llama.cpp", F32Gguf(1), Prompt("1 2 3 4 5 6 7 9"));
  const Port q = Diff(Lockstep(), other_request);
  EXPECT_EQ(q.exit_code, 2) << q.out << q.err;
  EXPECT_NE(q.err.find("different requests"), std::string::npos) << q.err;
  // summarize and the reports the port check does not write say so (exit 2).
  const auto s = test::RunLockstep("summarize " + Lockstep() + " " + Llama());
  EXPECT_EQ(s.exit_code, 2) << s.err;
  EXPECT_NE(s.err.find("different engines"), std::string::npos) << s.err;
  const auto md = test::RunLockstep("diff " + Lockstep() + " " + Llama() + " --md -");
  EXPECT_EQ(md.exit_code, 2) << md.err;
}

// Without op dumps the steps are still compared and the table says why it is empty; a pair with
// no step in common is never a pass.
TEST(PortCheck, WithoutDumpsTheTableSaysWhyAndNothingComparedFails) {
  SKIP_WITHOUT_LLAMACPP_PORT();
  const std::string dir = test::NewDir("port-nodump");
  const auto r = test::RunLockstep("generate --engine llama.cpp --model " + F32Gguf(1) +
                                   " --prompt-tokens " + Prompt("1 2 3 4 5 6 7 8") +
                                   " --max-new 4 --threads 1 --llama-kv-type f32 "
                                   "--export-windows all --export-points post_verify --export " +
                                   dir + "/a.h5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Port p = Diff(Lockstep(), dir + "/a.h5");
  EXPECT_EQ(p.exit_code, 0) << p.out;
  EXPECT_EQ(p.j["ops"]["cells_compared"], 0);
  EXPECT_NE(p.out.find("no op dumps (--op-dump OPS@WINDOWS) in B"), std::string::npos) << p.out;
  const auto n = test::RunLockstep("generate --engine llama.cpp --model " + F32Gguf(1) +
                                   " --prompt-tokens " + Prompt("1 2 3 4 5 6 7 8") +
                                   " --max-new 4 --threads 1 --export-windows none --export " +
                                   dir + "/none.h5");
  ASSERT_EQ(n.exit_code, 0) << n.err;
  const Port v = Diff(Lockstep(), dir + "/none.h5");
  EXPECT_EQ(v.exit_code, 1) << v.out;
  EXPECT_NE(v.out.find("FAIL: nothing compared"), std::string::npos) << v.out;
}

// The step rule without llama.cpp (these run in every build): a greedy split is a named near-tie
// only where A's top-2 gap is under the profile's; elsewhere, and over the NRMSE / KL bounds, the
// step fails.
TEST(PortStep, GreedySplitPassesOnlyAtANearTie) {
  const PortThresholds th = CrossEngineProfile();
  std::vector<float> a(64), b(64);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] = 0.01f * static_cast<float>(i % 7);
  a[10] = 3.0f, a[20] = 2.9999990f;  // A's top two within 1e-6
  b = a;
  std::swap(b[10], b[20]);  // B prefers the other: a split at a near-tie
  const PortStep tie = ComparePortStep(0, 8, a, b, th);
  EXPECT_FALSE(tie.agree);
  EXPECT_TRUE(tie.near_tie);
  EXPECT_TRUE(tie.passed) << tie.reason;
  EXPECT_EQ(tie.top1_a, 10);
  EXPECT_EQ(tie.top1_b, 20);
  EXPECT_LT(tie.gap_a, 1e-5);
  // The same split where A's gap is 0.5: a failure that names the gap, whatever the NRMSE.
  a[20] = 2.5f;
  b = a;
  b[20] = 3.0f, b[10] = 2.5f;
  PortThresholds loose = th;
  loose.logits_nrmse_max = loose.kl_max = 1e9;
  const PortStep split = ComparePortStep(0, 8, a, b, loose);
  EXPECT_FALSE(split.agree);
  EXPECT_FALSE(split.near_tie);
  EXPECT_FALSE(split.passed);
  EXPECT_NE(split.reason.find("not a near-tie"), std::string::npos) << split.reason;
  // Agreement with logits 1e-4 apart: over the profile's NRMSE bound.
  b = a;
  for (float& v : b) v *= 1.0001f;
  const PortStep far = ComparePortStep(0, 8, a, b, th);
  EXPECT_TRUE(far.agree);
  EXPECT_FALSE(far.passed);
  EXPECT_NE(far.reason.find("logits NRMSE"), std::string::npos) << far.reason;
  // Bitwise equal rows pass with NRMSE and KL 0.
  const PortStep same = ComparePortStep(0, 8, a, a, th);
  EXPECT_TRUE(same.passed && same.agree);
  EXPECT_EQ(same.nrmse, 0.0);
  EXPECT_EQ(same.kl, 0.0);
}

// The profile is its own, never the A/A defaults, and the map is what REPORTS.md documents.
TEST(PortStep, ProfileAndMap) {
  const PortThresholds th = CrossEngineProfile();
  EXPECT_EQ(th.profile, "cross_engine");
  EXPECT_LT(th.op_nrmse_max, 2e-4);
  EXPECT_LT(th.kl_max, 1e-5);
  EXPECT_EQ(PortOpMap().size(), 20u);
  int layer = -9;
  const auto two = FindPortPairsTheirs("attn_output-7", &layer);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(layer, 7);
  EXPECT_STREQ(two[0]->ours, "o_proj");
  EXPECT_STREQ(two[1]->ours, "recurrence");
  const auto norm = FindPortPairsTheirs("attn_post_norm-12", &layer);
  ASSERT_EQ(norm.size(), 1u);
  EXPECT_STREQ(norm[0]->ours, "ffn_norm");
  EXPECT_EQ(layer, 12);
  EXPECT_EQ(FindPortPairsTheirs("result_norm", &layer).size(), 1u);
  EXPECT_EQ(layer, -1);
  EXPECT_TRUE(FindPortPairsTheirs("Kcur-3", &layer).empty());
  EXPECT_TRUE(FindPortPairsTheirs("attn_norm", &layer).empty()) << "a layer op needs its layer";
  EXPECT_EQ(FindPortPairOurs("in_proj"), nullptr);
}

}  // namespace
}  // namespace lockstep
