// Must show 3 (issue 22): slot reuse. One slot serves request X, then request Y: Y's tokens,
// window path fields and every state item of every checkpoint are bitwise Y on a fresh engine.
// Fresh K/V pages and GDN scratch are NaN here (poison.h), so a read of anything X left behind
// or nothing wrote shows up: the test also asserts that no f32 item holds a NaN.
#include <gtest/gtest.h>

#include <vector>

#include "engine/slot_state_util.h"
#include "lockstep/engine/poison.h"
#include "lockstep/engine/scheduler.h"
#include "test_util.h"

namespace lockstep {
namespace {

// Poison on for the test's allocations, back to the environment's value afterwards.
class PoisonOn {
 public:
  PoisonOn() { SetPoisonFreshForTesting(1); }
  ~PoisonOn() { SetPoisonFreshForTesting(-1); }
};

EngineConfig Config(DType kv, bool prefix_cache) {
  EngineConfig c;
  c.model = test::ModelDir("tiny");
  c.threads = 2;
  c.slots = 1;
  c.prefill_chunk = 16;
  c.kv_page_rows = 16;
  c.kv_dtype = kv;
  c.prefix_cache = prefix_cache;
  return c;
}

RequestOptions Options(int max_new) {
  RequestOptions o;
  o.max_new = max_new;
  o.ignore_eos = true;
  o.spec = 3;
  return o;
}

RequestResult RunOn(Scheduler& s, const std::vector<std::int32_t>& prompt, int max_new,
                    test::ItemRecorder* rec) {
  RequestSpec spec;
  spec.id = "r";
  spec.prompt = prompt;
  spec.options = Options(max_new);
  spec.hooks.observer = rec;
  auto t = s.Submit(std::move(spec));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(s.RunUntilIdle().ok());
  auto done = s.TakeFinished();
  EXPECT_EQ(done.size(), 1u);
  if (done.empty()) return {};
  EXPECT_TRUE(done[0].status.ok()) << done[0].status.ToString();
  return done[0];
}

class SlotReuse : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(SlotReuse, YAfterXInOneSlotIsYOnAFreshEngine) {
  PoisonOn poison;
  const auto [kv, prefix_cache] = GetParam();
  // X is longer than Y (its pages and scratch reach further) and drafts longer windows.
  const auto X = test::Tokens(150, 201), Y = test::Tokens(70, 202);
  test::ItemRecorder rx, ry, fresh_y;
  RequestResult x, y, fy;
  {
    auto e = Engine::Create(Config(kv, prefix_cache), test::Model("tiny"));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    Scheduler s(**e);
    x = RunOn(s, X, 24, &rx);
    y = RunOn(s, Y, 16, &ry);
  }
  {
    auto e = Engine::Create(Config(kv, false), test::Model("tiny"));
    ASSERT_TRUE(e.ok());
    Scheduler s(**e);
    fy = RunOn(s, Y, 16, &fresh_y);
  }
  EXPECT_EQ(x.slot, 0);
  EXPECT_EQ(y.slot, 0);
  EXPECT_EQ(y.prefix.snapshot_position, -1);  // nothing shared with X
  EXPECT_EQ(y.result.output, fy.result.output);
  ASSERT_EQ(ry.windows.size(), fresh_y.windows.size());
  for (std::size_t i = 0; i < ry.windows.size(); ++i) {
    EXPECT_EQ(ry.windows[i].draft, fresh_y.windows[i].draft) << i;
    EXPECT_EQ(ry.windows[i].emitted, fresh_y.windows[i].emitted) << i;
  }
  EXPECT_FALSE(ry.items.empty());
  EXPECT_EQ(test::DifferingItems(ry, fresh_y), std::vector<std::string>{});
  EXPECT_EQ(rx.nan_values, 0);
  EXPECT_EQ(ry.nan_values, 0);
  EXPECT_EQ(fresh_y.nan_values, 0);
}

INSTANTIATE_TEST_SUITE_P(KvAndCache, SlotReuse,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kI8),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(dtype_name(std::get<0>(p.param))) +
                                  (std::get<1>(p.param) ? "_prefix_cache" : "_no_cache");
                         });

}  // namespace
}  // namespace lockstep
