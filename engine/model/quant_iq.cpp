// Dequantisation of ggml's i-quants (IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ1_S, IQ1_M) and ternary types (TQ1_0, TQ2_0), one 32-element chunk at a time, each value
// computed with the f32 operations of the format's definition in the order it defines them (see
// quant.h for the layouts). The lattice grids are data: quant_grids.h.
#include "model/quant_iq.h"

#include <array>
#include <cstring>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "model/quant_grids.h"

namespace lockstep::quant_detail {

namespace {

float Half(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
std::uint16_t U16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
std::uint32_t U32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
const std::uint8_t* U8(const std::byte* p) { return reinterpret_cast<const std::uint8_t*>(p); }

int HexDigit(char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; }

// Entries of a packed grid (quant_grids.h): `width` values per entry, each an index of `bits`
// bits (2, or 3 stored in 4) into `map`.
template <class T, std::size_t N>
std::vector<T> Unpack(const char* hex, int bits, const T (&map)[N], std::size_t entries,
                      int width) {
  std::vector<T> out(entries * static_cast<std::size_t>(width));
  const int step = bits == 2 ? 2 : 4, per_byte = 8 / step, mask = bits == 2 ? 3 : 7;
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::size_t b = k / static_cast<std::size_t>(per_byte);
    const int byte = HexDigit(hex[2 * b]) << 4 | HexDigit(hex[2 * b + 1]);
    const int idx =
        (byte >> (step * static_cast<int>(k % static_cast<std::size_t>(per_byte)))) & mask;
    out[k] = map[idx];
  }
  return out;
}

}  // namespace

IqGrids::IqGrids()
    : g2xxs(Unpack(iq_grids::kIq2xxsHex, 2, iq_grids::kIq2Map, 256, 8)),
      g2xs(Unpack(iq_grids::kIq2xsHex, 2, iq_grids::kIq2Map, 512, 8)),
      g2s(Unpack(iq_grids::kIq2sHex, 2, iq_grids::kIq2Map, 1024, 8)),
      g3xxs(Unpack(iq_grids::kIq3xxsHex, 3, iq_grids::kIq3xxsMap, 256, 4)),
      g3s(Unpack(iq_grids::kIq3sHex, 3, iq_grids::kIq3sMap, 512, 4)),
      g1s(Unpack(iq_grids::kIq1sHex, 2, iq_grids::kIq1Map, 2048, 8)) {}

const IqGrids& Grids() {
  static const IqGrids g;
  return g;
}

namespace {

const IqGrids& G() { return Grids(); }

// v with its sign flipped where bit j of `signs` is set: a negation (as ggml's compiled code
// does it), which flips a NaN's sign too, where a product by -1 may not.
inline float Signed(float v, std::uint8_t signs, int j) { return (signs >> j) & 1 ? -v : v; }

void Iq4Nl(const std::byte* b, float* y) {
  const float d = Half(b);
  const std::uint8_t* q = U8(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(iq_grids::kIq4nl[q[j] & 0xF]);
    y[j + 16] = d * static_cast<float>(iq_grids::kIq4nl[q[j] >> 4]);
  }
}

void Iq4Xs(const std::byte* b, int ib, float* y) {
  const float d = Half(b);
  const std::uint16_t sh = U16(b + 2);
  const std::uint8_t* sl = U8(b + 4);
  const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
  const float dl = d * static_cast<float>(ls - 32);
  const std::uint8_t* q = U8(b + 8) + 16 * ib;
  for (int j = 0; j < 16; ++j) {
    y[j] = dl * static_cast<float>(iq_grids::kIq4nl[q[j] & 0xF]);
    y[j + 16] = dl * static_cast<float>(iq_grids::kIq4nl[q[j] >> 4]);
  }
}

// Eight values of a grid entry times db with sign bits.
inline void Grid8(const std::uint8_t* g, float db, std::uint8_t signs, float* y) {
  for (int j = 0; j < 8; ++j) y[j] = Signed(db * static_cast<float>(g[j]), signs, j);
}

void Iq2Xxs(const std::byte* b, int ib, float* y) {
  const float d = Half(b);
  const std::byte* p = b + 2 + 8 * ib;
  const std::uint8_t* idx = U8(p);
  const std::uint32_t aux = U32(p + 4);
  const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
  for (int l = 0; l < 4; ++l)
    Grid8(&G().g2xxs[8u * idx[l]], db, iq_grids::kKsigns[(aux >> (7 * l)) & 127], y + 8 * l);
}

void Iq2Xs(const std::byte* b, int ib, float* y) {
  const float d = Half(b);
  const std::uint8_t sc = U8(b + 66)[ib];
  const float db[2] = {d * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f,
                       d * (0.5f + static_cast<float>(sc >> 4)) * 0.25f};
  for (int l = 0; l < 4; ++l) {
    const std::uint16_t v = U16(b + 2 + 2 * (4 * ib + l));
    Grid8(&G().g2xs[8u * (v & 511)], db[l / 2], iq_grids::kKsigns[v >> 9], y + 8 * l);
  }
}

void Iq2S(const std::byte* b, int ib, float* y) {
  const float d = Half(b);
  const std::uint8_t* qs = U8(b + 2) + 4 * ib;
  const std::uint8_t* signs = U8(b + 2) + 32 + 4 * ib;
  const std::uint8_t qh = U8(b + 66)[ib], sc = U8(b + 74)[ib];
  const float db[2] = {d * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f,
                       d * (0.5f + static_cast<float>(sc >> 4)) * 0.25f};
  for (int l = 0; l < 4; ++l) {
    const int idx = qs[l] | ((qh << (8 - 2 * l)) & 0x300);
    Grid8(&G().g2s[8u * static_cast<unsigned>(idx)], db[l / 2], signs[l], y + 8 * l);
  }
}

// Two 4-value entries (g1, g2) with the sign bits 0-3 and 4-7 of `signs`.
inline void Grid4x2(const std::uint8_t* g1, const std::uint8_t* g2, float db, std::uint8_t signs,
                    float* y) {
  for (int j = 0; j < 4; ++j) {
    y[j] = Signed(db * static_cast<float>(g1[j]), signs, j);
    y[j + 4] = Signed(db * static_cast<float>(g2[j]), signs, j + 4);
  }
}

void Iq3Xxs(const std::byte* b, int ib, float* y) {
  const float d = Half(b);
  const std::uint8_t* qs = U8(b + 2) + 8 * ib;
  const std::uint32_t aux = U32(b + 66 + 4 * ib);
  const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
  for (int l = 0; l < 4; ++l)
    Grid4x2(&G().g3xxs[4u * qs[2 * l]], &G().g3xxs[4u * qs[2 * l + 1]], db,
            iq_grids::kKsigns[(aux >> (7 * l)) & 127], y + 8 * l);
}

void Iq3S(const std::byte* b, int ib, float* y) {
  const float d = Half(b);
  const std::uint8_t* qs = U8(b + 2) + 8 * ib;
  const std::uint8_t qh = U8(b + 66)[ib];
  const std::uint8_t* signs = U8(b + 74) + 4 * ib;
  const std::uint8_t sc = U8(b + 106)[ib / 2];
  const float db = d * static_cast<float>(1 + 2 * ((sc >> (4 * (ib % 2))) & 0xF));
  for (int l = 0; l < 4; ++l) {
    const unsigned i1 = qs[2 * l] | ((qh << (8 - 2 * l)) & 256);
    const unsigned i2 = qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
    Grid4x2(&G().g3s[4 * i1], &G().g3s[4 * i2], db, signs[l], y + 8 * l);
  }
}

constexpr float kIq1Delta = 0.125f;

inline void Grid1(unsigned idx, float dl, float delta, float* y) {
  const std::int8_t* g = &G().g1s[8 * idx];
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(g[j]) + delta);
}

void Iq1S(const std::byte* b, int ib, float* y) {
  const float d = Half(b);
  const std::uint8_t* qs = U8(b + 2) + 4 * ib;
  const std::uint16_t qh = U16(b + 34 + 2 * ib);
  const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
  const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
  for (int l = 0; l < 4; ++l) Grid1(qs[l] | (((qh >> (3 * l)) & 7u) << 8), dl, delta, y + 8 * l);
}

void Iq1M(const std::byte* b, int ib, float* y) {
  std::uint16_t sc[4];
  std::memcpy(sc, b + 48, 8);
  const std::uint16_t dbits = static_cast<std::uint16_t>(
      (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
  const float d = f16_to_f32(dbits);
  const std::uint16_t s = sc[ib / 2];
  const int sh = 6 * (ib % 2);
  const float dl[2] = {d * static_cast<float>(2 * ((s >> sh) & 7) + 1),
                       d * static_cast<float>(2 * ((s >> (sh + 3)) & 7) + 1)};
  const std::uint8_t* qs = U8(b) + 4 * ib;
  const std::uint8_t* qh = U8(b + 32) + 2 * ib;
  for (int l = 0; l < 4; ++l) {
    const std::uint8_t h = qh[l / 2];
    const unsigned hi = l % 2 == 0 ? (h << 8) & 0x700u : (h << 4) & 0x700u;
    const bool neg = l % 2 == 0 ? (h & 0x08) != 0 : (h & 0x80) != 0;
    Grid1(qs[l] | hi, dl[l / 2], neg ? -kIq1Delta : kIq1Delta, y + 8 * l);
  }
}

// TQ1_0: element e of the block is a base-3 digit of one byte (see quant.h).
void Tq1(const std::byte* b, int c, float* y) {
  static constexpr std::uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const std::uint8_t* qs = U8(b);
  const float d = Half(b + 52);
  for (int l = 0; l < 32; ++l) {
    const int e = 32 * c + l;
    std::uint8_t byte, n;
    if (e < 160) {
      byte = qs[e % 32], n = static_cast<std::uint8_t>(e / 32);
    } else if (e < 240) {
      byte = qs[32 + (e - 160) % 16], n = static_cast<std::uint8_t>((e - 160) / 16);
    } else {
      byte = qs[48 + (e - 240) % 4], n = static_cast<std::uint8_t>((e - 240) / 4);
    }
    const auto q = static_cast<std::uint8_t>(byte * kPow3[n]);
    const int xi = (static_cast<std::uint16_t>(q) * 3) >> 8;
    y[l] = static_cast<float>(xi - 1) * d;
  }
}

void Tq2(const std::byte* b, int c, float* y) {
  const std::uint8_t* qs = U8(b) + 32 * (c / 4);
  const int shift = 2 * (c % 4);
  const float d = Half(b + 64);
  for (int m = 0; m < 32; ++m) y[m] = static_cast<float>(((qs[m] >> shift) & 3) - 1) * d;
}

}  // namespace

bool DequantizeChunkIq(WeightType t, const std::byte* b, int c, float* out) {
  switch (t) {
    case WeightType::kIQ4_NL:
      Iq4Nl(b, out);
      return true;
    case WeightType::kIQ4_XS:
      Iq4Xs(b, c, out);
      return true;
    case WeightType::kIQ3_S:
      Iq3S(b, c, out);
      return true;
    case WeightType::kIQ3_XXS:
      Iq3Xxs(b, c, out);
      return true;
    case WeightType::kIQ2_XXS:
      Iq2Xxs(b, c, out);
      return true;
    case WeightType::kIQ2_XS:
      Iq2Xs(b, c, out);
      return true;
    case WeightType::kIQ2_S:
      Iq2S(b, c, out);
      return true;
    case WeightType::kIQ1_S:
      Iq1S(b, c, out);
      return true;
    case WeightType::kIQ1_M:
      Iq1M(b, c, out);
      return true;
    case WeightType::kTQ1_0:
      Tq1(b, c, out);
      return true;
    case WeightType::kTQ2_0:
      Tq2(b, c, out);
      return true;
    default:
      return false;
  }
}

}  // namespace lockstep::quant_detail
