// Block-quantised weight types in ggml's byte layouts (what a GGUF file stores), with their
// dequantised values defined exactly (f32 arithmetic in the order written below, as ggml's
// dequantize_row_* define it), and simple quantisers for the synthetic GGUF writer.
// d, dmin, m: f16 scales widened exactly; "x * y" below is one f32 product, left to right.
//
//   Q4_0  32 in 18: d, 16 bytes of nibbles (element j low nibble of byte j, j+16 the high).
//         w = (q - 8) * d
//   Q4_1  32 in 20: d, m, nibbles as Q4_0.                       w = q * d + m
//   Q5_0  32 in 22: d, u32 qh (bit j: 5th bit of element j), nibbles.   w = (q - 16) * d
//   Q5_1  32 in 24: d, m, qh, nibbles.                            w = q * d + m
//   Q8_0  32 in 34: d, int8 q[32].                                w = d * q
//   Q2_K  256 in 84: 16 scale bytes (low nibble scale, high min, per 16 elements), 64 bytes of
//         2-bit q, d, dmin.                                       w = (d * sc) * q - dmin * mn
//   Q3_K  256 in 110: 32 bytes hmask (3rd bit), 64 bytes 2-bit q, 12 bytes of sixteen 6-bit
//         scales, d.                     w = (d * (sc - 32)) * (q2 - (hbit ? 0 : 4))
//   Q4_K  256 in 144: d, dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of 4-bit q
//         (sub-block s of 32 uses the low nibbles of bytes [32(s/2), 32(s/2)+32) when s is even,
//         the high nibbles when odd).                            w = (d * sc_s) * q - (dmin * m_s)
//   Q5_K  256 in 176: as Q4_K plus 32 bytes qh (bit s of byte l: +16 for element l of s).
//   Q6_K  256 in 210: 128 bytes of low 4 bits, 64 bytes of high 2 bits, int8 scales[16] (one per
//         16 elements), d.                                        w = (d * scale) * (q - 32)
//   IQ4_NL 32 in 18: d, nibbles into the 16 values kIq4nl.        w = d * kIq4nl[q]
//   IQ4_XS 256 in 136: d, u16 scales_h, 4 bytes scales_l (6-bit scale per 32), nibbles.
//         w = (d * (ls - 32)) * kIq4nl[q]
//   IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S: d; per 32 elements a scale and 4 or 8 lattice points
//         (quant_grids.h) with sign bits.      w = sign ? -((d * f(scale)) * grid) : ...
//         (a negation, so a NaN scale's sign flips too, as in ggml's own build)
//   IQ1_S, IQ1_M: d (IQ1_M's spread over the scale words); per 8 elements a grid point of -1/0/1
//         and a delta of +-1/8.                w = (d * (2 * s + 1)) * (grid + delta)
//   TQ1_0 256 in 54 (base-3 digits of 5 per byte), TQ2_0 256 in 66 (2 bits).  w = (q - 1) * d
// Every product above of an f16 and a small integer is exact in f32; the additions and
// subtractions of a min and Q6_K's second product round once (to nearest), so a value is the same
// on every machine. tests/engine/quant_oracle_test.cpp checks every type bitwise against ggml's
// own to_float.
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
// Quantises n values (n a multiple of the block size) into n / block_elems blocks at out: a
// simple round-to-nearest quantiser per type (not ggml's search), for synthetic checkpoints.
void QuantizeRow(WeightType t, const float* x, std::size_t n, std::byte* out);

}  // namespace lockstep
