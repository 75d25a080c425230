#include "lockstep/engine/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lockstep/engine/dtype.h"

namespace lockstep {

namespace {

float Half(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

void PutHalf(std::byte* p, float v) {
  const std::uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

const std::uint8_t* U8(const std::byte* p) { return reinterpret_cast<const std::uint8_t*>(p); }

void Q8Chunk(const std::byte* b, float* out) {
  const float d = Half(b);
  const auto* q = reinterpret_cast<const std::int8_t*>(b + 2);
  for (int l = 0; l < 32; ++l) out[l] = d * static_cast<float>(q[l]);
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

void QuantizeQ8(const float* x, std::byte* b) {
  float amax = 0;
  for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[l]));
  const float d = amax / 127.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  auto* q = reinterpret_cast<std::int8_t*>(b + 2);
  for (int l = 0; l < 32; ++l)
    q[l] = static_cast<std::int8_t>(std::clamp(std::nearbyint(x[l] * id), -127.0f, 127.0f));
}

void QuantizeQ4K(const float* x, std::byte* b) {
  float scale[8], minv[8];
  for (int s = 0; s < 8; ++s) {
    float lo = x[32 * s], hi = x[32 * s];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * s + l]), hi = std::max(hi, x[32 * s + l]);
    lo = std::min(lo, 0.0f);
    scale[s] = (hi - lo) / 15.0f;
    minv[s] = -lo;
  }
  const float ms = *std::max_element(scale, scale + 8), mm = *std::max_element(minv, minv + 8);
  PutHalf(b, ms / 63.0f);
  PutHalf(b + 2, mm / 63.0f);
  const float d = Half(b), dmin = Half(b + 2);
  std::uint8_t sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<std::uint8_t>(d > 0 ? std::clamp(std::nearbyint(scale[s] / d), 0.0f, 63.0f)
                                            : 0);
    m[s] = static_cast<std::uint8_t>(
        dmin > 0 ? std::clamp(std::nearbyint(minv[s] / dmin), 0.0f, 63.0f) : 0);
  }
  auto* sb = reinterpret_cast<std::uint8_t*>(b + 4);
  for (int j = 0; j < 4; ++j) {
    sb[j] = static_cast<std::uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    sb[j + 4] = static_cast<std::uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    sb[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  auto* q = reinterpret_cast<std::uint8_t*>(b + 16);
  std::memset(q, 0, 128);
  for (int s = 0; s < 8; ++s) {
    std::uint8_t scv, mv;
    Q4KScaleMin(s, sb, &scv, &mv);
    const float d1 = d * static_cast<float>(scv), m1 = dmin * static_cast<float>(mv);
    for (int l = 0; l < 32; ++l) {
      const float v = d1 > 0 ? std::nearbyint((x[32 * s + l] + m1) / d1) : 0.0f;
      const auto qi = static_cast<std::uint8_t>(std::clamp(v, 0.0f, 15.0f));
      q[32 * (s / 2) + l] |= static_cast<std::uint8_t>(qi << ((s % 2) * 4));
    }
  }
}

void QuantizeQ6K(const float* x, std::byte* b) {
  float scale[16];
  for (int s = 0; s < 16; ++s) {
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * s + l]));
    scale[s] = amax / 31.0f;
  }
  const float ms = *std::max_element(scale, scale + 16);
  PutHalf(b + 208, ms / 127.0f);
  const float d = Half(b + 208);
  auto* sc = reinterpret_cast<std::int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s)
    sc[s] = static_cast<std::int8_t>(
        d > 0 ? std::clamp(std::nearbyint(scale[s] / d), -127.0f, 127.0f) : 0);
  auto* ql = reinterpret_cast<std::uint8_t*>(b);
  auto* qh = reinterpret_cast<std::uint8_t*>(b + 128);
  std::memset(ql, 0, 192);
  for (int c = 0; c < 8; ++c) {
    const int n = c / 4, j = c % 4;
    for (int l = 0; l < 32; ++l) {
      const float ds = d * static_cast<float>(sc[8 * n + l / 16 + 2 * j]);
      const float v = ds != 0 ? std::nearbyint(x[128 * n + 32 * j + l] / ds) : 0.0f;
      const int q = static_cast<int>(std::clamp(v, -32.0f, 31.0f)) + 32;
      ql[64 * n + (j % 2) * 32 + l] |= static_cast<std::uint8_t>((q & 0xF) << ((j / 2) * 4));
      qh[32 * n + l] |= static_cast<std::uint8_t>((q >> 4) << (2 * j));
    }
  }
}

}  // namespace

void DequantizeChunk32(WeightType t, const std::byte* block, int c, float* out) {
  switch (t) {
    case WeightType::kQ8_0:
      Q8Chunk(block, out);
      return;
    case WeightType::kQ4_K:
      Q4KChunk(block, c, out);
      return;
    case WeightType::kQ6_K:
      Q6KChunk(block, c, out);
      return;
    default:
      return;
  }
}

void DequantizeBlock(WeightType t, const std::byte* block, float* out) {
  const int chunks = weight_block_elems(t) / 32;
  for (int c = 0; c < chunks; ++c) DequantizeChunk32(t, block, c, out + 32 * c);
}

void QuantizeRow(WeightType t, const float* x, std::size_t n, std::byte* out) {
  const auto be = static_cast<std::size_t>(weight_block_elems(t));
  const std::size_t bb = weight_block_bytes(t);
  for (std::size_t i = 0; i < n / be; ++i) {
    const float* xs = x + i * be;
    std::byte* b = out + i * bb;
    if (t == WeightType::kQ8_0) QuantizeQ8(xs, b);
    if (t == WeightType::kQ4_K) QuantizeQ4K(xs, b);
    if (t == WeightType::kQ6_K) QuantizeQ6K(xs, b);
  }
}

}  // namespace lockstep
