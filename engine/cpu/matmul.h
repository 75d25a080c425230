// CPU matrix products.
//
// Two kinds, chosen by the caller, never by the size of the input:
//   kInvariant  (decode / verify windows): each output element y[t][o] is one Dot() of row t
//               of x with row o of W, with a fixed 32-lane accumulation order over `in` and a
//               fixed combine tree. Row t's result is therefore bitwise independent of how many
//               rows are computed together and of the thread count (threads split the outputs
//               o, never the reduction).
//   kGemm       (prefill chunks): bitwise Eigen's blocked GEMM (gemm.h: its arithmetic, our
//               kernel for most of it). Faster for many rows; its blocking depends on the shape,
//               so results may differ from kInvariant in the last bits (measured: prefill chunk
//               size changes logits by NRMSE ~1e-7, see tests).
//
// Weights of every WeightType (weights.h) are read as stored and widened (bf16, f16: exact) or
// dequantised (the ggml block types: quant.h; cpu/quant_src.h) in registers or in cache-sized
// blocks; a stacked matrix (weights.h) goes part by part. Both kinds give
// bitwise the result of the same product on an f32 copy of the weights (the widened or
// dequantised values) for every shape and thread count: kInvariant consumes the same f32 values
// in the same order; kGemm packs widened blocks into the kernels' layouts (gemm.cpp).
//
//   kInvariantQ8 / kGemmQ8  (`quant_dot = ggml`): a weight whose types all have an 8-bit kernel
//               (matmul_q8.h: Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS) takes x rounded
//               to 8 bits per block and integer dot products, as llama.cpp computes, in one fixed
//               order whatever the row count (prefill chunks too: batch- and T-invariant);
//               a bf16 / f16 weight takes x rounded to bf16 / f16 (ggml's vec_dot_type for
//               them) into kInvariant / kGemm; every other weight is kInvariant / kGemm's.
#pragma once

#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/weights.h"

namespace lockstep::cpu {

enum class MatmulKind { kInvariant, kGemm, kInvariantQ8, kGemmQ8 };

// kind with quant_dot = ggml applied (q8) or not.
inline MatmulKind WithQuantDot(MatmulKind kind, bool q8) {
  if (!q8) return kind;
  return kind == MatmulKind::kGemm || kind == MatmulKind::kGemmQ8 ? MatmulKind::kGemmQ8
                                                                  : MatmulKind::kInvariantQ8;
}
// Whether kind's f32 products are kInvariant's (a decode / verify product).
inline bool IsInvariant(MatmulKind kind) {
  return kind == MatmulKind::kInvariant || kind == MatmulKind::kInvariantQ8;
}

// Dot product with the fixed reduction order described above (n >= 0).
float Dot(const float* a, const float* b, int n);

// y[t, o] = x[t, :] . W[o, :] for t < n_rows (W of any WeightType), o < w.rows. x f32 [n_rows,
// w.cols] (row stride w.cols), y f32 [n_rows, w.rows] (row stride ldy, default w.rows).
void Matmul(MatmulKind kind, const float* x, int n_rows, const Mat& w, float* y, ThreadPool* pool,
            int ldy = -1);

// The same product (kInvariant or kInvariantQ8) for a contiguous subset of W's rows [o_begin,
// o_end) on the calling thread: writes y[t, o - o_begin] (row stride ldy), bitwise Matmul's
// columns o_begin .. o_end - 1 (each output is one row's dot whatever the split). Splits one
// weight without copying (per-head projections, the MoE's halves of a down product). kGemm has
// none: its blocking follows the shape.
void MatmulRowsRange(MatmulKind kind, const float* x, int n_rows, const Mat& w, int o_begin,
                     int o_end, float* y, int ldy);

// Rows per DotRows block of kInvariant (8 with AVX-512, else 4): the rows of x are computed in
// blocks of this many (then one block of the rest). Same bits whatever the blocking (above).
int InvariantRowBlock();

}  // namespace lockstep::cpu
