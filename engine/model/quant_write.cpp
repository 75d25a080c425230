// QuantizeRow (quant.h): simple round-to-nearest quantisers for every block type, written for
// the synthetic GGUF writer (`lockstep model init --quant`). Not ggml's quantisers (no search
// over scales, no importance matrix): each picks its scales from the block's range, stores them,
// then rounds every value against the stored (dequantised) scale, so that dequantising the block
// gives the nearest representable value under those scales. The i-quants pick the nearest
// lattice point by exhaustive search (slow for IQ1_S / IQ1_M: 2048 entries; fine for the
// synthetic presets).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/quant.h"
#include "model/quant_grids.h"
#include "model/quant_iq.h"

namespace lockstep {

namespace {

float StoreHalf(std::byte* p, float v) {  // stores f16(v); returns the stored value
  const std::uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
  return f16_to_f32(h);
}

std::uint8_t* Bytes(std::byte* p) { return reinterpret_cast<std::uint8_t*>(p); }

int Round(float v, int lo, int hi) {
  return static_cast<int>(
      std::clamp(std::nearbyint(v), static_cast<float>(lo), static_cast<float>(hi)));
}

// The value of largest magnitude (with its sign) and the largest magnitude of x[0, n).
float SignedMax(const float* x, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(m)) m = x[i];
  return m;
}
float AbsMax(const float* x, int n) { return std::fabs(SignedMax(x, n)); }
float Inv(float d) { return d != 0 ? 1.0f / d : 0.0f; }

void QuantizeQ8(const float* x, std::byte* b) {
  const float d = StoreHalf(b, AbsMax(x, 32) / 127.0f);
  auto* q = reinterpret_cast<std::int8_t*>(b + 2);
  for (int l = 0; l < 32; ++l) q[l] = static_cast<std::int8_t>(Round(x[l] * Inv(d), -127, 127));
}

// Q4_0 / Q5_0 (bits 4 or 5, no min): d = max / -2^(bits-1), as ggml picks it.
void QuantizeLegacy(const float* x, int bits, bool with_min, std::byte* b) {
  const int levels = (1 << bits) - 1;
  float d, m = 0;
  if (with_min) {
    const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
    d = StoreHalf(b, (hi - lo) / static_cast<float>(levels));
    m = StoreHalf(b + 2, lo);
  } else {
    d = StoreHalf(b, SignedMax(x, 32) / -static_cast<float>(1 << (bits - 1)));
  }
  std::byte* h = b + (with_min ? 4 : 2);
  std::uint8_t* q = Bytes(h + (bits == 5 ? 4 : 0));
  std::uint32_t qh = 0;
  std::memset(q, 0, 16);
  for (int j = 0; j < 32; ++j) {
    const int v = with_min ? Round((x[j] - m) * Inv(d), 0, levels)
                           : Round(x[j] * Inv(d), -(1 << (bits - 1)), levels - (1 << (bits - 1))) +
                                 (1 << (bits - 1));
    q[j % 16] |= static_cast<std::uint8_t>((v & 0xF) << (j < 16 ? 0 : 4));
    qh |= static_cast<std::uint32_t>((v >> 4) & 1) << j;
  }
  if (bits == 5) std::memcpy(h, &qh, 4);
}

// Scale s_k and min m_k (>= 0) of `count` sub-blocks of `len` elements for `levels` + 1 levels.
void RangeScales(const float* x, int count, int len, int levels, float* sc, float* mn) {
  for (int k = 0; k < count; ++k) {
    const float* xs = x + len * k;
    const float lo = std::min(0.0f, *std::min_element(xs, xs + len));
    const float hi = *std::max_element(xs, xs + len);
    sc[k] = (hi - lo) / static_cast<float>(levels);
    mn[k] = -lo;
  }
}

void QuantizeQ2K(const float* x, std::byte* b) {
  float sc[16], mn[16];
  RangeScales(x, 16, 16, 3, sc, mn);
  const float d = StoreHalf(b + 80, *std::max_element(sc, sc + 16) / 15.0f);
  const float dmin = StoreHalf(b + 82, *std::max_element(mn, mn + 16) / 15.0f);
  std::uint8_t* s = Bytes(b);
  std::uint8_t* q = Bytes(b + 16);
  std::memset(q, 0, 64);
  for (int k = 0; k < 16; ++k) {
    const int a = Round(sc[k] * Inv(d), 0, 15), m = Round(mn[k] * Inv(dmin), 0, 15);
    s[k] = static_cast<std::uint8_t>(a | (m << 4));
    const float dl = d * static_cast<float>(a), ml = dmin * static_cast<float>(m);
    const int c = k / 2, h = k % 2, n = c / 4, j = c % 4;
    for (int l = 0; l < 16; ++l) {
      const int v = Round((x[16 * k + l] + ml) * Inv(dl), 0, 3);
      q[32 * n + 16 * h + l] |= static_cast<std::uint8_t>(v << (2 * j));
    }
  }
}

void QuantizeQ3K(const float* x, std::byte* b) {
  float scale[16];
  for (int k = 0; k < 16; ++k) scale[k] = SignedMax(x + 16 * k, 16) / -4.0f;
  float amax = 0;
  for (float v : scale) amax = std::max(amax, std::fabs(v));
  const float d = StoreHalf(b + 108, amax / 31.0f);
  std::uint8_t* hm = Bytes(b);
  std::uint8_t* q = Bytes(b + 32);
  std::uint8_t* s = Bytes(b + 96);
  std::memset(b, 0, 108);
  for (int k = 0; k < 16; ++k) {
    const int sc = Round(scale[k] * Inv(d), -32, 31);
    const int u = sc + 32;
    s[k < 8 ? k : k - 8] |= static_cast<std::uint8_t>((u & 0xF) << (k < 8 ? 0 : 4));
    s[8 + k % 4] |= static_cast<std::uint8_t>((u >> 4) << (2 * (k / 4)));
    const float dl = d * static_cast<float>(sc);
    const int c = k / 2, h = k % 2, n = c / 4, j = c % 4;
    for (int l = 0; l < 16; ++l) {
      const int v = Round(x[16 * k + l] * Inv(dl), -4, 3);
      const int hbit = v >= 0 ? 1 : 0, q2 = v >= 0 ? v : v + 4;
      q[32 * n + 16 * h + l] |= static_cast<std::uint8_t>(q2 << (2 * j));
      hm[16 * h + l] |= static_cast<std::uint8_t>(hbit << c);
    }
  }
}

// Q4_K / Q5_K: eight (scale, min) pairs of 6 bits; `bits` 4 or 5.
void QuantizeQ45K(const float* x, int bits, std::byte* b) {
  const int levels = (1 << bits) - 1;
  float scale[8], minv[8];
  RangeScales(x, 8, 32, levels, scale, minv);
  const float d = StoreHalf(b, *std::max_element(scale, scale + 8) / 63.0f);
  const float dmin = StoreHalf(b + 2, *std::max_element(minv, minv + 8) / 63.0f);
  std::uint8_t sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<std::uint8_t>(Round(scale[s] * Inv(d), 0, 63));
    m[s] = static_cast<std::uint8_t>(Round(minv[s] * Inv(dmin), 0, 63));
  }
  std::uint8_t* sb = Bytes(b + 4);
  for (int j = 0; j < 4; ++j) {
    sb[j] = static_cast<std::uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    sb[j + 4] = static_cast<std::uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    sb[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  std::uint8_t* qh = Bytes(b + 16);
  std::uint8_t* q = Bytes(b + (bits == 5 ? 48 : 16));
  std::memset(b + 16, 0, bits == 5 ? 160 : 128);
  for (int s = 0; s < 8; ++s) {
    std::uint8_t scv, mv;
    Q4KScaleMin(s, sb, &scv, &mv);
    const float d1 = d * static_cast<float>(scv), m1 = dmin * static_cast<float>(mv);
    for (int l = 0; l < 32; ++l) {
      const int v = Round((x[32 * s + l] + m1) * Inv(d1), 0, levels);
      q[32 * (s / 2) + l] |= static_cast<std::uint8_t>((v & 0xF) << ((s % 2) * 4));
      if (bits == 5) qh[l] |= static_cast<std::uint8_t>(((v >> 4) & 1) << s);
    }
  }
}

void QuantizeQ6K(const float* x, std::byte* b) {
  float scale[16];
  for (int s = 0; s < 16; ++s) scale[s] = AbsMax(x + 16 * s, 16) / 31.0f;
  const float d = StoreHalf(b + 208, *std::max_element(scale, scale + 16) / 127.0f);
  auto* sc = reinterpret_cast<std::int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s)
    sc[s] = static_cast<std::int8_t>(Round(scale[s] * Inv(d), -127, 127));
  std::uint8_t* ql = Bytes(b);
  std::uint8_t* qh = Bytes(b + 128);
  std::memset(ql, 0, 192);
  for (int c = 0; c < 8; ++c) {
    const int n = c / 4, j = c % 4;
    for (int l = 0; l < 32; ++l) {
      const float ds = d * static_cast<float>(sc[8 * n + l / 16 + 2 * j]);
      const int q = Round(x[128 * n + 32 * j + l] * Inv(ds), -32, 31) + 32;
      ql[64 * n + (j % 2) * 32 + l] |= static_cast<std::uint8_t>((q & 0xF) << ((j / 2) * 4));
      qh[32 * n + l] |= static_cast<std::uint8_t>((q >> 4) << (2 * j));
    }
  }
}

// Index of the IQ4_NL value nearest v.
int NearestIq4(float v) {
  int best = 0;
  for (int i = 1; i < 16; ++i)
    if (std::fabs(v - iq_grids::kIq4nl[i]) < std::fabs(v - iq_grids::kIq4nl[best])) best = i;
  return best;
}

void PutIq4Nibbles(const float* x, float dl, std::uint8_t* q) {
  for (int j = 0; j < 16; ++j)
    q[j] = static_cast<std::uint8_t>(NearestIq4(x[j] * Inv(dl)) |
                                     (NearestIq4(x[j + 16] * Inv(dl)) << 4));
}

void QuantizeIq4Nl(const float* x, std::byte* b) {
  const float d = StoreHalf(b, SignedMax(x, 32) / -127.0f);
  PutIq4Nibbles(x, d, Bytes(b + 2));
}

void QuantizeIq4Xs(const float* x, std::byte* b) {
  float ds[8], amax = 0;
  for (int ib = 0; ib < 8; ++ib)
    amax = std::max(amax, std::fabs(ds[ib] = SignedMax(x + 32 * ib, 32) / -127.0f));
  const float d = StoreHalf(b, amax / 31.0f);
  std::uint16_t sh = 0;
  std::uint8_t* sl = Bytes(b + 4);
  std::memset(sl, 0, 4);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = Round(ds[ib] * Inv(d), -32, 31) + 32;
    sl[ib / 2] |= static_cast<std::uint8_t>((ls & 0xF) << (4 * (ib % 2)));
    sh = static_cast<std::uint16_t>(sh | ((ls >> 4) << (2 * ib)));
    PutIq4Nibbles(x + 32 * ib, d * static_cast<float>(ls - 32), Bytes(b + 8) + 16 * ib);
  }
  std::memcpy(b + 2, &sh, 2);
}

void QuantizeTq2(const float* x, std::byte* b) {
  const float d = StoreHalf(b + 64, AbsMax(x, 256));
  std::uint8_t* qs = Bytes(b);
  std::memset(qs, 0, 64);
  for (int c = 0; c < 8; ++c)
    for (int m = 0; m < 32; ++m)
      qs[32 * (c / 4) + m] |=
          static_cast<std::uint8_t>((Round(x[32 * c + m] * Inv(d), -1, 1) + 1) << (2 * (c % 4)));
}

// TQ1_0: five base-3 digits per byte (the first the most significant), stored as
// ceil(v * 256 / 243) so that digit n is ((byte * 3^n) mod 256 * 3) >> 8.
void QuantizeTq1(const float* x, std::byte* b) {
  const float d = StoreHalf(b + 52, AbsMax(x, 256));
  int v[52] = {0};
  static constexpr int kW[5] = {81, 27, 9, 3, 1};
  for (int e = 0; e < 256; ++e) {
    const int q = Round(x[e] * Inv(d), -1, 1) + 1;
    if (e < 160)
      v[e % 32] += q * kW[e / 32];
    else if (e < 240)
      v[32 + (e - 160) % 16] += q * kW[(e - 160) / 16];
    else
      v[48 + (e - 240) % 4] += q * kW[(e - 240) / 4];
  }
  for (int i = 0; i < 52; ++i) Bytes(b)[i] = static_cast<std::uint8_t>((v[i] * 256 + 242) / 243);
}

}  // namespace

namespace quant_detail {
void QuantizeIq(WeightType t, const float* x, std::byte* b);  // quant_write_iq.cpp
}

void QuantizeRow(WeightType t, const float* x, std::size_t n, std::byte* out) {
  const auto be = static_cast<std::size_t>(weight_block_elems(t));
  const std::size_t bb = weight_block_bytes(t);
  for (std::size_t i = 0; i < n / be; ++i) {
    const float* xs = x + i * be;
    std::byte* b = out + i * bb;
    switch (t) {
      case WeightType::kQ8_0:
        QuantizeQ8(xs, b);
        break;
      case WeightType::kQ4_0:
        QuantizeLegacy(xs, 4, false, b);
        break;
      case WeightType::kQ4_1:
        QuantizeLegacy(xs, 4, true, b);
        break;
      case WeightType::kQ5_0:
        QuantizeLegacy(xs, 5, false, b);
        break;
      case WeightType::kQ5_1:
        QuantizeLegacy(xs, 5, true, b);
        break;
      case WeightType::kQ2_K:
        QuantizeQ2K(xs, b);
        break;
      case WeightType::kQ3_K:
        QuantizeQ3K(xs, b);
        break;
      case WeightType::kQ4_K:
        QuantizeQ45K(xs, 4, b);
        break;
      case WeightType::kQ5_K:
        QuantizeQ45K(xs, 5, b);
        break;
      case WeightType::kQ6_K:
        QuantizeQ6K(xs, b);
        break;
      case WeightType::kIQ4_NL:
        QuantizeIq4Nl(xs, b);
        break;
      case WeightType::kIQ4_XS:
        QuantizeIq4Xs(xs, b);
        break;
      case WeightType::kTQ1_0:
        QuantizeTq1(xs, b);
        break;
      case WeightType::kTQ2_0:
        QuantizeTq2(xs, b);
        break;
      default:
        quant_detail::QuantizeIq(t, xs, b);
        break;
    }
  }
}

}  // namespace lockstep
