// Comparison metrics (DESIGN.md "compare/"): all accumulation in f64.
//
//   nrmse   = sqrt(sum((a-b)^2) / sum(a^2)), a = reference; 0 when both are all-zero; +inf when
//             only the reference is zero; NaN/Inf anywhere -> non_finite = true (the item fails)
//   max_abs = max |a-b|
//   n_diff  = count of bitwise-different elements, first_diff = index of the first (-1: none)
//   KL      = per row KL(softmax(a) || softmax(b)), natural log; max and mean over rows, plus top-1
//             agreement (argmax with the lowest index on ties)
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep {

struct DiffStats {
  double nrmse = 0.0;
  double max_abs = 0.0;
  std::uint64_t n_diff = 0;
  std::int64_t first_diff = -1;
  bool non_finite = false;
  std::uint64_t n = 0;
};

// Compares n floats; a is the reference.
DiffStats CompareF32(const float* a, const float* b, std::size_t n);

struct KlStats {
  double kl_max = 0.0;
  double kl_mean = 0.0;
  std::uint64_t top1_agree = 0;
  std::uint64_t rows = 0;
  bool non_finite = false;
};

// Row-wise KL(softmax(a) || softmax(b)) over rows x cols logits.
KlStats CompareLogits(const float* a, const float* b, std::size_t rows, std::size_t cols);

}  // namespace lockstep
