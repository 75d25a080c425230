// Timing statistics over repeated fresh-process timing arms (issue "state arms and timing arms are
// separate"): medians with a 95% interval, a noise band, and pyperf-style instability flags.
#pragma once

#include <string>
#include <vector>

namespace lockstep {

struct SampleStats {
  int n = 0;
  double median = 0.0;
  double lo95 = 0.0, hi95 = 0.0;  // distribution-free 95% interval of the median (order statistics,
                                  // binomial); for small n it widens to the sample min/max
  double min = 0.0, max = 0.0;
  double mean = 0.0, stdev = 0.0;
  // pyperf-style flags
  bool spread_unstable = false;       // stdev >= 10% of the mean (pyperf's rule)
  bool has_outlier = false;           // a sample >= 50% away from the median
  std::vector<std::string> warnings;  // human-readable, one per flag; also: fewer than 6 samples
                                      // (interval = sample range), non-finite samples (NaN =
                                      // not measured) ignored, no samples
};

SampleStats ComputeStats(std::vector<double> samples);

// A/B timing verdict over repeats: per-window medians of verify time (ms) for each arm and the
// aggregate (sum over matched windows), compared with a noise band = the union of both arms'
// 95% intervals. `windows_a[r][w]` = verify ms of repeat r, window w (repeats may have different
// lengths: window w uses the repeats that have it).
struct TimingVerdict {
  bool refused = false;        // too few repeats (or no common window) for a verdict; the
                               // stats are still filled, the *_outside_noise fields are not
  std::string refused_reason;  // "2 repeats per arm (A: 2, B: 6); a timing verdict needs at least 6
                               // fresh processes per arm"
  int repeats_a = 0, repeats_b = 0;
  std::vector<SampleStats> window_a, window_b;  // per window index
  SampleStats aggregate_a, aggregate_b;         // sum of verify ms per repeat
  int aggregate_windows = 0;                    // W: the sums cover windows [0, W), W = the fewest
                                                // windows of any repeat of either arm
  double aggregate_rel_diff = 0.0;              // (median_b - median_a) / median_a; NaN (and
                                                // refused) when median_a is unknown or <= 0
  bool aggregate_outside_noise = false;         // the medians' 95% intervals do not overlap
  std::vector<int> windows_outside_noise;       // windows whose intervals do not overlap
  bool unstable = false;                        // any instability flag on either arm's aggregate
};

TimingVerdict CompareTimingRepeats(const std::vector<std::vector<double>>& windows_a,
                                   const std::vector<std::vector<double>>& windows_b,
                                   int min_repeats);

}  // namespace lockstep
