#include "lockstep/engine/quant.h"

#include <cstring>

#include "lockstep/engine/dtype.h"
#include "model/quant_iq.h"

namespace lockstep {

namespace {

float Half(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

const std::uint8_t* U8(const std::byte* p) { return reinterpret_cast<const std::uint8_t*>(p); }

void Q8Chunk(const std::byte* b, float* out) {
  const float d = Half(b);
  const auto* q = reinterpret_cast<const std::int8_t*>(b + 2);
  for (int l = 0; l < 32; ++l) out[l] = d * static_cast<float>(q[l]);
}

// Q4_0 / Q4_1: nibble j of byte j is element j, the high nibble element j + 16.
void Q4LegacyChunk(const std::byte* b, bool with_min, float* out) {
  const float d = Half(b);
  const std::uint8_t* q = U8(b + (with_min ? 4 : 2));
  if (!with_min) {
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>((q[j] & 0xF) - 8) * d;
      out[j + 16] = static_cast<float>((q[j] >> 4) - 8) * d;
    }
    return;
  }
  const float m = Half(b + 2);
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<float>(q[j] & 0xF) * d + m;
    out[j + 16] = static_cast<float>(q[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: as Q4_0 / Q4_1 with a fifth bit per element from the 32-bit qh (bit j: element j).
void Q5LegacyChunk(const std::byte* b, bool with_min, float* out) {
  const float d = Half(b);
  const std::byte* h = b + (with_min ? 4 : 2);
  std::uint32_t qh;
  std::memcpy(&qh, h, 4);
  const std::uint8_t* q = U8(h + 4);
  const float m = with_min ? Half(b + 2) : 0.0f;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    const int x0 = (q[j] & 0xF) | h0, x1 = (q[j] >> 4) | h1;
    if (with_min) {
      out[j] = static_cast<float>(x0) * d + m;
      out[j + 16] = static_cast<float>(x1) * d + m;
    } else {
      out[j] = static_cast<float>(x0 - 16) * d;
      out[j + 16] = static_cast<float>(x1 - 16) * d;
    }
  }
}

// Chunk c of a Q2_K block: 128-element half n = c / 4 uses qs[32n, 32n + 32), bits 2j..2j+1
// (j = c % 4); its two 16-element halves have scale bytes 8n + 2j and 8n + 2j + 1.
void Q2KChunk(const std::byte* b, int c, float* out) {
  const int n = c / 4, j = c % 4;
  const std::uint8_t* sc = U8(b) + 8 * n + 2 * j;
  const std::uint8_t* q = U8(b + 16) + 32 * n;
  const float d = Half(b + 80), dmin = Half(b + 82);
  for (int h = 0; h < 2; ++h) {
    const float dl = d * static_cast<float>(sc[h] & 0xF),
                ml = dmin * static_cast<float>(sc[h] >> 4);
    for (int l = 0; l < 16; ++l)
      out[16 * h + l] = dl * static_cast<float>((q[16 * h + l] >> (2 * j)) & 3) - ml;
  }
}

// Q3_K's 6-bit scale i (0..15): low 4 bits from the nibbles of bytes 0..7, high 2 bits from
// bytes 8..11.
int Q3KScale(const std::uint8_t* s, int i) {
  const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Chunk c of a Q3_K block: low 2 bits as Q2_K's, the third bit is bit c of hmask[l] (set: +0,
// clear: -4).
void Q3KChunk(const std::byte* b, int c, float* out) {
  const int n = c / 4, j = c % 4;
  const std::uint8_t* hm = U8(b);
  const std::uint8_t* q = U8(b + 32) + 32 * n;
  const std::uint8_t* s = U8(b + 96);
  const float d = Half(b + 108);
  for (int h = 0; h < 2; ++h) {
    const float dl = d * static_cast<float>(Q3KScale(s, 8 * n + 2 * j + h));
    for (int l = 0; l < 16; ++l) {
      const int k = 16 * h + l;
      const int v = ((q[k] >> (2 * j)) & 3) - ((hm[k] >> c) & 1 ? 0 : 4);
      out[k] = dl * static_cast<float>(v);
    }
  }
}

void Q4KChunk(const std::byte* b, int c, float* out) {
  const float d = Half(b), dmin = Half(b + 2);
  const std::uint8_t* scales = U8(b + 4);
  const std::uint8_t* q = U8(b + 16) + 32 * (c / 2);
  std::uint8_t sc, m;
  Q4KScaleMin(c, scales, &sc, &m);
  const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
  const int shift = (c % 2) * 4;
  for (int l = 0; l < 32; ++l) out[l] = d1 * static_cast<float>((q[l] >> shift) & 0xF) - m1;
}

// Q5_K: Q4_K with a fifth bit, bit c of qh[l].
void Q5KChunk(const std::byte* b, int c, float* out) {
  const float d = Half(b), dmin = Half(b + 2);
  const std::uint8_t* qh = U8(b + 16);
  const std::uint8_t* q = U8(b + 48) + 32 * (c / 2);
  std::uint8_t sc, m;
  Q4KScaleMin(c, U8(b + 4), &sc, &m);
  const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
  const int shift = (c % 2) * 4;
  for (int l = 0; l < 32; ++l) {
    const int v = ((q[l] >> shift) & 0xF) + ((qh[l] >> c) & 1 ? 16 : 0);
    out[l] = d1 * static_cast<float>(v) - m1;
  }
}

// Chunk c (0..7) of a Q6_K block: half n = c / 4 (128 elements each), quarter j = c % 4.
void Q6KChunk(const std::byte* b, int c, float* out) {
  const int n = c / 4, j = c % 4;
  const std::uint8_t* ql = U8(b) + 64 * n + (j % 2) * 32;
  const std::uint8_t* qh = U8(b + 128) + 32 * n;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192) + 8 * n;
  const float d = Half(b + 208);
  const int lshift = (j / 2) * 4, hshift = 2 * j;
  for (int l = 0; l < 32; ++l) {
    const int q = ((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4);
    out[l] = d * static_cast<float>(sc[l / 16 + 2 * j]) * static_cast<float>(q - 32);
  }
}

}  // namespace

void DequantizeChunk32(WeightType t, const std::byte* block, int c, float* out) {
  switch (t) {
    case WeightType::kQ8_0:
      return Q8Chunk(block, out);
    case WeightType::kQ4_0:
    case WeightType::kQ4_1:
      return Q4LegacyChunk(block, t == WeightType::kQ4_1, out);
    case WeightType::kQ5_0:
    case WeightType::kQ5_1:
      return Q5LegacyChunk(block, t == WeightType::kQ5_1, out);
    case WeightType::kQ2_K:
      return Q2KChunk(block, c, out);
    case WeightType::kQ3_K:
      return Q3KChunk(block, c, out);
    case WeightType::kQ4_K:
      return Q4KChunk(block, c, out);
    case WeightType::kQ5_K:
      return Q5KChunk(block, c, out);
    case WeightType::kQ6_K:
      return Q6KChunk(block, c, out);
    default:
      quant_detail::DequantizeChunkIq(t, block, c, out);
      return;
  }
}

void DequantizeBlock(WeightType t, const std::byte* block, float* out) {
  const int chunks = weight_block_elems(t) / 32;
  for (int c = 0; c < chunks; ++c) DequantizeChunk32(t, block, c, out + 32 * c);
}

}  // namespace lockstep
