#include "cpu/norm.h"

#include "cpu/activation.h"
#include "cpu/matmul.h"

namespace lockstep::cpu {

void RmsNormZc(const float* x, int n, const float* w, float eps, float* y) {
  float ss = Dot(x, x, n);
  float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * r * (1.0f + w[i]);
}

void GatedRmsNorm(const float* x, const float* z, int n, const float* w, float eps, float* y) {
  float ss = Dot(x, x, n);
  float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  GatedScale(x, z, w, r, static_cast<std::size_t>(n), y);
}

void L2NormInPlace(float* x, int n, float eps) {
  float ss = Dot(x, x, n);
  float r = 1.0f / std::sqrt(ss + eps);
  for (int i = 0; i < n; ++i) x[i] *= r;
}

}  // namespace lockstep::cpu
