// Medians of measurements (verify times, timing gaps): the one definition the campaign gates, the
// service report, compare's align and the resource sampler share. O(n) (nth_element on the copy
// passed in); the values' order does not matter and NaN must not be among them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace lockstep {

// The lower and upper middle of `v` (equal for an odd count); {0, 0} for an empty vector. `v` is
// reordered.
std::pair<double, double> MiddleValues(std::vector<double>& v);
std::pair<std::int64_t, std::int64_t> MiddleValues(std::vector<std::int64_t>& v);

// Median of `v`: the middle value, the mean of the two middle values for an even count; 0 for an
// empty vector.
double Median(std::vector<double> v);
// The same for integers, the mean rounded down (no overflow): lower + (upper - lower) / 2.
std::int64_t Median(std::vector<std::int64_t> v);

}  // namespace lockstep
