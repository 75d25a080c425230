#include "serve/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "lockstep/engine/clock.h"
#include "lockstep/engine/prefix_cache.h"
#include "serve/memory.h"
#include "serve/prefix_hooks.h"

namespace lockstep {

RequestOptions RequestOptions::FromConfig(const EngineConfig& cfg) {
  RequestOptions o;
  o.max_new = cfg.max_new;
  o.sampling = SamplingFrom(cfg);
  o.ignore_eos = cfg.ignore_eos;
  o.spec = cfg.spec;
  o.mtp = cfg.mtp;
  o.spec_max_suffix = cfg.spec_max_suffix;
  o.suffix_index = cfg.suffix_index;
  o.draft_policy = cfg.draft_policy;
  o.replay_path = cfg.replay_path;
  o.inject = cfg.inject;
  return o;
}

std::string ReuseReasonText(const PrefixReport& p) {
  std::string s = ReuseReasonName(p.reason);
  if (p.reason == ReuseReason::kPrefixMismatch) s += "_at=" + std::to_string(p.reason_at);
  return s;
}

const char* RequestEndName(RequestEnd e) {
  switch (e) {
    case RequestEnd::kFinished:
      return "finished";
    case RequestEnd::kCancelled:
      return "cancelled";
    case RequestEnd::kFailed:
      return "failed";
    case RequestEnd::kRefused:
      return "refused";
  }
  return "?";
}

namespace {
std::string MiB(std::uint64_t bytes) {
  return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB";
}
}  // namespace

Scheduler::Scheduler(Engine& engine, SchedulerOptions opts)
    : engine_(engine),
      opts_(opts),
      n_slots_(opts.slots > 0 ? std::min(opts.slots, engine.max_slots()) : engine.max_slots()) {
  live_.resize(static_cast<std::size_t>(n_slots_));
  const EngineConfig& cfg = engine.config();
  if (cfg.prefix_cache)
    prefix_cache_ = std::make_unique<PrefixCache>(
        cfg.SnapshotGrid(), static_cast<std::uint64_t>(cfg.prefix_cache_mib) << 20);
}

Scheduler::~Scheduler() {
  for (const auto* v : {&queue_, &future_})
    for (const auto& e : *v)
      if (!e->slot_file.empty()) std::remove(e->slot_file.c_str());
  if (opts_.leave_slots_open) return;
  for (auto& e : live_)
    if (e) engine_.CloseSlot(e->res.slot);
}

Result<std::unique_ptr<Scheduler::Entry>> Scheduler::MakeEntry(RequestSpec spec, Ticket ticket) {
  auto e = std::make_unique<Entry>();
  e->spec = std::move(spec);
  e->hooks = e->spec.borrowed_hooks ? e->spec.borrowed_hooks : &e->spec.hooks;
  e->res.id = e->spec.id;
  e->res.ticket = ticket;
  e->res.arrive_step = e->spec.arrive_step;
  e->seq = std::make_unique<Sequence>(engine_, -1, e->spec.prompt, e->spec.options, e->hooks);
  LOCKSTEP_RETURN_IF_ERROR(e->seq->Setup());
  LOCKSTEP_ASSIGN_OR_RETURN(
      e->injections, engine_.ParseInjectionList(e->spec.options.inject, e->spec.options.max_new));
  e->reserved = ReservationBytes(e->spec);
  const std::uint64_t limit = MemoryLimitBytes(engine_.config());
  if (limit > 0 && e->reserved > limit)
    return Status::InvalidArgument("request '" + e->spec.id + "'",
                                   "needs " + MiB(e->reserved) + " of K/V and state for " +
                                       std::to_string(e->spec.prompt.size()) + " prompt + " +
                                       std::to_string(e->spec.options.max_new) +
                                       " new tokens, more than --memory-mib " +
                                       std::to_string(engine_.config().memory_mib) + " allows");
  return e;
}

std::uint64_t Scheduler::ReservationBytes(const RequestSpec& spec) const {
  const RequestOptions& o = spec.options;
  const bool speculative = o.spec > 0 || !o.replay_path.empty();
  const bool mtp = speculative && o.mtp && engine_.has_mtp();
  // A replayed window can be as long as its record; bound it by the longest draft budget.
  const int max_T = speculative ? 1 + std::max(std::max(o.spec, o.spec_max_suffix), 16) : 1;
  const int rows = static_cast<int>(spec.prompt.size()) + std::max(0, o.max_new) + max_T;
  return ReserveRequest(engine_.config(), engine_.weights().config, mtp, rows, max_T).total();
}

Result<Ticket> Scheduler::Submit(RequestSpec spec, SubmitError* why) {
  SubmitError unused = SubmitError::kNone;
  SubmitError& err = why ? *why : unused;
  err = SubmitError::kNone;
  ++counters_.submitted;
  const Ticket t = next_ticket_++;
  auto made = MakeEntry(std::move(spec), t);
  if (!made.ok()) {
    ++counters_.refused;
    err = made.status().code() == Status::Code::kInvalidArgument ? SubmitError::kInvalid
                                                                 : SubmitError::kOther;
    return made.status();
  }
  std::unique_ptr<Entry> e = std::move(made).value();
  if (e->spec.arrive_step > step_) {
    future_.push_back(std::move(e));
    return t;
  }
  // Requests due by now go first (FIFO by arrival), then free slots take the queue's head, so
  // the queue holds only what truly waits.
  Arrive();
  Admit();
  const int depth = engine_.config().queue_depth;
  if (static_cast<int>(queue_.size()) >= depth) {
    ++counters_.refused;
    err = SubmitError::kQueueFull;
    return Status::Runtime("request '" + e->spec.id + "'",
                           "queue full: " + std::to_string(queue_.size()) +
                               " waiting (--queue-depth " + std::to_string(depth) + ")");
  }
  Enqueue(std::move(e));
  Admit();
  return t;
}

void Scheduler::Enqueue(std::unique_ptr<Entry> e) {
  if (e->queue_order < 0) e->queue_order = queue_seq_++;
  // Higher priority first, FIFO by first enqueue within one (a preempted request keeps its place).
  const Entry& n = *e;
  const auto at = std::find_if(queue_.begin(), queue_.end(), [&n](const auto& q) {
    return q->spec.priority < n.spec.priority ||
           (q->spec.priority == n.spec.priority && q->queue_order > n.queue_order);
  });
  queue_.insert(at, std::move(e));
  Count();
}

void Scheduler::Arrive() {
  std::stable_sort(future_.begin(), future_.end(), [](const auto& a, const auto& b) {
    return a->spec.arrive_step < b->spec.arrive_step;
  });
  std::size_t n = 0;
  while (n < future_.size() && future_[n]->spec.arrive_step <= step_) ++n;
  std::vector<std::unique_ptr<Entry>> due(std::make_move_iterator(future_.begin()),
                                          std::make_move_iterator(future_.begin() + n));
  future_.erase(future_.begin(), future_.begin() + static_cast<std::ptrdiff_t>(n));
  const int depth = engine_.config().queue_depth;
  for (auto& e : due) {
    if (!e->resume && static_cast<int>(queue_.size()) >= depth) {  // a preempted one never is
      ++counters_.refused;
      const std::string why = "queue full: " + std::to_string(queue_.size()) +
                              " waiting (--queue-depth " + std::to_string(depth) + ")";
      Status st = Status::Runtime("request '" + e->spec.id + "'", why);
      EndUnadmitted(std::move(e), RequestEnd::kRefused, std::move(st));
      continue;
    }
    Enqueue(std::move(e));
  }
}

int Scheduler::FreeSlot() const {
  for (int s = 0; s < n_slots_; ++s)
    if (!live_[static_cast<std::size_t>(s)]) return s;
  return -1;
}

void Scheduler::Admit() {
  const std::uint64_t limit = MemoryLimitBytes(engine_.config());
  while (!queue_.empty()) {
    const int s = FreeSlot();
    Entry& head = *queue_.front();
    if (s < 0 || (limit > 0 && counters_.reserved_bytes + head.reserved > limit)) {
      if (!PreemptFor(head)) break;  // lower-priority requests hold what it needs
      continue;
    }
    std::unique_ptr<Entry> e = std::move(queue_.front());
    queue_.erase(queue_.begin());
    live_[static_cast<std::size_t>(s)] = std::move(e);
    Entry& en = *live_[static_cast<std::size_t>(s)];
    counters_.reserved_bytes += en.reserved;
    ++counters_.admitted;
    Status st = en.resume ? ResumeInto(en, s) : AdmitInto(en, s);
    if (!st.ok()) Finish(en, RequestEnd::kFailed, st);
  }
  Count();
}

Status Scheduler::AdmitInto(Entry& e, int slot) {
  e.res.slot = slot;
  e.res.admit_step = step_;
  e.admit_order = admit_seq_++;
  e.seq->set_slot(slot);
  if (!(opts_.adopt_open_slots && engine_.slot_open(slot)))
    LOCKSTEP_RETURN_IF_ERROR(engine_.OpenSlot(slot, e.injections));
  e.seq->OnAdmit();
  LOCKSTEP_RETURN_IF_ERROR(PrefixLookupOnAdmit(e));
  if (e.res.prefix.snapshot_position < 0) e.res.prefix.prefill_computed = 0;
  return Status::Ok();
}

Status Scheduler::PrefixLookupOnAdmit(Entry& e) {
  e.res.prefix.reason = ReuseReason::kCacheOff;
  if (!prefix_cache_ || !e.spec.use_prefix_cache) return Status::Ok();
  return PrefixAdmit(*prefix_cache_, engine_, *e.seq, &e.res.prefix);
}

Status Scheduler::PrefixCaptureAfterChunk(Entry& e, int chunk_end) {
  if (!prefix_cache_ || !e.spec.use_prefix_cache) return Status::Ok();
  return PrefixCapture(*prefix_cache_, engine_, *e.seq, chunk_end);
}

void Scheduler::Count() {
  counters_.queue_depth = static_cast<int>(queue_.size());
  counters_.max_queue_depth = std::max(counters_.max_queue_depth, counters_.queue_depth);
  counters_.live = static_cast<int>(
      std::count_if(live_.begin(), live_.end(), [](const auto& e) { return e != nullptr; }));
  counters_.max_reserved_bytes = std::max(counters_.max_reserved_bytes, counters_.reserved_bytes);
}

Scheduler::Entry* Scheduler::FindLive(Ticket t) {
  for (auto& e : live_)
    if (e && e->res.ticket == t) return e.get();
  return nullptr;
}

void Scheduler::Finish(Entry& e, RequestEnd end, Status st) {
  const int slot = e.res.slot;
  engine_.UseSlot(slot);
  e.res.end = end;
  e.res.status = std::move(st);
  e.res.result = e.seq->TakeResult();
  e.res.injections = engine_.InjectionReport();
  e.res.expert_counters.clear();  // before CloseSlot frees them (exports' /counters)
  for (int is = 0; is < engine_.n_stages(); ++is)
    e.res.expert_counters.push_back(engine_.stage(is).experts().counters());
  ++counters_.finished;
  if (end == RequestEnd::kCancelled) ++counters_.cancelled;
  e.kept = e.spec.keep && end == RequestEnd::kFinished;
  e.res.kept = e.kept;
  finished_.push_back(e.res);
  if (!e.kept) {
    counters_.reserved_bytes -= e.reserved;
    engine_.CloseSlot(slot);
    live_[static_cast<std::size_t>(slot)].reset();  // e is gone from here on
    if (prefix_cache_) prefix_cache_->Trim();       // its pages may now be the entries' alone
  }
  Count();
}

void Scheduler::EndUnadmitted(std::unique_ptr<Entry> e, RequestEnd end, Status st) {
  e->res.end = end;
  e->res.status = std::move(st);
  e->res.result = e->seq->TakeResult();
  if (end == RequestEnd::kCancelled) ++counters_.cancelled;
  if (!e->res.preemptions.empty()) ++counters_.finished;  // it had been admitted
  if (!e->slot_file.empty()) std::remove(e->slot_file.c_str());
  finished_.push_back(std::move(e->res));
}

Status Scheduler::Cancel(Ticket t) {
  auto drop = [&](std::vector<std::unique_ptr<Entry>>& v) {
    for (auto it = v.begin(); it != v.end(); ++it)
      if ((*it)->res.ticket == t) {
        std::unique_ptr<Entry> e = std::move(*it);
        v.erase(it);
        EndUnadmitted(std::move(e), RequestEnd::kCancelled, Status::Ok());
        Count();
        return true;
      }
    return false;
  };
  if (drop(queue_) || drop(future_)) return Status::Ok();
  Entry* e = FindLive(t);
  if (e == nullptr)
    return Status::InvalidArgument("cancel", "no waiting or live request " + std::to_string(t));
  if (e->kept) return Release(t);
  Finish(*e, RequestEnd::kCancelled, Status::Ok());
  return Status::Ok();
}

Status Scheduler::Release(Ticket t) {
  Entry* e = FindLive(t);
  if (e == nullptr || !e->kept)
    return Status::InvalidArgument("release", "no kept conversation " + std::to_string(t));
  const int slot = e->res.slot;
  counters_.reserved_bytes -= e->reserved;
  engine_.CloseSlot(slot);
  live_[static_cast<std::size_t>(slot)].reset();
  if (prefix_cache_) prefix_cache_->Trim();
  Count();
  return Status::Ok();
}

std::vector<RequestResult> Scheduler::TakeFinished() {
  std::vector<RequestResult> out = std::move(finished_);
  finished_.clear();
  return out;
}

Status Scheduler::RunUntilIdle() {
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool more, Step());
    if (!more) return Status::Ok();
  }
}

}  // namespace lockstep
