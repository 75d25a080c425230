// The prefill product (MatmulKind::kGemm, matmul.h) of a range of W's rows:
//
//   y[t, o - ob] = x[t, :] . W[o, :]   for t < T, ob <= o < oe   (y row stride ldy)
//
// Numerics: bitwise what Eigen 3.4 computes for `Y = X * W^T` on an f32 copy of those rows (the
// widened or dequantised values), for every shape and weight type. That is the contract the
// golden exports were recorded under; this file keeps it while reading the weights as stored and
// running a faster kernel than Eigen's for most of the product.
//
// Why that is possible: for the rows Eigen's gebp kernel handles in its widest register panel
// (mr = 3 packets, the `3pX4` / `3pX1` micro-kernels), each result element is, per reduction block
// of kc columns (Eigen's blocking for the shape), one sequential chain c = pmadd(w, x, c) over k
// from c = 0, then y += c; blocks in increasing k. Nothing else (the row or column blocking, the
// tile shape, the order of tiles) touches an element's arithmetic. gemm.cpp computes those rows
// with its own tiles (8 columns instead of 4: half the loads of W per multiply-add), its own
// cache blocking and a packing step that widens bf16 / f16 straight into the packed layout. The
// remaining rows of each of Eigen's row blocks (fewer than mr; Eigen runs them through other
// micro-kernels, one of which splits the reduction over two accumulators) go through Eigen's own
// gebp kernel, packed by Eigen, exactly as Eigen would run them. Shapes Eigen does not send to
// its GEMM (coefficient-based tiny products, T == 1 or N == 1) go to Eigen's product.
// tests/engine/gemm_test.cpp checks the claim bitwise against Eigen over every shape class.
#pragma once

#include "lockstep/engine/weights.h"

namespace lockstep::cpu {

void GemmRows(const float* x, int T, const Mat& w, int ob, int oe, float* y, int ldy);

// Which implementation GemmRows runs. Both give the same bits (above); kEigen is Eigen's own
// product on widened blocks (the implementation before 2026-12-01), kept as the reference the
// tests compare against and as the baseline of tests/bench/weights_bench.cpp. Process-wide; for
// tests and benchmarks only.
enum class GemmImpl { kOwn, kEigen };
void SetGemmImpl(GemmImpl impl);
GemmImpl CurrentGemmImpl();

}  // namespace lockstep::cpu
