#include "serve/metrics.h"

#include <fmt/format.h>

#include <utility>

namespace lockstep {

namespace {

// Prometheus prints floats with Go's shortest form; "{}" (shortest round-trip) matches it.
std::string Num(double v) { return fmt::format("{}", v); }

void Header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void Scalar(std::string& out, const std::string& name, const char* type, const std::string& help,
            double v) {
  Header(out, name, type, help);
  out += name + " " + Num(v) + "\n";
}

// The prefix cache's counters (one lookup per admitted request that uses the cache).
void RenderPrefixCache(std::string& out, const ServeGauges& g) {
  const PrefixCacheCounters& c = g.prefix;
  const auto d = [](auto v) { return static_cast<double>(v); };
  Scalar(out, "lockstep_prefix_cache_queries_total", "counter", "Prefix-cache lookups",
         d(c.queries));
  Scalar(out, "lockstep_prefix_cache_hits_total", "counter",
         "Prefix-cache lookups that reused state", d(c.hits));
  Scalar(out, "lockstep_prefix_cache_misses_total", "counter",
         "Prefix-cache lookups that found nothing", d(c.queries - c.hits));
  Scalar(out, "lockstep_prefix_cache_tokens_reused_total", "counter",
         "Prompt tokens restored from the prefix cache", d(c.tokens_reused));
  Scalar(out, "lockstep_prefix_cache_inserts_total", "counter", "Prefix-cache entries stored",
         d(c.inserts));
  Scalar(out, "lockstep_prefix_cache_evictions_total", "counter",
         "Prefix-cache entries evicted for the --prefix-cache-mib budget", d(c.evictions));
  Scalar(out, "lockstep_prefix_cache_snapshot_bytes_total", "counter",
         "GDN snapshot bytes copied into entries", d(c.snapshot_bytes));
  Scalar(out, "lockstep_prefix_cache_entries", "gauge", "Prefix-cache entries held", d(c.entries));
  Scalar(out, "lockstep_prefix_cache_bytes", "gauge",
         "Bytes the prefix cache holds alone (snapshots and pages no live slot shares)",
         d(c.bytes));
  Scalar(out, "lockstep_prefix_cache_budget_bytes", "gauge", "--prefix-cache-mib in bytes",
         d(g.prefix_budget_bytes));
}

std::vector<double> LatencyBounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size(), 0) {}

void Histogram::Observe(double v) {
  ++count_;
  sum_ += v;
  for (std::size_t i = 0; i < bounds_.size(); ++i)
    if (v <= bounds_[i]) {
      ++buckets_[i];
      return;
    }
}

void Histogram::Render(const std::string& name, const std::string& help, std::string& out) const {
  Header(out, name, "histogram", help);
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cum += buckets_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, Num(bounds_[i]), cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name,
                     Num(sum_), name, count_);
}

ServeMetrics::ServeMetrics()
    : step_(LatencyBounds()), ttft_(LatencyBounds()), itl_(LatencyBounds()) {
  for (const char* r : {"evicted", "idle", "cap", "erased", "continued"}) kept_released_[r] = 0;
  for (ReuseReason r : kAllReuseReasons) reuse_[ReuseReasonName(r)] = 0;
}

void ServeMetrics::CountResponse(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++responses_[{endpoint, status}];
}

void ServeMetrics::CountTokens(std::int64_t prompt, std::int64_t generated, std::int64_t cached) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
  cached_tokens_ += cached;
}

void ServeMetrics::CountFinish(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++finishes_[reason];
}

void ServeMetrics::CountStaleRemoved(std::uint64_t files, std::uint64_t bytes) {
  std::lock_guard lk(mu_);
  stale_files_ += files;
  stale_bytes_ += bytes;
}

std::uint64_t ServeMetrics::CompletionsRun() const {
  std::lock_guard lk(mu_);
  std::uint64_t n = 0;
  for (const auto& [reason, k] : finishes_) n += k;
  return n;
}

void ServeMetrics::CountDrafts(const std::string& source, std::int64_t drafted,
                               std::int64_t accepted) {
  std::lock_guard lk(mu_);
  auto& d = drafts_[source];
  d[0] += drafted;
  d[1] += accepted;
}

void ServeMetrics::CountKeptRelease(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++kept_released_[reason];
}

void ServeMetrics::CountReuse(ReuseReason reason) {
  std::lock_guard lk(mu_);
  ++reuse_[ReuseReasonName(reason)];
}

void ServeMetrics::ObserveStep(double seconds) {
  std::lock_guard lk(mu_);
  step_.Observe(seconds);
}
void ServeMetrics::ObserveTimeToFirstToken(double seconds) {
  std::lock_guard lk(mu_);
  ttft_.Observe(seconds);
}
void ServeMetrics::ObserveInterToken(double seconds) {
  std::lock_guard lk(mu_);
  itl_.Observe(seconds);
}

std::string ServeMetrics::Text(const ServeGauges& g) const {
  std::lock_guard lk(mu_);
  std::string out;
  Header(out, "lockstep_requests_total", "counter", "HTTP responses by endpoint and status code");
  for (const auto& [key, n] : responses_)
    out += fmt::format("lockstep_requests_total{{endpoint=\"{}\",code=\"{}\"}} {}\n", key.first,
                       key.second, n);
  Header(out, "lockstep_completions_total", "counter", "Completions that ran, by finish reason");
  for (const auto& [reason, n] : finishes_)
    out += fmt::format("lockstep_completions_total{{finish_reason=\"{}\"}} {}\n", reason, n);
  Scalar(out, "lockstep_stale_files_removed_total", "counter",
         "Unfinished exports and temp files of earlier processes removed at start",
         static_cast<double>(stale_files_));
  Scalar(out, "lockstep_stale_bytes_removed_total", "counter", "Their bytes",
         static_cast<double>(stale_bytes_));
  Scalar(out, "lockstep_prompt_tokens_total", "counter", "Prompt tokens of completions that ran",
         static_cast<double>(prompt_tokens_));
  Scalar(out, "lockstep_generated_tokens_total", "counter", "Tokens generated",
         static_cast<double>(generated_tokens_));
  Scalar(out, "lockstep_cached_tokens_total", "counter",
         "Prompt tokens not recomputed: state from the prefix cache or a continued slot",
         static_cast<double>(cached_tokens_));
  Header(out, "lockstep_drafted_tokens_total", "counter", "Draft tokens proposed, by source");
  for (const auto& [src, d] : drafts_)
    out += fmt::format("lockstep_drafted_tokens_total{{source=\"{}\"}} {}\n", src, d[0]);
  Header(out, "lockstep_accepted_tokens_total", "counter", "Draft tokens accepted, by source");
  for (const auto& [src, d] : drafts_)
    out += fmt::format("lockstep_accepted_tokens_total{{source=\"{}\"}} {}\n", src, d[1]);
  if (g.prefix_cache) RenderPrefixCache(out, g);
  Scalar(out, "lockstep_slots", "gauge", "Engine slots", g.slots_total);
  Scalar(out, "lockstep_slots_busy", "gauge", "Slots holding a request", g.slots_busy);
  Scalar(out, "lockstep_slots_kept", "gauge", "Slots holding a kept conversation", g.slots_kept);
  Header(out, "lockstep_kept_released_total", "counter",
         "Kept conversations that left their slot, by reason");
  for (const auto& [reason, n] : kept_released_)
    out += fmt::format("lockstep_kept_released_total{{reason=\"{}\"}} {}\n", reason, n);
  Header(out, "lockstep_prefix_reuse_total", "counter",
         "Completions by why they reused no more of their prompt (prefix_cache.h ReuseReason)");
  for (const auto& [reason, n] : reuse_)
    out += fmt::format("lockstep_prefix_reuse_total{{reason=\"{}\"}} {}\n", reason, n);
  Scalar(out, "lockstep_queue_depth", "gauge", "Requests waiting for a slot", g.queue_depth);
  Scalar(out, "lockstep_queue_depth_max", "gauge", "Most requests ever waiting", g.max_queue_depth);
  Scalar(out, "lockstep_draining", "gauge", "1 while shutting down", g.draining ? 1 : 0);
  step_.Render("lockstep_step_seconds", "Engine step wall time", out);
  ttft_.Render("lockstep_time_to_first_token_seconds", "Request arrival to its first token", out);
  itl_.Render("lockstep_inter_token_seconds", "Time between a request's windows, per token", out);
  return out;
}

}  // namespace lockstep
