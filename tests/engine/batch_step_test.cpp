// Fused engine steps (cpu_stage.h ForwardStep): a step over several slots runs the verify rows of
// every sequence through shared batch-invariant products and each prefill chunk through its own,
// so every sequence's logits, normed hidden, K/V rows, GDN checkpoint and per-step states, MTP
// draft K/V, captured hand-offs and expert counters are bitwise what it gets alone. With
// fuse_all (batch_invariant = off) every product of the step is one GEMM over all rows, and the
// verify rows visibly differ from alone.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/engine/engine.h"
#include "test_util.h"

namespace lockstep {
namespace {

using Bytes = std::vector<std::uint8_t>;
using Items = std::map<std::string, Bytes>;  // item name -> raw bytes

inline std::size_t Z(int x) { return static_cast<std::size_t>(x); }

void Put(Items& it, const std::string& name, const void* p, std::size_t n) {
  Bytes& b = it[name];
  const auto* c = static_cast<const std::uint8_t*>(p);
  b.insert(b.end(), c, c + n);
}
template <typename T>
void PutVec(Items& it, const std::string& name, const std::vector<T>& v) {
  Put(it, name, v.data(), v.size() * sizeof(T));
}

struct Rig {
  std::string preset = "tiny";
  int stages = 4;
  DType kv = DType::kF32;
};

EngineConfig Config(const Rig& s, int slots) {
  EngineConfig c;
  c.model = test::ModelDir(s.preset);
  c.threads = 2;
  c.stages = s.stages;
  c.kv_dtype = s.kv;
  c.slots = slots;
  c.prefill_chunk = 16;
  c.pcie_frac = 0.5;  // half the experts miss, so fetched bytes count
  return c;
}

// One request of the step: `prefix` is prefilled before it; then `rows` run in the step, as a
// verify window (verify) or as one prefill chunk on the grid.
struct Req {
  int slot;
  bool verify;
  std::vector<std::int32_t> prefix;
  std::vector<std::int32_t> rows;
};

// MTP over rows at p.. from their normed hidden; next token of row t is tokens[t + 1] (the last
// row takes token 7). Draft K/V rows stay speculative for a verify, are committed for a prefill.
void Mtp(Engine& e, const float* normed, const std::vector<std::int32_t>& tokens, int p,
         ForwardMode mode, Items* seen) {
  if (!e.has_mtp()) return;
  const int T = static_cast<int>(tokens.size());
  const std::size_t H = Z(e.weights().config.n_embd), V = Z(e.weights().config.n_vocab);
  std::vector<std::int32_t> next(tokens.begin() + 1, tokens.end());
  next.push_back(7);
  std::vector<float> m(Z(T) * H), logits(V);
  e.MtpForward(normed, next.data(), p, T, mode, m.data(), logits.data(), 1);
  if (mode == ForwardMode::kPrefill) {
    e.MtpCommit(p + T);
  } else if (seen != nullptr) {
    PutVec(*seen, "mtp_m", m);
    PutVec(*seen, "mtp_logits", logits);
  }
}

void PrefillWithMtp(Engine& e, const std::vector<std::int32_t>& prompt) {
  ASSERT_TRUE(e.Prefill(prompt, [&](int p, int T, const float* normed) {
                 const std::vector<std::int32_t> toks(prompt.begin() + p, prompt.begin() + p + T);
                 Mtp(e, normed, toks, p, ForwardMode::kPrefill, nullptr);
                 return Status::Ok();
               }).ok());
}

// The current slot's state in every stage: K/V rows written (raw bytes and scales), GDN
// checkpoints and per-step states, expert counters, MTP draft K/V rows, captured hand-offs.
void ReadState(Engine& e, bool verify, Items& it) {
  const int n_layers = e.weights().config.n_layers;
  for (int is = 0; is < e.n_stages(); ++is) {
    StageSession& st = e.stage(is);
    for (int il = 0; il < n_layers; ++il) {
      const std::string l = "layer" + std::to_string(il);
      if (KvCache* kv = st.kv(il)) {
        for (int r = 0; r < kv->rows_written(); ++r) {
          Put(it, l + "/k", kv->KRaw(r), kv->row_bytes());
          Put(it, l + "/v", kv->VRaw(r), kv->row_bytes());
          if (kv->KScales(r) != nullptr) {
            Put(it, l + "/k_scale", kv->KScales(r), Z(kv->n_heads_kv()) * sizeof(float));
            Put(it, l + "/v_scale", kv->VScales(r), Z(kv->n_heads_kv()) * sizeof(float));
          }
        }
        const int rows[2] = {kv->rows_committed(), kv->rows_written()};
        Put(it, l + "/rows", rows, sizeof(rows));
      }
      if (GdnState* g = st.gdn(il)) {
        Put(it, l + "/conv", g->conv(), g->conv_size() * sizeof(float));
        Put(it, l + "/ssm", g->ssm(), g->ssm_size() * sizeof(float));
        const int pos[2] = {g->position(), verify ? g->n_steps() : 0};
        Put(it, l + "/gdn_pos", pos, sizeof(pos));
        for (int t = 0; verify && t < g->n_steps(); ++t) {
          Put(it, l + "/step_conv", g->step_conv(t), g->conv_size() * sizeof(float));
          Put(it, l + "/step_ssm", g->step_ssm(t), g->ssm_size() * sizeof(float));
        }
      }
    }
    const ExpertCounters& ec = st.experts().counters();
    if (st.experts().n_layers() > 0) {
      EXPECT_GT(ec.bytes_fetched, 0u) << "no expert missed";
    }
    Put(it, "stage" + std::to_string(is) + "/experts", &ec, sizeof(ec));
    if (verify && is + 1 < e.n_stages()) PutVec(it, "hidden_out", e.hidden_out(is));
  }
  if (KvCache* mk = e.stage(e.n_stages() - 1).mtp_kv())
    for (int r = 0; r < mk->rows_written(); ++r) {
      Put(it, "mtp/k", mk->KRaw(r), mk->row_bytes());
      Put(it, "mtp/v", mk->VRaw(r), mk->row_bytes());
    }
}

// Everything one request produces: its step outputs, its state before the window is committed
// and (verify) the GDN checkpoints after committing all its rows.
Items Alone(const Rig& s, const Req& r) {
  auto made = Engine::Create(Config(s, 1), test::Model(s.preset));
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  Engine& e = **made;
  const std::size_t H = Z(e.weights().config.n_embd), V = Z(e.weights().config.n_vocab);
  Items it;
  PrefillWithMtp(e, r.prefix);
  const int p = e.position();
  if (r.verify) {
    e.SetCaptureHidden(true);
    std::vector<float> logits(r.rows.size() * V), normed(r.rows.size() * H);
    EXPECT_TRUE(e.Verify(r.rows, logits.data(), normed.data()).ok());
    PutVec(it, "logits", logits);
    PutVec(it, "normed", normed);
    Mtp(e, normed.data(), r.rows, p, ForwardMode::kVerify, &it);
  } else {
    EXPECT_TRUE(e.Prefill(r.rows, [&](int pp, int T, const float* normed) {
                   Put(it, "normed", normed, Z(T) * H * sizeof(float));
                   const std::vector<std::int32_t> toks(r.rows.begin() + (pp - p),
                                                        r.rows.begin() + (pp - p) + T);
                   Mtp(e, normed, toks, pp, ForwardMode::kPrefill, nullptr);
                   return Status::Ok();
                 }).ok());
  }
  ReadState(e, r.verify, it);
  if (r.verify) {
    EXPECT_TRUE(e.Commit(static_cast<int>(r.rows.size())).ok());
    Items after;
    ReadState(e, false, after);
    for (auto& [k, v] : after) it["committed/" + k] = v;
  }
  return it;
}

// Slots 1, 2, 3 verify windows of T = 1, 5, 9 after prompts of 40, 23 and 57 tokens; slot 4
// prefills its second chunk [16, 32).
std::vector<Req> Requests() {
  return {Req{1, true, test::Tokens(40, 11), test::Tokens(1, 12)},
          Req{2, true, test::Tokens(23, 13), test::Tokens(5, 14)},
          Req{3, true, test::Tokens(57, 15), test::Tokens(9, 16)},
          Req{4, false, test::Tokens(16, 17), test::Tokens(16, 18)}};
}

// The requests prefilled one by one on one engine, then one step over all of them: each
// request's items, as Alone() names them.
std::vector<Items> Together(const Rig& s, const std::vector<Req>& reqs, bool fuse_all) {
  auto made = Engine::Create(Config(s, 5), test::Model(s.preset));
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  Engine& e = **made;
  const std::size_t H = Z(e.weights().config.n_embd), V = Z(e.weights().config.n_vocab);
  StepPlan plan;
  plan.fuse_all = fuse_all;
  std::vector<std::int32_t> toks;
  for (const Req& r : reqs) {
    EXPECT_TRUE(e.OpenSlot(r.slot).ok());
    e.UseSlot(r.slot);
    e.SetCaptureHidden(r.verify);
    PrefillWithMtp(e, r.prefix);
    plan.groups.push_back(RowGroup{r.slot, r.verify ? ForwardMode::kVerify : ForwardMode::kPrefill,
                                   e.position(), static_cast<int>(toks.size()),
                                   static_cast<int>(r.rows.size())});
    toks.insert(toks.end(), r.rows.begin(), r.rows.end());
  }
  e.UseSlot(0);
  Engine::StepOutputs out;
  EXPECT_TRUE(e.RunStep(plan, toks, &out).ok());
  std::vector<Items> seen;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const Req& r = reqs[i];
    const RowGroup& g = plan.groups[i];
    Items it;
    e.UseSlot(r.slot);
    const float* normed = out.normed.data() + Z(g.row0) * H;
    if (r.verify) Put(it, "logits", out.logits.data() + Z(g.row0) * V, Z(g.T) * V * sizeof(float));
    Put(it, "normed", normed, Z(g.T) * H * sizeof(float));
    Mtp(e, normed, r.rows, g.p, g.mode, r.verify ? &it : nullptr);
    ReadState(e, r.verify, it);
    if (r.verify) {
      EXPECT_TRUE(e.Commit(g.T).ok());
      Items after;
      ReadState(e, false, after);
      for (auto& [k, v] : after) it["committed/" + k] = v;
    }
    seen.push_back(std::move(it));
  }
  return seen;
}

// Item names whose bytes differ between a and b (and items only one side has).
std::vector<std::string> Differences(const Items& a, const Items& b) {
  std::vector<std::string> diff;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || it->second != v) diff.push_back(k);
  }
  for (const auto& [k, v] : b)
    if (a.find(k) == a.end()) diff.push_back(k + " (only together)");
  return diff;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void ExpectEachAsAlone(const Rig& s) {
  const auto reqs = Requests();
  const auto together = Together(s, reqs, false);
  ASSERT_EQ(together.size(), reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const Items alone = Alone(s, reqs[i]);
    EXPECT_GT(alone.size(), 5u);
    EXPECT_TRUE(alone.count("logits") == (reqs[i].verify ? 1u : 0u));
    const auto diff = Differences(alone, together[i]);
    EXPECT_TRUE(diff.empty()) << "slot " << reqs[i].slot << " differs from alone in " << Join(diff);
  }
}

class BatchStep : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(BatchStep, EveryRequestOfAFusedStepIsBitwiseAlone) {
  Rig s;
  s.stages = std::get<0>(GetParam());
  s.kv = std::get<1>(GetParam());
  ExpectEachAsAlone(s);
}

INSTANTIATE_TEST_SUITE_P(StagesAndKv, BatchStep,
                         ::testing::Combine(::testing::Values(3, 4),
                                            ::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kI8)));

TEST(BatchStepSmall, EveryRequestOfAFusedStepIsBitwiseAlone) {
  Rig s;
  s.preset = "small";
  ExpectEachAsAlone(s);
}

// The control: fuse_all runs the verify rows through GEMMs shared with the prefill chunk, so
// their logits differ from alone; a one-group step with fuse_all is exactly alone.
TEST(BatchStep, FuseAllDiffersFromAloneAndOneGroupDoesNot) {
  Rig s;
  const auto reqs = Requests();
  const auto together = Together(s, reqs, true);
  auto floats = [](const Bytes& b) {
    std::vector<float> f(b.size() / sizeof(float));
    std::memcpy(f.data(), b.data(), f.size() * sizeof(float));
    return f;
  };
  int differ = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const Items alone = Alone(s, reqs[i]);
    // Different rounding, same model: every group's output stays close to alone.
    EXPECT_LT(test::Nrmse(floats(alone.at("normed")), floats(together[i].at("normed"))), 1e-3)
        << "slot " << reqs[i].slot;
    if (reqs[i].verify) differ += alone.at("logits") != together[i].at("logits") ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "fuse_all verify logits are bitwise alone: the GEMM did not fuse";
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const std::vector<Req> one = {reqs[i]};
    const auto fused = Together(s, one, true);
    const auto diff = Differences(Alone(s, reqs[i]), fused[0]);
    EXPECT_TRUE(diff.empty()) << "one-group fuse_all step, slot " << reqs[i].slot << ": "
                              << Join(diff);
  }
}

// Engine::last_step_work (what the scheduler writes into StepRecord::weight_bytes / flops): a
// one-row verify step reads every dense product's matrix once and k routed experts, and costs 2
// flops per weight element per row; a two-row step costs exactly twice the flops (each row runs
// every dense product and k experts) and reads the dense matrices once.
TEST(BatchStep, StepWorkCountsTheProducts) {
  Rig s;
  s.preset = "small";
  const ModelWeights& w = test::Model(s.preset);
  const ModelConfig& c = w.config;
  std::uint64_t dense_bytes = w.lm_head.bytes(), dense_params = 0;
  auto add = [&](const Mat& m) {
    dense_bytes += m.bytes();
    dense_params += static_cast<std::uint64_t>(m.rows) * static_cast<std::uint64_t>(m.cols);
  };
  std::uint64_t expert_bytes = 0, expert_params = 0;
  for (const LayerWeights& l : w.layers) {
    if (l.type == LayerType::kFullAttention) {
      for (const Mat* m : {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj}) add(*m);
    } else {
      for (const Mat* m : {&l.gdn.in_proj_qkvz, &l.gdn.in_proj_ba, &l.gdn.out_proj}) add(*m);
    }
    ASSERT_TRUE(l.moe);
    for (const Mat* m :
         {&l.ffn_moe.router, &l.ffn_moe.shared.gate, &l.ffn_moe.shared.up, &l.ffn_moe.shared.down})
      add(*m);
    dense_bytes += Z(c.n_embd) * sizeof(float);  // the shared expert's gate vector
    dense_params += Z(c.n_embd);
    const FfnWeights& e0 = l.ffn_moe.experts[0];
    expert_bytes += e0.gate.bytes() + e0.up.bytes() + e0.down.bytes();
    expert_params += static_cast<std::uint64_t>(e0.gate.rows) * Z(e0.gate.cols) +
                     static_cast<std::uint64_t>(e0.up.rows) * Z(e0.up.cols) +
                     static_cast<std::uint64_t>(e0.down.rows) * Z(e0.down.cols);
  }
  const std::uint64_t lm_params = static_cast<std::uint64_t>(w.lm_head.rows) * Z(w.lm_head.cols);
  auto made = Engine::Create(Config(s, 2), w);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Engine& e = **made;
  for (int sl = 0; sl < 2; ++sl) {
    ASSERT_TRUE(e.OpenSlot(sl).ok());
    e.UseSlot(sl);
    ASSERT_TRUE(e.Prefill(std::vector<std::int32_t>{5, 9, 11 + sl}).ok());
  }
  Engine::StepOutputs out;
  auto step = [&](int n) {
    StepPlan plan;
    std::vector<std::int32_t> toks;
    for (int sl = 0; sl < n; ++sl) {
      e.UseSlot(sl);
      plan.groups.push_back(RowGroup{sl, ForwardMode::kVerify, e.position(), sl, 1});
      toks.push_back(20 + sl);
    }
    EXPECT_TRUE(e.RunStep(plan, toks, &out).ok());
    for (int sl = 0; sl < n; ++sl) {
      e.UseSlot(sl);
      EXPECT_TRUE(e.Commit(1).ok());
    }
    return e.last_step_work();
  };
  const StepWork one = step(1);
  EXPECT_EQ(one.weight_bytes,
            dense_bytes + static_cast<std::uint64_t>(c.n_experts_used) * expert_bytes);
  EXPECT_EQ(one.flops, 2 * (dense_params + lm_params +
                            static_cast<std::uint64_t>(c.n_experts_used) * expert_params));
  const StepWork two = step(2);
  EXPECT_EQ(two.flops, 2 * one.flops);
  EXPECT_GE(two.weight_bytes, one.weight_bytes);
  EXPECT_LE(two.weight_bytes,
            dense_bytes + 2 * static_cast<std::uint64_t>(c.n_experts_used) * expert_bytes);
}

}  // namespace
}  // namespace lockstep
