// Engine-level checks of the CUDA backend beyond tests/gpu/cuda_engine_test.cpp, run by the
// emulator binary (tests/cuda_emu, four emulated devices by default) and by cuda_tests on a real
// GPU (skipped without one): verify windows with
// partial commits for f32 / bf16 / int8 K/V, the MTP head (prefill and verify windows, its own
// K/V cache), the CPU-layout state mirrors of the cuda stages (GDN ssm / conv, per-step
// snapshots, K/V rows written and committed) and the expert-cache counters, all against the CPU
// backend on the same requests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>

#include "cuda/cuda_stage.h"
#include "gpu/cuda_engine_util.h"
#include "gpu/require_gpu.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine_cuda/register.h"
#include "test_util.h"

namespace lockstep {
namespace {
using test::Model;
using test::Nrmse;

std::vector<std::int32_t> Prompt(int n, std::uint64_t seed = 1) { return test::Tokens(n, seed); }
using test::MakeTiny;
using test::TinyConfig;
std::vector<float> FlatK(const KvCache& kv, int rows) {
  std::vector<float> out, tmp(static_cast<std::size_t>(kv.head_dim()));
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < kv.n_heads_kv(); ++h) {
      const float* k = kv.K(r, h, tmp.data());
      out.insert(out.end(), k, k + kv.head_dim());
      const float* v = kv.V(r, h, tmp.data());
      out.insert(out.end(), v, v + kv.head_dim());
    }
  return out;
}
void CompareStates(Engine& a, Engine& b, const std::string& where) {
  for (int is = 0; is < a.n_stages(); ++is) {
    StageSession& sa = a.stage(is);
    StageSession& sb = b.stage(is);
    EXPECT_EQ(sa.position(), sb.position()) << where;
    for (int il = sa.layer_begin(); il < sa.layer_end(); ++il) {
      if (GdnState* ga = sa.gdn(il)) {
        GdnState* gb = sb.gdn(il);
        ASSERT_NE(gb, nullptr);
        EXPECT_EQ(ga->position(), gb->position()) << where << " gdn pos layer " << il;
        EXPECT_EQ(ga->n_steps(), gb->n_steps()) << where << " gdn n_steps layer " << il;
        std::vector<float> x(ga->ssm(), ga->ssm() + ga->ssm_size()),
            y(gb->ssm(), gb->ssm() + gb->ssm_size());
        EXPECT_LT(Nrmse(x, y), 1e-4) << where << " ssm layer " << il;
        std::vector<float> cx(ga->conv(), ga->conv() + ga->conv_size()),
            cy(gb->conv(), gb->conv() + gb->conv_size());
        EXPECT_LT(Nrmse(cx, cy), 1e-4) << where << " conv layer " << il;
        for (int t = 0; t < std::min(ga->n_steps(), gb->n_steps()); ++t) {
          std::vector<float> sx(ga->step_ssm(t), ga->step_ssm(t) + ga->ssm_size()),
              sy(gb->step_ssm(t), gb->step_ssm(t) + gb->ssm_size());
          EXPECT_LT(Nrmse(sx, sy), 1e-4) << where << " step ssm " << t << " layer " << il;
          std::vector<float> qx(ga->step_conv(t), ga->step_conv(t) + ga->conv_size()),
              qy(gb->step_conv(t), gb->step_conv(t) + gb->conv_size());
          EXPECT_LT(Nrmse(qx, qy), 1e-4) << where << " step conv " << t << " layer " << il;
        }
      }
      if (KvCache* ka = sa.kv(il)) {
        KvCache* kb = sb.kv(il);
        ASSERT_NE(kb, nullptr);
        EXPECT_EQ(ka->rows_committed(), kb->rows_committed()) << where << " layer " << il;
        EXPECT_EQ(ka->rows_written(), kb->rows_written()) << where << " layer " << il;
        const int rows = std::min(ka->rows_written(), kb->rows_written());
        EXPECT_LT(Nrmse(FlatK(*ka, rows), FlatK(*kb, rows)), 1e-3) << where << " kv layer " << il;
      }
    }
    const ExpertCounters& ca = sa.experts().counters();
    const ExpertCounters& cb = sb.experts().counters();
    EXPECT_EQ(ca.hits, cb.hits) << where << " stage " << is;
    EXPECT_EQ(ca.misses, cb.misses) << where << " stage " << is;
  }
}

void PartialCommits(DType kv) {
  LOCKSTEP_REQUIRE_GPU(1);
  auto cpu = MakeTiny(TinyConfig("cpu", kv));
  auto gpu = MakeTiny(TinyConfig("cuda", kv));
  ASSERT_TRUE(cpu && gpu);
  const auto prompt = Prompt(37);
  ASSERT_TRUE(cpu->Prefill(prompt).ok());
  ASSERT_TRUE(gpu->Prefill(prompt).ok());
  CompareStates(*cpu, *gpu, "after prefill");
  const std::size_t V = static_cast<std::size_t>(cpu->weights().config.n_vocab);
  const std::size_t H = static_cast<std::size_t>(cpu->weights().config.n_embd);
  auto toks = Prompt(64, 99);
  const std::vector<int> sizes = {4, 9, 3, 5, 1, 7}, commits = {2, 5, 3, 1, 1, 7};
  std::size_t next = 0;
  for (std::size_t w = 0; w < sizes.size(); ++w) {
    const int T = sizes[w];
    std::vector<float> la(T * V), lb(T * V), na(T * H), nb(T * H);
    std::span<const std::int32_t> tk(toks.data() + next, static_cast<std::size_t>(T));
    Status s1 = cpu->Verify(tk, la.data(), na.data());
    Status s2 = gpu->Verify(tk, lb.data(), nb.data());
    ASSERT_TRUE(s1.ok() && s2.ok()) << s1.ToString() << s2.ToString();
    EXPECT_LT(Nrmse(la, lb), 1e-4) << "window " << w;
    EXPECT_LT(Nrmse(na, nb), 1e-4) << "normed window " << w;
    CompareStates(*cpu, *gpu, "window " + std::to_string(w) + " before commit");
    ASSERT_TRUE(cpu->Commit(commits[w]).ok());
    ASSERT_TRUE(gpu->Commit(commits[w]).ok());
    CompareStates(*cpu, *gpu, "window " + std::to_string(w) + " after commit");
    next += static_cast<std::size_t>(commits[w]);
  }
}

TEST(CudaEngineExtra, PartialCommitsMatchCpuF32) { PartialCommits(DType::kF32); }
TEST(CudaEngineExtra, PartialCommitsMatchCpuBf16) { PartialCommits(DType::kBF16); }
TEST(CudaEngineExtra, PartialCommitsMatchCpuI8) { PartialCommits(DType::kI8); }

TEST(CudaEngineExtra, MtpMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU(1);
  auto cpu = MakeTiny(TinyConfig("cpu"));
  auto gpu = MakeTiny(TinyConfig("cuda"));
  ASSERT_TRUE(cpu && gpu);
  ASSERT_TRUE(cpu->has_mtp());
  ASSERT_TRUE(gpu->has_mtp());
  const std::size_t V = static_cast<std::size_t>(cpu->weights().config.n_vocab);
  const std::size_t H = static_cast<std::size_t>(cpu->weights().config.n_embd);
  const auto prompt = Prompt(20);
  std::vector<float> ha, hb;
  auto hook = [](std::vector<float>* out) {
    return [out](int, int T, const float* normed) {
      out->insert(out->end(), normed, normed + static_cast<std::size_t>(T) * 64);
      return Status::Ok();
    };
  };
  ASSERT_EQ(H, 64u);
  ASSERT_TRUE(cpu->Prefill(prompt, hook(&ha)).ok());
  ASSERT_TRUE(gpu->Prefill(prompt, hook(&hb)).ok());
  ASSERT_EQ(ha.size(), 20 * H);
  EXPECT_LT(Nrmse(ha, hb), 1e-4) << "prefill normed";
  // MTP prefill over the prompt: next tokens are prompt[1..] plus one.
  std::vector<std::int32_t> nxt(prompt.begin() + 1, prompt.end());
  nxt.push_back(7);
  const int T = 20;
  std::vector<float> ma(T * H), mb(T * H), la(2 * V), lb(2 * V);
  cpu->MtpForward(ha.data(), nxt.data(), 0, T, ForwardMode::kPrefill, ma.data(), la.data(), 2);
  gpu->MtpForward(hb.data(), nxt.data(), 0, T, ForwardMode::kPrefill, mb.data(), lb.data(), 2);
  ASSERT_TRUE(gpu->stage(3).status().ok()) << gpu->stage(3).status().ToString();
  EXPECT_LT(Nrmse(ma, mb), 1e-4);
  EXPECT_LT(Nrmse(la, lb), 1e-4);
  cpu->MtpCommit(T);
  gpu->MtpCommit(T);
  // A verify-mode MTP window of 3 rows at p = 20.
  std::vector<float> h3(ha.end() - 3 * static_cast<long>(H), ha.end());
  std::vector<std::int32_t> n3 = {5, 9, 11};
  std::vector<float> m3a(3 * H), m3b(3 * H), l3a(3 * V), l3b(3 * V);
  cpu->MtpForward(h3.data(), n3.data(), T, 3, ForwardMode::kVerify, m3a.data(), l3a.data(), 3);
  gpu->MtpForward(h3.data(), n3.data(), T, 3, ForwardMode::kVerify, m3b.data(), l3b.data(), 3);
  ASSERT_TRUE(gpu->stage(3).status().ok()) << gpu->stage(3).status().ToString();
  EXPECT_LT(Nrmse(m3a, m3b), 1e-4);
  EXPECT_LT(Nrmse(l3a, l3b), 1e-4);
  KvCache* ka = cpu->stage(3).mtp_kv();
  KvCache* kb = gpu->stage(3).mtp_kv();
  ASSERT_TRUE(ka && kb);
  EXPECT_EQ(ka->rows_committed(), kb->rows_committed());
  EXPECT_EQ(ka->rows_written(), kb->rows_written());
  const int rows = std::min(ka->rows_written(), kb->rows_written());
  EXPECT_LT(Nrmse(FlatK(*ka, rows), FlatK(*kb, rows)), 1e-4);
  cpu->MtpCommit(T + 1);
  gpu->MtpCommit(T + 1);
  EXPECT_EQ(cpu->mtp_position(), gpu->mtp_position());
}

// Lossless bf16 device weights: a model whose matrices are bf16 values keeps them as bf16 on the
// device (half the bytes a decode step reads) and must give bitwise what the same stages give
// with f32 matrices (LOCKSTEP_CUDA_F32_WEIGHTS=1): prefill (cuBLAS over the widened matrices),
// verify windows and lm_head (RowsMatmul over bf16), routed experts, the MTP head, every state.
TEST(CudaEngineExtra, Bf16DeviceWeightsAreBitwiseTheF32Path) {
  LOCKSTEP_REQUIRE_GPU(1);
  EngineConfig c = TinyConfig("cuda");
  c.model = test::ModelDir("tiny-bf16");
  c.pcie_frac = 0.5;  // half the experts stay in host memory: the miss bytes are counted
  const ModelWeights& w = Model("tiny-bf16");
  ::setenv("LOCKSTEP_CUDA_F32_WEIGHTS", "1", 1);
  auto f32 = Engine::Create(c, w);
  ::unsetenv("LOCKSTEP_CUDA_F32_WEIGHTS");
  auto b16 = Engine::Create(c, w);
  EngineConfig cc = c;
  cc.backend = "cpu";
  auto cpu = Engine::Create(cc, w);
  ASSERT_TRUE(f32.ok() && b16.ok() && cpu.ok());
  for (int is = 0; is < (*b16)->n_stages(); ++is) {
    EXPECT_TRUE(dynamic_cast<cuda::CudaStageSession&>((*b16)->stage(is)).weights_bf16())
        << "stage " << is;
    EXPECT_FALSE(dynamic_cast<cuda::CudaStageSession&>((*f32)->stage(is)).weights_bf16())
        << "stage " << is;
  }
  // The f32 "tiny" has matrices that are not bf16 values: it keeps f32 matrices.
  auto tiny = MakeTiny(TinyConfig("cuda"));
  ASSERT_TRUE(tiny);
  EXPECT_FALSE(dynamic_cast<cuda::CudaStageSession&>(tiny->stage(0)).weights_bf16());

  const std::size_t V = static_cast<std::size_t>(w.config.n_vocab),
                    H = static_cast<std::size_t>(w.config.n_embd);
  const auto prompt = Prompt(37);
  std::vector<float> ha, hb, hc;
  auto hook = [H](std::vector<float>* out) {
    return [out, H](int, int T, const float* normed) {
      out->insert(out->end(), normed, normed + static_cast<std::size_t>(T) * H);
      return Status::Ok();
    };
  };
  ASSERT_TRUE((*f32)->Prefill(prompt, hook(&ha)).ok());
  ASSERT_TRUE((*b16)->Prefill(prompt, hook(&hb)).ok());
  ASSERT_TRUE((*cpu)->Prefill(prompt, hook(&hc)).ok());
  EXPECT_TRUE(test::BitwiseEqual(ha, hb)) << "prefill (cuBLAS over widened bf16 matrices)";
  EXPECT_LT(Nrmse(hc, hb), 1e-4) << "prefill vs cpu";
  auto states_equal = [](Engine& a, Engine& b, const std::string& where) {
    for (int is = 0; is < a.n_stages(); ++is)
      for (int il = a.stage(is).layer_begin(); il < a.stage(is).layer_end(); ++il) {
        if (GdnState* ga = a.stage(is).gdn(il)) {
          GdnState* gb = b.stage(is).gdn(il);
          EXPECT_EQ(std::memcmp(ga->ssm(), gb->ssm(), ga->ssm_size() * 4), 0)
              << where << " ssm layer " << il;
          EXPECT_EQ(std::memcmp(ga->conv(), gb->conv(), ga->conv_size() * 4), 0)
              << where << " conv layer " << il;
        }
        if (KvCache* ka = a.stage(is).kv(il)) {
          KvCache* kb = b.stage(is).kv(il);
          EXPECT_TRUE(
              test::BitwiseEqual(FlatK(*ka, ka->rows_written()), FlatK(*kb, kb->rows_written())))
              << where << " kv layer " << il;
        }
      }
  };
  states_equal(**f32, **b16, "after prefill");
  auto toks = Prompt(64, 99);
  const std::vector<int> sizes = {4, 9, 1}, commits = {2, 9, 1};
  std::size_t next = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const int T = sizes[i];
    std::vector<float> la(T * V), lb(T * V), lc(T * V);
    std::span<const std::int32_t> tk(toks.data() + next, static_cast<std::size_t>(T));
    ASSERT_TRUE((*f32)->Verify(tk, la.data()).ok());
    ASSERT_TRUE((*b16)->Verify(tk, lb.data()).ok());
    ASSERT_TRUE((*cpu)->Verify(tk, lc.data()).ok());
    EXPECT_TRUE(test::BitwiseEqual(la, lb)) << "verify window " << i << " (T = " << T << ")";
    EXPECT_LT(Nrmse(lc, lb), 1e-4) << "verify window " << i << " vs cpu";
    states_equal(**f32, **b16, "window " + std::to_string(i));
    ASSERT_TRUE((*f32)->Commit(commits[i]).ok() && (*b16)->Commit(commits[i]).ok() &&
                (*cpu)->Commit(commits[i]).ok());
    next += static_cast<std::size_t>(commits[i]);
  }
  // The MTP head (its fc and MoE layer): prefill-mode rows over the prompt's hidden states.
  ASSERT_TRUE((*b16)->has_mtp());
  std::vector<std::int32_t> nxt(prompt.begin() + 1, prompt.end());
  nxt.push_back(7);
  const int T = static_cast<int>(prompt.size());
  std::vector<float> ma(T * H), mb(T * H), la(2 * V), lb(2 * V);
  (*f32)->MtpForward(ha.data(), nxt.data(), 0, T, ForwardMode::kPrefill, ma.data(), la.data(), 2);
  (*b16)->MtpForward(hb.data(), nxt.data(), 0, T, ForwardMode::kPrefill, mb.data(), lb.data(), 2);
  ASSERT_TRUE((*b16)->stage(3).status().ok()) << (*b16)->stage(3).status().ToString();
  EXPECT_TRUE(test::BitwiseEqual(ma, mb)) << "mtp hidden";
  EXPECT_TRUE(test::BitwiseEqual(la, lb)) << "mtp logits";
  // The same hits and misses as the cpu; a miss reads half the bytes over PCIe as bf16.
  std::uint64_t fetched_b16 = 0;
  for (int is = 0; is < (*b16)->n_stages(); ++is) {
    const ExpertCounters& a = (*f32)->stage(is).experts().counters();
    const ExpertCounters& b = (*b16)->stage(is).experts().counters();
    const ExpertCounters& r = (*cpu)->stage(is).experts().counters();
    EXPECT_EQ(b.hits, r.hits) << "stage " << is;
    EXPECT_EQ(b.misses, r.misses) << "stage " << is;
    EXPECT_EQ(a.bytes_fetched, r.bytes_fetched) << "stage " << is;
    EXPECT_EQ(2 * b.bytes_fetched, a.bytes_fetched) << "stage " << is;
    fetched_b16 += b.bytes_fetched;
  }
  EXPECT_GT(fetched_b16, 0u);
}

// CUDA graphs (EngineConfig::cuda_graphs): verify windows replayed from a captured graph give
// bitwise the logits, normed rows, states and expert counters of launching every kernel from the
// host, through repeated and changing window sizes, partial commits and a K/V cache that grows
// (256 -> 512 rows) mid-run, which must re-capture rather than replay a graph into freed memory.
TEST(CudaEngineExtra, GraphsReplayBitwiseTheEagerPath) {
  LOCKSTEP_REQUIRE_GPU(1);
  EngineConfig c = TinyConfig("cuda", DType::kI8);
  c.prefill_chunk = 64;
  // Attention split every 64 positions, so the captured windows run the split-context path (its
  // partials scratch, grouped heads and the combine; 4 splits per row at 256 cache rows, 8 after
  // the growth to 512). MtpGraphsReplayBitwiseTheEagerMtp keeps the default (no split below 512).
  c.cuda_attn_split = 64;
  c.max_new = 0;  // no decode headroom reserved in prefill: the caches grow during the windows
  std::unique_ptr<Engine> g, e;
  test::MakeGraphedAndEager(c, &g, &e);
  ASSERT_TRUE(g && e);
  const std::size_t V = static_cast<std::size_t>(g->weights().config.n_vocab);
  const std::size_t H = static_cast<std::size_t>(g->weights().config.n_embd);
  const auto prompt = Prompt(230);
  ASSERT_TRUE(g->Prefill(prompt).ok());
  ASSERT_TRUE(e->Prefill(prompt).ok());
  auto counters = [](Engine& en, int is) { return en.stage(is).init_counters(); };
  for (int is = 0; is < g->n_stages(); ++is) {
    EXPECT_EQ(counters(*g, is).graph_captures, 0) << "prefill is never captured";
    EXPECT_EQ(counters(*e, is).graph_launches, 0);
  }
  auto states_equal = [](Engine& a, Engine& b, const std::string& where) {
    for (int is = 0; is < a.n_stages(); ++is) {
      EXPECT_EQ(a.stage(is).position(), b.stage(is).position()) << where;
      for (int il = a.stage(is).layer_begin(); il < a.stage(is).layer_end(); ++il) {
        if (GdnState* ga = a.stage(is).gdn(il)) {
          GdnState* gb = b.stage(is).gdn(il);
          ASSERT_EQ(ga->n_steps(), gb->n_steps()) << where << " layer " << il;
          EXPECT_EQ(std::memcmp(ga->ssm(), gb->ssm(), ga->ssm_size() * 4), 0)
              << where << " ssm layer " << il;
          EXPECT_EQ(std::memcmp(ga->conv(), gb->conv(), ga->conv_size() * 4), 0)
              << where << " conv layer " << il;
          for (int t = 0; t < ga->n_steps(); ++t)
            EXPECT_EQ(std::memcmp(ga->step_ssm(t), gb->step_ssm(t), ga->ssm_size() * 4), 0)
                << where << " step " << t << " layer " << il;
        }
        if (KvCache* ka = a.stage(is).kv(il)) {
          KvCache* kb = b.stage(is).kv(il);
          ASSERT_EQ(ka->rows_written(), kb->rows_written()) << where << " layer " << il;
          EXPECT_EQ(ka->rows_committed(), kb->rows_committed()) << where << " layer " << il;
          EXPECT_TRUE(
              test::BitwiseEqual(FlatK(*ka, ka->rows_written()), FlatK(*kb, kb->rows_written())))
              << where << " kv layer " << il;
        }
      }
      EXPECT_EQ(a.stage(is).experts().counters().hits, b.stage(is).experts().counters().hits)
          << where;
      EXPECT_EQ(a.stage(is).experts().counters().misses, b.stage(is).experts().counters().misses)
          << where;
    }
  };
  auto toks = Prompt(128, 5);
  std::size_t next = 0;
  auto window = [&](int T, int commit, const std::string& where) {
    std::vector<float> la(T * V), lb(T * V), na(T * H), nb(T * H);
    std::span<const std::int32_t> tk(toks.data() + next, static_cast<std::size_t>(T));
    ASSERT_TRUE(g->Verify(tk, la.data(), na.data()).ok()) << where;
    ASSERT_TRUE(e->Verify(tk, lb.data(), nb.data()).ok()) << where;
    EXPECT_TRUE(test::BitwiseEqual(la, lb)) << where << " logits";
    EXPECT_TRUE(test::BitwiseEqual(na, nb)) << where << " normed";
    states_equal(*g, *e, where + " before commit");
    ASSERT_TRUE(g->Commit(commit).ok() && e->Commit(commit).ok()) << where;
    states_equal(*g, *e, where + " after commit");
    next += static_cast<std::size_t>(commit);
  };
  // T = 1 four times: eager (the first verify window allocates the GDN per-step scratch), eager
  // again with nothing to grow (the size is now known to fit), captured, replayed.
  // The window records say which (StageTiming::graph, the "graph" key of each device stage).
  const GraphUse expect[] = {GraphUse::kEager, GraphUse::kEager, GraphUse::kCapture,
                             GraphUse::kReplay};
  for (int i = 0; i < 4; ++i) {
    window(1, 1, "decode " + std::to_string(i));
    for (int is = 0; is < g->n_stages(); ++is) {
      EXPECT_EQ(g->stage_timings()[static_cast<std::size_t>(is)].graph, expect[i])
          << "decode " << i << " stage " << is;
      EXPECT_EQ(e->stage_timings()[static_cast<std::size_t>(is)].graph, GraphUse::kEager)
          << "decode " << i;
    }
  }
  for (int is = 0; is < g->n_stages(); ++is) {
    EXPECT_EQ(counters(*g, is).graph_captures, 1) << "stage " << is;
    EXPECT_EQ(counters(*g, is).graph_launches, 2) << "stage " << is;
    EXPECT_EQ(counters(*e, is).graph_captures, 0) << "stage " << is;
    EXPECT_EQ(counters(*e, is).graph_launches, 0) << "stage " << is;
  }
  // Window sizes change and repeat, with partial commits (positions 234 .. 264: the K/V caches
  // grow from 256 to 512 rows on the way, so the graphs of the old layout must not be replayed).
  const std::vector<int> sizes = {4, 4, 4, 9, 9, 1, 9, 9, 1, 1, 1, 4},
                         commits = {2, 4, 1, 9, 3, 1, 2, 2, 1, 1, 1, 4};
  for (std::size_t w = 0; w < sizes.size(); ++w)
    window(sizes[w], commits[w],
           "window " + std::to_string(w) + " (T = " + std::to_string(sizes[w]) + ")");
  ASSERT_EQ(g->stage(0).position(), 265);
  for (int is = 0; is < g->n_stages(); ++is) {
    bool attention = false;
    for (int il = g->stage(is).layer_begin(); il < g->stage(is).layer_end(); ++il)
      attention = attention || g->stage(is).kv(il) != nullptr;
    // Each size runs eagerly once per layout (that run may grow buffers), is captured on its next
    // window and replayed after. Stages with attention layers: the T = 9 window at p = 250 needs
    // 259 rows, runs eagerly and grows the caches; T = 1 (at 253), 9 (at 254) and 4 (at 261) then
    // run eagerly once more, and T = 9 (at 256) and 1 (at 258) are captured again. Captures
    // T=1: 2, T=4: 1, T=9: 1; launches T=1: 2+3, T=4: 2, T=9: 1. Stages of GDN layers only never
    // see a new layout: captures 1+1+1, launches T=1: 2+4, T=4: 3, T=9: 3.
    EXPECT_EQ(counters(*g, is).graph_captures, attention ? 4 : 3) << "stage " << is;
    EXPECT_EQ(counters(*g, is).graph_launches, attention ? 8 : 12) << "stage " << is;
    EXPECT_EQ(counters(*e, is).graph_launches, 0) << "stage " << is;
  }
}

// A K/V cache that grows in prefill reserves the request's decode (max_new plus a window): a
// 250-token prompt with max_new 16 never grows during its 9 decode steps (no reallocation, no
// second capture: every window after the capture replays), where max_new 0 grows at row 257 and
// captures again. The capacity changes no bit: both give the same logits.
TEST(CudaEngineExtra, PrefillReservesTheDecodeRowsOfTheKvCache) {
  LOCKSTEP_REQUIRE_GPU(1);
  EngineConfig c = TinyConfig("cuda");
  c.prefill_chunk = 256;
  c.max_new = 16;
  EngineConfig c0 = c;
  c0.max_new = 0;
  auto r = MakeTiny(c);
  auto g = MakeTiny(c0);
  ASSERT_TRUE(r && g);
  const std::size_t V = static_cast<std::size_t>(r->weights().config.n_vocab);
  const auto prompt = Prompt(250, 3);
  ASSERT_TRUE(r->Prefill(prompt).ok() && g->Prefill(prompt).ok());
  std::vector<float> lr(V), lg(V);
  for (int i = 0; i < 9; ++i) {  // positions 250 .. 258
    const std::int32_t tok = prompt[static_cast<std::size_t>(i)];
    ASSERT_TRUE(r->Verify(std::span<const std::int32_t>(&tok, 1), lr.data()).ok() &&
                r->Commit(1).ok());
    ASSERT_TRUE(g->Verify(std::span<const std::int32_t>(&tok, 1), lg.data()).ok() &&
                g->Commit(1).ok());
    EXPECT_TRUE(test::BitwiseEqual(lr, lg)) << "step " << i;
    if (i < 3) continue;  // eager, eager, capture
    for (int is = 0; is < r->n_stages(); ++is)
      EXPECT_EQ(r->stage_timings()[static_cast<std::size_t>(is)].graph, GraphUse::kReplay)
          << "step " << i;
  }
  for (int is = 0; is < r->n_stages(); ++is) {
    bool attention = false;
    for (int il = r->stage(is).layer_begin(); il < r->stage(is).layer_end(); ++il)
      attention = attention || r->stage(is).kv(il) != nullptr;
    EXPECT_EQ(r->stage(is).init_counters().graph_captures, 1) << "stage " << is;
    EXPECT_EQ(g->stage(is).init_counters().graph_captures, attention ? 2 : 1) << "stage " << is;
  }
}

// The MTP head's draft steps replay a graph per (T, logit rows) too: bitwise what launching each
// kernel gives (m rows, logits, the MTP K/V cache), with verify windows of the stages between
// them sharing the routing buffer and changing the stage's layout, the MTP K/V cache growing from
// 256 to 512 rows on the way, and the captures / launches counted on the last stage.
TEST(CudaEngineExtra, MtpGraphsReplayBitwiseTheEagerMtp) {
  LOCKSTEP_REQUIRE_GPU(1);
  EngineConfig c = TinyConfig("cuda");
  c.max_new = 0;  // no decode headroom reserved in prefill: the caches grow during the windows
  std::unique_ptr<Engine> g, e;
  test::MakeGraphedAndEager(c, &g, &e);
  ASSERT_TRUE(g && e);
  ASSERT_TRUE(g->has_mtp());
  const std::size_t V = static_cast<std::size_t>(g->weights().config.n_vocab);
  const std::size_t H = static_cast<std::size_t>(g->weights().config.n_embd);
  const int last = g->n_stages() - 1;
  const int n = 250;
  const auto prompt = Prompt(n);
  std::vector<float> hg, he;
  auto hook = [H](std::vector<float>* out) {
    return [out, H](int, int T, const float* normed) {
      out->insert(out->end(), normed, normed + static_cast<std::size_t>(T) * H);
      return Status::Ok();
    };
  };
  ASSERT_TRUE(g->Prefill(prompt, hook(&hg)).ok());
  ASSERT_TRUE(e->Prefill(prompt, hook(&he)).ok());
  ASSERT_TRUE(test::BitwiseEqual(hg, he));
  std::vector<std::int32_t> nxt(prompt.begin() + 1, prompt.end());
  nxt.push_back(7);
  std::vector<float> m(n * H), l(V);
  g->MtpForward(hg.data(), nxt.data(), 0, n, ForwardMode::kPrefill, m.data(), l.data(), 1);
  e->MtpForward(he.data(), nxt.data(), 0, n, ForwardMode::kPrefill, m.data(), l.data(), 1);
  g->MtpCommit(n);
  e->MtpCommit(n);
  const auto base = g->stage(last).init_counters();
  EXPECT_EQ(base.graph_captures, 0) << "MTP prefill is never captured";

  // One MTP call on both engines; everything it returns and the MTP cache must be equal bits.
  auto mtp = [&](const float* h, std::span<const std::int32_t> toks, int p, int n_logits,
                 const std::string& where, std::vector<float>* m_out) {
    const int T = static_cast<int>(toks.size());
    std::vector<float> mg(T * H), me(T * H), lg(std::max(n_logits, 1) * V),
        le(std::max(n_logits, 1) * V);
    g->MtpForward(h, toks.data(), p, T, ForwardMode::kVerify, mg.data(), lg.data(), n_logits);
    e->MtpForward(h, toks.data(), p, T, ForwardMode::kVerify, me.data(), le.data(), n_logits);
    ASSERT_TRUE(g->stage(last).status().ok())
        << where << ": " << g->stage(last).status().ToString();
    EXPECT_TRUE(test::BitwiseEqual(mg, me)) << where << " m";
    EXPECT_TRUE(test::BitwiseEqual(lg, le)) << where << " logits";
    KvCache* kg = g->stage(last).mtp_kv();
    KvCache* ke = e->stage(last).mtp_kv();
    ASSERT_EQ(kg->rows_written(), ke->rows_written()) << where;
    EXPECT_TRUE(test::BitwiseEqual(FlatK(*kg, kg->rows_written()), FlatK(*ke, ke->rows_written())))
        << where;
    if (m_out != nullptr) *m_out = mg;
  };
  auto toks = Prompt(64, 3);
  std::vector<float> row(hg.end() - static_cast<long>(H), hg.end());
  int p = n;
  // As the drafter runs it: extend over the committed row, then a speculative chain step on its m.
  for (int i = 0; i < 8; ++i) {
    const std::string at = "draft step " + std::to_string(i);
    std::vector<float> mo;
    mtp(row.data(), {toks.data() + 2 * i, 1}, p, 1, at + " extend", &mo);
    g->MtpCommit(p + 1);
    e->MtpCommit(p + 1);
    mtp(mo.data(), {toks.data() + 2 * i + 1, 1}, p + 1, 1, at + " chain", &row);
    ++p;
    if (i % 2 == 1) {  // a verify window of the stages between draft steps (routing buffer shared)
      std::vector<float> la(V), lb(V);
      std::span<const std::int32_t> t1(toks.data() + 40 + i, 1);
      ASSERT_TRUE(g->Verify(t1, la.data()).ok() && e->Verify(t1, lb.data()).ok()) << at;
      EXPECT_TRUE(test::BitwiseEqual(la, lb)) << at << " verify logits";
      ASSERT_TRUE(g->Commit(1).ok() && e->Commit(1).ok()) << at;
    }
  }
  // A three-row extend with three logit rows: its own graph key, so eager at first.
  std::vector<float> h3(hg.end() - 3 * static_cast<long>(H), hg.end());
  mtp(h3.data(), {toks.data() + 50, 3}, p, 3, "extend T=3", nullptr);
  EXPECT_EQ(g->stage(last).mtp_kv()->rows_written(), p + 3);
  // (T=1, 1 logit row), 16 calls: eager (1), captured (2), replayed (3, 4). The first verify
  // window then grows the stage's GDN step scratch, a new layout: the MTP graph must not be
  // replayed, so call 5 runs eagerly, 6 is captured again and 7-11 replay. Call 12, the chain
  // step at p = 256, needs a 257th MTP K/V row: eager, and the cache grows to 512 rows, another
  // new layout: 13 eager, 14 captured, 15-16 replay. The T=3 extend is a new key: eager. The
  // verify windows (T=1 at 250-253: eager, eager, captured, replayed) add one capture and two
  // launches. Captures 3 + 1, launches (3 + 6 + 3) + 2.
  const auto now = g->stage(last).init_counters();
  EXPECT_EQ(now.graph_captures - base.graph_captures, 4);
  EXPECT_EQ(now.graph_launches - base.graph_launches, 14);
  // Set-up is counted where it was paid: MTP calls 2, 6 and 14 (captures) and 12 (the MTP K/V
  // cache grows); verify windows 1 (the GDN step scratch) and 3 (capture).
  EXPECT_EQ(now.first_calls - base.first_calls, 4 + 2);
  EXPECT_EQ(e->stage(last).init_counters().graph_launches, 0);
  EXPECT_EQ(g->stage(0).init_counters().graph_captures, 1)
      << "stage 0 has no MTP: its verify graph only";
}

}  // namespace
}  // namespace lockstep
