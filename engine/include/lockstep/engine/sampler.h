// Token selection: greedy argmax, or seeded sampling with temperature / top-k / top-p driven by
// a counter-based RNG keyed on (seed, position), so a draw depends only on where the token goes,
// never on how many draws came before (speculative and plain decoding draw identically).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/engine/splitmix.h"  // SplitMix64, which CounterHash is built on

namespace lockstep {

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy
  int top_k = 0;             // 0 = off
  double top_p = 1.0;        // 1 = off
  std::uint64_t seed = 0;
  // Token penalties (ApplyPenalties). Neutral by default; a request's bits change only when set.
  double presence_penalty = 0.0;   // OpenAI: minus this once for each token the output has used
  double frequency_penalty = 0.0;  // OpenAI: minus this per earlier use in the output
  double repeat_penalty = 1.0;     // llama.cpp / CTRL: logit / r if > 0, * r otherwise
  int repeat_last_n = 64;  // repeat_penalty looks this far back in prompt + output; -1 = all
  bool greedy() const { return temperature <= 0.0; }
  bool penalized() const {
    return presence_penalty != 0.0 || frequency_penalty != 0.0 ||
           (repeat_penalty != 1.0 && repeat_last_n != 0);
  }
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

// The tokens before the row being sampled: `context` = prompt + output (in order), of which the
// last `n_output` are the output. Two spans so a verify window can add its accepted tokens
// without copying the history: the context is `base` followed by `more`.
struct PenaltyContext {
  std::span<const std::int32_t> base, more;
  std::size_t n_output = 0;
};

// logits f32 [n_vocab] with params' penalties applied, into `out` (resized): for each token t,
//   l = logits[t]; if t is among the last repeat_last_n context tokens: l = l > 0 ? l / r : l * r;
//   l -= frequency_penalty * c(t) + presence_penalty * (c(t) > 0),
// c(t) = how often t occurs in the output so far. Each element is computed in f64 and rounded to
// f32 once, so the result depends on the history alone (never on what shares the step). Ids out
// of [0, n_vocab) in the history are ignored.
void ApplyPenalties(const float* logits, int n_vocab, const SamplingParams& params,
                    const PenaltyContext& history, std::vector<float>* out);

}  // namespace lockstep
