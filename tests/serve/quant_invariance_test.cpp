// Batch invariance and T-invariance on a quantised file (issue 39, Must show 4): llama.cpp's own
// Q4_K_M of `small` (4 layers, 8 experts; llama_model_quantize from the f32 GGUF, as
// llama-quantize makes it: Q4_K and Q6_K with Q5_0 / Q8_0 where a row does not fit a K block,
// and attn_qkv + attn_gate of different types, loaded as a stacked matrix). The weights are
// dequantised in registers (engine/cpu/quant_src.h), or with quant_dot = ggml multiplied as
// integers with x rounded to 8 bits (cpu/matmul_q8.h), so these are the kernels under test:
//   - a verify window of T rows equals T single-token decodes bitwise (logits and the state the
//     next step reads), T = 1..9;
//   - the needle: a spec-on request alone equals itself among 3 and 7 background requests of
//     random lengths arriving at random steps, on every exported item at NRMSE 0 / KL 0.
// Skips with the reason without the llama.cpp component (its quantiser makes the file).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/ggml_lib.h"
#include "serve/serve_util.h"
#include "test_util.h"

namespace lockstep {
namespace {

#if defined(LOCKSTEP_TEST_GGML_DIR)
// The Q4_K_M file, made once per process.
const std::string& Q4KM() {
  static const std::string path = [] {
    const std::string f32 = test::NewDir("qinv-f32");
    const test::CmdResult r = test::RunLockstep(
        "model init --preset small --seed 5 --layers 4 --experts 8 --dtype f32 --format gguf "
        "--out " +
        f32);
    if (r.exit_code != 0) return std::string();
    const std::string out = test::NewDir("qinv-q4km") + "/model.gguf";
    const auto& lib = test::GgmlLib::Get();
    llama_model_quantize_params p = lib.quantize_default_params();
    p.nthread = 2;
    p.ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M;
    if (lib.model_quantize((f32 + "/model.gguf").c_str(), out.c_str(), &p) != 0)
      return std::string();
    return out;
  }();
  return path;
}

const ModelWeights& Weights() {
  static const ModelWeightsPtr w = [] {
    auto got = ModelWeights::Load(Q4KM());
    if (!got.ok()) throw std::runtime_error(got.status().ToString());
    return std::move(got).value();
  }();
  return *w;
}
#endif

#define LOCKSTEP_NEED_Q4KM()                                                        \
  do {                                                                              \
    const std::string why = test::GgmlUnavailable();                                \
    if (!why.empty()) GTEST_SKIP() << "llama.cpp's quantiser unavailable: " << why; \
  } while (0)

TEST(QuantInvariance, Q4KMIsStackedWhereLlamaCppMixesTypes) {
  LOCKSTEP_NEED_Q4KM();
#if defined(LOCKSTEP_TEST_GGML_DIR)
  ASSERT_FALSE(Q4KM().empty());
  const ModelWeights& w = Weights();
  int stacked = 0, block = 0;
  for (const LayerWeights& l : w.layers) {
    if (l.type != LayerType::kLinearAttention) continue;
    stacked += l.gdn.in_proj_qkvz.parts != nullptr;
    block += weight_block_elems(l.gdn.out_proj.type) > 1;
  }
  EXPECT_GT(stacked, 0) << "no GDN layer has attn_qkv and attn_gate of different types";
  EXPECT_GT(block, 0);
  // The file's bytes, not an f32 copy: the stacked matrix costs what its parts cost.
  for (const LayerWeights& l : w.layers)
    if (const Mat& m = l.gdn.in_proj_qkvz; m.parts != nullptr) {
      EXPECT_LT(m.bytes(), static_cast<std::size_t>(m.rows) * m.cols) << "over 1 byte per weight";
    }
#endif
}

#if defined(LOCKSTEP_TEST_GGML_DIR)
void VerifyEqualsDecodes(const std::string& quant_dot) {
  const ModelWeights& w = Weights();
  const std::size_t v = static_cast<std::size_t>(w.config.n_vocab);
  const std::vector<std::int32_t> prompt = test::Tokens(30, 3), window = test::Tokens(10, 99);
  for (int T = 1; T <= 9; ++T) {
    SCOPED_TRACE("quant_dot " + quant_dot);
    EngineConfig c;
    c.threads = 2;
    c.prefill_chunk = 8;
    c.quant_dot = quant_dot;
    auto batched = Engine::Create(c, w);
    auto single = Engine::Create(c, w);
    ASSERT_TRUE(batched.ok() && single.ok());
    ASSERT_TRUE((*batched)->Prefill(prompt).ok());
    ASSERT_TRUE((*single)->Prefill(prompt).ok());
    const std::size_t n = static_cast<std::size_t>(T);
    std::vector<float> lb(n * v), ls(n * v);
    ASSERT_TRUE(
        (*batched)->Verify(std::span<const std::int32_t>(window.data(), n), lb.data()).ok());
    ASSERT_TRUE((*batched)->Commit(T).ok());
    for (std::size_t t = 0; t < n; ++t) {
      ASSERT_TRUE(
          (*single)->Verify(std::span<const std::int32_t>(&window[t], 1), ls.data() + t * v).ok());
      ASSERT_TRUE((*single)->Commit(1).ok());
    }
    EXPECT_TRUE(test::BitwiseEqual(lb, ls)) << "T=" << T;
    // The committed state: the next step's logits from both engines.
    std::vector<float> nb(v), ns(v);
    ASSERT_TRUE((*batched)->Verify(std::span<const std::int32_t>(&window[9], 1), nb.data()).ok());
    ASSERT_TRUE((*single)->Verify(std::span<const std::int32_t>(&window[9], 1), ns.data()).ok());
    EXPECT_TRUE(test::BitwiseEqual(nb, ns)) << "after T=" << T;
  }
}

void Needle(const std::string& quant_dot, const std::vector<int>& backgrounds) {
  const ModelWeights& w = Weights();
  const int V = w.config.n_vocab;
  EngineConfig cfg;
  cfg.model = Q4KM();
  cfg.threads = 2;
  cfg.slots = 8;
  cfg.prefill_chunk = 32;
  cfg.batch_tokens = 128;
  cfg.quant_dot = quant_dot;
  std::mt19937_64 rng(7);
  RequestSpec target;
  target.id = "target";
  const auto block = test::RandomTokens(24, rng(), V);
  for (int k = 0; k < 3; ++k) target.prompt.insert(target.prompt.end(), block.begin(), block.end());
  target.options = test::SpecOptions(16);
  const std::string dir = test::NewDir("qinv-needle-" + quant_dot);
  std::vector<test::ServeRequest> one(1);
  one[0].spec = target;
  one[0].export_path = dir + "/alone.h5";
  const test::ServeRun alone = test::RunRequestsOn(cfg, w, std::move(one));
  ASSERT_EQ(alone.results.at(0).end, RequestEnd::kFinished);
  bool multi_row = false;
  for (const WindowRecord& win : alone.results[0].result.windows) multi_row |= win.T_mtp > 0;
  EXPECT_TRUE(multi_row) << "no verify window carried an MTP draft";
  for (int n_bg : backgrounds) {
    SCOPED_TRACE(std::to_string(n_bg) + " background requests");
    std::vector<test::ServeRequest> reqs;
    const int at = std::uniform_int_distribution<int>(0, n_bg)(rng);
    for (int i = 0; i <= n_bg; ++i) {
      test::ServeRequest q;
      if (i == at) {
        q.spec = target;
        q.spec.arrive_step = std::uniform_int_distribution<int>(0, 6)(rng);
        q.export_path = dir + "/mixed" + std::to_string(n_bg) + ".h5";
      } else {
        q.spec.id = "bg" + std::to_string(i);
        q.spec.prompt =
            test::RandomTokens(std::uniform_int_distribution<int>(20, 200)(rng), rng(), V);
        q.spec.options = test::SpecOptions(std::uniform_int_distribution<int>(8, 20)(rng));
        q.spec.arrive_step = std::uniform_int_distribution<int>(0, 10)(rng);
      }
      reqs.push_back(std::move(q));
    }
    const test::ServeRun run = test::RunRequestsOn(cfg, w, std::move(reqs));
    const RequestResult& t = run.results.at(static_cast<std::size_t>(at));
    ASSERT_EQ(t.end, RequestEnd::kFinished) << t.status.ToString();
    EXPECT_EQ(t.result.output, alone.results[0].result.output);
    int shared = 0;
    for (const WindowRecord& win : t.result.windows) shared += win.step_seqs > 1;
    EXPECT_GT(shared, 0) << "the target never shared a step";
    const DiffResult d =
        test::DiffExact(dir + "/alone.h5", dir + "/mixed" + std::to_string(n_bg) + ".h5");
    EXPECT_TRUE(d.Passed()) << d.failed << " items differ; " << d.vacuous;
    EXPECT_GT(d.compared, 0);
    std::printf(
        "q4_k_m needle, quant_dot %s, %d background: %zu windows (%d shared a step), %d "
        "items equal\n",
        quant_dot.c_str(), n_bg, t.result.windows.size(), shared, d.passed);
  }
}
#endif

TEST(QuantInvariance, VerifyWindowEqualsTSingleDecodesOnQ4KM) {
  LOCKSTEP_NEED_Q4KM();
#if defined(LOCKSTEP_TEST_GGML_DIR)
  for (const std::string quant_dot : {"exact", "ggml"}) VerifyEqualsDecodes(quant_dot);
#endif
}

TEST(QuantInvariance, NeedleOnQ4KMIsBitwiseItselfAmongBackgroundRequests) {
  LOCKSTEP_NEED_Q4KM();
#if defined(LOCKSTEP_TEST_GGML_DIR)
  Needle("exact", {3, 7});
#endif
}

// quant_dot = ggml (cpu/matmul_q8.h): the 8-bit products keep both properties.
TEST(QuantInvariance, NeedleWithGgmlProductsIsBitwiseItselfAmongBackgroundRequests) {
  LOCKSTEP_NEED_Q4KM();
#if defined(LOCKSTEP_TEST_GGML_DIR)
  Needle("ggml", {7});
#endif
}

}  // namespace
}  // namespace lockstep
