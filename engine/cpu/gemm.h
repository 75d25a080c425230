// The prefill product (MatmulKind::kGemm, matmul.h) of a range of W's rows:
//
//   y[t, o - ob] = x[t, :] . W[o, :]   for t < T, ob <= o < oe   (y row stride ldy)
//
// Numerics: bitwise what Eigen 3.4 computes for `Y = X * W^T` on an f32 copy of those rows (the
// widened or dequantised values), for every shape and weight type. That is the contract the
// golden exports were recorded under; this file keeps it while reading the weights as stored and
// running a faster kernel than Eigen's for most of the product.
//
// Why that is possible: Eigen's gebp kernel cuts each of its row blocks (mc rows, per kc block of
// the reduction) into panels of 3, 2 and 1 packets of rows and then fewer. For the rows of a 3- or
// 2-packet panel each result element is one sequential chain c = pmadd(w, x, c) over the block's
// k from c = 0, then y += c; for a 1-packet panel against a 4-column rhs panel, even and odd k
// (over the block's first depth & ~7) run in two chains that are added before the rest continues
// the first; against the last cols % 4 single columns, one chain. Blocks go in increasing k.
// Nothing else (the row or column blocking, the tile shape, the order of tiles, the packing)
// touches an element's arithmetic. gemm.cpp computes every row of those panels with its own
// tiles (48 rows x 8 columns: half the loads of W per multiply-add of Eigen's 48 x 4), its own
// cache blocking, W widened from bf16 / f16 straight into the packed layout and X read from its
// rows unpacked, each element with the arithmetic of its Eigen panel. The rows after the last
// whole packet of a row block (Eigen's half-, quarter-packet and scalar paths) go through
// Eigen's own packing and gebp kernel, exactly as Eigen would run them. T == 1 on bf16 / f16 (a
// prefill chunk's single-row experts, the last token's head) is Eigen's row-major matrix-vector
// product (one pmadd chain per row over whole packets, predux, the scalar tail; half and quarter
// packets on an odd last row), computed with Eigen's pmadd and predux on weights widened in
// registers. Other shapes Eigen does not send to its GEMM (coefficient-based tiny products,
// N == 1, T == 1 on f32 or block types) go to Eigen's product.
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

// The row counts (T, X's rows) where the kernel's blocking changes: Eigen's rhs panel of 4
// columns (the last T % 4 one by one) and the own kernel's tile of 4 x kPanelsPerTile columns (8
// with 32 vector registers). T == 1 on bf16 / f16 is the matrix-vector path.
int GemmColumnPanel();
int GemmColumnTile();

}  // namespace lockstep::cpu
