// Helpers shared by the tests that check CUDA kernel arithmetic against the CPU ops: on the host
// (tests/engine/cuda_kernel_math_test.cpp) and on a device (tests/gpu/cuda_ops_test.cpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace lockstep::test {

using FVec = std::vector<float>;
inline constexpr double kU = 5.9604644775390625e-08;  // 2^-24, the f32 unit roundoff

inline std::size_t Z(int x) { return static_cast<std::size_t>(x); }

// n uniform values in [lo, hi) from `rng`.
inline FVec RandomVec(std::mt19937& rng, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  FVec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// sum |a_i b_i| in f64: the scale of a dot product's rounding error.
inline double AbsDot(const float* a, const float* b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += std::fabs(static_cast<double>(a[i]) * static_cast<double>(b[i]));
  return s;
}

// Worst-case difference of the GPU's (32 lanes, then the butterfly) and the CPU's summation
// orders for an n-term dot product with sum |a_i b_i| = abs_sum (first-order bound).
inline double DotTol(int n, double abs_sum) { return 2.0 * (n / 32.0 + 8.0) * kU * abs_sum; }

// Bound of one element of CUDA attention's output against cpu::AttendGroup's. score_tol: the bound
// on a score's difference; pv: sum_u p_u |v_u[i]|; exp_u: one expf's relative error in units of
// u (1 on the host; 4 on a device, whose expf is within 2 ulp); n_blocks: the row's context
// splits (1: one block). p_u differs by <= 4 score_tol relatively (score, max, normaliser) plus
// its exp; the value sums then round n_ctx + 4 more times on different inputs. A split row's
// p_u is exp(s_u - m_j) * (exp(m_j - M) * inv): one more exp and two products (the exps'
// arguments are exact differences of the same scores), and the fold adds one add per block.
inline double AttentionTol(double score_tol, int n_ctx, int n_blocks, double pv, double exp_u) {
  const double split_terms = n_blocks > 1 ? exp_u + 2.0 + n_blocks : 0.0;
  return (4.0 * score_tol + (n_ctx + 4 + 4 * exp_u + split_terms) * kU) * pv;
}

}  // namespace lockstep::test
