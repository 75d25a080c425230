// Block-quantised weight types in ggml's byte layouts (what a GGUF file stores), with their
// dequantised values defined exactly (f32 arithmetic in the order written below), and simple
// quantisers for the synthetic GGUF writer.
//
//   Q8_0  32 elements in 34 bytes: f16 d, int8 q[32].            w = d * q
//   Q4_K  256 elements in 144 bytes: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min)
//         pairs, 128 bytes of 4-bit q (sub-block s of 32 uses the low nibbles of bytes
//         [32(s/2), 32(s/2)+32) when s is even, the high nibbles when odd).
//         w = (d * sc_s) * q - (dmin * m_s)
//   Q6_K  256 elements in 210 bytes: 128 bytes of low 4 bits, 64 bytes of high 2 bits, int8
//         scales[16] (one per 16 elements), f16 d.              w = (d * scale) * (q - 32)
// Every product above of an f16 and a small integer is exact in f32; Q4_K's subtraction and
// Q6_K's second product round once (to nearest), so a value is the same on every machine.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lockstep/engine/weights.h"

namespace lockstep {

inline constexpr int kQ8_0Elems = 32;
inline constexpr std::size_t kQ8_0Bytes = 34;
inline constexpr int kQkK = 256;
inline constexpr std::size_t kQ4_KBytes = 144;
inline constexpr std::size_t kQ6_KBytes = 210;

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K block's 12 scale bytes.
inline void Q4KScaleMin(int j, const std::uint8_t* s, std::uint8_t* sc, std::uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<std::uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<std::uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Dequantises one block of type t (a block type) into out[weight_block_elems(t)].
void DequantizeBlock(WeightType t, const std::byte* block, float* out);
// Dequantises elements [32c, 32c + 32) of one block (c < weight_block_elems(t) / 32): the unit
// the kernels consume.
void DequantizeChunk32(WeightType t, const std::byte* block, int c, float* out);
// Quantises n values (n a multiple of the block size) into n / block_elems blocks at out.
void QuantizeRow(WeightType t, const float* x, std::size_t n, std::byte* out);

}  // namespace lockstep
