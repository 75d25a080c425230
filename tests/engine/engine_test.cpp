// Engine-level properties of the CPU reference backend (issue "Foundation", Must show 1-5, 8):
// chunked GDN == recurrence, layer-split invariance, prefill chunk size, determinism, int8 K/V
// bound, batch invariance of verify windows, commit/rollback, and that the synthetic models
// behave like models (logit scale, varied output, MTP agreement).
#include "lockstep/engine/engine.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "cpu/gdn.h"
#include "lockstep/compare/metrics.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/tokenizer.h"
#include "test_util.h"

namespace lockstep {
namespace {

// Logits NRMSE of quantised K/V caches against f32 K/V on the first verify window after a
// 120-token prompt (tiny, seed 7, g++ 12 -O3, x86-64): measured int8 3.2e-4, bf16 7.1e-4.
// Bounds carry ~6x margin. (int8 keeps a per-row-per-head scale, so its error is of the same
// order as bf16's 8-bit mantissa.)
constexpr double kInt8KvLogitsNrmseBound = 2e-3;
constexpr double kBf16KvLogitsNrmseBound = 4e-3;

using test::BitwiseEqual;
using test::Model;
using test::Nrmse;

// A deterministic, non-repetitive prompt of n byte tokens.
std::vector<std::int32_t> Prompt(int n, std::uint64_t seed = 3) {
  auto r = test::Random(static_cast<std::size_t>(n), seed, 0.0f, 255.0f);
  std::vector<std::int32_t> ids;
  for (float x : r) ids.push_back(static_cast<std::int32_t>(x));
  return ids;
}

EngineConfig BaseConfig(const std::string& preset, int threads = 2) {
  EngineConfig c;
  c.model = test::ModelDir(preset);
  c.threads = threads;
  c.max_new = 12;
  c.ignore_eos = true;
  return c;
}

EnginePtr MakeEngine(const EngineConfig& cfg, const ModelWeights& w) {
  auto r = Engine::Create(cfg, w);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

struct RunOut {
  std::vector<std::int32_t> tokens;
  std::vector<float> logits;  // all windows' logits, concatenated
};

RunOut Generate(const EngineConfig& cfg, const std::vector<std::int32_t>& prompt,
                const std::string& preset = "tiny") {
  auto engine = Engine::Create(cfg, Model(preset));
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  RunOut run;
  GenerateHooks hooks;
  const int v = Model(preset).config.n_vocab;
  hooks.on_window = [&](int, int T, const float* logits) {
    run.logits.insert(run.logits.end(), logits,
                      logits + static_cast<std::size_t>(T) * static_cast<std::size_t>(v));
  };
  auto res = lockstep::Generate(**engine, prompt, &hooks);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  run.tokens = res->output;
  return run;
}

// ---- Must show 1: chunked GDN prefill == token-by-token recurrence ----
TEST(Engine, ChunkedGdnPrefillEqualsRecurrence) {
  const ModelWeights& w = Model("tiny");
  const ModelConfig& c = w.config;
  const LayerWeights& lw = w.layers[0];
  ASSERT_EQ(lw.type, LayerType::kLinearAttention);
  for (int T : {1, 37, 64, 150}) {
    GdnState chunked(c.conv_dim(), c.conv_kernel, c.n_v_heads, c.k_head_dim, c.v_head_dim);
    GdnState recur(c.conv_dim(), c.conv_kernel, c.n_v_heads, c.k_head_dim, c.v_head_dim);
    // Start both from the same nonzero state.
    auto conv0 = test::Random(chunked.conv_size(), 11),
         ssm0 = test::Random(chunked.ssm_size(), 12, -0.3f, 0.3f);
    std::copy(conv0.begin(), conv0.end(), chunked.conv());
    std::copy(conv0.begin(), conv0.end(), recur.conv());
    std::copy(ssm0.begin(), ssm0.end(), chunked.ssm());
    std::copy(ssm0.begin(), ssm0.end(), recur.ssm());
    auto a = test::Random(static_cast<std::size_t>(T) * static_cast<std::size_t>(c.n_embd),
                          13 + static_cast<std::uint64_t>(T));
    std::vector<float> out_c(a.size()), out_r(a.size());
    Arena arena;
    cpu::GdnForward(lw.gdn, c, a.data(), T, chunked, cpu::GdnMode::kPrefill,
                    cpu::MatmulKind::kInvariant, nullptr, arena, out_c.data());
    cpu::GdnForward(lw.gdn, c, a.data(), T, recur, cpu::GdnMode::kVerify,
                    cpu::MatmulKind::kInvariant, nullptr, arena, out_r.data());
    recur.CommitSteps(T);
    EXPECT_EQ(chunked.position(), T);
    EXPECT_EQ(recur.position(), T);
    std::vector<float> sc(chunked.ssm(), chunked.ssm() + chunked.ssm_size()),
        sr(recur.ssm(), recur.ssm() + recur.ssm_size());
    std::vector<float> cc(chunked.conv(), chunked.conv() + chunked.conv_size()),
        cr(recur.conv(), recur.conv() + recur.conv_size());
    EXPECT_LT(Nrmse(out_r, out_c), 1e-6) << "outputs, T=" << T;
    EXPECT_LT(Nrmse(sr, sc), 1e-6) << "ssm state, T=" << T;
    EXPECT_TRUE(BitwiseEqual(cr, cc)) << "conv state is a copy of inputs, T=" << T;
    // The test would notice a real difference: a perturbed state is far away.
    sc[0] += 0.1f;
    EXPECT_GT(Nrmse(sr, sc), 1e-6);
  }
}

// ---- Must show 2: 1 stage vs 4 stages (any split) -> bitwise identical ----
TEST(Engine, LayerSplitInvariance) {
  auto prompt = Prompt(40);
  EngineConfig one = BaseConfig("tiny");
  one.stages = 1;
  one.prefill_chunk = 16;
  RunOut ref = Generate(one, prompt);
  for (std::vector<int> split : {std::vector<int>{}, std::vector<int>{1, 2, 3},
                                 std::vector<int>{5, 6, 7}, std::vector<int>{1, 4, 7}}) {
    EngineConfig four = one;
    four.stages = 4;
    four.split = split;
    RunOut got = Generate(four, prompt);
    EXPECT_EQ(ref.tokens, got.tokens);
    EXPECT_TRUE(BitwiseEqual(ref.logits, got.logits)) << "split size " << split.size();
  }
  EngineConfig eight = one;
  eight.stages = 8;
  EXPECT_TRUE(BitwiseEqual(ref.logits, Generate(eight, prompt).logits));
}

// ---- Must show 3: prefill chunk size changes logits by NRMSE < 1e-5; tokens match ----
TEST(Engine, PrefillChunkSize) {
  auto prompt = Prompt(150);
  EngineConfig c = BaseConfig("tiny");
  c.prefill_chunk = 1 << 20;  // whole prompt
  RunOut whole = Generate(c, prompt);
  double worst = 0.0;
  for (int chunk : {7, 64, 149}) {
    c.prefill_chunk = chunk;
    RunOut got = Generate(c, prompt);
    EXPECT_EQ(whole.tokens, got.tokens) << "chunk " << chunk;
    double e = Nrmse(whole.logits, got.logits);
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-5) << "chunk " << chunk;
  }
  RecordProperty("worst_nrmse", fmt::format("{:.3g}", worst));
}

// ---- Must show 4: two fresh runs, same config and threads -> bitwise identical ----
TEST(Engine, DeterministicAcrossFreshRuns) {
  auto prompt = Prompt(70);
  for (int threads : {1, 2}) {
    EngineConfig c = BaseConfig("tiny", threads);
    c.prefill_chunk = 32;
    c.temperature = 0.8;
    c.top_p = 0.9;
    c.seed = 42;
    RunOut a = Generate(c, prompt), b = Generate(c, prompt);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_TRUE(BitwiseEqual(a.logits, b.logits)) << threads << " threads";
  }
}

// Decode (verify) kernels split work over outputs only, so decode logits do not depend on the
// thread count either (prefill's GEMM may, within its own tolerance).
TEST(Engine, DecodeIndependentOfThreadCount) {
  auto prompt = Prompt(1);  // no prefill at all: every row goes through verify kernels
  EngineConfig c1 = BaseConfig("tiny", 1), c2 = BaseConfig("tiny", 2);
  c1.max_new = c2.max_new = 20;
  RunOut a = Generate(c1, prompt), b = Generate(c2, prompt);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_TRUE(BitwiseEqual(a.logits, b.logits));
}

// ---- Must show 5: int8 (and bf16) K/V vs f32 K/V, measured bound ----
TEST(Engine, QuantisedKvBound) {
  auto prompt = Prompt(120);
  EngineConfig c = BaseConfig("tiny");
  c.max_new = 16;
  RunOut f32 = Generate(c, prompt);
  c.kv_dtype = DType::kI8;
  RunOut i8 = Generate(c, prompt);
  c.kv_dtype = DType::kBF16;
  RunOut bf = Generate(c, prompt);
  // The first window compares identical token histories (later windows may follow other tokens).
  const std::size_t v = static_cast<std::size_t>(Model("tiny").config.n_vocab);
  std::vector<float> f0(f32.logits.begin(), f32.logits.begin() + static_cast<std::ptrdiff_t>(v));
  std::vector<float> i0(i8.logits.begin(), i8.logits.begin() + static_cast<std::ptrdiff_t>(v));
  std::vector<float> b0(bf.logits.begin(), bf.logits.begin() + static_cast<std::ptrdiff_t>(v));
  double e_i8 = Nrmse(f0, i0), e_bf = Nrmse(f0, b0);
  RecordProperty("int8_nrmse", fmt::format("{:.3g}", e_i8));
  RecordProperty("bf16_nrmse", fmt::format("{:.3g}", e_bf));
  EXPECT_LT(e_i8, kInt8KvLogitsNrmseBound);
  EXPECT_LT(e_bf, kBf16KvLogitsNrmseBound);
  EXPECT_GT(e_i8, 0.0) << "int8 storage must actually quantise";
  EXPECT_GT(e_bf, 0.0);
}

// ---- Must show 8: a T-row verify == T single-token decodes, bitwise (T = 1..9) ----
TEST(Engine, VerifyWindowBatchInvariance) {
  const ModelWeights& w = Model("tiny");
  const std::size_t v = static_cast<std::size_t>(w.config.n_vocab);
  auto prompt = Prompt(30);
  auto window = Prompt(9, 99);
  for (int T = 1; T <= 9; ++T) {
    EngineConfig c = BaseConfig("tiny");
    c.prefill_chunk = 8;
    auto batched = MakeEngine(c, w);
    auto single = MakeEngine(c, w);
    ASSERT_TRUE(batched->Prefill(prompt).ok());
    ASSERT_TRUE(single->Prefill(prompt).ok());
    std::vector<float> lb(static_cast<std::size_t>(T) * v), ls(static_cast<std::size_t>(T) * v);
    ASSERT_TRUE(
        batched
            ->Verify(std::span<const std::int32_t>(window.data(), static_cast<std::size_t>(T)),
                     lb.data())
            .ok());
    ASSERT_TRUE(batched->Commit(T).ok());
    for (int t = 0; t < T; ++t) {
      ASSERT_TRUE(
          single
              ->Verify(std::span<const std::int32_t>(&window[static_cast<std::size_t>(t)], 1),
                       ls.data() + static_cast<std::size_t>(t) * v)
              .ok());
      ASSERT_TRUE(single->Commit(1).ok());
    }
    EXPECT_TRUE(BitwiseEqual(lb, ls)) << "T=" << T;
    // Committed state after the window equals the state after T single decodes.
    for (int is = 0; is < c.stages; ++is) {
      StageSession& sb = batched->stage(is);
      StageSession& ss = single->stage(is);
      for (int il = sb.layer_begin(); il < sb.layer_end(); ++il) {
        if (GdnState* gb = sb.gdn(il)) {
          GdnState* gs = ss.gdn(il);
          EXPECT_EQ(0, std::memcmp(gb->ssm(), gs->ssm(), gb->ssm_size() * sizeof(float)))
              << "layer " << il;
          EXPECT_EQ(0, std::memcmp(gb->conv(), gs->conv(), gb->conv_size() * sizeof(float)))
              << "layer " << il;
          EXPECT_EQ(gb->position(), gs->position());
        }
        if (KvCache* kb = sb.kv(il)) {
          KvCache* ks = ss.kv(il);
          ASSERT_EQ(kb->rows_committed(), ks->rows_committed());
          for (int r = 0; r < kb->rows_committed(); ++r) {
            EXPECT_EQ(0, std::memcmp(kb->KRaw(r), ks->KRaw(r), kb->row_bytes()));
            EXPECT_EQ(0, std::memcmp(kb->VRaw(r), ks->VRaw(r), kb->row_bytes()));
          }
        }
      }
    }
  }
}

// Commit keeps a prefix; rejected rows never reach committed state.
TEST(Engine, CommitKeepsPrefixAndDiscardsRest) {
  const ModelWeights& w = Model("tiny");
  const std::size_t v = static_cast<std::size_t>(w.config.n_vocab);
  auto prompt = Prompt(20);
  auto window = Prompt(6, 5);
  EngineConfig c = BaseConfig("tiny");
  auto a = MakeEngine(c, w);
  auto b = MakeEngine(c, w);
  ASSERT_TRUE(a->Prefill(prompt).ok());
  ASSERT_TRUE(b->Prefill(prompt).ok());
  std::vector<float> la(6 * v), lb(2 * v);
  ASSERT_TRUE(a->Verify(window, la.data()).ok());
  // After verify: K/V hold speculative rows, GDN checkpoint unchanged.
  StageSession& last = a->stage(a->n_stages() - 1);
  const int attn = w.config.n_layers - 1;
  ASSERT_NE(last.kv(attn), nullptr);
  EXPECT_EQ(last.kv(attn)->rows_committed(), 20);
  EXPECT_EQ(last.kv(attn)->rows_spec(), 6);
  EXPECT_EQ(a->stage(0).gdn(0)->position(), 20);
  EXPECT_FALSE(a->Verify(window, la.data()).ok()) << "a second verify before commit is refused";
  ASSERT_TRUE(a->Commit(2).ok());
  EXPECT_EQ(last.kv(attn)->rows_committed(), 22);
  EXPECT_EQ(last.kv(attn)->rows_spec(), 0);
  EXPECT_EQ(a->stage(0).gdn(0)->position(), 22);
  ASSERT_TRUE(b->Verify(std::span<const std::int32_t>(window.data(), 2), lb.data()).ok());
  ASSERT_TRUE(b->Commit(2).ok());
  // Both continue identically.
  std::vector<float> na(v), nb(v);
  std::int32_t next = 17;
  ASSERT_TRUE(a->Verify(std::span<const std::int32_t>(&next, 1), na.data()).ok());
  ASSERT_TRUE(b->Verify(std::span<const std::int32_t>(&next, 1), nb.data()).ok());
  EXPECT_TRUE(BitwiseEqual(na, nb));
  EXPECT_FALSE(a->Commit(2).ok()) << "cannot keep more rows than the window had";
}

// ---- the synthetic model behaves like a model ----
TEST(SyntheticModel, LogitScaleAndVariedGreedyOutput) {
  for (const char* preset : {"tiny", "small"}) {
    EngineConfig c = BaseConfig(preset);
    c.max_new = 48;
    RunOut r =
        Generate(c, EncodeBytes("The quick brown fox jumps over the lazy dog. 0123456789"), preset);
    double sum = 0, sq = 0;
    for (float x : r.logits) sum += x, sq += static_cast<double>(x) * x;
    const double n = static_cast<double>(r.logits.size());
    const double sd = std::sqrt(sq / n - (sum / n) * (sum / n));
    EXPECT_GT(sd, 0.5) << preset;
    EXPECT_LT(sd, 2.0) << preset;
    std::set<std::int32_t> distinct(r.tokens.begin(), r.tokens.end());
    EXPECT_GE(distinct.size(), r.tokens.size() / 3)
        << preset << ": greedy output is too repetitive";
  }
}

TEST(SyntheticModel, GdnDecaysSpreadFastToSlow) {
  const ModelWeights& w = Model("tiny");
  float lo = 1.0f, hi = 0.0f;
  for (const auto& l : w.layers) {
    if (l.type != LayerType::kLinearAttention) continue;
    for (int j = 0; j < w.config.n_v_heads; ++j) {
      // decay at a = 0: alpha = exp(-exp(A_log) * softplus(dt_bias))
      const float alpha =
          std::exp(-std::exp(l.gdn.a_log[j]) * std::log1p(std::exp(l.gdn.dt_bias[j])));
      lo = std::min(lo, alpha);
      hi = std::max(hi, alpha);
    }
  }
  EXPECT_LT(lo, 0.7f) << "no fast-decaying head";
  EXPECT_GT(hi, 0.99f) << "no slow-decaying head";
}

// Every layer moves the residual stream visibly: ||x_{l+1} - x_l|| / ||x_l|| per layer.
TEST(SyntheticModel, EveryLayerChangesTheResidualStream) {
  const ModelWeights& w = Model("tiny");
  EngineConfig c = BaseConfig("tiny");
  c.stages = w.config.n_layers;  // one layer per stage: read the stream between layers
  auto e = MakeEngine(c, w);
  auto prompt = Prompt(16);
  Activation act;
  act.p = 0;
  act.T = 16;
  std::vector<float> prev;
  for (int is = 0; is < e->n_stages(); ++is) {
    if (is == 0) {
      ASSERT_TRUE(e->stage(0).Forward(ForwardMode::kVerify, prompt.data(), act).ok());
      // compare against the embeddings
      prev.clear();
      for (auto t : prompt)
        prev.insert(prev.end(), w.embed.row(t), w.embed.row(t) + w.config.n_embd);
    } else {
      ASSERT_TRUE(e->stage(is).Forward(ForwardMode::kVerify, prompt.data(), act).ok());
    }
    const double rel = Nrmse(prev, act.hidden);
    EXPECT_GT(rel, 0.05) << "layer " << is << " barely changes the stream";
    EXPECT_LT(rel, 3.0) << "layer " << is << " swamps the stream";
    prev = act.hidden;
  }
}

// The MTP head's draft (argmax of its logits from (h_p, t_{p+1})) agrees with the main model's
// greedy t_{p+2} a real fraction of the time, so speculative accept paths get exercised.
TEST(SyntheticModel, MtpAgreesWithMainModel) {
  const ModelWeights& w = Model("tiny");
  ASSERT_TRUE(w.mtp.present);
  const int H = w.config.n_embd, V = w.config.n_vocab;
  EngineConfig c = BaseConfig("tiny");
  auto e = MakeEngine(c, w);
  std::vector<std::int32_t> seq =
      EncodeBytes("Speculative decoding needs a drafter that is often right.");
  const int n_prompt = static_cast<int>(seq.size());
  std::vector<float> normed, logits(static_cast<std::size_t>(V)), h(static_cast<std::size_t>(H));
  // Feed the prompt and then the greedy output one token at a time, keeping the normed hidden.
  for (int p = 0; p < n_prompt + 64; ++p) {
    ASSERT_TRUE(e->Verify(std::span<const std::int32_t>(&seq[static_cast<std::size_t>(p)], 1),
                          logits.data(), h.data())
                    .ok());
    ASSERT_TRUE(e->Commit(1).ok());
    normed.insert(normed.end(), h.begin(), h.end());
    if (p + 1 >= n_prompt) seq.push_back(Argmax(logits.data(), V));
  }
  const int n = static_cast<int>(seq.size()) - 2;  // rows with a t_{p+2}
  StageSession& last = e->stage(e->n_stages() - 1);
  std::vector<float> m(static_cast<std::size_t>(n) * static_cast<std::size_t>(H)),
      ml(static_cast<std::size_t>(n) * static_cast<std::size_t>(V));
  last.MtpForward(normed.data(), seq.data() + 1, 0, n, ForwardMode::kVerify, m.data(), ml.data(),
                  n);
  int agree = 0, total = 0;
  for (int p = n_prompt - 1; p < n; ++p) {  // drafts of generated tokens only
    ++total;
    agree += Argmax(ml.data() + static_cast<std::size_t>(p) * static_cast<std::size_t>(V), V) ==
             seq[static_cast<std::size_t>(p) + 2];
  }
  const double rate = static_cast<double>(agree) / total;
  RecordProperty("mtp_agreement", std::to_string(rate));
  EXPECT_GE(rate, 0.30) << agree << " of " << total;
}

}  // namespace
}  // namespace lockstep
