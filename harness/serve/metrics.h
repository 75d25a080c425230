// ServeMetrics: the counters and histograms behind `GET /metrics`, rendered in the Prometheus
// text exposition format (version 0.0.4): raw counters (`_total`), gauges and cumulative
// histograms (`_bucket{le=...}`, `_sum`, `_count`), every name prefixed `lockstep_`.
//
// Thread-safe: HTTP handler threads and the engine driver thread record into it concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/engine/prefix_cache.h"

namespace lockstep {

// Cumulative-bucket histogram over fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // Appends the `_bucket`, `_sum` and `_count` lines of `name`.
  void Render(const std::string& name, const std::string& help, std::string& out) const;
  std::uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> buckets_;  // per bound, not cumulative
  std::uint64_t count_ = 0;
  double sum_ = 0.0;
};

struct ServeGauges {
  // The prefix cache's own counters (prefix_cache.h), read after each engine step; absent from
  // the text when the engine runs without a cache.
  bool prefix_cache = false;
  PrefixCacheCounters prefix;
  std::uint64_t prefix_budget_bytes = 0;
  int slots_total = 0;
  int slots_busy = 0;
  int slots_kept = 0;  // slots holding a kept conversation (counted in slots_busy too)
  int queue_depth = 0;
  int max_queue_depth = 0;
  bool draining = false;
};

class ServeMetrics {
 public:
  ServeMetrics();
  // One HTTP response by its endpoint (the route: "/v1/completions", "/slots/{id}", "other" for
  // a path that is none) and status code (200, 400, 429, ...).
  void CountResponse(const std::string& endpoint, int status);
  // A completion that ran (finished or cancelled): its token counts.
  void CountTokens(std::int64_t prompt, std::int64_t generated, std::int64_t cached);
  void CountFinish(const std::string& reason);  // stop | length | cancelled | error
  void CountDrafts(const std::string& source, std::int64_t drafted, std::int64_t accepted);
  // A kept conversation left its slot: evicted | idle | cap | erased | continued.
  void CountKeptRelease(const std::string& reason);
  // Leftovers of earlier processes removed at start (stale_files.h): files and their bytes.
  void CountStaleRemoved(std::uint64_t files, std::uint64_t bytes);
  // A completion that ran: why it reused no more of its prompt (every reason listed from 0).
  void CountReuse(ReuseReason reason);
  void ObserveStep(double seconds);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterToken(double seconds);

  // Completions that ran so far (every finish reason): what the server had served.
  std::uint64_t CompletionsRun() const;

  // The whole exposition text with the gauges of now.
  std::string Text(const ServeGauges& g) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, std::uint64_t> responses_;  // GUARDED_BY(mu_)
  std::map<std::string, std::uint64_t> finishes_;
  std::int64_t prompt_tokens_ = 0, generated_tokens_ = 0, cached_tokens_ = 0;
  std::uint64_t stale_files_ = 0, stale_bytes_ = 0;
  std::map<std::string, std::array<std::int64_t, 2>> drafts_;  // source -> drafted, accepted
  std::map<std::string, std::uint64_t> kept_released_;         // by reason, each listed from 0
  std::map<std::string, std::uint64_t> reuse_;                 // by ReuseReasonName, from 0
  Histogram step_, ttft_, itl_;
};

}  // namespace lockstep
