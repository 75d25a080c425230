// The needle test on state (issue 22, Must show 1): a target request alone vs the same request
// at a random position among 1, 3, 7 and 15 background requests of random lengths (prompts of
// 50-2,000 tokens) arriving at random steps, spec 4 with MTP and suffix drafts under the static
// policy: its tokens, window path fields and every exported state item are bitwise equal
// (StateDiff at NRMSE 0 / KL 0, and once through `lockstep diff --nrmse-max 0 --kl-max 0`),
// over seeds 1, 2, 3. The control: with batch_invariant off (fuse_all: one GEMM over every row
// of a step) the same comparison finds differences, reported against the default thresholds.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "serve/serve_util.h"
#include "test_util.h"

namespace lockstep {
namespace {

constexpr int kChunk = 64;
// The induction variant copies from its context, so suffix drafts of the repeated block hit.
constexpr const char* kPreset = "tiny-induction";

// The target: a repeated block (suffix drafts find matches) and a random tail.
RequestSpec Target(std::mt19937_64& rng, int V) {
  RequestSpec s;
  s.id = "target";
  const auto block = test::RandomTokens(std::uniform_int_distribution<int>(20, 60)(rng), rng(), V);
  for (int k = 0; k < 3; ++k) s.prompt.insert(s.prompt.end(), block.begin(), block.end());
  const auto tail = test::RandomTokens(std::uniform_int_distribution<int>(10, 200)(rng), rng(), V);
  s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
  s.options = test::SpecOptions(std::uniform_int_distribution<int>(16, 24)(rng));
  return s;
}

std::vector<test::ServeRequest> Mixed(const RequestSpec& target, int n_bg, std::uint64_t seed,
                                      int V, const std::string& export_path) {
  std::mt19937_64 rng(seed * 1000 + static_cast<std::uint64_t>(n_bg));
  std::vector<test::ServeRequest> reqs;
  const int target_at = std::uniform_int_distribution<int>(0, n_bg)(rng);
  for (int i = 0; i <= n_bg; ++i) {
    test::ServeRequest q;
    if (i == target_at) {
      q.spec = target;
      q.spec.arrive_step = std::uniform_int_distribution<int>(0, 20)(rng);
      q.export_path = export_path;
    } else {
      q.spec.id = "bg" + std::to_string(i);
      q.spec.prompt =
          test::RandomTokens(std::uniform_int_distribution<int>(50, 2000)(rng), rng(), V);
      q.spec.options = test::SpecOptions(std::uniform_int_distribution<int>(8, 24)(rng));
      q.spec.arrive_step = std::uniform_int_distribution<int>(0, 40)(rng);
    }
    reqs.push_back(std::move(q));
  }
  return reqs;
}

const RequestResult& TargetOf(const test::ServeRun& run) {
  for (const RequestResult& r : run.results)
    if (r.id == "target") return r;
  return run.results.front();
}

std::string Alone(const EngineConfig& cfg, const RequestSpec& target, const std::string& dir,
                  RequestResult* out) {
  const std::string path = dir + "/alone.h5";
  std::vector<test::ServeRequest> one(1);
  one[0].spec = target;
  one[0].export_path = path;
  test::ServeRun run = test::RunRequests(cfg, std::move(one));
  *out = run.results.at(0);
  return path;
}

// Shared by the test and the control: the target alone and among n_bg others.
struct Pair {
  RequestResult alone, mixed;
  std::string alone_path, mixed_path;
  int shared_windows = 0;  // target windows whose step carried other requests
};

TEST(Needle, TheTargetIsBitwiseItselfAmongBackgroundRequests) {
  const EngineConfig cfg = test::ServeConfig(16, kChunk, kPreset);
  const int V = test::Model(kPreset).config.n_vocab;
  bool ran_cli = false, saw_suffix = false, saw_mtp = false;
  for (std::uint64_t seed : {1, 2, 3}) {
    std::mt19937_64 rng(seed);
    const RequestSpec target = Target(rng, V);
    const std::string dir = test::NewDir("needle" + std::to_string(seed));
    RequestResult alone;
    const std::string alone_path = Alone(cfg, target, dir, &alone);
    ASSERT_EQ(alone.end, RequestEnd::kFinished) << alone.status.ToString();
    for (const WindowRecord& w : alone.result.windows) {
      saw_suffix |= w.from_sfx;
      saw_mtp |= w.T_mtp > 0;
    }
    for (int n_bg : {1, 3, 7, 15}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(n_bg) + " background");
      const std::string path = dir + "/mixed" + std::to_string(n_bg) + ".h5";
      const auto t0 = std::chrono::steady_clock::now();
      test::ServeRun run = test::RunRequests(cfg, Mixed(target, n_bg, seed, V, path));
      const RequestResult& t = TargetOf(run);
      ASSERT_EQ(t.end, RequestEnd::kFinished) << t.status.ToString();
      EXPECT_EQ(t.result.output, alone.result.output);
      ASSERT_EQ(t.result.windows.size(), alone.result.windows.size());
      int shared = 0;
      for (std::size_t i = 0; i < t.result.windows.size(); ++i) {
        EXPECT_TRUE(t.result.windows[i].SamePath(alone.result.windows[i])) << "window " << i;
        shared += t.result.windows[i].step_seqs > 1;
      }
      for (const RequestResult& r : run.results)
        EXPECT_EQ(r.end, RequestEnd::kFinished) << r.id << ": " << r.status.ToString();
      if (n_bg >= 3) {
        EXPECT_GT(shared, 0) << "the target never shared a step";
      }
      const auto t1 = std::chrono::steady_clock::now();
      const DiffResult d = test::DiffExact(alone_path, path);
      const auto t2 = std::chrono::steady_clock::now();
      EXPECT_TRUE(d.Passed()) << d.failed << " items differ; " << d.vacuous;
      EXPECT_GT(d.compared, 0);
      std::printf(
          "needle seed %d, %2d background: %zu windows (%d shared a step), %d items "
          "equal; %lld steps, run %.1f s, diff %.1f s\n",
          static_cast<int>(seed), n_bg, t.result.windows.size(), shared, d.passed,
          static_cast<long long>(run.counters.steps),
          std::chrono::duration<double>(t1 - t0).count(),
          std::chrono::duration<double>(t2 - t1).count());
      if (!ran_cli && n_bg == 15) {
        ran_cli = true;
        const test::CmdResult c =
            test::RunLockstep("diff " + alone_path + " " + path + " --nrmse-max 0 --kl-max 0");
        EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
      }
    }
  }
  EXPECT_TRUE(saw_suffix) << "no target window drafted from the suffix index";
  EXPECT_TRUE(saw_mtp) << "no target window drafted with the MTP head";
}

TEST(Needle, ControlWithBatchInvariantOffFindsDifferences) {
  EngineConfig cfg = test::ServeConfig(16, kChunk, kPreset);
  cfg.batch_invariant = false;
  const int V = test::Model(kPreset).config.n_vocab;
  std::mt19937_64 rng(1);
  const RequestSpec target = Target(rng, V);
  const std::string dir = test::NewDir("needle_off");
  RequestResult alone;
  const std::string alone_path = Alone(cfg, target, dir, &alone);
  const std::string path = dir + "/mixed15.h5";
  test::ServeRun run = test::RunRequests(cfg, Mixed(target, 15, 1, V, path));
  const DiffResult d = test::DiffExact(alone_path, path);
  const test::DiffMax m = test::MaxOf(d);
  const Thresholds defaults;
  std::printf(
      "control (batch_invariant off, seed 1, 15 background): %d of %d items differ; "
      "max NRMSE %.3g (default threshold %.0e), max logits KL %.3g (default %.0e); "
      "tokens %s\n",
      m.failed, m.compared, m.nrmse, defaults.nrmse_max, m.kl, defaults.kl_max,
      TargetOf(run).result.output == alone.result.output ? "equal" : "differ");
  EXPECT_FALSE(d.Passed()) << "fuse_all left the target bitwise itself";
  EXPECT_GT(m.failed, 0);
}

}  // namespace
}  // namespace lockstep
