#include "lockstep/engine/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace lockstep {

// Every float <-> half/bf16 conversion below works on the uint32 bit pattern and converts to or
// from float exactly once (std::bit_cast). There is deliberately no "mask a float's bits under a
// runtime condition" step: g++ 12.2 at -O1+ miscompiles
//   if (flag) v = std::bit_cast<float>(std::bit_cast<uint32_t>(v) & 0xffff0000u);
// by keeping the unmasked value. dtype_test.cpp (VolatileFlagPath*) guards against regressions.

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
    case DType::kI32:
      return 4;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF64:
      return "f64";
    case DType::kI8:
      return "int8";
    case DType::kU8:
      return "uint8";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kBool:
      return "BOOL";
  }
  return "UNKNOWN";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  static constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI8,
                                   DType::kU8,  DType::kI32, DType::kI64,  DType::kBool};
  for (DType t : kAll) {
    if (dtype_safetensors_name(t) == name) return t;
  }
  return std::nullopt;
}

// ---- scalar conversions ----

std::uint16_t f32_to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep sign and the top payload bits, force the quiet bit so a payload living only in
    // the low 16 bits cannot turn into Inf.
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  // Round to nearest even on the integer pattern: add 0x7fff plus the lsb of the kept half.
  // A carry out of the mantissa bumps the exponent, which is exactly the next representable
  // value; FLT_MAX-ish values carry into the all-ones exponent and become +-Inf. No overflow of
  // the uint32: the largest non-NaN pattern is 0xff800000 (-Inf).
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

float bf16_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

std::uint16_t f32_to_f16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;

  if (a > 0x7f800000u) {  // NaN: quiet bit set, sign and top 9 payload bits kept
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  }
  // 65520 = 0x477ff000 is the midpoint between 65504 (max finite, odd mantissa) and 2^16; the
  // tie goes to the even neighbour 2^16, which is Inf. Everything >= it (incl. Inf) is Inf.
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);

  if (a >= 0x38800000u) {  // >= 2^-14: normal half
    // Rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits, nearest even.
    // A mantissa carry propagates into the exponent, giving the next binade correctly.
    const std::uint32_t lsb = (a >> 13) & 1u;
    const std::uint32_t r = a - (112u << 23) + 0xfffu + lsb;
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  // Half subnormal: value = q * 2^-24. Values <= 2^-25 (0x33000000, the tie with zero) round to
  // zero; this also covers f32 zeros and subnormals.
  if (a <= 0x33000000u) return static_cast<std::uint16_t>(sign);
  const std::uint32_t e = a >> 23;                          // 102..112
  const std::uint32_t m = (a & 0x007fffffu) | 0x00800000u;  // 24-bit significand
  const std::uint32_t shift = 126u - e;                     // 14..24
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u) != 0u)) ++q;  // q == 0x400 is 2^-14, still right
  return static_cast<std::uint16_t>(sign | q);
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t e = (static_cast<std::uint32_t>(h) >> 10) & 0x1fu;
  std::uint32_t m = static_cast<std::uint32_t>(h) & 0x03ffu;
  std::uint32_t bits;
  if (e == 0x1fu) {
    // Inf or NaN: payload widened bit-exactly (like bf16_to_f32, widening never alters a NaN).
    bits = sign | 0x7f800000u | (m << 13);
  } else if (e != 0u) {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0u) {
    bits = sign;
  } else {
    // Subnormal m * 2^-24: normalise so the leading one lands on bit 10.
    const int sh = std::countl_zero(m) - 21;  // 1..10
    m = (m << sh) & 0x03ffu;
    bits = sign | ((113u - static_cast<std::uint32_t>(sh)) << 23) | (m << 13);
  }
  return std::bit_cast<float>(bits);
}

// ---- bulk conversion ----

bool convert_to_f32(DType t, const void* src, std::size_t n, float* dst) {
  // Sources may be unaligned (a safetensors data section starts at 8 + header length), so each
  // element is loaded with memcpy; compilers turn that into a plain unaligned load.
  const auto* p = static_cast<const unsigned char*>(src);
  switch (t) {
    case DType::kF32:
      if (n != 0) std::memcpy(dst, p, n * sizeof(float));
      return true;
    case DType::kBF16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, p + 2 * i, sizeof v);
        dst[i] = bf16_to_f32(v);
      }
      return true;
    case DType::kF16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, p + 2 * i, sizeof v);
        dst[i] = f16_to_f32(v);
      }
      return true;
    case DType::kF64:
      // Narrowing uses the hardware conversion in the default rounding mode (nearest even).
      for (std::size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + 8 * i, sizeof v);
        dst[i] = static_cast<float>(v);
      }
      return true;
    case DType::kI8:
    case DType::kU8:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      return false;
  }
  return false;
}

// ---- int8 symmetric quantisation ----

float quantize_int8_row(const float* x, std::size_t n, std::int8_t* codes) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;
  }
  const float scale = amax / 127.0f;
  // An all-zero row (or one so tiny that max/127 underflows to 0) gets scale 0 and all-zero codes
  // instead of dividing by zero.
  if (!(scale > 0.0f)) {
    for (std::size_t i = 0; i < n; ++i) codes[i] = 0;
    return 0.0f;
  }
  for (std::size_t i = 0; i < n; ++i) {
    // x / scale (not x * (1/scale)) so exact ties such as 2.5 stay exact; nearbyint uses the
    // default rounding mode, ties to even. The clamp is written so a NaN lands on 127 rather
    // than reaching the (undefined) float -> int8 conversion.
    float c = std::nearbyint(x[i] / scale);
    c = c <= 127.0f ? c : 127.0f;
    c = c >= -127.0f ? c : -127.0f;
    codes[i] = static_cast<std::int8_t>(c);
  }
  return scale;
}

void dequantize_int8_row(const std::int8_t* codes, float scale, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * scale;
}

}  // namespace lockstep
