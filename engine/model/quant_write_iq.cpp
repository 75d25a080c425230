// QuantizeRow's i-quants with lattice grids (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
// IQ1_M): per sub-block a scale from its largest magnitude, then per group the nearest grid entry
// by exhaustive search (squared error) and the signs of the values. Types whose sign index holds
// 7 bits (ksigns: an even number of minus signs) flip the sign of the group's smallest value
// when the count is odd.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/quant.h"
#include "model/quant_iq.h"

namespace lockstep::quant_detail {

namespace {

float StoreHalfIq(std::byte* p, float v) {
  const std::uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
  return f16_to_f32(h);
}

float MaxAbs(const float* x, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

int RoundTo(float v, int lo, int hi) {
  return static_cast<int>(
      std::clamp(std::nearbyint(v), static_cast<float>(lo), static_cast<float>(hi)));
}

// Index of the grid entry (width w) nearest t[0, w).
template <class T>
int Nearest(const std::vector<T>& grid, int w, const float* t) {
  int best = 0;
  float best_e = std::numeric_limits<float>::infinity();
  const int n = static_cast<int>(grid.size()) / w;
  for (int i = 0; i < n; ++i) {
    float e = 0;
    for (int j = 0; j < w; ++j) {
      const float dv = t[j] - static_cast<float>(grid[static_cast<std::size_t>(w * i + j)]);
      e += dv * dv;
    }
    if (e < best_e) best_e = e, best = i;
  }
  return best;
}

// Sign bits of x[0, 8) (bit j: x[j] < 0); with `even`, the smallest |x| flips to make the count
// of minus signs even. t[j] = |x[j]| / db with the chosen sign applied.
std::uint8_t Signs(const float* x, float db, bool even, float* t) {
  int bits = 0, smallest = 0;
  for (int j = 0; j < 8; ++j) {
    if (x[j] < 0) bits |= 1 << j;
    if (std::fabs(x[j]) < std::fabs(x[smallest])) smallest = j;
  }
  if (even && __builtin_popcount(static_cast<unsigned>(bits)) % 2 == 1) bits ^= 1 << smallest;
  const float id = db != 0 ? 1.0f / db : 0.0f;
  for (int j = 0; j < 8; ++j) t[j] = ((bits >> j) & 1 ? -x[j] : x[j]) * id;
  return static_cast<std::uint8_t>(bits);
}

// IQ2 scale: db = d * (0.5 + ls) * 0.25 for a 4-bit ls.
int Iq2Ls(float want, float d) { return RoundTo(d > 0 ? want / (d * 0.25f) - 0.5f : 0, 0, 15); }
float Iq2Db(float d, int ls) { return d * (0.5f + static_cast<float>(ls)) * 0.25f; }

// Block scale d for sub-block needs want[0, n): the largest need over `top` (the scale factor at
// the largest code).
float BlockScale(std::byte* p, const float* want, int n, float top) {
  return StoreHalfIq(p, *std::max_element(want, want + n) / top);
}

void Iq2Xxs(const float* x, std::byte* b) {
  const IqGrids& g = Grids();
  float want[8];
  for (int ib = 0; ib < 8; ++ib) want[ib] = MaxAbs(x + 32 * ib, 32) / 43.0f;
  const float d = BlockScale(b, want, 8, 15.5f * 0.25f);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = Iq2Ls(want[ib], d);
    const float db = Iq2Db(d, ls);
    std::uint8_t* idx = reinterpret_cast<std::uint8_t*>(b + 2 + 8 * ib);
    std::uint32_t aux = static_cast<std::uint32_t>(ls) << 28;
    for (int l = 0; l < 4; ++l) {
      float t[8];
      const std::uint8_t s = Signs(x + 32 * ib + 8 * l, db, true, t);
      idx[l] = static_cast<std::uint8_t>(Nearest(g.g2xxs, 8, t));
      aux |= static_cast<std::uint32_t>(s & 127) << (7 * l);
    }
    std::memcpy(b + 2 + 8 * ib + 4, &aux, 4);
  }
}

// IQ2_XS (9-bit index, 7-bit sign index) and IQ2_S (10-bit index, 8 sign bits): two 4-bit
// scales per 32 elements.
void Iq2XsS(const float* x, bool s_type, std::byte* b) {
  const IqGrids& g = Grids();
  float want[16];
  for (int h = 0; h < 16; ++h) want[h] = MaxAbs(x + 16 * h, 16) / 43.0f;
  const float d = BlockScale(b, want, 16, 15.5f * 0.25f);
  std::uint8_t* scales = reinterpret_cast<std::uint8_t*>(b + (s_type ? 74 : 66));
  std::uint8_t* qs = reinterpret_cast<std::uint8_t*>(b + 2);
  if (s_type) std::memset(b + 66, 0, 8);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls0 = Iq2Ls(want[2 * ib], d), ls1 = Iq2Ls(want[2 * ib + 1], d);
    scales[ib] = static_cast<std::uint8_t>(ls0 | (ls1 << 4));
    for (int l = 0; l < 4; ++l) {
      float t[8];
      const float db = Iq2Db(d, l < 2 ? ls0 : ls1);
      const std::uint8_t s = Signs(x + 32 * ib + 8 * l, db, !s_type, t);
      const int i = Nearest(s_type ? g.g2s : g.g2xs, 8, t);
      if (s_type) {
        qs[4 * ib + l] = static_cast<std::uint8_t>(i & 0xFF);
        qs[32 + 4 * ib + l] = s;
        reinterpret_cast<std::uint8_t*>(b + 66)[ib] |=
            static_cast<std::uint8_t>((i >> 8) << (2 * l));
      } else {
        const auto v = static_cast<std::uint16_t>(i | ((s & 127) << 9));
        std::memcpy(b + 2 + 2 * (4 * ib + l), &v, 2);
      }
    }
  }
}

void Iq3Xxs(const float* x, std::byte* b) {
  const IqGrids& g = Grids();
  float want[8];
  for (int ib = 0; ib < 8; ++ib) want[ib] = MaxAbs(x + 32 * ib, 32) / 62.0f;
  const float d = BlockScale(b, want, 8, 15.5f * 0.5f);
  std::uint8_t* qs = reinterpret_cast<std::uint8_t*>(b + 2);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = RoundTo(d > 0 ? want[ib] / (d * 0.5f) - 0.5f : 0, 0, 15);
    const float db = d * (0.5f + static_cast<float>(ls)) * 0.5f;
    std::uint32_t aux = static_cast<std::uint32_t>(ls) << 28;
    for (int l = 0; l < 4; ++l) {
      float t[8];
      const std::uint8_t s = Signs(x + 32 * ib + 8 * l, db, true, t);
      qs[8 * ib + 2 * l] = static_cast<std::uint8_t>(Nearest(g.g3xxs, 4, t));
      qs[8 * ib + 2 * l + 1] = static_cast<std::uint8_t>(Nearest(g.g3xxs, 4, t + 4));
      aux |= static_cast<std::uint32_t>(s & 127) << (7 * l);
    }
    std::memcpy(b + 66 + 4 * ib, &aux, 4);
  }
}

void Iq3S(const float* x, std::byte* b) {
  const IqGrids& g = Grids();
  float want[8];
  for (int ib = 0; ib < 8; ++ib) want[ib] = MaxAbs(x + 32 * ib, 32) / 15.0f;
  const float d = BlockScale(b, want, 8, 31.0f);
  auto* u = reinterpret_cast<std::uint8_t*>(b);
  std::memset(u + 2, 0, 108);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = RoundTo(d > 0 ? (want[ib] / d - 1.0f) / 2.0f : 0, 0, 15);
    u[106 + ib / 2] |= static_cast<std::uint8_t>(ls << (4 * (ib % 2)));
    const float db = d * static_cast<float>(1 + 2 * ls);
    for (int l = 0; l < 4; ++l) {
      float t[8];
      u[74 + 4 * ib + l] = Signs(x + 32 * ib + 8 * l, db, false, t);
      for (int k = 0; k < 2; ++k) {
        const int i = Nearest(g.g3s, 4, t + 4 * k);
        u[2 + 8 * ib + 2 * l + k] = static_cast<std::uint8_t>(i & 0xFF);
        u[66 + ib] |= static_cast<std::uint8_t>((i >> 8) << (2 * l + k));
      }
    }
  }
}

// IQ1: the grid entry nearest x[0, 8) / dl - delta; negative delta when the values lean negative.
int Iq1Group(const float* x, float dl, bool* neg) {
  float sum = 0;
  for (int j = 0; j < 8; ++j) sum += x[j];
  *neg = sum < 0;
  const float delta = *neg ? -0.125f : 0.125f, id = dl != 0 ? 1.0f / dl : 0.0f;
  float t[8];
  for (int j = 0; j < 8; ++j) t[j] = x[j] * id - delta;
  return Nearest(Grids().g1s, 8, t);
}

int Iq1Scale(float want, float d) { return RoundTo(d > 0 ? (want / d - 1.0f) / 2.0f : 0, 0, 7); }

void Iq1S(const float* x, std::byte* b) {
  float want[8];
  for (int ib = 0; ib < 8; ++ib) want[ib] = MaxAbs(x + 32 * ib, 32) / 1.125f;
  const float d = BlockScale(b, want, 8, 15.0f);
  for (int ib = 0; ib < 8; ++ib) {
    const int s = Iq1Scale(want[ib], d);
    const float dl = d * static_cast<float>(2 * s + 1);
    float sum = 0;
    for (int j = 0; j < 32; ++j) sum += x[32 * ib + j];
    std::uint16_t qh = static_cast<std::uint16_t>((s << 12) | (sum < 0 ? 0x8000 : 0));
    for (int l = 0; l < 4; ++l) {
      const float* xs = x + 32 * ib + 8 * l;
      float t[8];
      const float delta = sum < 0 ? -0.125f : 0.125f, id = dl != 0 ? 1.0f / dl : 0.0f;
      for (int j = 0; j < 8; ++j) t[j] = xs[j] * id - delta;
      const int i = Nearest(Grids().g1s, 8, t);
      reinterpret_cast<std::uint8_t*>(b + 2)[4 * ib + l] = static_cast<std::uint8_t>(i & 0xFF);
      qh = static_cast<std::uint16_t>(qh | ((i >> 8) << (3 * l)));
    }
    std::memcpy(b + 34 + 2 * ib, &qh, 2);
  }
}

void Iq1M(const float* x, std::byte* b) {
  float want[16];
  for (int h = 0; h < 16; ++h) want[h] = MaxAbs(x + 16 * h, 16) / 1.125f;
  const float top = *std::max_element(want, want + 16) / 15.0f;
  const std::uint16_t dbits = f32_to_f16(top);
  const float d = f16_to_f32(dbits);
  std::uint16_t sc[4] = {0, 0, 0, 0};
  auto* u = reinterpret_cast<std::uint8_t*>(b);
  std::memset(u + 32, 0, 16);
  for (int ib = 0; ib < 8; ++ib) {
    for (int half = 0; half < 2; ++half) {
      const int s = Iq1Scale(want[2 * ib + half], d);
      sc[ib / 2] = static_cast<std::uint16_t>(sc[ib / 2] | (s << (6 * (ib % 2) + 3 * half)));
      const float dl = d * static_cast<float>(2 * s + 1);
      for (int l = 2 * half; l < 2 * half + 2; ++l) {
        bool neg = false;
        const int i = Iq1Group(x + 32 * ib + 8 * l, dl, &neg);
        u[4 * ib + l] = static_cast<std::uint8_t>(i & 0xFF);
        const int bits = ((i >> 8) & 7) | (neg ? 8 : 0);
        u[32 + 2 * ib + l / 2] |= static_cast<std::uint8_t>(bits << (l % 2 == 0 ? 0 : 4));
      }
    }
  }
  for (int k = 0; k < 4; ++k)
    sc[k] = static_cast<std::uint16_t>(sc[k] | (((dbits >> (4 * k)) & 0xF) << 12));
  std::memcpy(b + 48, sc, 8);
}

}  // namespace

void QuantizeIq(WeightType t, const float* x, std::byte* b) {
  switch (t) {
    case WeightType::kIQ2_XXS:
      return Iq2Xxs(x, b);
    case WeightType::kIQ2_XS:
      return Iq2XsS(x, false, b);
    case WeightType::kIQ2_S:
      return Iq2XsS(x, true, b);
    case WeightType::kIQ3_XXS:
      return Iq3Xxs(x, b);
    case WeightType::kIQ3_S:
      return Iq3S(x, b);
    case WeightType::kIQ1_S:
      return Iq1S(x, b);
    case WeightType::kIQ1_M:
      return Iq1M(x, b);
    default:
      return;
  }
}

}  // namespace lockstep::quant_detail
