// Preemption (issue 40, Must show 2): a target request among 7 background requests (6 slots, so
// some wait) is preempted at seeded random points by the RequestSpec::preempt_at test hook,
// after prefill chunks and after decode windows, spec 4 with MTP and suffix drafts, and resumes
// by recompute from a prefix-cache snapshot, from position 0 (cache bypassed) or from the slot
// file written at preemption. Each time its tokens, window path fields and every exported item
// are bitwise its solo run (StateDiff at NRMSE 0 / KL 0) and its export records each preemption
// (root attribute `preemptions`). Then the two scheduler triggers: a higher-priority arrival
// takes a lower-priority request's slot (kPriority) or its memory (kMemory), and the preempted
// request still ends with its solo tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "lockstep/compare/export_reader.h"
#include "serve/serve_util.h"
#include "test_util.h"

namespace lockstep {
namespace {

constexpr int kChunk = 16;
constexpr const char* kPreset = "tiny-induction";

enum class Mode { kSnapshot, kScratch, kSlotFile };

// The target: a repeated block (suffix drafts hit) and a random tail; 3 to 10 prefill chunks.
RequestSpec Target(std::mt19937_64& rng, int V) {
  RequestSpec s;
  s.id = "target";
  const auto block = test::RandomTokens(std::uniform_int_distribution<int>(12, 30)(rng), rng(), V);
  for (int k = 0; k < 3; ++k) s.prompt.insert(s.prompt.end(), block.begin(), block.end());
  const auto tail = test::RandomTokens(std::uniform_int_distribution<int>(8, 60)(rng), rng(), V);
  s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
  s.options = test::SpecOptions(std::uniform_int_distribution<int>(16, 24)(rng));
  return s;
}

// Seeded preemption points: one or two after prefill chunks, one or two after windows.
std::vector<PreemptAt> Points(std::mt19937_64& rng, const RequestSpec& t) {
  const int chunks = (static_cast<int>(t.prompt.size()) - 1 + kChunk - 1) / kChunk;
  std::vector<PreemptAt> at;
  std::uniform_int_distribution<int> hold(0, 3);
  const int n_prefill = std::uniform_int_distribution<int>(1, 2)(rng);
  for (int i = 0; i < n_prefill; ++i)
    at.push_back({false, std::uniform_int_distribution<int>(0, chunks - 1)(rng), hold(rng)});
  at.push_back({true, std::uniform_int_distribution<int>(0, 2)(rng), hold(rng)});
  at.push_back({true, std::uniform_int_distribution<int>(3, 6)(rng), hold(rng)});
  return at;
}

std::vector<test::ServeRequest> Mixed(const RequestSpec& target, std::uint64_t seed, int V,
                                      const std::string& export_path) {
  std::mt19937_64 rng(seed * 7919);
  std::vector<test::ServeRequest> reqs;
  const int target_at = std::uniform_int_distribution<int>(0, 7)(rng);
  for (int i = 0; i < 8; ++i) {
    test::ServeRequest q;
    if (i == target_at) {
      q.spec = target;
      q.spec.arrive_step = std::uniform_int_distribution<int>(0, 6)(rng);
      q.export_path = export_path;
    } else {
      q.spec.id = "bg" + std::to_string(i);
      q.spec.prompt =
          test::RandomTokens(std::uniform_int_distribution<int>(20, 100)(rng), rng(), V);
      q.spec.options = test::SpecOptions(std::uniform_int_distribution<int>(8, 16)(rng));
      q.spec.arrive_step = std::uniform_int_distribution<int>(0, 12)(rng);
    }
    reqs.push_back(std::move(q));
  }
  return reqs;
}

const RequestResult& ById(const test::ServeRun& run, const std::string& id) {
  for (const RequestResult& r : run.results)
    if (r.id == id) return r;
  return run.results.front();
}

struct Tally {
  int prefill = 0, decode = 0, snapshot = 0, scratch = 0, slot_file = 0, recomputed = 0;
  int shared = 0;  // target windows whose step carried other requests' rows
};

// One seed: the target alone, then among 7 others with its preemption points; asserts the
// bitwise equality and the records. Returns what it saw.
Tally RunSeed(std::uint64_t seed, Mode mode, const EngineConfig& cfg, int V) {
  Tally tally;
  std::mt19937_64 rng(seed);
  RequestSpec target = Target(rng, V);
  target.use_prefix_cache = mode != Mode::kScratch;
  const std::vector<PreemptAt> points = Points(rng, target);
  const std::string dir = test::NewDir("preempt" + std::to_string(seed));
  std::vector<test::ServeRequest> one(1);
  one[0].spec = target;
  one[0].export_path = dir + "/alone.h5";
  const test::ServeRun solo = test::RunRequests(cfg, std::move(one));
  const RequestResult& alone = solo.results.at(0);
  EXPECT_EQ(alone.end, RequestEnd::kFinished) << alone.status.ToString();
  EXPECT_TRUE(alone.preemptions.empty());

  target.preempt_at = points;
  SchedulerOptions so;
  if (mode == Mode::kSlotFile) so.preempt_slot_dir = dir;
  const std::string path = dir + "/mixed.h5";
  const test::ServeRun run = test::RunRequests(cfg, Mixed(target, seed, V, path), so);
  const RequestResult& t = ById(run, "target");
  EXPECT_EQ(t.end, RequestEnd::kFinished) << t.status.ToString();
  EXPECT_EQ(t.result.output, alone.result.output);
  EXPECT_EQ(t.result.windows.size(), alone.result.windows.size());
  for (std::size_t i = 0; i < std::min(t.result.windows.size(), alone.result.windows.size()); ++i)
    EXPECT_TRUE(t.result.windows[i].SamePath(alone.result.windows[i])) << "window " << i;
  for (const WindowRecord& w : t.result.windows) tally.shared += w.step_seqs > 1 ? 1 : 0;
  for (const RequestResult& r : run.results)
    EXPECT_EQ(r.end, RequestEnd::kFinished) << r.id << ": " << r.status.ToString();
  EXPECT_GE(t.preemptions.size(), 2u) << "the hook preempted too little";
  EXPECT_EQ(run.counters.preempted, static_cast<std::int64_t>(t.preemptions.size()));
  EXPECT_EQ(run.counters.resumed, run.counters.preempted);
  for (const PreemptionRecord& p : t.preemptions) {
    EXPECT_EQ(p.reason, PreemptReason::kTest);
    EXPECT_GE(p.resume_step, p.step);
    EXPECT_EQ(p.windows_diverged, 0);
    EXPECT_EQ(p.windows_replayed, p.decode && p.from != ResumeFrom::kSlotFile ? p.window : 0);
    (p.decode ? tally.decode : tally.prefill)++;
    tally.recomputed += p.tokens_recomputed;
    switch (p.from) {
      case ResumeFrom::kSnapshot:
        ++tally.snapshot;
        EXPECT_GT(p.from_position, 0);
        break;
      case ResumeFrom::kScratch:
        ++tally.scratch;
        EXPECT_EQ(p.from_position, 0);
        EXPECT_EQ(p.tokens_recomputed > 0, p.position > 0);
        break;
      case ResumeFrom::kSlotFile:
        ++tally.slot_file;
        EXPECT_EQ(p.from_position, p.position);
        EXPECT_EQ(p.tokens_recomputed, 0);
        break;
    }
    if (mode == Mode::kScratch) {
      EXPECT_EQ(p.from, ResumeFrom::kScratch);
    }
    if (mode == Mode::kSlotFile) {
      EXPECT_EQ(p.from, ResumeFrom::kSlotFile);
    }
  }
  // Every exported item bitwise the solo run's.
  const DiffResult d = test::DiffExact(dir + "/alone.h5", path);
  EXPECT_TRUE(d.Passed()) << d.failed << " items differ; " << d.vacuous;
  EXPECT_GT(d.compared, 0);
  // The export records each preemption, as the result does.
  auto reader = ExportReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (reader.ok()) {
    const auto j = nlohmann::json::parse((*reader)->meta().preemptions, nullptr, false);
    EXPECT_TRUE(j.is_array()) << (*reader)->meta().preemptions;
    EXPECT_EQ(j.is_array() ? j.size() : 0u, t.preemptions.size());
    for (std::size_t i = 0; j.is_array() && i < std::min(j.size(), t.preemptions.size()); ++i) {
      const PreemptionRecord& p = t.preemptions[i];
      EXPECT_EQ(j[i].value("phase", ""), p.decode ? "decode" : "prefill");
      EXPECT_EQ(j[i].value("reason", ""), "test");
      EXPECT_EQ(j[i].value("step", -2), p.step);
      EXPECT_EQ(j[i].value("resumed_from", ""), ResumeFromName(p.from));
      EXPECT_EQ(j[i].value("tokens_recomputed", -1), p.tokens_recomputed);
    }
    auto solo_reader = ExportReader::Open(dir + "/alone.h5");
    EXPECT_TRUE(solo_reader.ok() && (*solo_reader)->meta().preemptions.empty());
  }
  std::printf("preempt seed %d (%s): %zu preemptions, %zu windows, %d items equal, %d recomputed\n",
              static_cast<int>(seed),
              mode == Mode::kSnapshot  ? "snapshot"
              : mode == Mode::kScratch ? "scratch"
                                       : "slot file",
              t.preemptions.size(), t.result.windows.size(), d.passed, tally.recomputed);
  return tally;
}

TEST(Preempt, SeededPreemptionsAreBitwiseTheSoloRun) {
  EngineConfig cfg = test::ServeConfig(6, kChunk, kPreset);
  cfg.prefix_cache = true;
  const int V = test::Model(kPreset).config.n_vocab;
  Tally all;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    const Mode mode = seed % 4 == 0   ? Mode::kSlotFile
                      : seed % 2 == 0 ? Mode::kScratch
                                      : Mode::kSnapshot;
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Tally t = RunSeed(seed, mode, cfg, V);
    all.prefill += t.prefill;
    all.decode += t.decode;
    all.snapshot += t.snapshot;
    all.scratch += t.scratch;
    all.slot_file += t.slot_file;
    all.recomputed += t.recomputed;
    all.shared += t.shared;
  }
  std::printf(
      "preempt: %d prefill + %d decode preemptions (%d snapshot, %d scratch, %d slot file), "
      "%d positions recomputed, %.1f s\n",
      all.prefill, all.decode, all.snapshot, all.scratch, all.slot_file, all.recomputed,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_GE(all.prefill + all.decode, 20);
  EXPECT_GE(all.prefill, 5);
  EXPECT_GE(all.decode, 5);
  EXPECT_GT(all.snapshot, 0);
  EXPECT_GT(all.scratch, 0);
  EXPECT_GT(all.slot_file, 0);
  EXPECT_GT(all.recomputed, 0);
  EXPECT_GT(all.shared, 0) << "the target never shared a step with the background requests";
  std::printf("preempt: %d target windows shared a step\n", all.shared);
}

// Solo outputs of `reqs` (each alone on a fresh engine of `cfg`).
std::vector<std::vector<std::int32_t>> SoloOutputs(const EngineConfig& cfg,
                                                   const std::vector<test::ServeRequest>& reqs) {
  std::vector<std::vector<std::int32_t>> out;
  for (const test::ServeRequest& q : reqs) {
    std::vector<test::ServeRequest> one{q};
    one[0].spec.arrive_step = 0;
    one[0].spec.priority = 0;
    out.push_back(test::RunRequests(cfg, std::move(one)).results.at(0).result.output);
  }
  return out;
}

test::ServeRequest Request(const std::string& id, int n, int max_new, std::uint64_t seed, int V,
                           int priority, int arrive) {
  test::ServeRequest q;
  q.spec.id = id;
  q.spec.prompt = test::RandomTokens(n, seed, V);
  q.spec.options = test::SpecOptions(max_new);
  q.spec.priority = priority;
  q.spec.arrive_step = arrive;
  return q;
}

// Two slots held by priority-0 requests; a priority-1 request arriving at step 6 preempts the
// later admitted one (kPriority) and is admitted at once; the preempted one resumes and ends
// with its solo tokens.
TEST(Preempt, HigherPriorityTakesTheSlotOfTheLatestLowerPriorityRequest) {
  const EngineConfig cfg = test::ServeConfig(2, kChunk, kPreset);
  const int V = test::Model(kPreset).config.n_vocab;
  std::vector<test::ServeRequest> reqs = {Request("low0", 60, 20, 1, V, 0, 0),
                                          Request("low1", 70, 20, 2, V, 0, 0),
                                          Request("high", 40, 8, 3, V, 1, 6)};
  const auto solo = SoloOutputs(cfg, reqs);
  const test::ServeRun run = test::RunRequests(cfg, reqs);
  ASSERT_EQ(run.results.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(run.results[i].end, RequestEnd::kFinished) << run.results[i].status.ToString();
    EXPECT_EQ(run.results[i].result.output, solo[i]) << run.results[i].id;
  }
  EXPECT_TRUE(run.results[0].preemptions.empty());
  ASSERT_EQ(run.results[1].preemptions.size(), 1u);
  EXPECT_EQ(run.results[1].preemptions[0].reason, PreemptReason::kPriority);
  EXPECT_EQ(run.results[1].preemptions[0].step, 6);
  EXPECT_EQ(run.results[2].admit_step, 6);
  EXPECT_EQ(run.counters.preempted, 1);
}

// Memory: --memory-mib fits two of these reservations, not three, with four slots free. A
// priority-1 arrival preempts a priority-0 request for its memory (kMemory); equal priorities
// never preempt (the control: the same arrival at priority 0 waits).
TEST(Preempt, MemoryPressurePreemptsOnlyForAHigherPriority) {
  EngineConfig cfg = test::ServeConfig(4, kChunk, kPreset);
  const int V = test::Model(kPreset).config.n_vocab;
  auto engine = Engine::Create(cfg, test::Model(kPreset));
  ASSERT_TRUE(engine.ok());
  Scheduler probe(**engine);
  int n = 0, mib = 0;
  for (int len = 100; len <= 8000 && mib == 0; len += 100) {
    const std::uint64_t r = probe.ReservationBytes(Request("x", len, 16, 1, V, 0, 0).spec);
    const std::uint64_t m = (2 * r + (1u << 20) - 1) >> 20;
    if ((m << 20) < 3 * r) n = len, mib = static_cast<int>(m);
  }
  ASSERT_GT(mib, 0) << "no prompt length gives a limit between 2 and 3 reservations";
  cfg.memory_mib = mib;
  for (int priority : {1, 0}) {
    SCOPED_TRACE("arrival priority " + std::to_string(priority));
    std::vector<test::ServeRequest> reqs = {Request("low0", n, 16, 1, V, 0, 0),
                                            Request("low1", n, 16, 2, V, 0, 0),
                                            Request("late", n, 16, 3, V, priority, 3)};
    const test::ServeRun run = test::RunRequests(cfg, reqs);
    ASSERT_EQ(run.results.size(), 3u);
    for (const RequestResult& r : run.results)
      EXPECT_EQ(r.end, RequestEnd::kFinished) << r.id << ": " << r.status.ToString();
    if (priority == 1) {
      ASSERT_EQ(run.results[1].preemptions.size(), 1u);
      EXPECT_EQ(run.results[1].preemptions[0].reason, PreemptReason::kMemory);
      EXPECT_EQ(run.results[2].admit_step, 3);
      const auto solo = SoloOutputs(cfg, reqs);
      for (std::size_t i = 0; i < 3; ++i)
        EXPECT_EQ(run.results[i].result.output, solo[i]) << run.results[i].id;
    } else {
      EXPECT_EQ(run.counters.preempted, 0);
      EXPECT_GT(run.results[2].admit_step, 3);
    }
    EXPECT_LE(run.counters.max_reserved_bytes, static_cast<std::uint64_t>(mib) << 20);
  }
}

}  // namespace
}  // namespace lockstep
