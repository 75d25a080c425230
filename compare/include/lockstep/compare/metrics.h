// Comparison metrics (DESIGN.md "compare/"): accumulation in f64 (KL: blocks of 8 f32 terms per
// lane added into f64); a is the reference.
//
//   nrmse      = sqrt(sum((a-b)^2) / sum(a^2)); 0 when both sums are zero (a and b all zero, signs
//                of zero ignored); +inf when only the reference sum is zero
//   max_abs    = max |a-b| over the elements where both a and b are finite
//   n_diff     = count of bitwise-different elements (f32: the 32-bit patterns, bf16: the 16-bit
//                codes, int8: the f32 patterns of the dequantized values), so -0.0 vs +0.0 and two
//                NaNs with different payloads count as differences; first_diff = global index of
//                the first such element (-1: none)
//   non_finite = NaN or +-Inf in a or b anywhere (int8: in a dequantized value, i.e. a scale).
//                The item fails: nrmse is NaN (and KL max/mean are NaN); n_diff, first_diff and
//                max_abs (over the finite pairs) stay meaningful
//   int8       = value_i = float(code_i) * scale[row, head] (one f32 rounding, as
//                dequantize_int8_row does); NRMSE etc. over those values; the codes themselves are
//                compared exactly: code_diff / first_code_diff
//   KL         = per row KL(softmax(a) || softmax(b)), natural log; max and mean over rows, plus
//                top-1 agreement (argmax with the lowest index on ties; -0.0 ties with +0.0). A row
//                with NaN/Inf is not evaluated (no KL, no top-1 vote) and sets non_finite.
//
// Accuracy: nrmse within ~1e-14 relative of an exact evaluation at 10^7 elements (f64 sums, in
// partial sums of 4096 elements, of exact f64 differences of f32 values). KL typically within
// ~1e-7 relative of exact, by construction within a few 1e-6 (the softmax weights use an f32 exp,
// see metrics.cpp: its error only perturbs the weights, never the log-ratio, so the error stays
// relative even when KL is tiny); KL of identical rows, and of rows shifted by an exactly
// representable constant, is exactly 0.
//
// Determinism: every function is a pure function of its inputs and of the block split. The
// vector code is written once (GCC/Clang vector extensions, no FMA contraction), so the bits do
// not depend on the instruction set (SSE2, AVX2 and AVX-512 builds agree). Each Add*/AddRows
// call reduces its block to one partial sum, in a fixed lane order, before adding it to the
// running total; merging accumulators that each received one block, in block order, therefore
// gives the same bits as one accumulator fed the same blocks in that order, whatever the number
// of threads that produced them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep {

namespace detail {
struct F32BlockSums;  // metrics.cpp
}  // namespace detail

struct DiffStats {
  double nrmse = 0.0;
  double max_abs = 0.0;
  std::uint64_t n_diff = 0;
  std::int64_t first_diff = -1;
  bool non_finite = false;
  std::uint64_t n = 0;
  std::uint64_t code_diff = 0;        // int8 only: codes that differ
  std::int64_t first_code_diff = -1;  // int8 only: global index of the first (-1: none)
};

// Streams one item in blocks of elements. Element indices (first_diff, first_code_diff) are
// global: first_index + the number of elements added before. For parallel reduction give each
// worker an accumulator of its own with first_index = the start of its range, and Merge them in a
// fixed order; an Add after a Merge continues at first_index + n (contiguous ranges).
struct F32Accumulator {
  F32Accumulator() = default;
  explicit F32Accumulator(std::uint64_t first_index) : first_index_(first_index) {}

  // n floats of each side.
  void Add(const float* a, const float* b, std::size_t n);
  // n raw bf16 codes of each side; values widen exactly (code << 16).
  void AddBf16(const std::uint16_t* a, const std::uint16_t* b, std::size_t n);
  // rows x heads x head_dim codes, row-major, with one scale per (row, head): [rows, heads].
  void AddInt8(const std::int8_t* a, const float* a_scale, const std::int8_t* b,
               const float* b_scale, std::size_t rows, std::size_t heads, std::size_t head_dim);
  // Adds another accumulator's elements (sums add, counts add, first indices take the minimum).
  // Deterministic for a fixed merge order.
  void Merge(const F32Accumulator& other);
  DiffStats Finish() const;

 private:
  void Commit(const detail::F32BlockSums& block);

  std::uint64_t first_index_ = 0;
  std::uint64_t n_ = 0;
  double sum_sq_diff_ = 0.0;  // sum (a-b)^2
  double sum_sq_ref_ = 0.0;   // sum a^2
  double max_abs_ = 0.0;
  std::uint64_t n_diff_ = 0;
  std::int64_t first_diff_ = -1;
  std::uint64_t code_diff_ = 0;
  std::int64_t first_code_diff_ = -1;
  bool non_finite_ = false;
};

// Compares n floats; a is the reference. One-block use of F32Accumulator.
DiffStats CompareF32(const float* a, const float* b, std::size_t n);

struct KlStats {
  double kl_max = 0.0;
  double kl_mean = 0.0;
  std::uint64_t top1_agree = 0;
  std::uint64_t rows = 0;
  bool non_finite = false;
};

// Streams logits in row blocks. kl_mean divides by all rows, non-finite ones included (it is NaN
// then anyway). A row of zero columns has KL 0 and counts as top-1 agreement.
struct KlAccumulator {
  // rows x cols logits of each side, row-major.
  void AddRows(const float* a, const float* b, std::size_t rows, std::size_t cols);
  // Deterministic for a fixed merge order (see the file comment).
  void Merge(const KlAccumulator& other);
  KlStats Finish() const;

 private:
  double sum_kl_ = 0.0;
  double kl_max_ = 0.0;
  std::uint64_t top1_agree_ = 0;
  std::uint64_t rows_ = 0;
  bool non_finite_ = false;
};

// Row-wise KL(softmax(a) || softmax(b)) over rows x cols logits. One-block use of KlAccumulator.
KlStats CompareLogits(const float* a, const float* b, std::size_t rows, std::size_t cols);

}  // namespace lockstep
