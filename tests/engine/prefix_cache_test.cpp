// The prefix cache (prefix_cache.h) and the slot snapshots under it (Engine::SnapshotSlot /
// OpenSlotFrom): deepest grid snapshot <= n-1, keyed by MTP use, token compare (never the
// hash), LRU eviction under the budget with its counters, and a slot restored from a snapshot
// continuing bitwise like the slot it was taken from (all or nothing on a bad snapshot).
#include "lockstep/engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/slot_state_util.h"
#include "lockstep/engine/engine.h"
#include "test_util.h"

namespace lockstep {
namespace {

// An entry for prompt[0, s] whose snapshot holds one GDN checkpoint of `gdn_floats` floats and,
// when `kv` is given, its K/V prefix of s rows.
PrefixEntry Entry(const std::vector<std::int32_t>& prompt, int s, bool mtp,
                  std::size_t gdn_floats = 0, const KvCache* kv = nullptr) {
  PrefixEntry e;
  e.tokens.assign(prompt.begin(), prompt.begin() + s + 1);
  e.uses_mtp = mtp;
  e.snap.position = s;
  StageSlotSnapshot st;
  st.position = s;
  if (gdn_floats > 0) st.gdn.emplace_back(0, GdnCheckpoint{std::vector<float>(gdn_floats), {}});
  if (kv != nullptr) st.kv.emplace_back(1, kv->Prefix(s));
  e.snap.stages.push_back(std::move(st));
  return e;
}

TEST(PrefixCache, DeepestGridSnapshotAtMostNMinusOne) {
  PrefixCache pc(64, 1u << 30);
  const auto p = test::Tokens(300, 1);
  for (int s : {64, 128, 192, 256}) pc.Insert(Entry(p, s, false));
  // n = 257: s <= 256 -> 256. n = 256: s <= 255 -> 192 (256 would need token 256).
  auto q = std::vector<std::int32_t>(p.begin(), p.begin() + 257);
  ASSERT_NE(pc.Lookup(q, false), nullptr);
  EXPECT_EQ(pc.Lookup(q, false)->position(), 256);
  q.pop_back();
  EXPECT_EQ(pc.Lookup(q, false)->position(), 192);
  // A prompt that leaves P at 150 (token 150 differs): 128.
  auto r = std::vector<std::int32_t>(p.begin(), p.begin() + 200);
  r[150] = r[150] + 1;
  EXPECT_EQ(pc.Lookup(r, false)->position(), 128);
  // Differs at token 64: token 64 pins the snapshot at 64 too, so nothing hits.
  r[64] = r[64] + 1;
  EXPECT_EQ(pc.Lookup(r, false), nullptr);
  // Shorter than one grid step.
  EXPECT_EQ(pc.Lookup(std::vector<std::int32_t>(p.begin(), p.begin() + 64), false), nullptr);
  const PrefixCacheCounters c = pc.counters();
  EXPECT_EQ(c.queries, 6);
  EXPECT_EQ(c.hits, 4);  // the first 257-token lookup is counted too
  EXPECT_EQ(c.tokens_reused, 256 + 256 + 192 + 128);
  EXPECT_EQ(c.entries, 4);
}

TEST(PrefixCache, WantsOnlyGridPointsInsideThePromptNotYetStored) {
  PrefixCache pc(64, 1u << 30);
  const auto p = test::Tokens(129, 2);
  EXPECT_FALSE(pc.Wants(32, p, false));
  EXPECT_TRUE(pc.Wants(64, p, false));
  EXPECT_TRUE(pc.Wants(128, p, false));  // n - 1 = 128
  EXPECT_FALSE(pc.Wants(192, p, false));
  pc.Insert(Entry(p, 64, false));
  EXPECT_FALSE(pc.Wants(64, p, false));
  EXPECT_TRUE(pc.Wants(64, p, true));  // the MTP entry is another key
}

TEST(PrefixCache, KeyedByMtpUse) {
  PrefixCache pc(64, 1u << 30);
  const auto p = test::Tokens(200, 3);
  pc.Insert(Entry(p, 128, true));
  EXPECT_EQ(pc.Lookup(p, false), nullptr);
  ASSERT_NE(pc.Lookup(p, true), nullptr);
  EXPECT_TRUE(pc.Lookup(p, true)->uses_mtp);
  pc.Insert(Entry(p, 64, false));
  EXPECT_EQ(pc.Lookup(p, false)->position(), 64);
  EXPECT_EQ(pc.Lookup(p, true)->position(), 128);
}

TEST(PrefixCache, ComparesTokensNeverTrustsTheHash) {
  // Every key collides: only the token compare can tell entries apart.
  PrefixCache pc(64, 1u << 30, [](std::span<const std::int32_t>) { return std::uint64_t{42}; });
  const auto a = test::Tokens(200, 4);
  auto b = a;
  b[10] = b[10] + 1;
  pc.Insert(Entry(a, 128, false));
  EXPECT_EQ(pc.Lookup(b, false), nullptr);
  pc.Insert(Entry(b, 64, false));
  EXPECT_EQ(pc.Lookup(b, false)->position(), 64);
  EXPECT_EQ(pc.Lookup(a, false)->position(), 128);
  EXPECT_EQ(pc.Lookup(b, false)->tokens, std::vector<std::int32_t>(b.begin(), b.begin() + 65));
}

TEST(PrefixCache, LruEvictionUnderTheBudgetAndCounters) {
  const std::size_t floats = 1000;  // 4,000 bytes per entry
  PrefixCache pc(64, 3 * floats * sizeof(float));
  const auto a = test::Tokens(200, 5), b = test::Tokens(200, 6), c = test::Tokens(200, 7),
             d = test::Tokens(200, 8);
  pc.Insert(Entry(a, 64, false, floats));
  pc.Insert(Entry(b, 64, false, floats));
  pc.Insert(Entry(c, 64, false, floats));
  EXPECT_EQ(pc.bytes(), 3 * floats * sizeof(float));
  EXPECT_NE(pc.Lookup(a, false), nullptr);  // a is now more recent than b
  pc.Insert(Entry(d, 64, false, floats));   // over budget: b (least recently used) goes
  EXPECT_EQ(pc.Lookup(b, false), nullptr);
  EXPECT_NE(pc.Lookup(a, false), nullptr);
  EXPECT_NE(pc.Lookup(c, false), nullptr);
  EXPECT_NE(pc.Lookup(d, false), nullptr);
  const PrefixCacheCounters k = pc.counters();
  EXPECT_EQ(k.evictions, 1);
  EXPECT_EQ(k.entries, 3);
  EXPECT_EQ(k.inserts, 4);
  EXPECT_EQ(k.snapshot_bytes, 4 * floats * sizeof(float));
  EXPECT_EQ(k.bytes, 3 * floats * sizeof(float));
  EXPECT_EQ(k.queries, 5);
  EXPECT_EQ(k.hits, 4);
}

TEST(PrefixCache, PagesCountOnlyWhenNoLiveCacheHoldsThem) {
  const auto p = test::Tokens(200, 9);
  auto kv = std::make_unique<KvCache>(1, 4, DType::kF32, 16);
  std::vector<float> x(4 * 128, 1.0f);
  kv->Write(0, 128, x.data(), x.data());
  kv->Commit(128);
  const std::uint64_t page = kv->page_bytes();
  PrefixCache pc(64, 1u << 30);
  pc.Insert(Entry(p, 64, false, 0, kv.get()));   // pages 0-3
  pc.Insert(Entry(p, 128, false, 0, kv.get()));  // pages 0-7 (0-3 shared with the first entry)
  EXPECT_EQ(pc.bytes(), 0u);                     // the live cache holds every page
  kv.reset();                       // the slot ends: its pages now live in the entries only
  EXPECT_EQ(pc.bytes(), 8 * page);  // each page once, though two entries hold pages 0-3
  // A budget of 6 pages: the LRU entry (at 128) goes, the one at 64 keeps pages 0-3.
  PrefixCache small(64, 6 * page);
  auto kv2 = std::make_unique<KvCache>(1, 4, DType::kF32, 16);
  kv2->Write(0, 128, x.data(), x.data());
  kv2->Commit(128);
  small.Insert(Entry(p, 128, false, 0, kv2.get()));
  small.Insert(Entry(p, 64, false, 0, kv2.get()));
  kv2.reset();
  small.Trim();
  EXPECT_EQ(small.entries(), 1);
  EXPECT_EQ(small.counters().evictions, 1);
  EXPECT_EQ(small.bytes(), 4 * page);
  ASSERT_NE(small.Lookup(p, false), nullptr);
  EXPECT_EQ(small.Lookup(p, false)->position(), 64);
}

// ---- slot snapshots on a real engine ----

EngineConfig SnapConfig(DType kv) {
  EngineConfig c;
  c.model = test::ModelDir("tiny");
  c.threads = 2;
  c.slots = 3;
  c.prefill_chunk = 16;
  c.kv_dtype = kv;
  c.kv_page_rows = 32;
  return c;
}

// Prefill of prompt[0, n-1) with the MTP draft K/V of every chunk (row q pairs h_q with token
// q+1), like generate's prefill, starting at the engine's position.
void PrefillWithMtp(Engine& e, const std::vector<std::int32_t>& prompt, int end) {
  const int H = e.weights().config.n_embd, V = e.weights().config.n_vocab;
  std::vector<float> m, logits(static_cast<std::size_t>(V));
  const std::span<const std::int32_t> part(prompt.data() + e.position(),
                                           static_cast<std::size_t>(end - e.position()));
  ASSERT_TRUE(e.Prefill(part, [&](int p, int T, const float* normed) {
                 if (!e.has_mtp()) return Status::Ok();
                 m.resize(static_cast<std::size_t>(T) * static_cast<std::size_t>(H));
                 e.MtpForward(normed, prompt.data() + p + 1, p, T, ForwardMode::kPrefill, m.data(),
                              logits.data(), 1);
                 e.MtpCommit(p + T);
                 return Status::Ok();
               }).ok());
}

std::vector<float> VerifyLogits(Engine& e, const std::vector<std::int32_t>& window) {
  std::vector<float> logits(window.size() * static_cast<std::size_t>(e.weights().config.n_vocab));
  EXPECT_TRUE(e.Verify(window, logits.data()).ok());
  EXPECT_TRUE(e.Commit(static_cast<int>(window.size())).ok());
  return logits;
}

class SlotSnapshotTest : public ::testing::TestWithParam<DType> {};

TEST_P(SlotSnapshotTest, RestoredSlotContinuesBitwiseAndLeavesTheSourceAlone) {
  auto made = Engine::Create(SnapConfig(GetParam()), test::Model("tiny"));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Engine& e = **made;
  const auto prompt = test::Tokens(90, 11);
  const auto window = test::Tokens(3, 12);
  // Slot 0: prefill to 48 (a chunk end, mid page), snapshot, then on to 89 and a window.
  PrefillWithMtp(e, prompt, 48);
  auto snap = e.SnapshotSlot(0);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_EQ(snap->position, 48);
  EXPECT_GT(snap->bytes(), 0u);
  PrefillWithMtp(e, prompt, 89);
  const auto logits0 = VerifyLogits(e, window);
  const auto items0 = test::CurrentSlotItems(e);
  // Slot 1 from the snapshot: the same rest of the prefill and window give the same bits.
  ASSERT_TRUE(e.OpenSlotFrom(1, *snap).ok());
  e.UseSlot(1);
  EXPECT_EQ(e.position(), 48);
  EXPECT_EQ(e.mtp_position(), e.has_mtp() ? 48 : 0);
  PrefillWithMtp(e, prompt, 89);
  const auto logits1 = VerifyLogits(e, window);
  EXPECT_TRUE(test::BitwiseEqual(logits0, logits1));
  EXPECT_EQ(test::DifferingItems(items0, test::CurrentSlotItems(e)), std::vector<std::string>{});
  // And both equal a cold slot that never saw a snapshot (same chunk grid: 48 is on it).
  ASSERT_TRUE(e.OpenSlot(2).ok());
  e.UseSlot(2);
  PrefillWithMtp(e, prompt, 89);
  EXPECT_TRUE(test::BitwiseEqual(logits0, VerifyLogits(e, window)));
  EXPECT_EQ(test::DifferingItems(items0, test::CurrentSlotItems(e)), std::vector<std::string>{});
  // Slot 0 after slot 1's writes into the shared pages: unchanged.
  e.UseSlot(0);
  EXPECT_EQ(test::DifferingItems(items0, test::CurrentSlotItems(e)), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SlotSnapshotTest, ::testing::Values(DType::kF32, DType::kI8),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

TEST(SlotSnapshot, ABadSnapshotLeavesTheSlotClosedAndFresh) {
  auto made = Engine::Create(SnapConfig(DType::kF32), test::Model("tiny"));
  ASSERT_TRUE(made.ok());
  Engine& e = **made;
  const auto prompt = test::Tokens(40, 13);
  PrefillWithMtp(e, prompt, 32);
  auto snap = e.SnapshotSlot(0);
  ASSERT_TRUE(snap.ok());
  // The last stage's GDN checkpoint is truncated: earlier stages restore, then it fails.
  Engine::SlotSnapshot bad = *snap;
  StageSlotSnapshot* last_gdn = nullptr;
  for (auto& s : bad.stages)
    if (!s.gdn.empty()) last_gdn = &s;
  ASSERT_NE(last_gdn, nullptr);
  last_gdn->gdn.back().second.ssm.pop_back();
  EXPECT_FALSE(e.OpenSlotFrom(1, bad).ok());
  EXPECT_FALSE(e.slot_open(1));
  // Too few stages: refused before anything.
  bad = *snap;
  bad.stages.pop_back();
  EXPECT_EQ(e.OpenSlotFrom(1, bad).code(), Status::Code::kInvalidArgument);
  // The slot opens cold afterwards, with nothing of the failed restore left.
  ASSERT_TRUE(e.OpenSlot(1).ok());
  e.UseSlot(1);
  EXPECT_EQ(e.position(), 0);
  for (int is = 0; is < e.n_stages(); ++is)
    for (int il = 0; il < e.weights().config.n_layers; ++il)
      if (KvCache* kv = e.stage(is).kv(il)) {
        EXPECT_EQ(kv->rows_written(), 0);
      }
  // A slot with a pending window cannot be snapshot.
  e.UseSlot(0);
  std::vector<float> logits(static_cast<std::size_t>(e.weights().config.n_vocab));
  ASSERT_TRUE(e.Verify(std::vector<std::int32_t>{prompt[32]}, logits.data()).ok());
  EXPECT_FALSE(e.SnapshotSlot(0).ok());
}

}  // namespace
}  // namespace lockstep
