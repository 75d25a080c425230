// SiLU over rows and a softmax's exponentials, 16 lanes at a time, bitwise equal to the scalar
// forms (norm.h's Silu, x / (1 + exp(-x)), and exp(x - max), with the C library's expf).
//
// Why our own exp: the engine's activations call expf ~120,000 times a decode step of `wide
// --layers 8` (the GDN conv's 8,192 channels and the gated norm's 4,096 per GDN layer, each
// expert's 512 per layer) and ~14,000 times per prompt token and layer in prefill, one scalar
// call at a time: ~15.7 us per 8,192 SiLUs on one core here, 2.5 us in vector form. The vector
// form evaluates glibc's expf algorithm (sysdeps/ieee754/flt-32/e_expf.c as its FMA build,
// __expf_fma, computes it: the same double operations, fused where that build fuses them, the
// same 32-entry table), so each lane is the scalar call's value; the arguments glibc sends to
// its slow path (|x| >= ~85, inf, NaN) go to the scalar call. tests/engine/activation_test.cpp
// holds the lanes to std::exp on a dense sweep of all floats and on the inputs nearest a rounding
// (an exhaustive run over all 2^32 matched too: LOCKSTEP_EXHAUSTIVE_EXP=1). Where the host's libm
// is not that build (another glibc, a CPU without FMA), that test fails rather than the engine's
// bits drifting silently; without AVX-512 the scalar form runs.
#pragma once

#include <cstddef>

namespace lockstep::cpu {

// x[i] = Silu(x[i]).
void SiluInPlace(float* x, std::size_t n);
// g[i] = Silu(g[i]) * u[i] (SwiGLU's gate).
void SiluMulInPlace(float* g, const float* u, std::size_t n);
// y[i] = x[i] * r * w[i] * Silu(z[i]), left to right (the gated RMSNorm's scaling).
void GatedScale(const float* x, const float* z, const float* w, float r, std::size_t n, float* y);

// x[i] = exp(x[i] - shift) (a softmax's numerators: the float subtraction, then expf).
void ExpShiftedInPlace(float* x, std::size_t n, float shift);

// Tests: out[i] = expf(x[i]) by the vector form (the scalar call where it is not built).
void ExpForTest(const float* x, std::size_t n, float* out);

}  // namespace lockstep::cpu
