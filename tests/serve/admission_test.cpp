// Admission and memory (issue 22, Must show 6): 64 requests against 16 slots all finish with the
// tokens each gets alone, the queue never holds more than --queue-depth, the reservations of the
// live requests stay within --memory-mib at every step, and a request too large for the engine
// is refused with the reason. A burst past the queue bound is refused with "queue full".
#include <gtest/gtest.h>

#include <random>

#include "serve/serve_util.h"
#include "test_util.h"

namespace lockstep {
namespace {

constexpr int kChunk = 32;

std::vector<std::int32_t> Solo(const EngineConfig& cfg, const RequestSpec& spec) {
  EngineConfig c = cfg;
  c.slots = 1;
  c.memory_mib = 0;
  auto e = Engine::Create(c, test::Model("tiny"));
  EXPECT_TRUE(e.ok());
  Scheduler s(**e);
  EXPECT_TRUE(s.Submit(spec).ok());
  EXPECT_TRUE(s.RunUntilIdle().ok());
  auto done = s.TakeFinished();
  return done.empty() ? std::vector<std::int32_t>{} : done[0].result.output;
}

TEST(Admission, SixtyFourRequestsOnSixteenSlotsWithinTheQueueAndMemory) {
  EngineConfig cfg = test::ServeConfig(16, kChunk);
  cfg.queue_depth = 32;
  const int V = test::Model("tiny").config.n_vocab;
  std::mt19937_64 rng(5);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 64; ++i) {
    RequestSpec s;
    s.id = "q" + std::to_string(i);
    s.prompt = test::RandomTokens(std::uniform_int_distribution<int>(10, 160)(rng), rng(), V);
    s.options = test::SpecOptions(std::uniform_int_distribution<int>(4, 10)(rng));
    s.arrive_step = i / 2;  // two arrivals a step: the queue builds up behind the slots
    specs.push_back(std::move(s));
  }
  auto probe = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(probe.ok());
  std::uint64_t largest = 0;
  {
    Scheduler s(**probe);
    for (const RequestSpec& sp : specs) largest = std::max(largest, s.ReservationBytes(sp));
  }
  // Memory for about ten of the largest: memory, not slots, limits admission part of the time.
  cfg.memory_mib = static_cast<int>((10 * largest) >> 20) + 1;
  const std::uint64_t limit = static_cast<std::uint64_t>(cfg.memory_mib) << 20;

  auto made = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(made.ok());
  Scheduler sched(**made);
  std::uint64_t max_reserved = 0;
  int max_queue = 0, max_live = 0;
  sched.SetStepCallback([&](const StepRecord& r) {
    max_reserved = std::max(max_reserved, sched.counters().reserved_bytes);
    max_queue = std::max(max_queue, r.queue_depth);
    max_live = std::max(max_live, r.live);
  });
  for (const RequestSpec& sp : specs) ASSERT_TRUE(sched.Submit(sp).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  auto done = sched.TakeFinished();
  ASSERT_EQ(done.size(), specs.size());
  const SchedulerCounters& c = sched.counters();
  EXPECT_LE(c.max_queue_depth, cfg.queue_depth);
  EXPECT_GT(c.max_queue_depth, 0) << "the queue never held anyone: the test shows nothing";
  EXPECT_LE(c.max_reserved_bytes, limit);
  EXPECT_LE(max_reserved, limit);
  EXPECT_LE(max_live, 16);
  EXPECT_EQ(c.refused, 0);
  EXPECT_EQ(c.live, 0);
  EXPECT_EQ(c.reserved_bytes, 0u);
  std::printf(
      "admission: 64 requests, %lld steps, max queue %d (bound %d), max live %d, max "
      "reserved %.1f of %d MiB\n",
      static_cast<long long>(c.steps), c.max_queue_depth, cfg.queue_depth, max_live,
      static_cast<double>(c.max_reserved_bytes) / (1 << 20), cfg.memory_mib);
  for (const RequestResult& r : done) {
    ASSERT_EQ(r.end, RequestEnd::kFinished) << r.id << ": " << r.status.ToString();
    const RequestSpec& sp = specs[static_cast<std::size_t>(r.ticket - 1)];
    EXPECT_EQ(r.result.output, Solo(cfg, sp)) << r.id;
  }
}

TEST(Admission, ARequestTooLargeForTheEngineIsRefusedWithTheReason) {
  EngineConfig cfg = test::ServeConfig(4, kChunk);
  cfg.memory_mib = 1;
  auto made = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(made.ok());
  Scheduler sched(**made);
  RequestSpec s;
  s.id = "huge";
  s.prompt = test::RandomTokens(20000, 1, (*made)->weights().config.n_vocab);
  s.options = test::SpecOptions(8);
  auto t = sched.Submit(s);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(t.status().ToString().find("more than --memory-mib 1 allows"), std::string::npos)
      << t.status().ToString();
  EXPECT_EQ(sched.counters().refused, 1);
  RequestSpec bad = s;
  bad.prompt = {1, 2, -3};
  SubmitError why = SubmitError::kNone;
  auto b = sched.Submit(bad, &why);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().ToString().find("outside the vocabulary"), std::string::npos);
  EXPECT_EQ(why, SubmitError::kInvalid);
}

TEST(Admission, ABurstPastTheQueueBoundIsRefusedQueueFull) {
  EngineConfig cfg = test::ServeConfig(2, kChunk);
  cfg.queue_depth = 3;
  auto made = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(made.ok());
  Scheduler sched(**made);
  const int V = (*made)->weights().config.n_vocab;
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    RequestSpec s;
    s.id = "b" + std::to_string(i);
    s.prompt = test::RandomTokens(20, static_cast<std::uint64_t>(i), V);
    s.options = test::SpecOptions(3);
    SubmitError why = SubmitError::kOther;
    auto t = sched.Submit(s, &why);
    EXPECT_EQ(why, t.ok() ? SubmitError::kNone : SubmitError::kQueueFull)
        << "the type, not the text";
    if (!t.ok()) {
      ++refused;
      EXPECT_EQ(t.status().code(), Status::Code::kRuntime);
      EXPECT_NE(t.status().ToString().find("queue full: 3 waiting (--queue-depth 3)"),
                std::string::npos)
          << t.status().ToString();
    }
    EXPECT_LE(sched.counters().queue_depth, 3);
  }
  EXPECT_EQ(refused, 3) << "2 slots + 3 waiting of 8";
  EXPECT_EQ(sched.counters().max_queue_depth, 3);
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  auto done = sched.TakeFinished();
  EXPECT_EQ(done.size(), 5u);
  for (const RequestResult& r : done) EXPECT_EQ(r.end, RequestEnd::kFinished) << r.id;
}

}  // namespace
}  // namespace lockstep
