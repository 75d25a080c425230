// Generate: the request loop on top of the Engine — prefill, then verify windows with
// speculative drafts (MTP, suffix, merged), acceptance, commit.
//
// As in the seed issue, prefill covers positions [0, n-1) of an n-token prompt and the first
// verify window is p = n-1, T = 1 (the last prompt token, no draft yet); it yields the first
// output token. Window k then runs at the first uncommitted position p with the current token
// followed by up to T-1 drafts. Acceptance is exact for point-mass proposals: row i's token is
// argmax (greedy) or the sample drawn with the counter RNG at position p+i; drafts are accepted
// while they equal those tokens, and the first mismatching token (or the token after the last
// draft) is the bonus. So speculative and plain decoding emit identical tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/observer.h"
#include "lockstep/engine/sampler.h"
#include "lockstep/engine/window.h"

namespace lockstep {

struct GenerateResult {
  std::vector<std::int32_t> output;  // generated token ids
  std::string stop_reason;           // "eos" | "length"
  int n_windows = 0;                 // verify windows run
  std::int64_t prefill_ns = 0;  // wall time of the prefill incl. its MTP rows (CLOCK_MONOTONIC)
  std::int64_t decode_ns = 0;   // wall time of all windows (draft + verify + commit)
  std::vector<WindowRecord> windows;
};

struct GenerateHooks {
  // After each verify, before commit: position p, T rows, logits f32 [T, V].
  std::function<void(int p, int T, const float* logits)> on_window;
  // After each commit, with the finished record (timing fields complete except end_ns is set).
  // A non-OK status stops the request with that status.
  std::function<Status(const WindowRecord& rec)> on_record;
  // Polled before every window: a non-empty reason ends the request cleanly with that
  // stop_reason (e.g. "resource_guard"); the output so far is kept.
  std::function<std::string()> stop_check;
  // State observer (export): called at pre_verify / post_verify / commit of the windows it
  // wants; the time spent there is the window's export_ns. Borrowed; may be null.
  Observer* observer = nullptr;
  // After each prefill chunk: prompt rows done and the total (prefill covers n-1 rows of n).
  std::function<void(int done, int total)> on_prefill;
};

SamplingParams SamplingFrom(const EngineConfig& cfg);

// Runs one request on a fresh engine (position 0). The prompt must hold at least one token.
// Errors: kInvalidArgument (bad prompt, bad or inconsistent --replay-path), engine errors.
Result<GenerateResult> Generate(Engine& engine, std::span<const std::int32_t> prompt,
                                const GenerateHooks* hooks = nullptr);

}  // namespace lockstep
