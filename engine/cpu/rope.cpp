#include "cpu/rope.h"

#include <cmath>

namespace lockstep::cpu {

Rope::Rope(int rotary_dim, double theta) : rotary_dim_(rotary_dim) {
  const int half = rotary_dim / 2;
  inv_freq_.resize(static_cast<std::size_t>(half));
  const float base = static_cast<float>(theta);
  for (int i = 0; i < half; ++i)
    inv_freq_[static_cast<std::size_t>(i)] =
        1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
}

void Rope::Apply(float* x, int n_heads, int head_dim, int pos) const {
  const int half = rotary_dim_ / 2;
  if (half == 0) return;
  float cs[256], sn[256];  // R/2 <= 256 (head_dim <= 1024 checked at load)
  for (int i = 0; i < half; ++i) {
    float phi = static_cast<float>(pos) * inv_freq_[static_cast<std::size_t>(i)];
    cs[i] = std::cos(phi);
    sn[i] = std::sin(phi);
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<std::size_t>(h) * static_cast<std::size_t>(head_dim);
    for (int i = 0; i < half; ++i) {
      float a = v[i], b = v[i + half];
      v[i] = a * cs[i] - b * sn[i];
      v[i + half] = b * cs[i] + a * sn[i];
    }
  }
}

}  // namespace lockstep::cpu
