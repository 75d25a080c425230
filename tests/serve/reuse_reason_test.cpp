// Must show 3 (issue 40): why a request reused no more of its prompt than it did. One test per
// reason (prefix_cache.h ReuseReason), each on `tiny` with a 16-position snapshot grid: the
// request's PrefixReport carries the reason, the tokens reused and (prefix_mismatch) the position
// P; the export of one says the same in its root attributes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/prefix_cache.h"
#include "lockstep/engine/scheduler.h"
#include "serve/serve_util.h"
#include "test_util.h"

namespace lockstep {
namespace {

constexpr int kGrid = 16;

EngineConfig Config(bool prefix_cache, int cache_mib = 64) {
  EngineConfig c = test::ServeConfig(2, kGrid);
  c.prefix_cache = prefix_cache;
  c.prefix_cache_mib = cache_mib;
  return c;
}

RequestOptions Options(bool mtp) {
  RequestOptions o = test::SpecOptions(2, 2);
  o.mtp = mtp;
  return o;
}

int Vocab() { return test::Model("tiny").config.n_vocab; }

std::vector<std::int32_t> Prompt(int n, std::uint64_t seed) {
  return test::RandomTokens(n, seed, Vocab());
}

// `p` with token i replaced by another.
std::vector<std::int32_t> Changed(std::vector<std::int32_t> p, int i) {
  p[static_cast<std::size_t>(i)] = (p[static_cast<std::size_t>(i)] + 1) % Vocab();
  return p;
}

// Requests run one after another on one engine (each ends before the next is submitted).
class Serial {
 public:
  explicit Serial(const EngineConfig& cfg) {
    auto e = Engine::Create(cfg, test::Model("tiny"));
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    sched_ = std::make_unique<Scheduler>(*engine_);
  }
  RequestResult Run(std::vector<std::int32_t> prompt, bool mtp = true, bool keep = false,
                    bool use_cache = true) {
    RequestSpec spec;
    spec.id = "r";
    spec.prompt = std::move(prompt);
    spec.options = Options(mtp);
    spec.keep = keep;
    spec.use_prefix_cache = use_cache;
    auto t = sched_->Submit(std::move(spec));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return Finish();
  }
  RequestResult Finish() {
    EXPECT_TRUE(sched_->RunUntilIdle().ok());
    auto done = sched_->TakeFinished();
    EXPECT_EQ(done.size(), 1u);
    if (done.empty()) return {};
    EXPECT_TRUE(done[0].status.ok()) << done[0].status.ToString();
    return done[0];
  }
  Scheduler& sched() { return *sched_; }

 private:
  EnginePtr engine_;
  std::unique_ptr<Scheduler> sched_;
};

TEST(ReuseReason, CacheOffWithoutACacheAndWhenBypassed) {
  Serial off(Config(false));
  const auto p = Prompt(40, 1);
  off.Run(p);
  RequestResult r = off.Run(p);
  EXPECT_EQ(ReuseReasonText(r.prefix), "cache_off");
  EXPECT_EQ(r.prefix.reused_tokens, 0);
  Serial on(Config(true));
  on.Run(p);
  r = on.Run(p, true, false, /*use_cache=*/false);
  EXPECT_EQ(ReuseReasonText(r.prefix), "cache_off");
  EXPECT_EQ(r.prefix.reused_tokens, 0);
}

TEST(ReuseReason, NoEntryOnAFreshCacheAndForAnUnrelatedPrompt) {
  Serial s(Config(true));
  RequestResult r = s.Run(Prompt(40, 2));
  EXPECT_EQ(ReuseReasonText(r.prefix), "no_entry");
  EXPECT_EQ(r.prefix.reused_tokens, 0);
  r = s.Run(Changed(Prompt(40, 2), 0));  // not even the first token in common
  EXPECT_EQ(ReuseReasonText(r.prefix), "no_entry");
  EXPECT_EQ(r.prefix.reused_tokens, 0);
}

TEST(ReuseReason, PrefixMismatchNamesTheFirstDifferingToken) {
  Serial s(Config(true));
  const auto a = Prompt(60, 4);
  s.Run(a);
  RequestResult r = s.Run(Changed(a, 37));
  EXPECT_EQ(ReuseReasonText(r.prefix), "prefix_mismatch_at=37");
  EXPECT_EQ(r.prefix.reason_at, 37);
  EXPECT_EQ(r.prefix.reused_tokens, 32);  // the grid position below 37
  // Before the first grid position: nothing reused, still the mismatch.
  r = s.Run(Changed(a, 5));
  EXPECT_EQ(ReuseReasonText(r.prefix), "prefix_mismatch_at=5");
  EXPECT_EQ(r.prefix.reused_tokens, 0);
}

TEST(ReuseReason, SnapshotGridWhenTheSharedPrefixEndsBetweenSnapshots) {
  Serial s(Config(true));
  const auto a = Prompt(40, 5);
  s.Run(a);
  // a's 40 tokens and 30 more: the shared prefix ends at 40, between the snapshots 32 and 48.
  auto b = a;
  const auto more = Prompt(30, 6);
  b.insert(b.end(), more.begin(), more.end());
  RequestResult r = s.Run(b);
  EXPECT_EQ(ReuseReasonText(r.prefix), "snapshot_grid");
  EXPECT_EQ(r.prefix.reused_tokens, 32);
  // The same prompt again: it ends between snapshots itself (39 tokens of state, 32 reused).
  r = s.Run(a);
  EXPECT_EQ(ReuseReasonText(r.prefix), "snapshot_grid");
  EXPECT_EQ(r.prefix.reused_tokens, 32);
}

TEST(ReuseReason, EvictedWhenTheBudgetDroppedTheEntries) {
  // A budget of 0 evicts every entry as it is stored.
  Serial s(Config(true, 0));
  const auto a = Prompt(40, 7);
  s.Run(a);
  ASSERT_GT(s.sched().prefix_cache()->counters().evictions, 0);
  RequestResult r = s.Run(a);
  EXPECT_EQ(ReuseReasonText(r.prefix), "evicted");
  EXPECT_EQ(r.prefix.reused_tokens, 0);
}

TEST(ReuseReason, DifferentConfigWhenOnlyTheOtherMtpUseIsCached) {
  Serial s(Config(true));
  const auto a = Prompt(40, 8);
  s.Run(a, /*mtp=*/true);
  RequestResult r = s.Run(a, /*mtp=*/false);
  EXPECT_EQ(ReuseReasonText(r.prefix), "different_config");
  EXPECT_EQ(r.prefix.reused_tokens, 0);
  r = s.Run(a, /*mtp=*/true);  // its own key is there
  EXPECT_EQ(r.prefix.reused_tokens, 32);
}

TEST(ReuseReason, KeptSlotForAContinuationWithItsCommittedTokens) {
  Serial s(Config(true));
  const auto a = Prompt(40, 9);
  RequestResult first = s.Run(a, true, /*keep=*/true);
  ASSERT_TRUE(first.kept);
  auto t = s.sched().Continue(first.ticket, Prompt(5, 10), Options(true));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  RequestResult r = s.Finish();
  EXPECT_EQ(ReuseReasonText(r.prefix), "kept_slot");
  EXPECT_EQ(r.prefix.kept_tokens, static_cast<int>(a.size() + first.result.output.size()) - 1);
}

TEST(ReuseReason, TheExportSaysWhy) {
  const auto a = Prompt(60, 11);
  std::vector<test::ServeRequest> reqs(2);
  reqs[0].spec.id = "a";
  reqs[0].spec.prompt = a;
  reqs[0].spec.options = Options(true);
  reqs[1].spec.id = "b";
  reqs[1].spec.prompt = Changed(a, 37);
  reqs[1].spec.options = Options(true);
  reqs[1].spec.arrive_step = 40;  // after a has ended
  const std::string path = test::NewDir("reuse-export") + "/b.h5";
  reqs[1].export_path = path;
  test::ServeRun run = test::RunRequests(Config(true), std::move(reqs));
  ASSERT_EQ(run.results.size(), 2u);
  ASSERT_LT(run.results[0].last_step, 40);
  EXPECT_EQ(ReuseReasonText(run.results[1].prefix), "prefix_mismatch_at=37");
  auto reader = ExportReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->meta().prefix_reuse, "prefix_mismatch_at=37");
  EXPECT_EQ((*reader)->meta().prompt_tokens_reused, 32);
}

}  // namespace
}  // namespace lockstep
