#include "lockstep/harness/timing_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <utility>

namespace lockstep {
namespace {

// The confidence of the median interval, and pyperf's thresholds (pyperf `check` command):
// "the standard deviation is >= 10% of the mean" and a value ">= 50%" away from the centre. We
// measure the outlier distance from the median, which one slow first call cannot drag along.
constexpr double kConfidence = 0.95;
constexpr double kStdevFrac = 0.10;
constexpr double kOutlierFrac = 0.50;

// Smallest n for which some order-statistic interval reaches kConfidence: [X_(1), X_(n)] covers
// the median with probability 1 - 2 * 0.5^n, 0.96875 at n = 6 and 0.9375 at n = 5.
constexpr int kMinIntervalSamples = 6;

// Largest rank j (1-based) such that [X_(j), X_(n+1-j)] covers the population median with
// probability >= kConfidence, or 0 when even j = 1 does not. The number of samples below the
// median is B ~ Binomial(n, 1/2), and the interval misses exactly when B < j or B > n - j, so the
// coverage is 1 - 2 * P(B <= j - 1). The pmf is accumulated in log space: 0.5^n underflows a
// double from n = 1075 on.
int MedianIntervalRank(int n) {
  if (n <= 0) return 0;
  const double log_half_n = -static_cast<double>(n) * std::log(2.0);
  double log_pmf = log_half_n;  // log P(B = 0)
  double cdf = 0.0;             // P(B <= i - 1) before step i
  int best = 0;
  for (int j = 1; 2 * j <= n + 1; ++j) {
    const int i = j - 1;  // add P(B = i) so cdf = P(B <= j - 1)
    if (i > 0)
      log_pmf += std::log(static_cast<double>(n - i + 1)) - std::log(static_cast<double>(i));
    cdf += std::exp(log_pmf);
    if (1.0 - 2.0 * cdf >= kConfidence) {
      best = j;
    } else {
      break;  // coverage only falls as j grows
    }
  }
  return best;
}

std::string Num(double v) { return fmt::format("{:.4g}", v); }

bool IntervalsOverlap(const SampleStats& a, const SampleStats& b) {
  return a.lo95 <= b.hi95 && b.lo95 <= a.hi95;
}

}  // namespace

SampleStats ComputeStats(std::vector<double> samples) {
  SampleStats s;
  // A sample that was not measured is NaN (never a made-up zero, DESIGN.md); it carries no
  // information about the distribution, and would break the sort.
  const auto finite_end =
      std::partition(samples.begin(), samples.end(), [](double v) { return std::isfinite(v); });
  const auto dropped = static_cast<std::size_t>(samples.end() - finite_end);
  samples.erase(finite_end, samples.end());
  if (dropped > 0) s.warnings.push_back(fmt::format("{} non-finite sample(s) ignored", dropped));
  s.n = static_cast<int>(samples.size());
  if (samples.empty()) {
    s.warnings.push_back("no samples");
    return s;
  }
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  s.min = samples.front();
  s.max = samples.back();
  s.median = n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(n);
  if (n >= 2) {
    double ss = 0.0;  // two passes: no cancellation for tightly clustered timings
    for (double v : samples) ss += (v - s.mean) * (v - s.mean);
    s.stdev = std::sqrt(ss / static_cast<double>(n - 1));
  }

  const int j = MedianIntervalRank(s.n);
  if (j == 0 || s.n < kMinIntervalSamples) {
    s.lo95 = s.min;
    s.hi95 = s.max;
    s.warnings.push_back(fmt::format("fewer than {} samples: the interval is the sample range",
                                     kMinIntervalSamples));
  } else {
    s.lo95 = samples[static_cast<std::size_t>(j - 1)];
    s.hi95 = samples[n - static_cast<std::size_t>(j)];  // rank n + 1 - j, 0-based n - j
  }

  // pyperf-style flags. Both need a positive centre to be relative to; timings are positive.
  if (n >= 2 && s.mean > 0.0 && s.stdev >= kStdevFrac * s.mean) {
    s.spread_unstable = true;
    s.warnings.push_back(fmt::format("the standard deviation ({}) is {:.0f}% of the mean ({})",
                                     Num(s.stdev), 100.0 * s.stdev / s.mean, Num(s.mean)));
  }
  if (s.median > 0.0) {
    const double limit = kOutlierFrac * s.median;
    const auto far = static_cast<std::size_t>(std::count_if(
        samples.begin(), samples.end(), [&](double v) { return std::abs(v - s.median) >= limit; }));
    if (far > 0) {
      s.has_outlier = true;
      // The sorted extremes are the farthest candidates on either side.
      const double worst = (s.max - s.median) >= (s.median - s.min) ? s.max : s.min;
      s.warnings.push_back(
          fmt::format("{} sample(s) at least 50% away from the median ({}); the farthest is {} "
                      "({:+.0f}%)",
                      far, Num(s.median), Num(worst), 100.0 * (worst - s.median) / s.median));
    }
  }
  return s;
}

TimingVerdict CompareTimingRepeats(const std::vector<std::vector<double>>& windows_a,
                                   const std::vector<std::vector<double>>& windows_b,
                                   int min_repeats) {
  TimingVerdict v;
  v.repeats_a = static_cast<int>(windows_a.size());
  v.repeats_b = static_cast<int>(windows_b.size());

  // Per window: repeats may stop at different windows (a run that diverged or stopped early), so
  // window w is judged over the repeats that reached it.
  const auto per_window = [](const std::vector<std::vector<double>>& repeats) {
    std::size_t longest = 0;
    for (const auto& r : repeats) longest = std::max(longest, r.size());
    std::vector<SampleStats> out;
    out.reserve(longest);
    for (std::size_t w = 0; w < longest; ++w) {
      std::vector<double> samples;
      for (const auto& r : repeats) {
        if (w < r.size()) samples.push_back(r[w]);
      }
      out.push_back(ComputeStats(std::move(samples)));
    }
    return out;
  };
  v.window_a = per_window(windows_a);
  v.window_b = per_window(windows_b);

  // The aggregate of a repeat is the sum of its verify ms over windows [0, W), W = the fewest
  // windows any repeat of either arm has. A sum over each repeat's own length would compare runs
  // that did different amounts of work; W makes every sum cover the same windows.
  std::size_t common = std::numeric_limits<std::size_t>::max();
  for (const auto& r : windows_a) common = std::min(common, r.size());
  for (const auto& r : windows_b) common = std::min(common, r.size());
  if (windows_a.empty() && windows_b.empty()) common = 0;
  v.aggregate_windows = static_cast<int>(common);
  const auto sums = [common](const std::vector<std::vector<double>>& repeats) {
    std::vector<double> out;
    out.reserve(repeats.size());
    for (const auto& r : repeats) {
      out.push_back(
          std::accumulate(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(common), 0.0));
    }
    return out;
  };
  v.aggregate_a = ComputeStats(sums(windows_a));
  v.aggregate_b = ComputeStats(sums(windows_b));
  // Undefined without a positive baseline: unknown (NaN), not a made-up 0.
  v.aggregate_rel_diff = v.aggregate_a.median > 0.0 && v.aggregate_a.n > 0 && v.aggregate_b.n > 0
                             ? (v.aggregate_b.median - v.aggregate_a.median) / v.aggregate_a.median
                             : std::numeric_limits<double>::quiet_NaN();
  v.unstable = v.aggregate_a.spread_unstable || v.aggregate_a.has_outlier ||
               v.aggregate_b.spread_unstable || v.aggregate_b.has_outlier;

  if (v.repeats_a < min_repeats || v.repeats_b < min_repeats) {
    v.refused = true;
    v.refused_reason = fmt::format(
        "{} repeats per arm (A: {}, B: {}); a timing verdict needs at least {} fresh processes per "
        "arm",
        std::min(v.repeats_a, v.repeats_b), v.repeats_a, v.repeats_b, min_repeats);
  } else if (common == 0) {
    v.refused = true;
    v.refused_reason = "no verify window is common to all repeats of both arms";
  } else if (std::isnan(v.aggregate_rel_diff)) {
    // Reports print the relative difference of every verdict; one that has none is no verdict.
    v.refused = true;
    v.refused_reason =
        "the summed verify time of arm A is unknown or not positive: no relative difference";
  }
  // The noise comparison is the verdict itself: a refused comparison states none (the stats
  // above stay filled for the report).
  if (v.refused) return v;
  v.aggregate_outside_noise = !IntervalsOverlap(v.aggregate_a, v.aggregate_b);
  const std::size_t both = std::min(v.window_a.size(), v.window_b.size());
  for (std::size_t w = 0; w < both; ++w) {
    const SampleStats& a = v.window_a[w];
    const SampleStats& b = v.window_b[w];
    if (a.n > 0 && b.n > 0 && !IntervalsOverlap(a, b))
      v.windows_outside_noise.push_back(static_cast<int>(w));
  }
  return v;
}

}  // namespace lockstep
