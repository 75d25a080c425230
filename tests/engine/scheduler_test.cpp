// The serving scheduler's plans (engine/include/lockstep/engine/scheduler.h): verify windows
// first in ascending slot order, then whole prefill chunks on the absolute grid in admission
// order within batch_tokens (the head chunk always goes), FIFO admission of arrivals by step,
// a cancelled request's slot free before the next step, and the same composition on a rerun.
#include "lockstep/engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "serve/serve_util.h"
#include "test_util.h"

namespace lockstep {
namespace {

constexpr int kChunk = 16;

struct Req {
  int prompt;
  std::int64_t arrive;
  int max_new;
};

RequestSpec Spec(const Req& r, int i, int V) {
  RequestSpec s;
  s.id = "r" + std::to_string(i);
  s.prompt = test::RandomTokens(r.prompt, 100 + static_cast<std::uint64_t>(i), V);
  s.options = test::SpecOptions(r.max_new);
  s.arrive_step = r.arrive;
  return s;
}

struct PlanRun {
  std::vector<StepRecord> steps;
  std::vector<RequestResult> results;  // by ticket order
};

PlanRun RunAll(const EngineConfig& cfg, const std::vector<Req>& reqs) {
  PlanRun run;
  auto made = Engine::Create(cfg, test::Model("tiny"));
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  Scheduler sched(**made);
  const int V = (*made)->weights().config.n_vocab;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto t = sched.Submit(Spec(reqs[i], static_cast<int>(i), V));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
  }
  EXPECT_TRUE(sched.RunUntilIdle().ok());
  run.results = sched.TakeFinished();
  std::sort(run.results.begin(), run.results.end(),
            [](const auto& a, const auto& b) { return a.ticket < b.ticket; });
  run.steps = sched.step_records();
  return run;
}

// The request holding `slot` at `step` (slots are reused).
const RequestResult* Holder(const PlanRun& run, int slot, std::int64_t step) {
  for (const RequestResult& r : run.results)
    if (r.slot == slot && r.first_step <= step && step <= r.last_step) return &r;
  return nullptr;
}

void ExpectPlansFollowTheRules(const PlanRun& run, const std::vector<Req>& reqs, int budget) {
  for (const StepRecord& s : run.steps) {
    bool prefill_seen = false;
    int last_verify_slot = -1, prefill_groups = 0, rows = 0;
    for (const StepRecord::Group& g : s.groups) {
      rows += g.T;
      const RequestResult* r = Holder(run, g.slot, s.step);
      ASSERT_NE(r, nullptr) << "step " << s.step << " slot " << g.slot;
      const int n = reqs[static_cast<std::size_t>(r->ticket - 1)].prompt;
      if (g.verify) {
        EXPECT_FALSE(prefill_seen) << "step " << s.step << ": a verify group after a prefill";
        EXPECT_GT(g.slot, last_verify_slot) << "step " << s.step << ": verify slots ascend";
        last_verify_slot = g.slot;
      } else {
        prefill_seen = true;
        ++prefill_groups;
        // Whole chunks on the absolute grid of the request's own prefill [0, n-1).
        const int grid_end = (g.p / kChunk + 1) * kChunk;
        EXPECT_EQ(g.p + g.T, std::min(grid_end, n - 1)) << "step " << s.step << " p " << g.p;
      }
    }
    EXPECT_EQ(rows, s.rows);
    // Over budget only by the head chunk that goes anyway.
    if (s.rows > budget) {
      EXPECT_LE(prefill_groups, 1) << "step " << s.step << " has " << s.rows << " rows";
    }
  }
}

TEST(Scheduler, PlansPutDecodeFirstAndWholeChunksOnTheGrid) {
  EngineConfig cfg = test::ServeConfig(3, kChunk);
  cfg.batch_tokens = 24;  // two chunks do not fit: the second waits, never cut
  const std::vector<Req> reqs = {{50, 0, 6}, {37, 0, 6}, {5, 2, 4}, {70, 3, 6}, {23, 3, 5}};
  const PlanRun run = RunAll(cfg, reqs);
  ASSERT_EQ(run.results.size(), reqs.size());
  ExpectPlansFollowTheRules(run, reqs, cfg.batch_tokens);
  bool mixed = false;  // some step carries verify and prefill rows together
  for (const StepRecord& s : run.steps) mixed |= s.verify_rows > 0 && s.prefill_rows > 0;
  EXPECT_TRUE(mixed);
  for (const RequestResult& r : run.results) {
    EXPECT_EQ(r.end, RequestEnd::kFinished) << r.id << " " << r.status.ToString();
    EXPECT_GE(r.admit_step, r.arrive_step) << r.id;
    EXPECT_EQ(static_cast<int>(r.result.output.size()),
              reqs[static_cast<std::size_t>(r.ticket - 1)].max_new);
    for (const WindowRecord& w : r.result.windows) {
      ASSERT_GE(w.step, 0);
      const StepRecord& s = run.steps[static_cast<std::size_t>(w.step)];
      EXPECT_EQ(s.step, w.step);
      EXPECT_EQ(w.step_rows, s.rows);
      EXPECT_EQ(w.step_seqs, s.seqs);
      EXPECT_EQ(w.step_prefill_rows, s.prefill_rows);
    }
  }
  // FIFO: with 3 slots, r3 (arrives at 3) is admitted no earlier than r2 (arrives at 2).
  EXPECT_LE(run.results[2].admit_step, run.results[3].admit_step);
  EXPECT_LE(run.results[3].admit_step, run.results[4].admit_step);
}

TEST(Scheduler, AStepThatWouldCarryNoPrefillTakesTheHeadChunk) {
  EngineConfig cfg = test::ServeConfig(4, kChunk);
  cfg.batch_tokens = 8;  // three decoding windows of spec 4 fill it
  const std::vector<Req> reqs = {{3, 0, 12}, {4, 0, 12}, {2, 0, 12}, {90, 2, 3}};
  const PlanRun run = RunAll(cfg, reqs);
  ExpectPlansFollowTheRules(run, reqs, cfg.batch_tokens);
  const RequestResult& big = run.results[3];
  int prefill_steps = 0;
  for (const StepRecord& s : run.steps)
    for (const StepRecord::Group& g : s.groups)
      if (!g.verify && g.slot == big.slot && s.step >= big.first_step) ++prefill_steps;
  // 89 prefill rows on a 16-grid: 6 chunks, one per step, none held back by the budget.
  EXPECT_EQ(prefill_steps, 6);
  EXPECT_EQ(big.end, RequestEnd::kFinished);
}

TEST(Scheduler, ARerunComposesTheSameSteps) {
  EngineConfig cfg = test::ServeConfig(2, kChunk);
  cfg.batch_tokens = 24;
  const std::vector<Req> reqs = {{41, 0, 7}, {19, 1, 5}, {60, 1, 6}, {8, 5, 4}};
  const PlanRun a = RunAll(cfg, reqs), b = RunAll(cfg, reqs);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    ASSERT_EQ(a.steps[i].groups.size(), b.steps[i].groups.size()) << "step " << i;
    for (std::size_t k = 0; k < a.steps[i].groups.size(); ++k) {
      const auto &x = a.steps[i].groups[k], &y = b.steps[i].groups[k];
      EXPECT_TRUE(x.slot == y.slot && x.verify == y.verify && x.p == y.p && x.T == y.T)
          << "step " << i << " group " << k;
    }
  }
  for (std::size_t i = 0; i < a.results.size(); ++i)
    EXPECT_EQ(a.results[i].result.output, b.results[i].result.output);
}

TEST(Scheduler, CancelFreesTheSlotBeforeTheNextStep) {
  EngineConfig cfg = test::ServeConfig(1, kChunk);
  auto made = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(made.ok());
  Engine& e = **made;
  Scheduler sched(e);
  const int V = e.weights().config.n_vocab;
  auto a = sched.Submit(Spec({30, 0, 50}, 0, V));
  auto b = sched.Submit(Spec({20, 0, 4}, 1, V));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(sched.counters().queue_depth, 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(sched.Step().ok());
  ASSERT_TRUE(sched.Cancel(*a).ok());
  EXPECT_FALSE(e.slot_open(0)) << "the cancelled request's slot is closed at once";
  EXPECT_EQ(sched.counters().live, 0);
  const std::int64_t next = sched.step();
  ASSERT_TRUE(sched.Step().ok());
  ASSERT_EQ(sched.step_records().back().step, next);
  EXPECT_EQ(sched.step_records().back().slots, std::vector<int>{0}) << "b runs in the freed slot";
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  auto done = sched.TakeFinished();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].ticket, *a);
  EXPECT_EQ(done[0].end, RequestEnd::kCancelled);
  EXPECT_EQ(done[1].admit_step, next);
  EXPECT_EQ(done[1].end, RequestEnd::kFinished);
  EXPECT_FALSE(sched.Cancel(*a).ok()) << "an ended request cannot be cancelled again";
}

// The post_verify checkpoint sees the window's rows speculative (before Commit); the commit
// checkpoint sees them committed.
class CommitObserver final : public Observer {
 public:
  bool WantsCheckpoint(int, CheckpointPoint) const override { return true; }
  void OnCheckpointBegin(const CheckpointInfo& info) override {
    if (info.point == CheckpointPoint::kPostVerify) post.push_back(info.committed_rows - info.p);
  }
  void OnState(const CheckpointInfo&, const StateView&) override {}
  void OnCheckpointEnd(const CheckpointInfo&) override {}
  std::vector<int> post;
};

TEST(Scheduler, PostVerifyCheckpointsPrecedeTheCommit) {
  EngineConfig cfg = test::ServeConfig(2, kChunk);
  auto made = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(made.ok());
  Scheduler sched(**made);
  CommitObserver obs;
  RequestSpec s = Spec({25, 0, 6}, 0, (*made)->weights().config.n_vocab);
  s.hooks.observer = &obs;
  ASSERT_TRUE(sched.Submit(s).ok());
  ASSERT_TRUE(sched.Submit(Spec({33, 0, 6}, 1, (*made)->weights().config.n_vocab)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  ASSERT_FALSE(obs.post.empty());
  for (int d : obs.post) EXPECT_EQ(d, 0) << "rows committed before the post_verify checkpoint";
}

}  // namespace
}  // namespace lockstep
