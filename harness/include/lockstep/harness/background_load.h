// Background load for service arms (`load = {...}` of a campaign arm, issue 25): seeded
// random-token completions sent to a `lockstep serve` while the arm's own request runs, so the
// arm's steps are shared with other sequences' verify windows and prefill chunks.
//
// The load is a function of its LoadSpec: request k has a prompt of prompt_lo..prompt_hi token
// ids (each in [0, vocab)) and max_new tokens, drawn from a generator seeded by (seed, k); it is
// sent streamed (a cancelled stream frees its slot in the server), with temperature 0 and
// ignore_eos, without exports or traces. `concurrency` client threads send the requests in order
// k = 0, 1, ...; every socket wait of a request is bounded by the time left to the load's
// deadline, LoadSpec::timeout_s after Start(): by then the whole load has ended (unsent requests
// count as failed; requests still in flight are cancelled and count as failed). A 429 (queue
// full) or 503 answer is retried every 50 ms until the deadline. Only digests are kept (the
// SHA-256 of each request's prompt ids and of its output ids), never the text.
//
// LoadPrompt's generator (what makes a load reproducible): s = SplitMix64(SplitMix64(seed) + k);
// the length is lo + s % (hi - lo + 1); then for each id s = SplitMix64(s), id = s % vocab
// (lockstep/engine/splitmix.h; lo is at least 1).
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
  // Per request k: Sha256Tokens(prompt ids) ":" Sha256Tokens(output ids), or ":failed" in place
  // of the output's digest for a request that did not complete.
  std::vector<std::string> digests;
  std::string digest;  // SHA-256 (hex) over the digests joined by "\n"
  double seconds = 0;  // Start() to Finish()'s return
  // The ledger's `service.load` object: requests, concurrency, completed, failed, digest,
  // digests (not seconds: wall time would make two runs' ledgers differ).
  nlohmann::json ToJson() const;
};

class BackgroundLoad {
 public:
  BackgroundLoad(ServiceEndpoint ep, LoadSpec spec, int vocab);
  ~BackgroundLoad();  // stops and joins whatever is still running
  BackgroundLoad(const BackgroundLoad&) = delete;
  BackgroundLoad& operator=(const BackgroundLoad&) = delete;

  void Start();
  // Blocks until at least one load request is running in the server (GET /slots shows a busy
  // slot, or a load stream has delivered its first event and not ended) or `timeout_s` passed;
  // false on timeout, and false at once when every client thread has already ended (the load
  // finished or failed before it was seen in flight).
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
