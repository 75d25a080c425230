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

// ApplyPenalties against the formula worked by hand: repeat over the last repeat_last_n tokens
// of prompt + output (each distinct token once), presence / frequency over the output only.
TEST(Sampler, PenaltiesFollowTheirFormula) {
  const std::vector<float> logits{2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  const std::vector<std::int32_t> prompt{0, 0, 1};  // token 0 twice, 1 once: prompt only
  const std::vector<std::int32_t> output{2, 2, 3};  // output: 2 twice, 3 once
  SamplingParams sp;
  sp.presence_penalty = 0.25;
  sp.frequency_penalty = 0.5;
  sp.repeat_penalty = 2.0;
  sp.repeat_last_n = 4;  // tokens 1, 2, 2, 3 (the prompt's 0s are out of the window)
  std::vector<float> out;
  ApplyPenalties(logits.data(), 5, sp, {.base = prompt, .more = output, .n_output = 3}, &out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0], 2.0f);                  // outside the window, not in the output
  EXPECT_EQ(out[1], -2.0f);                 // negative: multiplied by 2, once
  EXPECT_EQ(out[2], 0.25f - 1.0f - 0.25f);  // 0.5 / 2, minus 2 * 0.5, minus 0.25
  EXPECT_EQ(out[3], 1.5f - 0.5f - 0.25f);   // 3 / 2, one use
  EXPECT_EQ(out[4], 1.0f);                  // never seen
  sp.repeat_last_n = -1;                    // the whole context: token 0 now too
  ApplyPenalties(logits.data(), 5, sp, {.base = prompt, .more = output, .n_output = 3}, &out);
  EXPECT_EQ(out[0], 1.0f);
  // The split between base and more does not matter, only the sequence.
  std::vector<std::int32_t> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  std::vector<float> joined;
  ApplyPenalties(logits.data(), 5, sp, {.base = all, .more = {}, .n_output = 3}, &joined);
  EXPECT_EQ(out, joined);
  // Out-of-vocabulary ids in the history are ignored, and neutral values change nothing.
  const std::vector<std::int32_t> odd{-1, 9, 4};
  ApplyPenalties(logits.data(), 5, SamplingParams{}, {.base = odd, .more = {}, .n_output = 3},
                 &out);
  EXPECT_EQ(out, logits);
  EXPECT_FALSE(SamplingParams{}.penalized());
}

}  // namespace
}  // namespace lockstep
