// Greedy and seeded sampling with the counter RNG.
#include "lockstep/engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace lockstep {
namespace {

TEST(Sampler, ArgmaxLowestIndexWinsTies) {
  std::vector<float> l{0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(Argmax(l.data(), 4), 1);
  l[0] = NAN;
  EXPECT_EQ(Argmax(l.data(), 4), 1);
}

TEST(Sampler, CounterRngDependsOnlyOnSeedAndPosition) {
  EXPECT_EQ(CounterHash(1, 100), CounterHash(1, 100));
  EXPECT_NE(CounterHash(1, 100), CounterHash(1, 101));
  EXPECT_NE(CounterHash(1, 100), CounterHash(2, 100));
  std::set<std::uint64_t> seen;
  for (std::uint64_t p = 0; p < 1000; ++p) seen.insert(CounterHash(7, p));
  EXPECT_EQ(seen.size(), 1000u);
  double mean = 0;
  for (std::uint64_t p = 0; p < 20000; ++p) mean += CounterUniform(3, p);
  EXPECT_NEAR(mean / 20000, 0.5, 0.01);
}

TEST(Sampler, SamplingFollowsTheDistribution) {
  std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = k/10
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.seed = 9;
  std::vector<int> scratch, count(4, 0);
  const int n = 40000;
  for (int p = 0; p < n; ++p)
    ++count[static_cast<std::size_t>(SampleToken(logits.data(), 4, sp, p, &scratch))];
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(count[static_cast<std::size_t>(i)] / static_cast<double>(n), (i + 1) / 10.0, 0.01)
        << i;
  // Same seed and position -> same token, whatever was drawn before.
  EXPECT_EQ(SampleToken(logits.data(), 4, sp, 12345, &scratch),
            SampleToken(logits.data(), 4, sp, 12345, &scratch));
}

TEST(Sampler, TopKAndTopPCut) {
  std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  SamplingParams sp;
  sp.temperature = 1.0;
  std::vector<int> scratch;
  sp.top_k = 2;
  for (int p = 0; p < 2000; ++p) EXPECT_GE(SampleToken(logits.data(), 4, sp, p, &scratch), 2);
  sp.top_k = 0;
  sp.top_p = 0.5;  // mass 0.4 (id 3) < 0.5 -> keep ids 3 and 2
  std::set<int> got;
  for (int p = 0; p < 2000; ++p) got.insert(SampleToken(logits.data(), 4, sp, p, &scratch));
  EXPECT_EQ(got, (std::set<int>{2, 3}));
  SamplingParams greedy;
  EXPECT_EQ(SampleToken(logits.data(), 4, greedy, 0, &scratch), 3);
}

}  // namespace
}  // namespace lockstep
