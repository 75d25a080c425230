// One engine step of the scheduler (planning, RunStep, finishing every group) and the
// conversation calls. Planning reads no clock: a step is a function of the arrivals and of the
// requests' state, so reruns compose the same steps.
#include <algorithm>

#include "lockstep/engine/clock.h"
#include "serve/memory.h"
#include "serve/scheduler.h"

namespace lockstep {

void Scheduler::PlanStep(Plan& plan) {
  int rows = 0;
  // Verify windows of every decoding sequence first, ascending slot (Engine::RunStep's order).
  for (int s = 0; s < n_slots_; ++s) {
    Entry* e = live_[static_cast<std::size_t>(s)].get();
    if (e == nullptr || e->kept || e->seq->prefilling()) continue;
    const bool replay = e->seq->replaying();  // a resumed request's recorded windows first
    if (!replay && (e->seq->done() || e->seq->StopRequested())) {
      Finish(*e, RequestEnd::kFinished, Status::Ok());
      continue;
    }
    Status st = replay ? e->seq->BeginReplayWindow() : e->seq->BeginWindow();
    if (!st.ok()) {
      Finish(*e, RequestEnd::kFailed, st);
      continue;
    }
    const auto wt = e->seq->window_tokens();
    const int T = static_cast<int>(wt.size());
    plan.plan.groups.push_back(RowGroup{s, ForwardMode::kVerify, e->seq->window_p(), rows, T});
    plan.tokens.insert(plan.tokens.end(), wt.begin(), wt.end());
    plan.entries.push_back(e);
    rows += T;
  }
  // Then whole prefill chunks in admission order while the step stays within batch_tokens; a
  // step that would carry no prefill row takes the head chunk anyway (prefill always moves).
  std::vector<Entry*> waiting;
  for (auto& e : live_)
    if (e && !e->kept && e->seq->prefilling()) waiting.push_back(e.get());
  std::sort(waiting.begin(), waiting.end(),
            [](const Entry* a, const Entry* b) { return a->admit_order < b->admit_order; });
  const int budget = engine_.config().batch_tokens;
  int prefill_rows = 0;
  for (Entry* e : waiting) {
    const int T = e->seq->NextChunkRows();
    if (prefill_rows > 0 && rows + T > budget) break;
    const int p = e->seq->prefill_next();
    plan.plan.groups.push_back(RowGroup{e->res.slot, ForwardMode::kPrefill, p, rows, T});
    const auto ct = e->seq->ChunkTokens(p, T);
    plan.tokens.insert(plan.tokens.end(), ct.begin(), ct.end());
    plan.entries.push_back(e);
    rows += T;
    prefill_rows += T;
  }
  plan.plan.fuse_all = !engine_.config().batch_invariant && plan.plan.groups.size() >= 2;
}

Result<bool> Scheduler::Step() {
  const std::size_t ended_before = finished_.size();
  const std::int64_t admitted_before = counters_.admitted;
  Arrive();
  Admit();
  Plan plan;
  PlanStep(plan);
  if (plan.plan.groups.empty()) {
    if (finished_.size() != ended_before || counters_.admitted != admitted_before) return true;
    if (!future_.empty()) {
      std::int64_t next = future_.front()->spec.arrive_step;
      for (const auto& e : future_) next = std::min(next, e->spec.arrive_step);
      step_ = std::max(step_ + 1, next);
      return true;
    }
    return false;
  }
  StepRecord rec;
  rec.step = step_;
  rec.rows = plan.plan.rows();
  rec.seqs = static_cast<int>(plan.plan.groups.size());
  rec.verify_rows = plan.plan.verify_rows();
  rec.prefill_rows = rec.rows - rec.verify_rows;
  rec.queue_depth = static_cast<int>(queue_.size());
  rec.live = counters_.live;
  for (const RowGroup& g : plan.plan.groups) {
    rec.slots.push_back(g.slot);
    rec.groups.push_back({g.slot, g.mode == ForwardMode::kVerify, g.p, g.T});
  }
  Engine::StepOutputs out;
  rec.begin_ns = MonotonicNs();
  LOCKSTEP_RETURN_IF_ERROR(engine_.RunStep(plan.plan, plan.tokens, &out));
  rec.end_ns = MonotonicNs();
  rec.weight_bytes = engine_.last_step_work().weight_bytes;
  rec.flops = engine_.last_step_work().flops;
  ++step_;
  ++counters_.steps;
  records_.push_back(rec);
  FinishStep(plan, out, rec);
  if (on_step_) on_step_(rec);
  return true;
}

void Scheduler::FinishStep(Plan& plan, const Engine::StepOutputs& out, const StepRecord& rec) {
  const std::size_t H = static_cast<std::size_t>(engine_.weights().config.n_embd);
  const std::size_t V = static_cast<std::size_t>(engine_.weights().config.n_vocab);
  StepContext ctx;
  ctx.step = rec.step;
  ctx.rows = rec.rows;
  ctx.seqs = rec.seqs;
  ctx.prefill_rows = rec.prefill_rows;
  ctx.begin_ns = rec.begin_ns;
  ctx.end_ns = rec.end_ns;
  std::vector<std::pair<Entry*, bool>> hooked;  // preempt_at candidates: (entry, decode)
  for (std::size_t i = 0; i < plan.plan.groups.size(); ++i) {
    const RowGroup& g = plan.plan.groups[i];
    Entry& e = *plan.entries[i];
    if (e.res.first_step < 0) e.res.first_step = rec.step;
    e.res.last_step = rec.step;
    // Verify rows are [0, verify_rows) in plan order, so a verify group's logits start at row0.
    const float* normed = out.normed.data() + static_cast<std::size_t>(g.row0) * H;
    const float* logits = out.logits.data() + static_cast<std::size_t>(g.row0) * V;
    const bool recompute = e.seq->recomputing();
    Status st;
    if (g.mode == ForwardMode::kVerify && e.seq->in_replay_window()) {
      PreemptionRecord& pr = e.res.preemptions.back();
      const int rows = e.seq->replayed_rows();
      bool diverged = false;
      st = e.seq->OnReplayed(logits, normed, &diverged);
      pr.tokens_recomputed += e.seq->replayed_rows() - rows;
      ++pr.windows_replayed;
      pr.windows_diverged += diverged ? 1 : 0;
    } else if (g.mode == ForwardMode::kVerify) {
      st = e.seq->OnVerified(logits, normed, ctx);
    } else {
      st = e.seq->OnPrefillChunk(g.p, g.T, normed);
      if (recompute) {
        e.res.preemptions.back().tokens_recomputed += g.T;
      } else {
        e.res.prefix.prefill_computed += g.T;
        ++e.chunks_run;
      }
      if (st.ok()) st = PrefixCaptureAfterChunk(e, g.p + g.T);
    }
    if (e.hooks->observer != nullptr) e.hooks->observer->OnStep(rec);
    if (!st.ok()) {
      Finish(e, RequestEnd::kFailed, st);
    } else if (e.seq->done()) {
      Finish(e, RequestEnd::kFinished, Status::Ok());
    } else if (!recompute && !e.spec.preempt_at.empty()) {
      hooked.emplace_back(&e, g.mode == ForwardMode::kVerify);
    }
  }
  for (auto [e, decode] : hooked) PreemptAtHook(*e, decode);
}

Result<Ticket> Scheduler::Continue(Ticket t, std::vector<std::int32_t> more, RequestOptions opts,
                                   const GenerateHooks* hooks, bool keep) {
  Entry* e = FindLive(t);
  if (e == nullptr || !e->kept)
    return Status::InvalidArgument("continue", "no kept conversation " + std::to_string(t));
  if (!opts.inject.empty())
    return Status::InvalidArgument("continue",
                                   "a continuation takes no --inject (its slot keeps the "
                                   "injections of the conversation's first request)");
  RequestSpec probe;
  probe.prompt = e->seq->tokens();
  probe.prompt.insert(probe.prompt.end(), more.begin(), more.end());
  probe.options = opts;
  const std::uint64_t reserve = ReservationBytes(probe);
  const std::uint64_t limit = MemoryLimitBytes(engine_.config());
  if (limit > 0 && counters_.reserved_bytes - e->reserved + reserve > limit)
    return Status::Runtime("continue", "the conversation would need " +
                                           std::to_string(reserve >> 20) +
                                           " MiB, more than --memory-mib leaves");
  e->spec.options = opts;
  e->spec.keep = keep;
  e->spec.hooks = GenerateHooks{};
  e->spec.borrowed_hooks = hooks;
  e->hooks = hooks != nullptr ? hooks : &e->spec.hooks;
  const int committed = static_cast<int>(e->seq->tokens().size()) - 1;  // the slot's position
  LOCKSTEP_RETURN_IF_ERROR(e->seq->Continue(std::move(more), std::move(opts), e->hooks));
  counters_.reserved_bytes = counters_.reserved_bytes - e->reserved + reserve;
  e->reserved = reserve;
  e->kept = false;
  const int slot = e->res.slot;
  e->res = RequestResult{};
  e->res.id = e->spec.id;
  e->res.ticket = next_ticket_++;
  e->res.slot = slot;
  e->res.arrive_step = e->res.admit_step = step_;
  e->res.prefix.reason = ReuseReason::kKeptSlot;
  e->res.prefix.kept_tokens = committed;
  e->admit_order = admit_seq_++;
  ++counters_.submitted;
  ++counters_.admitted;
  Count();
  return e->res.ticket;
}

// ExportConversation / ImportConversation: engine/serve/conversation.cpp.

}  // namespace lockstep
