// The engine's slot API (engine.h): slots hold independent sequences, a step over several slots
// gives each exactly what it gets alone, and a closed slot starts fresh.
#include <gtest/gtest.h>

#include <vector>

#include "lockstep/engine/engine.h"
#include "test_util.h"

namespace lockstep {
namespace {

std::vector<std::int32_t> Tokens(int n, std::uint64_t seed) {
  auto r = test::Random(static_cast<std::size_t>(n), seed, 0.0f, 255.0f);
  std::vector<std::int32_t> ids;
  for (float x : r) ids.push_back(static_cast<std::int32_t>(x));
  return ids;
}

EngineConfig Config(int slots) {
  EngineConfig c;
  c.model = test::ModelDir("tiny");
  c.threads = 2;
  c.slots = slots;
  c.prefill_chunk = 16;
  return c;
}

// What one sequence sees: logits of a verify window after its prompt, and its K/V.
struct Seen {
  std::vector<float> logits;
  std::vector<float> kv;  // every attention layer's committed K rows, as f32
};

void ReadKv(Engine& e, Seen& out) {
  const int n_layers = e.weights().config.n_layers;
  std::vector<float> tmp(1024);
  for (int is = 0; is < e.n_stages(); ++is)
    for (int il = 0; il < n_layers; ++il)
      if (KvCache* kv = e.stage(is).kv(il))
        for (int r = 0; r < kv->rows_committed(); ++r)
          for (int h = 0; h < kv->n_heads_kv(); ++h) {
            const float* k = kv->K(r, h, tmp.data());
            out.kv.insert(out.kv.end(), k, k + kv->head_dim());
          }
}

Seen Alone(const std::vector<std::int32_t>& prompt, const std::vector<std::int32_t>& window) {
  auto e = Engine::Create(Config(1), test::Model("tiny"));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  Engine& engine = **e;
  EXPECT_TRUE(engine.Prefill(prompt).ok());
  Seen s;
  s.logits.resize(window.size() * static_cast<std::size_t>(engine.weights().config.n_vocab));
  EXPECT_TRUE(engine.Verify(window, s.logits.data()).ok());
  EXPECT_TRUE(engine.Commit(static_cast<int>(window.size())).ok());
  ReadKv(engine, s);
  return s;
}

TEST(EngineSlots, AStepOverThreeSlotsGivesEachWhatItGetsAlone) {
  auto made = Engine::Create(Config(4), test::Model("tiny"));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Engine& e = **made;
  const int V = e.weights().config.n_vocab;
  const std::vector<std::vector<std::int32_t>> prompts = {Tokens(40, 1), Tokens(23, 2),
                                                          Tokens(57, 3)};
  const std::vector<std::vector<std::int32_t>> windows = {Tokens(1, 4), Tokens(5, 5), Tokens(3, 6)};
  // Slot 1 prefills through the single-sequence API, slots 2 and 3 share steps.
  ASSERT_TRUE(e.OpenSlot(1).ok());
  ASSERT_TRUE(e.OpenSlot(2).ok());
  ASSERT_TRUE(e.OpenSlot(3).ok());
  e.UseSlot(1);
  ASSERT_TRUE(e.Prefill(prompts[0]).ok());
  std::vector<int> done = {0, 0};
  while (done[0] < 23 || done[1] < 57) {
    StepPlan plan;
    std::vector<std::int32_t> toks;
    for (int k = 0; k < 2; ++k) {
      const auto& pr = prompts[static_cast<std::size_t>(k) + 1];
      const int n = std::min(16, static_cast<int>(pr.size()) - done[static_cast<std::size_t>(k)]);
      if (n <= 0) continue;
      plan.groups.push_back(RowGroup{k + 2, ForwardMode::kPrefill,
                                     done[static_cast<std::size_t>(k)],
                                     static_cast<int>(toks.size()), n});
      toks.insert(toks.end(), pr.begin() + done[static_cast<std::size_t>(k)],
                  pr.begin() + done[static_cast<std::size_t>(k)] + n);
      done[static_cast<std::size_t>(k)] += n;
    }
    Engine::StepOutputs out;
    ASSERT_TRUE(e.RunStep(plan, toks, &out).ok());
    EXPECT_EQ(out.normed.size(), toks.size() * static_cast<std::size_t>(e.weights().config.n_embd));
  }
  // One verify step over all three.
  StepPlan plan;
  std::vector<std::int32_t> toks;
  for (int k = 0; k < 3; ++k) {
    const int slot = k + 1;
    plan.groups.push_back(RowGroup{slot, ForwardMode::kVerify,
                                   static_cast<int>(prompts[static_cast<std::size_t>(k)].size()),
                                   static_cast<int>(toks.size()),
                                   static_cast<int>(windows[static_cast<std::size_t>(k)].size())});
    toks.insert(toks.end(), windows[static_cast<std::size_t>(k)].begin(),
                windows[static_cast<std::size_t>(k)].end());
  }
  Engine::StepOutputs out;
  ASSERT_TRUE(e.RunStep(plan, toks, &out).ok());
  for (int k = 0; k < 3; ++k) {
    const RowGroup& g = plan.groups[static_cast<std::size_t>(k)];
    e.UseSlot(g.slot);
    ASSERT_TRUE(e.Commit(g.T).ok());
    Seen s;
    s.logits.assign(out.logits.begin() + static_cast<std::ptrdiff_t>(g.row0) * V,
                    out.logits.begin() + static_cast<std::ptrdiff_t>(g.row0 + g.T) * V);
    ReadKv(e, s);
    const Seen alone =
        Alone(prompts[static_cast<std::size_t>(k)], windows[static_cast<std::size_t>(k)]);
    EXPECT_TRUE(test::BitwiseEqual(s.logits, alone.logits)) << "slot " << g.slot;
    EXPECT_TRUE(test::BitwiseEqual(s.kv, alone.kv)) << "slot " << g.slot;
    EXPECT_EQ(e.position(), static_cast<int>(prompts[static_cast<std::size_t>(k)].size() +
                                             windows[static_cast<std::size_t>(k)].size()));
  }
}

TEST(EngineSlots, AClosedSlotStartsFreshAndBadPlansAreRefused) {
  auto made = Engine::Create(Config(2), test::Model("tiny"));
  ASSERT_TRUE(made.ok());
  Engine& e = **made;
  const auto a = Tokens(30, 8), b = Tokens(20, 9), w = Tokens(2, 10);
  ASSERT_TRUE(e.OpenSlot(1).ok());
  e.UseSlot(1);
  ASSERT_TRUE(e.Prefill(a).ok());
  EXPECT_FALSE(e.OpenSlot(1).ok()) << "a slot holding a sequence cannot be opened again";
  e.CloseSlot(1);
  ASSERT_TRUE(e.OpenSlot(1).ok());
  EXPECT_EQ(e.position(), 0);
  ASSERT_TRUE(e.Prefill(b).ok());
  Seen s;
  s.logits.resize(w.size() * static_cast<std::size_t>(e.weights().config.n_vocab));
  ASSERT_TRUE(e.Verify(w, s.logits.data()).ok());
  ASSERT_TRUE(e.Commit(2).ok());
  ReadKv(e, s);
  const Seen alone = Alone(b, w);
  EXPECT_TRUE(test::BitwiseEqual(s.logits, alone.logits));
  EXPECT_TRUE(test::BitwiseEqual(s.kv, alone.kv));
  // A plan at the wrong position, a prefill group before a verify group: refused.
  StepPlan bad;
  bad.groups.push_back(RowGroup{1, ForwardMode::kVerify, 3, 0, 1});
  Engine::StepOutputs out;
  std::vector<std::int32_t> one = {1};
  EXPECT_FALSE(e.RunStep(bad, one, &out).ok());
  StepPlan order;
  order.groups.push_back(RowGroup{0, ForwardMode::kPrefill, 0, 0, 1});
  order.groups.push_back(RowGroup{1, ForwardMode::kVerify, e.position(), 1, 1});
  std::vector<std::int32_t> two = {1, 2};
  EXPECT_FALSE(e.RunStep(order, two, &out).ok());
}

TEST(EngineSlots, MoreSlotsThanTheBackendHoldsIsNotSupported) {
  EngineConfig c = Config(1);
  c.slots = 0;
  EXPECT_FALSE(Engine::Create(c, test::Model("tiny")).ok());
}

}  // namespace
}  // namespace lockstep
