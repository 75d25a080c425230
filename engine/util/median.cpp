#include "lockstep/engine/median.h"

#include <algorithm>
#include <cstddef>

namespace lockstep {
namespace {

template <typename T>
std::pair<T, T> Middles(std::vector<T>& v) {
  if (v.empty()) return {T{0}, T{0}};
  const std::size_t mid = v.size() / 2;
  const auto at = v.begin() + static_cast<std::ptrdiff_t>(mid);
  std::nth_element(v.begin(), at, v.end());
  const T upper = *at;
  if (v.size() % 2 == 1) return {upper, upper};
  // The lower middle is the largest element of the left partition nth_element left behind.
  return {*std::max_element(v.begin(), at), upper};
}

}  // namespace

std::pair<double, double> MiddleValues(std::vector<double>& v) { return Middles(v); }
std::pair<std::int64_t, std::int64_t> MiddleValues(std::vector<std::int64_t>& v) {
  return Middles(v);
}

double Median(std::vector<double> v) {
  const auto [lower, upper] = Middles(v);
  return v.size() % 2 == 1 ? upper : 0.5 * (lower + upper);
}

std::int64_t Median(std::vector<std::int64_t> v) {
  const auto [lower, upper] = Middles(v);
  return lower + (upper - lower) / 2;
}

}  // namespace lockstep
