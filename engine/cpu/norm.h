// Normalisations (MODEL.md 3.1-3.3) and activations, f32, one row at a time.
// Every sum of squares uses Dot()'s fixed reduction order, so results are batch-invariant.
#pragma once

#include <cmath>

namespace lockstep::cpu {

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
// PyTorch softplus (beta 1, threshold 20).
inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Zero-centred RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w). x, y f32 [n] (may alias).
void RmsNormZc(const float* x, int n, const float* w, float eps, float* y);
// Gated RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w * silu(z). Plain weight. x, z, y f32 [n].
void GatedRmsNorm(const float* x, const float* z, int n, const float* w, float eps, float* y);
// L2 norm: x *= rsqrt(sum(x^2) + eps) in place (eps = 1e-6 added to the sum).
void L2NormInPlace(float* x, int n, float eps);

}  // namespace lockstep::cpu
