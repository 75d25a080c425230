// Paged K/V cache: committed vs speculative rows, paging, storage dtypes, and the GDN state's
// checkpoint vs scratch.
#include "lockstep/engine/kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>

#include "lockstep/engine/gdn_state.h"
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

}  // namespace
}  // namespace lockstep
