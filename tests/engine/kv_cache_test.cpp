// Paged K/V cache: committed vs speculative rows, paging, storage dtypes, shared prefixes with
// copy on write, NaN poison of fresh pages, and the GDN state's checkpoint vs scratch.
#include "lockstep/engine/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "lockstep/engine/gdn_state.h"
#include "lockstep/engine/poison.h"
#include "test_util.h"

namespace lockstep {
namespace {

TEST(KvCache, CommittedSpeculativeAndTail) {
  KvCache kv(2, 8, DType::kF32, 4);
  auto k = test::Random(10 * 16, 1), v = test::Random(10 * 16, 2);
  kv.Write(0, 5, k.data(), v.data());
  EXPECT_EQ(kv.rows_committed(), 0);
  EXPECT_EQ(kv.rows_spec(), 5);
  EXPECT_EQ(kv.rows_capacity(), 8);  // two pages of 4
  kv.Commit(3);
  EXPECT_EQ(kv.rows_committed(), 3);
  EXPECT_EQ(kv.rows_spec(), 0);
  // Next window overwrites the rejected rows 3, 4 and extends into a third page.
  kv.Write(3, 7, k.data() + 3 * 16, v.data() + 3 * 16);
  EXPECT_EQ(kv.rows_spec(), 7);
  EXPECT_EQ(kv.rows_capacity(), 12);
  kv.DiscardSpeculative();
  EXPECT_EQ(kv.rows_written(), 3);
  float tmp[8];
  for (int r = 0; r < 3; ++r)
    for (int h = 0; h < 2; ++h)
      EXPECT_EQ(0, std::memcmp(kv.K(r, h, tmp), k.data() + r * 16 + h * 8, 8 * sizeof(float)));
}

TEST(KvCacheDeathTest, CommittedRowsAreNeverOverwritten) {
  KvCache kv(1, 4, DType::kF32, 4);
  std::vector<float> x(8, 1.0f);
  kv.Write(0, 2, x.data(), x.data());
  kv.Commit(2);
  EXPECT_DEATH(kv.Write(1, 1, x.data(), x.data()), "committed");
  EXPECT_DEATH(kv.Commit(3), "commit");
}

TEST(KvCache, StorageDtypesMatchTheConversions) {
  const int hd = 16, heads = 2;
  auto k = test::Random(3 * hd * heads, 5, -4.0f, 4.0f),
       v = test::Random(3 * hd * heads, 6, -4.0f, 4.0f);
  KvCache bf(heads, hd, DType::kBF16, 2), i8(heads, hd, DType::kI8, 2);
  bf.Write(0, 3, k.data(), v.data());
  i8.Write(0, 3, k.data(), v.data());
  float tmp[hd], codes_deq[hd];
  for (int r = 0; r < 3; ++r)
    for (int h = 0; h < heads; ++h) {
      const float* src = k.data() + (r * heads + h) * hd;
      const float* got = bf.K(r, h, tmp);
      for (int i = 0; i < hd; ++i) EXPECT_EQ(got[i], round_to_bf16(src[i]));
      std::int8_t codes[hd];
      float scale = quantize_int8_row(src, hd, codes);
      EXPECT_EQ(i8.KScales(r)[h], scale);
      dequantize_int8_row(codes, scale, hd, codes_deq);
      got = i8.K(r, h, tmp);
      for (int i = 0; i < hd; ++i) EXPECT_EQ(got[i], codes_deq[i]);
      EXPECT_EQ(0,
                std::memcmp(reinterpret_cast<const std::int8_t*>(i8.KRaw(r)) + h * hd, codes, hd));
    }
  EXPECT_EQ(i8.row_bytes(), static_cast<std::size_t>(heads * hd));
  EXPECT_EQ(bf.row_bytes(), static_cast<std::size_t>(2 * heads * hd));
}

TEST(GdnState, CommitStepsCopiesTheAcceptedStep) {
  GdnState s(6, 4, 2, 3, 3);
  auto c0 = test::Random(s.conv_size(), 1), s0 = test::Random(s.ssm_size(), 2);
  std::copy(c0.begin(), c0.end(), s.conv());
  std::copy(s0.begin(), s0.end(), s.ssm());
  s.BeginSteps(3);
  for (int t = 0; t < 3; ++t) {
    std::fill_n(s.step_conv(t), s.conv_size(), static_cast<float>(t + 1));
    std::fill_n(s.step_ssm(t), s.ssm_size(), static_cast<float>(10 * (t + 1)));
  }
  // Scratch writes never touch the checkpoint.
  EXPECT_EQ(0, std::memcmp(s.conv(), c0.data(), c0.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(s.ssm(), s0.data(), s0.size() * sizeof(float)));
  s.CommitSteps(2);
  EXPECT_EQ(s.position(), 2);
  EXPECT_EQ(s.conv()[0], 2.0f);
  EXPECT_EQ(s.ssm()[s.ssm_size() - 1], 20.0f);
  EXPECT_EQ(s.n_steps(), 0);
}

// Bytes of K or V row r (raw storage, all heads) and, for int8, its scales.
std::vector<std::byte> RowBytes(const KvCache& kv, int which, int r) {
  const std::byte* p = which == 0 ? kv.KRaw(r) : kv.VRaw(r);
  std::vector<std::byte> out(p, p + kv.row_bytes());
  if (const float* sc = which == 0 ? kv.KScales(r) : kv.VScales(r)) {
    const auto* b = reinterpret_cast<const std::byte*>(sc);
    out.insert(out.end(), b, b + static_cast<std::size_t>(kv.n_heads_kv()) * sizeof(float));
  }
  return out;
}

class KvPrefixTest : public ::testing::TestWithParam<DType> {};

TEST_P(KvPrefixTest, SharedPrefixIsReadableFromBothAndCopiedOnWrite) {
  const int heads = 2, hd = 8, row = heads * hd;
  auto k = test::Random(20 * row, 11, -3.0f, 3.0f), v = test::Random(20 * row, 12, -3.0f, 3.0f);
  KvCache a(heads, hd, GetParam(), 4);
  a.Write(0, 6, k.data(), v.data());
  a.Commit(6);
  std::vector<std::vector<std::byte>> before;
  for (int r = 0; r < 6; ++r) before.push_back(RowBytes(a, 0, r));

  KvPrefixPtr pre = a.Prefix(6);
  ASSERT_EQ(pre->rows, 6);
  ASSERT_EQ(pre->pages.size(), 2u);  // rows 0-3, 4-5 (+ 2 unused rows)
  EXPECT_EQ(pre->bytes(), 2 * a.page_bytes());
  EXPECT_EQ(a.pages_shared(), 2);
  EXPECT_EQ(pre->pages[0].use_count(), 2);  // a + the prefix

  KvCache b(heads, hd, GetParam(), 4);
  ASSERT_TRUE(b.Fits(*pre));
  b.AdoptPrefix(pre);
  EXPECT_EQ(b.rows_committed(), 6);
  EXPECT_EQ(b.rows_capacity(), 8);  // the same lazy pages a cold cache of 6 rows has
  EXPECT_EQ(pre->pages[0].use_count(), 3);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(RowBytes(b, 0, r), before[static_cast<std::size_t>(r)]);

  // b writes rows 6..9 (page 1 shared: copied; page 2 fresh): a and the prefix keep their bytes.
  auto k2 = test::Random(4 * row, 13), v2 = test::Random(4 * row, 14);
  b.Write(6, 4, k2.data(), v2.data());
  EXPECT_EQ(pre->pages[1].use_count(), 2);  // a + prefix; b has its own copy now
  EXPECT_EQ(pre->pages[0].use_count(), 3);  // page 0 untouched: still shared
  EXPECT_EQ(b.pages_shared(), 1);
  // a writes its own rows 6..7 into (its copy of) page 1: b's rows 6, 7 stay b's.
  a.Write(6, 2, k.data() + 6 * row, v.data() + 6 * row);
  EXPECT_EQ(pre->pages[1].use_count(), 1);  // only the prefix holds the original now
  KvCache c(heads, hd, GetParam(), 4), fresh_b(heads, hd, GetParam(), 4);
  fresh_b.Write(0, 6, k.data(), v.data());
  fresh_b.Write(6, 4, k2.data(), v2.data());
  for (int r = 0; r < 10; ++r) EXPECT_EQ(RowBytes(b, 1, r), RowBytes(fresh_b, 1, r)) << r;
  for (int r = 0; r < 8; ++r) {
    c.Write(r, 1, k.data() + r * row, v.data() + r * row);
    EXPECT_EQ(RowBytes(a, 0, r), RowBytes(c, 0, r)) << r;
  }
  // The prefix itself still reads as at Prefix() time, through a new adopter.
  KvCache d(heads, hd, GetParam(), 4);
  d.AdoptPrefix(pre);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(RowBytes(d, 0, r), before[static_cast<std::size_t>(r)]);
}

TEST_P(KvPrefixTest, ScaleRowsCopiesASharedPage) {
  const int heads = 1, hd = 8;
  auto k = test::Random(8 * hd, 21), v = test::Random(8 * hd, 22);
  KvCache a(heads, hd, GetParam(), 4);
  a.Write(0, 2, k.data(), v.data());
  a.Commit(2);
  KvPrefixPtr pre = a.Prefix(2);
  KvCache b(heads, hd, GetParam(), 4);
  b.AdoptPrefix(pre);
  // a's speculative rows 2, 3 live in page 0, which b and the prefix share.
  a.Write(2, 2, k.data() + 2 * hd, v.data() + 2 * hd);
  const auto b_row0 = RowBytes(b, 0, 0);
  a.ScaleRows(0, 2, 2, 3.0f);
  EXPECT_EQ(RowBytes(b, 0, 0), b_row0);
  EXPECT_EQ(RowBytes(a, 0, 0), b_row0);
  EXPECT_EQ(a.pages_shared(), 0);
  EXPECT_EQ(b.pages_shared(), 1);  // b + prefix
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvPrefixTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kI8),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

TEST(KvCache, PrefixOfNothingAndDroppingReferences) {
  KvCache a(1, 4, DType::kF32, 4);
  KvPrefixPtr empty = a.Prefix(0);
  EXPECT_TRUE(empty->pages.empty());
  KvCache b(1, 4, DType::kF32, 4);
  b.AdoptPrefix(empty);
  EXPECT_EQ(b.rows_committed(), 0);
  EXPECT_EQ(b.rows_capacity(), 0);
  std::vector<float> x(4 * 5, 2.0f);
  a.Write(0, 5, x.data(), x.data());
  a.Commit(5);
  std::weak_ptr<KvPage> page0;
  {
    KvPrefixPtr pre = a.Prefix(5);
    page0 = pre->pages[0];
    EXPECT_EQ(a.bytes_reserved(), 2 * a.page_bytes());
  }
  EXPECT_EQ(page0.use_count(), 1);  // the prefix gave its reference back
  EXPECT_EQ(a.pages_shared(), 0);
  KvCache other_dtype(1, 4, DType::kBF16, 4), other_pages(1, 4, DType::kF32, 2);
  EXPECT_FALSE(other_dtype.Fits(*a.Prefix(5)));
  EXPECT_FALSE(other_pages.Fits(*a.Prefix(5)));
}

TEST(KvCache, PoisonFillsFreshPagesWithNaN) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI8}) {
    SetPoisonFreshForTesting(1);
    KvCache kv(1, 4, dt, 4);
    std::vector<float> x(4, 1.0f);
    kv.Write(0, 1, x.data(), x.data());
    SetPoisonFreshForTesting(-1);
    float tmp[4];
    EXPECT_EQ(kv.K(0, 0, tmp)[0], 1.0f) << dtype_name(dt);
    kv.Write(1, 1, x.data(), x.data());  // rows 1..3 of the page were never written: NaN
    kv.DiscardSpeculative();
    EXPECT_TRUE(std::isnan(kv.V(2, 0, tmp)[3])) << dtype_name(dt);
  }
  SetPoisonFreshForTesting(0);
  KvCache kv(1, 4, DType::kF32, 4);
  std::vector<float> x(4, 1.0f);
  kv.Write(0, 1, x.data(), x.data());
  float tmp[4];
  EXPECT_EQ(kv.K(3, 0, tmp)[0], 0.0f);
  SetPoisonFreshForTesting(-1);
}

TEST(GdnState, FreshCheckpointIsZeroEvenWithPoisonAndScratchIsNaN) {
  SetPoisonFreshForTesting(1);
  GdnState s(6, 4, 2, 3, 3);
  s.BeginSteps(2);
  SetPoisonFreshForTesting(-1);
  for (std::size_t i = 0; i < s.conv_size(); ++i) ASSERT_EQ(s.conv()[i], 0.0f);
  for (std::size_t i = 0; i < s.ssm_size(); ++i) ASSERT_EQ(s.ssm()[i], 0.0f);
  EXPECT_TRUE(std::isnan(s.step_conv(1)[0]));
  EXPECT_TRUE(std::isnan(s.step_ssm(0)[s.ssm_size() - 1]));
}

TEST(GdnState, RestoreAndReset) {
  GdnState s(6, 4, 2, 3, 3);
  auto c0 = test::Random(s.conv_size(), 31), s0 = test::Random(s.ssm_size(), 32);
  s.BeginSteps(2);
  s.Restore(c0.data(), s0.data(), 64);
  EXPECT_EQ(s.position(), 64);
  EXPECT_EQ(s.n_steps(), 0);
  EXPECT_EQ(0, std::memcmp(s.conv(), c0.data(), c0.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(s.ssm(), s0.data(), s0.size() * sizeof(float)));
  s.Reset();
  EXPECT_EQ(s.position(), 0);
  EXPECT_EQ(s.conv()[0], 0.0f);
  EXPECT_EQ(s.ssm()[s.ssm_size() - 1], 0.0f);
}

}  // namespace
}  // namespace lockstep
