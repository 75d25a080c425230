// Tests for harness/timing_stats.{h,cpp}: sample statistics, the order-statistic interval of the
// median, pyperf-style flags, and the A/B timing verdict over repeats.
#include "lockstep/harness/timing_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace lockstep {
namespace {

bool HasWarning(const SampleStats& s, const std::string& part) {
  return std::any_of(s.warnings.begin(), s.warnings.end(),
                     [&](const std::string& w) { return w.find(part) != std::string::npos; });
}

// Independent of the implementation: exact binomial(n, 1/2) CDF with integers (n <= 60), and the
// symmetric rank pair (j, n + 1 - j) with the largest j whose coverage 1 - 2 P(B <= j - 1) >= 0.95.
int ExpectedRank(int n) {
  std::vector<std::uint64_t> c(static_cast<std::size_t>(n) + 1, 0);  // C(n, i)
  c[0] = 1;
  for (int row = 1; row <= n; ++row) {
    for (int i = row; i >= 1; --i)
      c[static_cast<std::size_t>(i)] += c[static_cast<std::size_t>(i - 1)];
  }
  const double total = std::ldexp(1.0, n);
  int best = 0;
  std::uint64_t below = 0;  // sum of C(n, i) for i <= j - 1
  for (int j = 1; 2 * j <= n + 1; ++j) {
    below += c[static_cast<std::size_t>(j - 1)];
    if (1.0 - 2.0 * static_cast<double>(below) / total >= 0.95) best = j;
  }
  return best;
}

// 1, 2, ..., n out of order (rotated, then reversed), so the rank r sample is r.
std::vector<double> Ranks(int n) {
  std::vector<double> v;
  for (int i = 1; i <= n; ++i) v.push_back(static_cast<double>(i));
  std::rotate(v.begin(), v.begin() + n / 3, v.end());
  std::reverse(v.begin(), v.end());
  return v;
}

TEST(ComputeStatsTest, MedianOddAndEven) {
  const SampleStats odd = ComputeStats({5.0, 1.0, 3.0});
  EXPECT_EQ(odd.n, 3);
  EXPECT_DOUBLE_EQ(odd.median, 3.0);
  EXPECT_DOUBLE_EQ(odd.mean, 3.0);
  EXPECT_DOUBLE_EQ(odd.stdev, 2.0);  // sample stdev: sqrt((4 + 0 + 4) / 2)
  EXPECT_DOUBLE_EQ(odd.min, 1.0);
  EXPECT_DOUBLE_EQ(odd.max, 5.0);

  const SampleStats even = ComputeStats({4.0, 1.0, 3.0, 2.0});
  EXPECT_DOUBLE_EQ(even.median, 2.5);
  EXPECT_DOUBLE_EQ(even.mean, 2.5);
}

TEST(ComputeStatsTest, SmallSamples) {
  const SampleStats none = ComputeStats({});
  EXPECT_EQ(none.n, 0);
  EXPECT_TRUE(HasWarning(none, "no samples"));

  const SampleStats one = ComputeStats({7.0});
  EXPECT_DOUBLE_EQ(one.median, 7.0);
  EXPECT_DOUBLE_EQ(one.stdev, 0.0);
  EXPECT_FALSE(one.spread_unstable);

  const SampleStats five = ComputeStats({10, 11, 12, 13, 14});
  EXPECT_DOUBLE_EQ(five.lo95, 10.0);
  EXPECT_DOUBLE_EQ(five.hi95, 14.0);
  EXPECT_TRUE(HasWarning(five, "fewer than 6 samples: the interval is the sample range"));
}

TEST(ComputeStatsTest, IntervalForSixIsTheRange) {
  const SampleStats s = ComputeStats({100, 101, 99, 100, 102, 100});
  EXPECT_EQ(ExpectedRank(6), 1);  // coverage 1 - 2/64 = 0.969
  EXPECT_DOUBLE_EQ(s.lo95, 99.0);
  EXPECT_DOUBLE_EQ(s.hi95, 102.0);
  EXPECT_FALSE(HasWarning(s, "fewer than 6"));
}

TEST(ComputeStatsTest, IntervalRanksFromTheBinomial) {
  for (int n : {6, 7, 10, 20, 33, 60}) {
    const int j = ExpectedRank(n);
    ASSERT_GE(j, 1) << n;
    const SampleStats s = ComputeStats(Ranks(n));
    EXPECT_DOUBLE_EQ(s.lo95, j) << "n=" << n;
    EXPECT_DOUBLE_EQ(s.hi95, n + 1 - j) << "n=" << n;
  }
  EXPECT_EQ(ExpectedRank(20), 6);  // P(B <= 5) = 21700 / 2^20 = 0.0207; P(B <= 6) = 0.0577
  const SampleStats s20 = ComputeStats(Ranks(20));
  EXPECT_DOUBLE_EQ(s20.lo95, 6.0);
  EXPECT_DOUBLE_EQ(s20.hi95, 15.0);
}

TEST(ComputeStatsTest, IntervalForLargeSamplesDoesNotUnderflow) {
  // 0.5^n underflows a double from n = 1075; the interval must still be the usual normal-ish one.
  const int n = 2001;
  const SampleStats s = ComputeStats(Ranks(n));
  EXPECT_DOUBLE_EQ(s.median, 1001.0);
  // Normal approximation: j ~ n/2 - 1.96 sqrt(n)/2 = 956.7; allow a rank or two of slack.
  EXPECT_NEAR(s.lo95, 957.0, 2.0);
  EXPECT_DOUBLE_EQ(s.hi95, n + 1 - s.lo95);
}

TEST(ComputeStatsTest, StableSamples) {
  const SampleStats s = ComputeStats({100, 101, 99, 100, 102, 100});
  EXPECT_FALSE(s.spread_unstable);
  EXPECT_FALSE(s.has_outlier);
  EXPECT_TRUE(s.warnings.empty()) << s.warnings.front();
}

TEST(ComputeStatsTest, OutlierFlag) {
  const SampleStats s = ComputeStats({100, 100, 100, 100, 100, 160});
  EXPECT_DOUBLE_EQ(s.median, 100.0);
  EXPECT_TRUE(s.has_outlier);
  EXPECT_TRUE(HasWarning(s, "50% away from the median"));
  EXPECT_TRUE(HasWarning(s, "160"));
  // 149 is not 50% away: no outlier.
  EXPECT_FALSE(ComputeStats({100, 100, 100, 100, 100, 149}).has_outlier);
  // Low side too.
  EXPECT_TRUE(ComputeStats({100, 100, 100, 100, 100, 50}).has_outlier);
}

TEST(ComputeStatsTest, SpreadFlag) {
  // stdev about 15% of the mean, nothing 50% away from the median.
  const SampleStats s = ComputeStats({80, 90, 100, 110, 120, 100, 85, 115});
  EXPECT_GE(s.stdev, 0.1 * s.mean);
  EXPECT_TRUE(s.spread_unstable);
  EXPECT_FALSE(s.has_outlier);
  EXPECT_TRUE(HasWarning(s, "standard deviation"));
  EXPECT_EQ(s.warnings.size(), 1u);
}

TEST(ComputeStatsTest, NonFiniteSamplesAreIgnored) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const SampleStats s = ComputeStats({1.0, nan, 3.0, 2.0});
  EXPECT_EQ(s.n, 3);
  EXPECT_DOUBLE_EQ(s.median, 2.0);
  EXPECT_TRUE(HasWarning(s, "non-finite"));
}

// `repeats` repeats of `windows` windows, window w of repeat r = base * (1 + w) + jitter(r).
std::vector<std::vector<double>> Repeats(int repeats, int windows, double base) {
  std::vector<std::vector<double>> out;
  for (int r = 0; r < repeats; ++r) {
    std::vector<double> w;
    for (int i = 0; i < windows; ++i) w.push_back(base * (1 + i) + 0.01 * ((r * 3) % 5));
    out.push_back(w);
  }
  return out;
}

TEST(CompareTimingRepeatsTest, RefusesTooFewRepeats) {
  const TimingVerdict v = CompareTimingRepeats(Repeats(2, 4, 10.0), Repeats(2, 4, 20.0), 6);
  EXPECT_TRUE(v.refused);
  EXPECT_NE(v.refused_reason.find('2'), std::string::npos) << v.refused_reason;
  EXPECT_NE(v.refused_reason.find('6'), std::string::npos) << v.refused_reason;
  EXPECT_EQ(
      v.refused_reason,
      "2 repeats per arm (A: 2, B: 2); a timing verdict needs at least 6 fresh processes per arm");
  EXPECT_EQ(v.repeats_a, 2);
  EXPECT_EQ(v.repeats_b, 2);
  // The stats it can give are still there; the verdict is not.
  EXPECT_EQ(v.window_a.size(), 4u);
  EXPECT_EQ(v.aggregate_a.n, 2);
  EXPECT_FALSE(v.aggregate_outside_noise);
  EXPECT_TRUE(v.windows_outside_noise.empty());

  const TimingVerdict one_short = CompareTimingRepeats(Repeats(6, 4, 10.0), Repeats(5, 4, 10.0), 6);
  EXPECT_TRUE(one_short.refused);
  EXPECT_NE(one_short.refused_reason.find("A: 6, B: 5"), std::string::npos)
      << one_short.refused_reason;
}

TEST(CompareTimingRepeatsTest, SixRepeatsGiveAVerdict) {
  const auto a = Repeats(6, 4, 10.0);
  const auto b = Repeats(6, 4, 12.0);
  const TimingVerdict v = CompareTimingRepeats(a, b, 6);
  ASSERT_FALSE(v.refused) << v.refused_reason;
  ASSERT_EQ(v.window_a.size(), 4u);
  ASSERT_EQ(v.window_b.size(), 4u);
  for (std::size_t w = 0; w < 4; ++w) {
    EXPECT_EQ(v.window_a[w].n, 6);
    EXPECT_NEAR(v.window_a[w].median, 10.0 * static_cast<double>(w + 1), 0.05);
    EXPECT_NEAR(v.window_b[w].median, 12.0 * static_cast<double>(w + 1), 0.05);
  }
  EXPECT_EQ(v.aggregate_windows, 4);
  EXPECT_EQ(v.aggregate_a.n, 6);
  EXPECT_NEAR(v.aggregate_a.median, 100.0, 0.2);  // 10 + 20 + 30 + 40
  EXPECT_NEAR(v.aggregate_b.median, 120.0, 0.2);
  EXPECT_NEAR(v.aggregate_rel_diff, 0.2, 0.01);
  EXPECT_TRUE(v.aggregate_outside_noise);
  EXPECT_EQ(v.windows_outside_noise, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_FALSE(v.unstable);

  // A/A: the same distribution is inside the noise.
  const TimingVerdict aa = CompareTimingRepeats(a, Repeats(6, 4, 10.0), 6);
  ASSERT_FALSE(aa.refused);
  EXPECT_FALSE(aa.aggregate_outside_noise);
  EXPECT_TRUE(aa.windows_outside_noise.empty());
  EXPECT_NEAR(aa.aggregate_rel_diff, 0.0, 1e-12);
}

TEST(CompareTimingRepeatsTest, WindowsOfDifferentLengths) {
  auto a = Repeats(6, 5, 10.0);
  auto b = Repeats(6, 5, 10.0);
  a[2].resize(3);  // one repeat of A stopped after 3 windows
  b[4].resize(4);
  b[5].push_back(99.0);  // one repeat of B ran a 6th window
  const TimingVerdict v = CompareTimingRepeats(a, b, 6);
  ASSERT_FALSE(v.refused) << v.refused_reason;
  ASSERT_EQ(v.window_a.size(), 5u);
  ASSERT_EQ(v.window_b.size(), 6u);
  EXPECT_EQ(v.window_a[2].n, 6);
  EXPECT_EQ(v.window_a[3].n, 5);
  EXPECT_EQ(v.window_b[4].n, 5);
  EXPECT_EQ(v.window_b[5].n, 1);
  EXPECT_DOUBLE_EQ(v.window_b[5].median, 99.0);
  // The aggregate sums the windows every repeat has: [0, 3).
  EXPECT_EQ(v.aggregate_windows, 3);
  EXPECT_NEAR(v.aggregate_a.median, 60.0, 0.1);
  EXPECT_NEAR(v.aggregate_b.median, 60.0, 0.1);
  EXPECT_FALSE(v.aggregate_outside_noise);
}

TEST(CompareTimingRepeatsTest, UnstableAggregate) {
  auto a = Repeats(6, 3, 10.0);
  auto b = Repeats(6, 3, 10.0);
  b[0] = {50.0, 50.0, 50.0};  // one slow process
  const TimingVerdict v = CompareTimingRepeats(a, b, 6);
  ASSERT_FALSE(v.refused);
  EXPECT_TRUE(v.aggregate_b.has_outlier);
  EXPECT_TRUE(v.unstable);
}

TEST(CompareTimingRepeatsTest, NoCommonWindowIsRefused) {
  auto a = Repeats(6, 3, 10.0);
  a[1].clear();
  const TimingVerdict v = CompareTimingRepeats(a, Repeats(6, 3, 10.0), 6);
  EXPECT_TRUE(v.refused);
  EXPECT_EQ(v.aggregate_windows, 0);
  EXPECT_NE(v.refused_reason.find("no verify window"), std::string::npos) << v.refused_reason;
}

TEST(CompareTimingRepeatsTest, UnknownBaselineIsRefused) {
  // Verify times that were not measured are NaN; a baseline made only of them has no median.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::vector<double>> a(6, std::vector<double>{nan, nan});
  const TimingVerdict v = CompareTimingRepeats(a, Repeats(6, 2, 10.0), 6);
  EXPECT_TRUE(v.refused);
  EXPECT_TRUE(std::isnan(v.aggregate_rel_diff));
  EXPECT_EQ(v.aggregate_a.n, 0);
  EXPECT_EQ(v.aggregate_b.n, 6);
  EXPECT_NE(v.refused_reason.find("arm A"), std::string::npos) << v.refused_reason;
}

}  // namespace
}  // namespace lockstep
