// ServeJob: one completion in flight, shared by the HTTP handler thread that owns its client and
// the engine driver thread that runs it. The driver writes events into the job's channel (text
// deltas, then the end); the handler waits on it. Everything under `mu` is the channel; the
// fields above it are set by the handler before Submit and read-only after; the fields marked
// "driver" are touched by the driver thread only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/engine/generate.h"
#include "lockstep/engine/request_options.h"
#include "lockstep/engine/scheduler.h"
#include "lockstep/instrument/export_writer.h"
#include "serve/api_error.h"
#include "serve/completion_request.h"
#include "serve/export_registry.h"
#include "serve/text_stream.h"

namespace lockstep {

struct TokenLogprob {
  std::int32_t token = 0;
  double logprob = 0.0;
  std::vector<std::pair<std::int32_t, double>> top;  // the request's `logprobs` best, best first
};

struct ServeJob {
  ServeJob(std::string id_, CompletionRequest req_, std::vector<std::int32_t> prompt_)
      : id(std::move(id_)), req(std::move(req_)), prompt(std::move(prompt_)), text(req.stop) {}

  // ---- set by the handler before Submit ----
  const std::string id;  // "cmpl-..." (export file name, logs)
  const CompletionRequest req;
  const std::vector<std::int32_t> prompt;
  RequestOptions options;
  std::unique_ptr<H5Exporter> exporter;  // the request's own observer; null without export
  ServedExport served;                   // its download registration (empty without export)
  std::int64_t arrive_ns = 0;            // CLOCK_MONOTONIC when the handler received it

  // ---- driver ----
  GenerateHooks hooks;  // borrowed by the scheduler while the request lives
  Ticket ticket = 0;
  TextStream text;
  std::vector<float> window_logits;  // f32 [T, V] of the last verify (logprobs only)
  std::int64_t last_token_ns = 0;
  int slot = -1;
  // A continuation (id_slot): the positions its slot already held in K/V (the conversation but
  // its last token), reused rather than recomputed; 0 otherwise.
  std::int64_t slot_reused = 0;
  // Filled when the request ends, for its export's /residency and /counters (the expert counters
  // are its slot's as it ended: RequestResult::expert_counters).
  std::vector<ExportRunInfo::Residency> residency;
  std::vector<ExportRunInfo::Counters> stage_counters;

  // ---- channel (driver -> handler) ----
  std::mutex mu;
  std::condition_variable cv;
  bool accepted = false;                     // GUARDED_BY(mu): queued in the scheduler
  std::optional<ApiError> error;             // GUARDED_BY(mu): refused or failed
  std::string delta;                         // GUARDED_BY(mu): text not yet taken by the handler
  std::vector<TokenLogprob> delta_logprobs;  // GUARDED_BY(mu)
  std::int64_t n_generated = 0;              // GUARDED_BY(mu)
  bool done = false;                         // GUARDED_BY(mu)
  std::optional<RequestResult> result;       // GUARDED_BY(mu): set with done (unless error)
  std::string finish_reason;                 // GUARDED_BY(mu): stop | length | cancelled | error

  std::atomic<bool> cancel{false};  // set by the handler: the client went away
};

using ServeJobPtr = std::shared_ptr<ServeJob>;

}  // namespace lockstep
