// The i-quant and ternary halves of quant.cpp's dequantisation (quant_iq.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/engine/weights.h"

namespace lockstep::quant_detail {

// Elements [32c, 32c + 32) of one block of an i-quant or ternary type t into out; false (nothing
// written) for any other type.
bool DequantizeChunkIq(WeightType t, const std::byte* block, int c, float* out);

// The i-quant lattice grids unpacked from quant_grids.h: entry i of a grid of width w is
// [w * i, w * i + w).
struct IqGrids {
  IqGrids();
  std::vector<std::uint8_t> g2xxs, g2xs, g2s;  // 256, 512, 1024 entries of 8
  std::vector<std::uint8_t> g3xxs, g3s;        // 256, 512 entries of 4
  std::vector<std::int8_t> g1s;                // 2048 entries of 8 (-1, 0, 1)
};
const IqGrids& Grids();  // built once, thread-safe

}  // namespace lockstep::quant_detail
