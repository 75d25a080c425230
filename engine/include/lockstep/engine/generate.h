// Generate: the request loop on top of the Engine (prefill, then one verify window per token).
//
// As in the seed issue, prefill covers positions [0, n-1) of an n-token prompt and the first
// verify window is p = n-1, T = 1 (the last prompt token); it yields the first output token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/sampler.h"

namespace lockstep {

struct GenerateResult {
  std::vector<std::int32_t> output;  // generated token ids
  std::string stop_reason;           // "eos" | "length"
  int n_windows = 0;                 // verify windows run
  std::int64_t prefill_ns = 0;       // wall time of the prefill (CLOCK_MONOTONIC)
  std::int64_t decode_ns = 0;        // wall time of all verify windows + commits
};

struct GenerateHooks {
  // Called after each verify, before commit: position p, T rows, logits f32 [T, V].
  std::function<void(int p, int T, const float* logits)> on_window;
};

SamplingParams SamplingFrom(const EngineConfig& cfg);

// Runs one request on a fresh engine (position 0). The prompt must hold at least one token.
Result<GenerateResult> Generate(Engine& engine, std::span<const std::int32_t> prompt,
                                const GenerateHooks* hooks = nullptr);

}  // namespace lockstep
