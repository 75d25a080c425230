// Element types and the exact conversions between them.
//
// Every conversion here is exact-by-table: f32 -> bf16 and f32 -> f16 round to nearest, ties to
// even; NaN stays NaN (quiet, sign kept); overflow goes to +-Inf; f16 subnormals are produced and
// read exactly. The implementations use integer arithmetic only, with no data-dependent masking
// of a float's bits (g++ 12.2 miscompiles `if (flag) v = bit_cast<float>(bits & 0xffff0000u)` at
// -O1 and above), and tests/engine/dtype_test.cpp proves them against tables under g++ and clang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lockstep {

enum class DType : std::uint8_t { kF32, kF16, kBF16, kF64, kI8, kU8, kI32, kI64, kBool };

// Bytes per element.
std::size_t dtype_size(DType t);
// Lower-case name used in messages and config ("f32", "bf16", "int8", ...).
std::string_view dtype_name(DType t);
// safetensors header names ("F32", "BF16", "F16", "F64", "I8", "U8", "I32", "I64", "BOOL").
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view name);

// ---- scalar conversions ----
// Narrowing (f32 -> bf16/f16) rounds to nearest, ties to even, on the bit pattern; values past
// the largest finite value round to +-Inf exactly where IEEE says (f16: |x| >= 65520 is Inf,
// 65519.99 is 65504). A NaN becomes a quiet NaN with the same sign and the top payload bits
// (bf16: (bits >> 16) | 0x0040; f16: 0x7e00 | payload >> 13).
// Widening (bf16/f16 -> f32) is exact for every code, NaN payloads included (not re-quieted).
// All four are pure functions: thread-safe, no dependence on the FP environment.
std::uint16_t f32_to_bf16(float x);  // round to nearest even; NaN -> quiet NaN
float bf16_to_f32(std::uint16_t b);  // exact
std::uint16_t f32_to_f16(float x);   // round to nearest even, subnormals, +-Inf on overflow
float f16_to_f32(std::uint16_t h);   // exact (subnormals included)
// x rounded to the nearest bf16 value and widened back (exact f32 result).
inline float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Converts n elements of `src` (of type `t`, any alignment, little-endian) to f32.
// Only floating types (f32, f16, bf16, f64) are accepted; returns false otherwise (and writes
// nothing). f64 narrows with the hardware conversion (default rounding mode: nearest even).
// `dst` must hold n floats and must not overlap `src`.
bool convert_to_f32(DType t, const void* src, std::size_t n, float* dst);

// ---- int8 symmetric quantisation (K/V cache) ----
// One scale per row of n values: scale = max|x| / 127 (0 when the row is all zero);
// code = clamp(nearbyint(x / scale), -127, 127), ties to even. Dequantised value = code * scale.
// A non-finite input makes the scale non-finite; callers never feed those (K/V are finite).
// Returns the scale. A row whose max|x| / 127 underflows to 0 is treated like an all-zero row
// (scale 0, codes 0). Division is x / scale (not x * (1 / scale)) so exact ties stay ties.
// Dequantisation: out[i] = float(codes[i]) * scale, one rounding.
float quantize_int8_row(const float* x, std::size_t n, std::int8_t* codes);
void dequantize_int8_row(const std::int8_t* codes, float scale, std::size_t n, float* out);

}  // namespace lockstep
