// RequestOptions: the knobs of one request (output length, sampling, speculative decoding,
// replay, fault injection). A serving engine takes them per request; `lockstep generate` reads
// them from its EngineConfig (FromConfig), so a one-request run is configured as before.
// Engine-level knobs (stages, chunks, caches, slots) stay in EngineConfig.
#pragma once

#include <string>
#include <vector>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/sampler.h"

namespace lockstep {

struct RequestOptions {
  int max_new = 64;                     // output tokens at most
  SamplingParams sampling;              // greedy by default
  bool ignore_eos = false;              // keep generating past EOS
  int spec = 0;                         // draft budget K; 0 = plain decoding (T = 1)
  bool mtp = true;                      // MTP drafter on (when the checkpoint ships mtp.*)
  int spec_max_suffix = 8;              // suffix drafts propose up to this many tokens
  std::string suffix_index = "sync";    // sync | async
  std::string draft_policy = "static";  // static | adaptive | latency
  std::string replay_path;              // window records whose drafts are replayed
  std::vector<std::string> inject;      // --inject texts of this request (its slot's injections)

  // The request fields of `cfg` (max_new, sampling, ignore_eos, spec*, mtp, suffix_index,
  // draft_policy, replay_path, inject).
  static RequestOptions FromConfig(const EngineConfig& cfg);
};

}  // namespace lockstep
