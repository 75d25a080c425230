// Background load for service arms (`load = {...}` of a campaign arm, issue 25): seeded
// random-token completions sent to a `lockstep serve` while the arm's own request runs, so the
// arm's steps are shared with other sequences' verify windows and prefill chunks.
//
// The load is a function of its LoadSpec: request k has a prompt of prompt_lo..prompt_hi token
// ids (each in [0, vocab)) and max_new tokens, drawn from a generator seeded by (seed, k); it is
// sent with temperature 0 and ignore_eos, without exports or traces. `concurrency` client threads
// send the requests in order k = 0, 1, ...; each request has its own deadline and the whole load
// ends by LoadSpec::timeout_s (unsent requests count as failed). Only digests are kept (the
// SHA-256 of each request's prompt ids and of its output ids), never the text.
//
// Thread safety: Start() once, then WaitUntilInFlight() / Finish() from the same thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/harness/campaign.h"

namespace lockstep {

struct ServiceEndpoint {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string api_key;  // "" none
};

struct LoadOutcome {
  int requests = 0;  // planned
  int concurrency = 0;
  int completed = 0;  // answered 200 with a completion
  int failed = 0;     // any other answer, a transport error, or not sent before the deadline
  std::vector<std::string> digests;  // per request k: sha256(prompt ids) ":" sha256(output ids)
  std::string digest;                // SHA-256 over the digests joined by "\n"
  double seconds = 0;
  nlohmann::json ToJson() const;  // the ledger's `service.load` object
};

class BackgroundLoad {
 public:
  BackgroundLoad(ServiceEndpoint ep, LoadSpec spec, int vocab);
  ~BackgroundLoad();  // stops and joins whatever is still running
  BackgroundLoad(const BackgroundLoad&) = delete;
  BackgroundLoad& operator=(const BackgroundLoad&) = delete;

  void Start();
  // Blocks until at least one load request is running in the server (GET /slots shows a busy
  // slot) or `timeout_s` passed; false on timeout.
  bool WaitUntilInFlight(double timeout_s);
  // Waits for every request (bounded by the spec's timeout) and returns the outcome.
  LoadOutcome Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The prompt ids of load request k (what BackgroundLoad sends; tests recompute digests with it).
std::vector<std::int32_t> LoadPrompt(const LoadSpec& spec, int vocab, int k);

}  // namespace lockstep
