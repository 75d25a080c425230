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
#pragma once

#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/weights.h"

namespace lockstep::cpu {

enum class MatmulKind { kInvariant, kGemm };

// Dot product with the fixed reduction order described above (n >= 0).
float Dot(const float* a, const float* b, int n);

// y[t, o] = x[t, :] . W[o, :] for t < n_rows (W of any WeightType), o < w.rows. x f32 [n_rows,
// w.cols] (row stride w.cols), y f32 [n_rows, w.rows] (row stride ldy, default w.rows).
void Matmul(MatmulKind kind, const float* x, int n_rows, const Mat& w, float* y, ThreadPool* pool,
            int ldy = -1);

// Same product, kInvariant, for a contiguous subset of W's rows [o_begin, o_end): writes
// y[t, o - o_begin]. Used to split one weight (e.g. per-head projections) without copying.
void MatmulRowsRange(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
                     int ldy);

// Rows per DotRows block of kInvariant (8 with AVX-512, else 4): the rows of x are computed in
// blocks of this many (then one block of the rest). Same bits whatever the blocking (above).
int InvariantRowBlock();

}  // namespace lockstep::cpu
