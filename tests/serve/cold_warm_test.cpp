// Must show 2 (issue 22): cold vs warm. A = P(1000) + X, then B = P(1000) + Y on an engine with
// the prefix cache (prefill chunk 64): B reuses the deepest snapshot inside the shared prefix
// (960 on a 64 grid, 896 on a 128 grid: never between snapshots), computes only the rest of its
// prefill, and its tokens, window path fields and every state item of every checkpoint are
// bitwise B on a cold engine. A request that drafts without MTP never hits an MTP entry.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "engine/slot_state_util.h"
#include "lockstep/engine/prefix_cache.h"
#include "lockstep/engine/scheduler.h"
#include "test_util.h"

namespace lockstep {
namespace {

struct Request {
  RequestResult res;
  test::ItemRecorder rec;
};

EngineConfig Config(const std::string& preset, DType kv, bool prefix_cache, int snapshot_every) {
  EngineConfig c;
  c.model = test::ModelDir(preset);
  c.threads = 2;
  c.slots = 2;
  c.prefill_chunk = 64;
  c.kv_dtype = kv;
  c.prefix_cache = prefix_cache;
  c.snapshot_every = snapshot_every;
  return c;
}

RequestOptions Options(bool mtp, int max_new) {
  RequestOptions o;
  o.max_new = max_new;
  o.ignore_eos = true;
  o.spec = 3;
  o.mtp = mtp;
  return o;
}

std::vector<std::int32_t> Join(const std::vector<std::int32_t>& a,
                               const std::vector<std::int32_t>& b) {
  std::vector<std::int32_t> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Runs one request to its end on `s`, recording every state item of every window.
void RunOn(Scheduler& s, const std::vector<std::int32_t>& prompt, const RequestOptions& opts,
           Request* out) {
  RequestSpec spec;
  spec.id = "r";
  spec.prompt = prompt;
  spec.options = opts;
  spec.hooks.observer = &out->rec;
  auto t = s.Submit(std::move(spec));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(s.RunUntilIdle().ok());
  auto done = s.TakeFinished();
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done[0].status.ok()) << done[0].status.ToString();
  out->res = std::move(done[0]);
}

void RunCold(const EngineConfig& cfg, const std::string& preset,
             const std::vector<std::int32_t>& prompt, const RequestOptions& opts, Request* out) {
  EngineConfig cold = cfg;
  cold.prefix_cache = false;
  auto e = Engine::Create(cold, test::Model(preset));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Scheduler s(**e);
  RunOn(s, prompt, opts, out);
}

void ExpectSamePath(const std::vector<WindowRecord>& a, const std::vector<WindowRecord>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].p, b[i].p) << i;
    EXPECT_EQ(a[i].T, b[i].T) << i;
    EXPECT_EQ(a[i].draft, b[i].draft) << i;
    EXPECT_EQ(a[i].accepted, b[i].accepted) << i;
    EXPECT_EQ(a[i].emitted, b[i].emitted) << i;
    EXPECT_EQ(a[i].source, b[i].source) << i;
    EXPECT_EQ(a[i].T_mtp, b[i].T_mtp) << i;
  }
}

void ExpectWarmEqualsCold(const Request& warm, const Request& cold) {
  EXPECT_EQ(warm.res.result.output, cold.res.result.output);
  ExpectSamePath(warm.rec.windows, cold.rec.windows);
  EXPECT_FALSE(warm.rec.items.empty());
  EXPECT_EQ(warm.rec.items.size(), cold.rec.items.size());
  EXPECT_EQ(test::DifferingItems(warm.rec, cold.rec), std::vector<std::string>{});
  EXPECT_EQ(cold.res.prefix.snapshot_position, -1);
  EXPECT_EQ(cold.res.prefix.reused_tokens, 0);
}

struct Case {
  std::string preset;
  DType kv;
  int snapshot_every;
  int expect_reused;
};

class ColdWarm : public ::testing::TestWithParam<Case> {};

TEST_P(ColdWarm, SharedPrefixIsReusedUpToTheSnapshotBeforeItAndWarmEqualsCold) {
  const Case& c = GetParam();
  const EngineConfig cfg = Config(c.preset, c.kv, true, c.snapshot_every);
  const auto P = test::Tokens(1000, 101), X = test::Tokens(40, 102), Y = test::Tokens(41, 103);
  const auto A = Join(P, X), B = Join(P, Y);
  ASSERT_NE(A[1000], B[1000]);
  const RequestOptions opts = Options(true, 10);
  auto e = Engine::Create(cfg, test::Model(c.preset));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Scheduler s(**e);
  ASSERT_NE(s.prefix_cache(), nullptr);
  Request a, b, cold_b;
  RunOn(s, A, opts, &a);
  EXPECT_EQ(a.res.prefix.snapshot_position, -1);
  EXPECT_EQ(a.res.prefix.prefill_computed, static_cast<int>(A.size()) - 1);
  RunOn(s, B, opts, &b);
  const int n_b = static_cast<int>(B.size());
  EXPECT_EQ(b.res.prefix.snapshot_position, c.expect_reused);
  EXPECT_EQ(b.res.prefix.reused_tokens, c.expect_reused);
  EXPECT_EQ(b.res.prefix.prefill_computed, n_b - 1 - c.expect_reused);
  const PrefixCacheCounters k = s.prefix_cache()->counters();
  EXPECT_EQ(k.queries, 2);
  EXPECT_EQ(k.hits, 1);
  EXPECT_EQ(k.tokens_reused, c.expect_reused);
  EXPECT_EQ(k.evictions, 0);
  EXPECT_GT(k.snapshot_bytes, 0u);
  RunCold(cfg, c.preset, B, opts, &cold_b);
  ExpectWarmEqualsCold(b, cold_b);
  std::printf(
      "[ cold/warm ] %s kv=%s snapshot_every=%d: B prefill cold %.1f ms (%d rows), warm %.1f ms "
      "(%d rows, %d reused); cache: %lld queries, %lld hits, %lld entries, %.2f MiB held, "
      "%.2f MiB GDN copied\n",
      c.preset.c_str(), std::string(dtype_name(c.kv)).c_str(), c.snapshot_every,
      static_cast<double>(cold_b.res.result.prefill_ns) / 1e6, cold_b.res.prefix.prefill_computed,
      static_cast<double>(b.res.result.prefill_ns) / 1e6, b.res.prefix.prefill_computed,
      b.res.prefix.reused_tokens, static_cast<long long>(k.queries), static_cast<long long>(k.hits),
      static_cast<long long>(k.entries), static_cast<double>(k.bytes) / (1 << 20),
      static_cast<double>(k.snapshot_bytes) / (1 << 20));
}

INSTANTIATE_TEST_SUITE_P(Presets, ColdWarm,
                         ::testing::Values(Case{"tiny", DType::kF32, 64, 960},
                                           Case{"tiny", DType::kF32, 128, 896},
                                           Case{"small", DType::kI8, 64, 960}),
                         [](const auto& p) {
                           return p.param.preset + "_" + std::string(dtype_name(p.param.kv)) +
                                  "_every" + std::to_string(p.param.snapshot_every);
                         });

// B arrives while A is still decoding: B's slot shares A's pages (and the entries' pages) while
// both write their own rows; both are bitwise what they get on a cold engine. Pages of 100 rows
// are not aligned with the grid: the page holding rows 900-999 is shared at 960 and written by
// A's prefill after the snapshot and by B after its restore (copy on write on both sides).
TEST(ColdWarm, AWarmRequestBesideTheLiveRequestItSharesPagesWith) {
  EngineConfig cfg = Config("tiny", DType::kI8, true, 64);
  cfg.kv_page_rows = 100;
  const auto P = test::Tokens(1000, 141);
  const auto A = Join(P, test::Tokens(40, 142)), B = Join(P, test::Tokens(30, 143));
  auto e = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(e.ok());
  Scheduler s(**e);
  Request a, b, cold_a, cold_b;
  for (int k = 0; k < 2; ++k) {
    RequestSpec spec;
    spec.id = k == 0 ? "a" : "b";
    spec.prompt = k == 0 ? A : B;
    spec.options = Options(true, k == 0 ? 40 : 10);
    spec.hooks.observer = k == 0 ? &a.rec : &b.rec;
    spec.arrive_step = k == 0 ? 0 : 20;  // A's prefill (17 chunks, one a step) is done by then
    ASSERT_TRUE(s.Submit(std::move(spec)).ok());
  }
  ASSERT_TRUE(s.RunUntilIdle().ok());
  for (RequestResult& r : s.TakeFinished()) {
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    (r.id == "a" ? a : b).res = std::move(r);
  }
  EXPECT_EQ(b.res.slot, 1);  // A still held slot 0
  EXPECT_LT(b.res.admit_step, a.res.last_step);
  EXPECT_EQ(b.res.prefix.snapshot_position, 960);
  RunCold(cfg, "tiny", A, Options(true, 40), &cold_a);
  RunCold(cfg, "tiny", B, Options(true, 10), &cold_b);
  ExpectWarmEqualsCold(b, cold_b);
  EXPECT_EQ(a.res.result.output, cold_a.res.result.output);
  EXPECT_EQ(test::DifferingItems(a.rec, cold_a.rec), std::vector<std::string>{});
}

// C extends A's whole prompt: the deepest shared state is A's prefill end (1039), off the grid;
// C resumes at the grid point before it (1024) and computes the cold chunk [1024, 1088) itself.
TEST(ColdWarm, AnExtendedPromptResumesAtTheGridPointNotAtTheExactMatch) {
  const EngineConfig cfg = Config("tiny", DType::kF32, true, 64);
  const auto A = Join(test::Tokens(1000, 131), test::Tokens(40, 132));
  const auto C = Join(A, test::Tokens(50, 133));
  auto e = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(e.ok());
  Scheduler s(**e);
  Request a, c, cold_c;
  RunOn(s, A, Options(true, 6), &a);
  RunOn(s, C, Options(true, 6), &c);
  EXPECT_EQ(c.res.prefix.snapshot_position, 1024);
  EXPECT_EQ(c.res.prefix.prefill_computed, static_cast<int>(C.size()) - 1 - 1024);
  RunCold(cfg, "tiny", C, Options(true, 6), &cold_c);
  ExpectWarmEqualsCold(c, cold_c);
}

TEST(ColdWarm, AnMtpOffRequestDoesNotHitAnMtpEntry) {
  const EngineConfig cfg = Config("tiny", DType::kF32, true, 64);
  const auto P = test::Tokens(300, 111), X = test::Tokens(20, 112), Y = test::Tokens(21, 113),
             Z = test::Tokens(22, 114);
  auto e = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(e.ok());
  Scheduler s(**e);
  Request a, b, b2, cold_b, cold_b2;
  RunOn(s, Join(P, X), Options(true, 6), &a);
  RunOn(s, Join(P, Y), Options(false, 6), &b);  // MTP off: the MTP entries are not its
  EXPECT_EQ(b.res.prefix.snapshot_position, -1);
  EXPECT_EQ(b.res.prefix.prefill_computed, static_cast<int>(P.size() + Y.size()) - 1);
  RunCold(cfg, "tiny", Join(P, Y), Options(false, 6), &cold_b);
  ExpectWarmEqualsCold(b, cold_b);
  // A second MTP-off request finds what the first stored: 256 (the last 64-multiple <= 299).
  RunOn(s, Join(P, Z), Options(false, 6), &b2);
  EXPECT_EQ(b2.res.prefix.snapshot_position, 256);
  RunCold(cfg, "tiny", Join(P, Z), Options(false, 6), &cold_b2);
  ExpectWarmEqualsCold(b2, cold_b2);
  EXPECT_EQ(s.prefix_cache()->counters().hits, 1);
}

// A budget smaller than A's entries (1 MiB; A's 16 entries reference 2 MiB of pages). While A
// lives its pages are not charged (evicting would free none of them), so B, arriving while A
// decodes, still finds the snapshot at 960; once both end, least recently used entries go until
// the rest fits. Eviction only drops references: B is bitwise cold, so is A.
TEST(ColdWarm, EvictionUnderTheBudgetChargesOnlyPagesNoLiveSlotHolds) {
  EngineConfig cfg = Config("tiny", DType::kF32, true, 64);
  cfg.prefix_cache_mib = 1;
  const auto P = test::Tokens(1000, 151);
  const auto A = Join(P, test::Tokens(40, 152)), B = Join(P, test::Tokens(40, 153));
  auto e = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(e.ok());
  Scheduler s(**e);
  Request a, b, cold_a, cold_b;
  for (int k = 0; k < 2; ++k) {
    RequestSpec spec;
    spec.id = k == 0 ? "a" : "b";
    spec.prompt = k == 0 ? A : B;
    spec.options = Options(true, k == 0 ? 30 : 6);
    spec.hooks.observer = k == 0 ? &a.rec : &b.rec;
    spec.arrive_step = k == 0 ? 0 : 20;
    ASSERT_TRUE(s.Submit(std::move(spec)).ok());
  }
  ASSERT_TRUE(s.RunUntilIdle().ok());
  for (RequestResult& r : s.TakeFinished()) (r.id == "a" ? a : b).res = std::move(r);
  EXPECT_EQ(b.res.prefix.snapshot_position, 960);
  const PrefixCacheCounters k = s.prefix_cache()->counters();
  EXPECT_GT(k.evictions, 0);
  EXPECT_LE(k.bytes, 1u << 20);
  EXPECT_EQ(k.entries + k.evictions, k.inserts);
  RunCold(cfg, "tiny", A, Options(true, 30), &cold_a);
  RunCold(cfg, "tiny", B, Options(true, 6), &cold_b);
  ExpectWarmEqualsCold(b, cold_b);
  EXPECT_EQ(test::DifferingItems(a.rec, cold_a.rec), std::vector<std::string>{});
}

TEST(ColdWarm, PrefixCacheOffIsACold) {
  const EngineConfig cfg = Config("tiny", DType::kF32, false, 64);
  const auto P = test::Tokens(200, 121);
  auto e = Engine::Create(cfg, test::Model("tiny"));
  ASSERT_TRUE(e.ok());
  Scheduler s(**e);
  EXPECT_EQ(s.prefix_cache(), nullptr);
  Request a, b;
  RunOn(s, Join(P, test::Tokens(10, 122)), Options(true, 4), &a);
  RunOn(s, Join(P, test::Tokens(10, 123)), Options(true, 4), &b);
  EXPECT_EQ(b.res.prefix.snapshot_position, -1);
  EXPECT_EQ(b.res.prefix.reused_tokens, 0);
  EXPECT_EQ(b.res.prefix.prefill_computed, 209);
}

}  // namespace
}  // namespace lockstep
