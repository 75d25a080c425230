#include "lockstep/compare/metrics.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace lockstep {

DiffStats CompareF32(const float* a, const float* b, std::size_t n) {
  DiffStats s;
  s.n = n;
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t ua, ub;
    std::memcpy(&ua, a + i, 4);
    std::memcpy(&ub, b + i, 4);
    if (ua != ub) {
      if (s.first_diff < 0) s.first_diff = static_cast<std::int64_t>(i);
      ++s.n_diff;
    }
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      s.non_finite = true;
      continue;
    }
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(a[i]) * static_cast<double>(a[i]);
    if (std::fabs(d) > s.max_abs) s.max_abs = std::fabs(d);
  }
  if (s.non_finite) {
    s.nrmse = std::numeric_limits<double>::quiet_NaN();
  } else if (den == 0.0) {
    s.nrmse = num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  } else {
    s.nrmse = std::sqrt(num / den);
  }
  return s;
}

KlStats CompareLogits(const float* a, const float* b, std::size_t rows, std::size_t cols) {
  KlStats k;
  k.rows = rows;
  double sum_kl = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = a + r * cols;
    const float* y = b + r * cols;
    double mx = -INFINITY, my = -INFINITY;
    std::size_t ax = 0, ay = 0;
    bool bad = false;
    for (std::size_t i = 0; i < cols; ++i) {
      if (!std::isfinite(x[i]) || !std::isfinite(y[i])) bad = true;
      if (x[i] > mx) mx = x[i], ax = i;
      if (y[i] > my) my = y[i], ay = i;
    }
    if (bad) {
      k.non_finite = true;
      continue;
    }
    double zx = 0.0, zy = 0.0;
    for (std::size_t i = 0; i < cols; ++i) {
      zx += std::exp(static_cast<double>(x[i]) - mx);
      zy += std::exp(static_cast<double>(y[i]) - my);
    }
    const double lzx = std::log(zx), lzy = std::log(zy);
    double kl = 0.0;
    for (std::size_t i = 0; i < cols; ++i) {
      const double lpx = static_cast<double>(x[i]) - mx - lzx;
      const double lpy = static_cast<double>(y[i]) - my - lzy;
      kl += std::exp(lpx) * (lpx - lpy);
    }
    if (kl < 0.0) kl = 0.0;  // rounding below zero for identical distributions
    sum_kl += kl;
    if (kl > k.kl_max) k.kl_max = kl;
    if (ax == ay) ++k.top1_agree;
  }
  k.kl_mean = rows ? sum_kl / static_cast<double>(rows) : 0.0;
  if (k.non_finite) k.kl_max = k.kl_mean = std::numeric_limits<double>::quiet_NaN();
  return k;
}

}  // namespace lockstep
