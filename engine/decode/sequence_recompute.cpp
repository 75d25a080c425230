// Sequence's preemption half (sequence.h "preemption"): what a preempted request recomputes and
// the replay of its recorded windows. Recompute is silent: the op observer is off and no hook is
// called, so what the request's observer saw is what an unpreempted run shows it.
#include <algorithm>

#include "decode/sequence.h"

namespace lockstep {

void Sequence::OnPreempt() {
  in_replay_ = false;
  if (recomputing()) return;  // preempted again mid-recompute: the same state to reach
  engine_.UseSlot(slot_);
  preempt_next_ = next_;
  preempt_position_ = engine_.position();
  replay_end_ = idx_;
}

Status Sequence::BeginRecompute(int from, const MtpDrafterState* mtp) {
  const int reached = std::min(preempt_next_, prefill_end_);
  if (from != preempt_position_ && (from < prefill_begin_ || from > reached))
    return Status::InvalidArgument("resume", "position " + std::to_string(from) +
                                                 " is not a point to recompute from (prefill at " +
                                                 std::to_string(reached) + ", committed " +
                                                 std::to_string(preempt_position_) + ")");
  engine_.UseSlot(slot_);
  engine_.SetOpObserver(nullptr);
  engine_.SetCaptureHidden(false);
  ReserveScratch();
  if (mtp_) {
    if (mtp != nullptr) {
      mtp_->LoadState(*mtp);
    } else {
      MtpDrafterState fresh;
      fresh.last_m.assign(static_cast<std::size_t>(mc_.n_embd), 0.0f);
      fresh.last_logits.assign(static_cast<std::size_t>(mc_.n_vocab), 0.0f);
      mtp_->LoadState(fresh);
    }
  }
  replayed_rows_ = 0;
  if (from == preempt_position_) {  // a slot file: nothing to recompute
    next_ = std::min(from, prefill_end_);
    recompute_until_ = 0;
    replay_k_ = replay_end_;
  } else {
    next_ = from;
    recompute_until_ = reached;
    replay_k_ = 0;
  }
  if (!recomputing()) EndRecompute();
  return Status::Ok();
}

void Sequence::EndRecompute() {
  recompute_until_ = 0;
  engine_.UseSlot(slot_);
  engine_.SetOpObserver(hooks_ ? hooks_->observer : nullptr);
}

Status Sequence::BeginReplayWindow() {
  engine_.UseSlot(slot_);
  const WindowRecord& r = res_.windows[static_cast<std::size_t>(replay_k_)];
  if (engine_.position() != r.p)
    return Status::Runtime("resume",
                           "window " + std::to_string(r.idx) + " was at p=" + std::to_string(r.p) +
                               ", the recomputed slot is at " + std::to_string(engine_.position()));
  const int mtp_rows = mtp_rows_after_draft_[static_cast<std::size_t>(replay_k_)];
  if (mtp_ && engine_.mtp_position() < mtp_rows) mtp_->Extend();  // its draft's extension
  w_ = Window{};
  w_.rec.idx = r.idx;
  w_.rec.p = r.p;
  window_tokens_.assign(1, tokens_[static_cast<std::size_t>(r.p)]);
  window_tokens_.insert(window_tokens_.end(), r.draft.begin(), r.draft.end());
  engine_.SetWindow(r.idx);
  engine_.SetCaptureHidden(false);
  in_replay_ = true;
  return Status::Ok();
}

Status Sequence::OnReplayed(const float* logits, const float* normed, bool* diverged) {
  engine_.UseSlot(slot_);
  in_replay_ = false;
  const WindowRecord& r = res_.windows[static_cast<std::size_t>(replay_k_)];
  const int n = r.accepted + 1;
  *diverged = false;
  if (!opts_.sampling.penalized()) {  // a penalised draw needs the history: not checked
    const int V = mc_.n_vocab;
    for (int i = 0; i < n && !*diverged; ++i) {
      const float* row = logits + static_cast<std::size_t>(i) * static_cast<std::size_t>(V);
      *diverged = SampleToken(row, V, opts_.sampling, r.p + i, &scratch_) !=
                  r.emitted[static_cast<std::size_t>(i)];
    }
  }
  LOCKSTEP_RETURN_IF_ERROR(engine_.Commit(n));
  if (mtp_) {
    mtp_->Queue(r.p, n, normed, r.emitted.data());
    if (mtp_->pending() >= 256) mtp_->Extend();
  }
  replayed_rows_ += n;
  ++replay_k_;
  if (!recomputing()) EndRecompute();
  return Status::Ok();
}

}  // namespace lockstep
