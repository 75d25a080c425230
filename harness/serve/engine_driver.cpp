#include "serve/engine_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "lockstep/engine/clock.h"
#include "lockstep/engine/expert_cache.h"
#include "lockstep/engine/prefix_cache.h"
#include "lockstep/engine/tokenizer.h"

namespace lockstep {

namespace {

// Log-softmax of one logits row: the chosen token's log-probability and the `n` best.
TokenLogprob LogprobOf(const float* row, int n_vocab, std::int32_t token, int n) {
  double mx = -INFINITY;
  for (int i = 0; i < n_vocab; ++i) mx = std::max(mx, static_cast<double>(row[i]));
  double z = 0.0;
  for (int i = 0; i < n_vocab; ++i) z += std::exp(static_cast<double>(row[i]) - mx);
  const double log_z = mx + std::log(z);
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = static_cast<double>(row[token]) - log_z;
  std::vector<int> idx(static_cast<std::size_t>(n_vocab));
  for (int i = 0; i < n_vocab; ++i) idx[static_cast<std::size_t>(i)] = i;
  const auto k = static_cast<std::ptrdiff_t>(std::min(n, n_vocab));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [row](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  for (std::ptrdiff_t i = 0; i < k; ++i)
    lp.top.emplace_back(idx[static_cast<std::size_t>(i)],
                        static_cast<double>(row[idx[static_cast<std::size_t>(i)]]) - log_z);
  return lp;
}

// The OpenAI finish_reason of a request that ran to its end.
// `stopped`: a stop string ended the text ("stop" even when that was the last allowed token).
std::string FinishReason(const RequestResult& r, bool stopped) {
  if (r.end == RequestEnd::kCancelled || r.result.stop_reason == "cancelled") return "cancelled";
  if (r.end != RequestEnd::kFinished) return "error";
  return r.result.stop_reason == "length" && !stopped ? "length" : "stop";  // eos or a stop string
}

}  // namespace

EngineDriver::EngineDriver(Engine& engine, ServeMetrics& metrics, const Tokenizer& tokenizer,
                           KeepPolicy keep)
    : engine_(engine),
      metrics_(metrics),
      tokenizer_(tokenizer),
      scheduler_(engine),
      n_slots_(engine.max_slots()),
      keep_(keep),
      thread_([this] { Loop(); }) {}

EngineDriver::~EngineDriver() {
  Shutdown();
  if (thread_.joinable()) thread_.join();
}

void EngineDriver::Submit(ServeJobPtr job) {
  std::lock_guard lk(mu_);
  if (stop_) {
    std::lock_guard jl(job->mu);
    job->error = ApiError::Unavailable("the server is shutting down", "draining");
    job->done = true;
    job->cv.notify_all();
    return;
  }
  ++in_flight_;
  commands_.push_back({Command::kSubmit, std::move(job), {}});
  cv_.notify_one();
}

void EngineDriver::Cancel(ServeJobPtr job) {
  job->cancel = true;
  std::lock_guard lk(mu_);
  commands_.push_back({Command::kCancel, std::move(job), {}});
  cv_.notify_one();
}

void EngineDriver::CancelAll() {
  std::lock_guard lk(mu_);
  commands_.push_back({Command::kCancelAll, nullptr, {}});
  cv_.notify_one();
}

void EngineDriver::Shutdown() {
  std::lock_guard lk(mu_);
  if (stop_) return;
  stop_ = true;
  commands_.push_back({Command::kCancelAll, nullptr, {}});
  cv_.notify_one();
}

int EngineDriver::in_flight() const {
  std::lock_guard lk(mu_);
  return in_flight_;
}

ServeGauges EngineDriver::Gauges() const {
  std::lock_guard lk(mu_);
  ServeGauges g;
  g.slots_total = n_slots_;
  g.slots_busy = counters_.live;
  g.slots_kept = static_cast<int>(kept_pub_.size());
  g.queue_depth = counters_.queue_depth;
  g.max_queue_depth = counters_.max_queue_depth;
  g.draining = stop_;
  // From the engine's config (immutable): right from the start, before any step published.
  g.prefix_cache = engine_.config().prefix_cache;
  g.prefix = prefix_;
  g.prefix_budget_bytes = static_cast<std::uint64_t>(engine_.config().prefix_cache_mib) << 20;
  return g;
}

nlohmann::json EngineDriver::Slots() const {
  std::lock_guard lk(mu_);
  const Clock::time_point now = Clock::now();
  nlohmann::json slots = nlohmann::json::array();
  for (int s = 0; s < n_slots_; ++s) {
    nlohmann::json j = {{"id", s}, {"state", "idle"}, {"request_id", nullptr}};
    for (const auto& [id, slot] : live_)
      if (slot == s) j["state"] = "busy", j["request_id"] = id;
    if (auto k = kept_pub_.find(s); k != kept_pub_.end()) {
      j["state"] = "kept", j["request_id"] = k->second.id, j["n_tokens"] = k->second.n_tokens;
      // Seconds since it was kept, restored or last continued: what --keep-idle measures.
      j["kept_age_s"] = std::chrono::duration<double>(now - k->second.since).count();
    } else if (auto r = released_pub_.find(s); r != released_pub_.end()) {
      j["released"] = r->second;  // why its last kept conversation went
    }
    slots.push_back(j);
  }
  nlohmann::json waiting = nlohmann::json::array();
  for (const auto& [id, slot] : live_)
    if (slot < 0) waiting.push_back(id);
  return {{"slots", slots},
          {"waiting", waiting},
          {"queue_depth", counters_.queue_depth},
          {"live", counters_.live},
          {"keep", {{"max", keep_.max}, {"idle_s", keep_.idle_s}}}};
}

void EngineDriver::Loop() {
  bool stalled = false;  // the last Step() ran no engine step
  for (;;) {
    std::deque<Command> cmds;
    {
      std::unique_lock lk(mu_);
      WaitForWork(lk);
      cmds.swap(commands_);
      if (stop_ && cmds.empty() && jobs_.empty()) return;
    }
    for (const Command& c : cmds) Run(c);
    ReclaimKept(stalled);
    stalled = false;
    if (!jobs_.empty()) {
      const std::int64_t steps = scheduler_.counters().steps, t0 = MonotonicNs();
      Result<bool> stepped = scheduler_.Step();
      if (scheduler_.counters().steps != steps)
        metrics_.ObserveStep(static_cast<double>(MonotonicNs() - t0) * 1e-9);
      else
        stalled = stepped.ok();
      if (!stepped.ok()) {
        // A step error that no request claimed: every live request ends with it (a bug).
        std::fprintf(stderr, "serve: engine step failed: %s\n", stepped.status().message().c_str());
        for (auto& [t, job] : jobs_) (void)scheduler_.Cancel(t);
      }
    }
    for (RequestResult& r : scheduler_.TakeFinished()) Deliver(std::move(r));
    FailLost();
    Publish();
  }
}

EngineDriver::Clock::duration EngineDriver::IdleLimit() const {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(keep_.idle_s));
}

void EngineDriver::WaitForWork(std::unique_lock<std::mutex>& lk) {
  const auto ready = [&] { return !commands_.empty() || !jobs_.empty() || stop_; };
  if (keep_.idle_s <= 0 || kept_.empty()) return cv_.wait(lk, ready);
  // A timed wait: the oldest kept conversation's idle release is due then (ReclaimKept).
  Clock::time_point due = Clock::time_point::max();
  for (const auto& [slot, k] : kept_) due = std::min(due, k.since + IdleLimit());
  (void)cv_.wait_until(lk, due, ready);
}

void EngineDriver::Run(const Command& c) {
  switch (c.kind) {
    case Command::kSubmit:
      SubmitNow(c.job);
      return;
    case Command::kCancel:
      if (c.job->ticket != 0 && jobs_.count(c.job->ticket)) (void)scheduler_.Cancel(c.job->ticket);
      return;
    case Command::kCancelAll:
      for (auto& [t, job] : jobs_) {
        job->cancel = true;
        (void)scheduler_.Cancel(t);
      }
      return;
    case Command::kCall:
      c.fn();
      return;
  }
}

void EngineDriver::SubmitNow(const ServeJobPtr& job) {
  InstallHooks(*job);
  if (job->req.id_slot >= 0) {
    (void)ContinueKept(job);
    return;
  }
  RequestSpec spec;
  spec.id = job->id;
  spec.prompt = job->prompt;
  spec.options = job->options;
  spec.borrowed_hooks = &job->hooks;
  spec.use_prefix_cache = !job->req.cache_bypass;
  spec.priority = job->req.priority;
  spec.keep = job->req.keep;
  SubmitError why = SubmitError::kNone;
  Result<Ticket> t = scheduler_.Submit(std::move(spec), &why);
  if (!t.ok()) return Refuse(job, ApiError::FromSubmit(why, t.status().message()));
  Accept(job, *t);
}

void EngineDriver::Refuse(const ServeJobPtr& job, ApiError e) {
  std::lock_guard jl(job->mu);
  job->error = std::move(e);
  job->done = true;
  job->cv.notify_all();
  std::lock_guard lk(mu_);
  --in_flight_;
}

void EngineDriver::Accept(const ServeJobPtr& job, Ticket t) {
  std::lock_guard jl(job->mu);
  job->ticket = t;
  job->accepted = true;
  jobs_[t] = job;
  job->cv.notify_all();
}

void EngineDriver::InstallHooks(ServeJob& job) {
  ServeJob* j = &job;
  job.hooks = {};
  job.hooks.observer = job.exporter.get();
  if (job.req.logprobs >= 0) {
    const auto V = static_cast<std::size_t>(engine_.weights().config.n_vocab);
    job.hooks.on_window = [j, V](int, int T, const float* logits) {
      j->window_logits.assign(logits, logits + static_cast<std::size_t>(T) * V);
    };
  }
  job.hooks.on_record = [this, j](const WindowRecord& rec) {
    OnWindow(*j, rec);
    return Status::Ok();
  };
  job.hooks.on_prefill = [this, j](int, int) { j->slot = engine_.slot(); };
  job.hooks.stop_check = [j] {
    if (j->cancel) return std::string("cancelled");
    // An export past its budget: the request ends now (answered 413, the file removed).
    if (j->exporter && j->exporter->over_budget()) return std::string("export_budget");
    return j->text.stopped() ? std::string("stop") : std::string();
  };
}

void EngineDriver::OnWindow(ServeJob& job, const WindowRecord& rec) {
  job.slot = engine_.slot();
  const std::int64_t now = MonotonicNs();
  const auto n = static_cast<double>(rec.emitted.size());
  if (job.last_token_ns == 0) {
    metrics_.ObserveTimeToFirstToken(static_cast<double>(now - job.arrive_ns) * 1e-9);
  } else if (n > 0) {
    for (std::size_t i = 0; i < rec.emitted.size(); ++i)
      metrics_.ObserveInterToken(static_cast<double>(now - job.last_token_ns) * 1e-9 / n);
  }
  job.last_token_ns = now;
  std::vector<TokenLogprob> lps;
  const int V = engine_.weights().config.n_vocab;
  if (job.req.logprobs >= 0 && job.window_logits.size() >= rec.emitted.size() * std::size_t(V))
    for (std::size_t i = 0; i < rec.emitted.size(); ++i)
      lps.push_back(LogprobOf(job.window_logits.data() + i * static_cast<std::size_t>(V), V,
                              rec.emitted[i], job.req.logprobs));
  if (!job.text.stopped()) job.text.AppendTokens(tokenizer_, rec.emitted);
  std::string delta = job.text.Take(false);
  std::lock_guard jl(job.mu);
  job.delta += delta;
  job.n_generated += static_cast<std::int64_t>(rec.emitted.size());
  for (auto& lp : lps) job.delta_logprobs.push_back(std::move(lp));
  job.cv.notify_all();
}

void EngineDriver::Deliver(RequestResult res) {
  auto it = jobs_.find(res.ticket);
  if (it == jobs_.end()) return;
  ServeJobPtr job = it->second;
  jobs_.erase(it);
  if (res.kept) {
    Kept& k = kept_[res.slot];
    k.ticket = res.ticket;
    k.tokens = job->prompt;
    k.tokens.insert(k.tokens.end(), res.result.output.begin(), res.result.output.end());
    k.id = job->id;
    k.since = Clock::now();
    released_.erase(res.slot);
    CapKept();
  }
  Publish();  // before the client hears of the end: /slots and /metrics already show it
  const std::string reason = FinishReason(res, job->text.stopped());
  // A request ended by its export budget is answered 413: an error, whatever its text says.
  metrics_.CountFinish(res.result.stop_reason == "export_budget" ? "error" : reason);
  metrics_.CountTokens(static_cast<std::int64_t>(job->prompt.size()),
                       static_cast<std::int64_t>(res.result.output.size()),
                       res.prefix.reused_tokens + job->slot_reused);
  metrics_.CountReuse(res.prefix.reason);
  for (const WindowRecord& w : res.result.windows)
    if (w.T > 1) metrics_.CountDrafts(DraftSourceName(w.source), w.T - 1, w.accepted);
  // The export's per-stage residency and counters. The slot is closed by now: its expert
  // counters are the ones the scheduler took as it ended (the residency map and the one-time
  // set-up counters are the stage's, the same for every slot).
  if (job->exporter) {
    AppendStageInfo(engine_, res.result.n_windows, &job->residency, &job->stage_counters);
    for (std::size_t is = 0; is < job->stage_counters.size(); ++is) {
      ExportRunInfo::Counters& c = job->stage_counters[is];
      const ExpertCounters e =
          is < res.expert_counters.size() ? res.expert_counters[is] : ExpertCounters{};
      c.expert_hits = static_cast<std::int64_t>(e.hits);
      c.expert_misses = static_cast<std::int64_t>(e.misses);
      c.expert_bytes_fetched = static_cast<std::int64_t>(e.bytes_fetched);
      c.host_expert_tokens = static_cast<std::int64_t>(e.host_tokens);
    }
  }
  std::string rest = job->text.Take(true);
  {
    std::lock_guard jl(job->mu);
    job->delta += rest;
    job->finish_reason = reason;
    if (res.end == RequestEnd::kFailed)
      job->error = ApiError::Internal("the request failed: " + res.status.message());
    if (res.end == RequestEnd::kRefused) job->error = ApiError::QueueFull(res.status.message());
    job->result = std::move(res);
    std::lock_guard lk(mu_);
    --in_flight_;
    job->done = true;
    job->cv.notify_all();
  }
}

void EngineDriver::FailLost() {
  // The scheduler idle while requests wait for their end: they would hang their clients and
  // keep this loop awake forever. Each gets a 500 (a bug: a result the scheduler never gave).
  // Kept conversations hold slots without running.
  const int running = scheduler_.counters().live - static_cast<int>(kept_.size());
  if (jobs_.empty() || running > 0 || scheduler_.counters().queue_depth > 0) return;
  for (auto& [t, job] : jobs_) {
    std::fprintf(stderr, "serve: %s: lost by the scheduler (ticket %lld)\n", job->id.c_str(),
                 static_cast<long long>(t));
    std::lock_guard jl(job->mu);
    job->error = ApiError::Internal("the request was lost by the scheduler (a bug)");
    job->finish_reason = "error";
    std::lock_guard lk(mu_);
    --in_flight_;
    job->done = true;
    job->cv.notify_all();
  }
  jobs_.clear();
}

void EngineDriver::Publish() {
  std::lock_guard lk(mu_);
  counters_ = scheduler_.counters();
  if (const PrefixCache* pc = scheduler_.prefix_cache()) prefix_ = pc->counters();
  live_.clear();
  for (const auto& [t, job] : jobs_) live_.emplace_back(job->id, job->slot);
  kept_pub_.clear();
  for (const auto& [slot, k] : kept_) kept_pub_[slot] = {k.id, k.tokens.size(), k.since};
  released_pub_.clear();
  for (const auto& [slot, r] : released_) released_pub_[slot] = r.reason;
}

}  // namespace lockstep
