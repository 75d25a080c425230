// Independent long-double references for the comparator's metrics, shared by the metric tests
// and the benchmarks that report their relative error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace lockstep::test {

// KL(softmax(x) || softmax(y)) by log-sum-exp in long double: sum p_i (log p_i - log q_i).
inline double ReferenceKl(const float* x, const float* y, std::size_t n) {
  auto lse = [n](const float* v) {
    long double m = -INFINITY;
    for (std::size_t i = 0; i < n; ++i) m = std::max(m, static_cast<long double>(v[i]));
    long double z = 0.0L;
    for (std::size_t i = 0; i < n; ++i) z += std::exp(static_cast<long double>(v[i]) - m);
    return m + std::log(z);
  };
  const long double lx = lse(x), ly = lse(y);
  long double kl = 0.0L;
  for (std::size_t i = 0; i < n; ++i) {
    const long double lp = static_cast<long double>(x[i]) - lx,
                      lq = static_cast<long double>(y[i]) - ly;
    kl += std::exp(lp) * (lp - lq);
  }
  return static_cast<double>(kl);
}

}  // namespace lockstep::test
