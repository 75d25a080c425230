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
//        acc[8 (b % 2) + j] = fma(float(isum_j), d_w(b) * d_x(b), acc[8 (b % 2) + j])
//   K block: 16 lanes l, each a group of 16 elements (16l .. 16l+15, within one sub-block):
//        isum_l = scale(l) * (sum of its 16 products)  (Q6_K's scale l, the others' of l / 2);
//        acc[l] = fma(float(isum_l), d_w * d_x, acc[l]);  with mins (Q4_K, Q5_K), per sub-block s:
//        acc_min[s] = fma(float(m_s * (x's sum over sub-block s)), dmin_w * d_x, acc_min[s])
//        IQ4_XS's lanes group its elements as its code bytes lie instead (Iq4XsElement below):
//        lane l is 16 elements of sub-block s(l) = l / 4 + 4 ((l % 4) / 2), scale(l) its scale.
//   y = Reduce16(acc) - Reduce8(acc_min): fixed trees (a[i] + a[i+8], then + 4, + 2, + 1, as
//   matmul.cpp's lanes; a[i] + a[i+4], + 2, + 1).
// (fma: one rounding, std::fma / vfmadd.) A K block's scale multiplies a lane's whole sum, so the
// vector form sums a lane's 16 products in one chain of 4 vpdpbusd and scales once per block; x's
// 256 format keeps its integers in that lane order (QuantRows), IQ4_XS's bx format in its own.
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

// The vector form's instruction sets (matmul_q8.cpp, matmul_q8_x.cpp: VNNI's vpdpbusd, VBMI's
// vpermb, GFNI's bit-field moves, BMI2's pdep; Ice Lake and Zen 4 on); without them the portable
// form runs.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__GFNI__) && defined(__BMI2__)
#define LOCKSTEP_Q8_SIMD 1
#endif

namespace lockstep::cpu::q8 {

// Whether `t` has an integer kernel here (the other types keep the exact product).
bool HasKernel(WeightType t);
// Whether every part of `w` (a stacked matrix's parts, or w itself) has one.
bool HasKernel(const Mat& w);

// Rows of x rounded to 8 bits in the formats the product needs (both when a stacked matrix
// mixes a 32-element type with a K type). Per row of `cols` elements: q the integers, n = -128 *
// the sums of q per lane (the offset of the unsigned forms), d the scales, and for the 256 format
// bsum the sums per 32 (its sub-blocks). The 32 format keeps q in order, a lane being 4
// consecutive elements; the 256 format keeps each super-block in lane order: byte k of lane l of
// chunk c (64 bytes) at 64c + 4l + k is element 16l + 4c + k, a lane being 16 elements. The bx
// format (IQ4_XS) is the 256 format with Iq4XsElement(l, c, k) there, and no bsum.
struct QuantRows {
  int rows = 0;
  int cols = 0;
  struct Format {
    std::vector<std::int8_t> q;
    std::vector<std::int32_t> n;  // per 4 elements (32 format) or per 16 (256 format)
    std::vector<float> d;
    std::vector<std::int32_t> bsum;  // per 32 (the 256 format only)
  };
  Format b32, b256, bx;
};

// IQ4_XS's lane order: byte k of lane l of chunk c is element 32 s + 16 (c % 2) + 8 (l % 2) + 4
// (c / 2) + k of the super-block, s = l / 4 + 4 ((l % 4) / 2) its sub-block. Those are the low
// (c even) or high nibbles of the dwords that two in-lane shuffles of the 128 code bytes put in
// lane l (even dwords of both 64-byte halves for c < 2, odd ones for c >= 2): no cross-lane
// permutation of the codes, and one sub-block (one scale) per lane.
constexpr int Iq4XsSub(int l) { return l / 4 + 4 * ((l % 4) / 2); }
constexpr int Iq4XsElement(int l, int c, int k) {
  return 32 * Iq4XsSub(l) + 16 * (c % 2) + 8 * (l % 2) + 4 * (c / 2) + k;
}

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
