// The 8-bit numeric path of the products (`quant_dot = ggml`, matmul.h kInvariantQ8 / kGemmQ8):
// llama.cpp's arithmetic for block-quantised weights, kept deterministic and batch-invariant.
//
// A row of x is rounded to 8 bits per block the way ggml rounds activations (vec_dot_type): per
// 32 elements for the 32-element types (Q8_0, Q4_0, Q5_0, IQ4_NL: ggml's Q8_0, d = amax / 127
// stored as f16), per 256 for the K types (Q4_K, Q5_K, Q6_K, IQ4_XS: ggml's Q8_K, d = max / -127
// in f32, x's sums per 32). Each weight block's integers are multiplied with x's and summed as
// integers (exact, so the order of those sums never matters), then scaled in f32:
//
//   32-element block b of the row: 8 lanes j, isum_j = sum of 4 products (elements 4j .. 4j+3);
//        acc[8 (b % 2) + j] += float(isum_j) * (d_w(b) * d_x(b))
//   K block: 16 lanes l, isum_l = sum over its 4 chunks c of 64 elements of
//        scale(c, l) * (sum of 4 products, elements 64c + 4l .. 64c + 4l + 3);
//        acc[l] += float(isum_l) * (d_w * d_x);  with mins (Q4_K, Q5_K), per sub-block s:
//        acc_min[s] += float(m_s * (x's sum over sub-block s)) * (dmin_w * d_x)
//   y = Reduce16(acc) - Reduce8(acc_min): fixed trees (a[i] + a[i+8], then + 4, + 2, + 1, as
//   matmul.cpp's lanes; a[i] + a[i+4], + 2, + 1).
//
// Every (x row, weight row) pair goes through exactly those operations whatever the row count,
// the thread count or the blocking, so the path is batch- and T-invariant like kInvariant. It is
// not bitwise llama.cpp (its f32 sums run in another order) but the same rounding of x, so its
// logits agree with llama.cpp's to the f32 floor of that order rather than to the 1e-2 that x's
// rounding costs the exact path. With AVX-512 (VNNI) the integer sums use vpdpbusd; elsewhere a
// portable form computes the same integers and the same f32 operations (same bits).
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/engine/weights.h"

// The vector form's instruction sets (matmul_q8.cpp, matmul_q8_x.cpp); without them the portable
// form runs.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define LOCKSTEP_Q8_SIMD 1
#endif

namespace lockstep::cpu::q8 {

// Whether `t` has an integer kernel here (the other types keep the exact product).
bool HasKernel(WeightType t);
// Whether every part of `w` (a stacked matrix's parts, or w itself) has one.
bool HasKernel(const Mat& w);

// Rows of x rounded to 8 bits in the formats the product needs (both when a stacked matrix
// mixes a 32-element type with a K type). Per row of `cols` elements: q the integers, n4 = -128 *
// the sum of each 4 consecutive q (the offset of the unsigned forms), d the scales, and for the
// 256 format bsum the sums per 32.
struct QuantRows {
  int rows = 0;
  int cols = 0;
  struct Format {
    std::vector<std::int8_t> q;
    std::vector<std::int32_t> n4;
    std::vector<float> d;
    std::vector<std::int32_t> bsum;  // per 32 (the 256 format only)
  };
  Format b32, b256;
};

// Rounds rows [0, n_rows) of x (row stride cols = w.cols) for w's types into `q`.
void Quantise(const float* x, int n_rows, const Mat& w, QuantRows& q);

// y[t, o - y_col0] = the 8-bit product of row t of x (as `q` holds it) with row o of w, for
// o in [o_begin, o_end) and t < n_rows (w stacked or not; HasKernel(w)).
void Rows(const QuantRows& q, int n_rows, const Mat& w, int o_begin, int o_end, float* y, int ldy,
          int y_col0);

// Tests: run the portable form even where the vector one is built (same bits by construction;
// the test holds both to it). Not thread-safe against running products.
void UsePortableForTest(bool on);
namespace detail {
extern bool g_portable;  // UsePortableForTest's flag (matmul_q8.cpp, matmul_q8_x.cpp)
}  // namespace detail

}  // namespace lockstep::cpu::q8
