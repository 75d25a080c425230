// Token selection: greedy argmax, or seeded sampling with temperature / top-k / top-p driven by
// a counter-based RNG keyed on (seed, position), so a draw depends only on where the token goes,
// never on how many draws came before (speculative and plain decoding draw identically).
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/engine/splitmix.h"  // SplitMix64, which CounterHash is built on

namespace lockstep {

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy
  int top_k = 0;             // 0 = off
  double top_p = 1.0;        // 1 = off
  std::uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0; }
};

// SplitMix64-keyed hash of (seed, position, stream): the counter RNG.
std::uint64_t CounterHash(std::uint64_t seed, std::uint64_t position, std::uint64_t stream = 0);
// Uniform double in [0, 1) from CounterHash (53 bits).
double CounterUniform(std::uint64_t seed, std::uint64_t position, std::uint64_t stream = 0);

// Index of the largest logit; the lowest index wins ties; NaN never wins.
int Argmax(const float* logits, int n);

// Samples from logits f32 [n_vocab] for the logits row at absolute `position` (the token goes to
// position + 1). Greedy when params.greedy(). Candidates are ordered by descending logit (lower id
// first on ties), cut by top_k, then softmax(logit / T) in f64, cut to the smallest prefix with
// mass >= top_p, and the token is the first whose cumulative mass exceeds u * total with
// u = CounterUniform(seed, position). `scratch` is reused between calls.
int SampleToken(const float* logits, int n_vocab, const SamplingParams& params,
                std::int64_t position, std::vector<int>* scratch);

}  // namespace lockstep
