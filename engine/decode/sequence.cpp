#include "decode/sequence.h"

#include <algorithm>
#include <mutex>
#include <set>

#include "lockstep/engine/backend.h"
#include "lockstep/engine/clock.h"
#include "lockstep/engine/gdn_state.h"
#include "observe/checkpoint.h"

namespace lockstep {

namespace {

// first_call: the first verify with a given T in this process pays allocation and warm-up
// costs (arena growth, page faults, cold caches).
bool FirstVerifyOfSize(int T) {
  static std::mutex mu;
  static std::set<int> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert(T).second;
}

// A verify window of T tokens keeps T per-step recurrent states in every GDN layer's scratch
// (step n-1 becomes the checkpoint at Commit(n)), and the scratch grows to the largest T seen.
// On `small` that is 1.2 MB per layer at T = 9: growing it at the first long window meant
// ~3,300 page faults on fresh memory, 60 ms on the development VM, in the middle of decoding
// (and again at each larger T for a policy that lengthens its drafts). Growing it here, before
// the first token, moves that one-time cost into setup (prefill time) like the K/V cache's
// allocation; the scratch is overwritten before it is read, so nothing computed changes. CPU
// stages only: a device backend's gdn() is a host mirror.
void ReserveWindowScratch(Engine& engine, int max_T) {
  if (engine.backend().name() != "cpu") return;
  const int n_layers = engine.weights().config.n_layers;
  for (int is = 0; is < engine.n_stages(); ++is)
    for (int il = 0; il < n_layers; ++il)
      if (GdnState* g = engine.stage(is).gdn(il)) {
        g->BeginSteps(max_T);
        g->DiscardSteps();
      }
}

std::string ReplayWhere(const std::string& path, int idx) {
  return "--replay-path '" + path + "' window " + std::to_string(idx);
}

}  // namespace

Sequence::Sequence(Engine& engine, int slot, std::vector<std::int32_t> prompt, RequestOptions opts,
                   const GenerateHooks* hooks)
    : engine_(engine),
      slot_(slot),
      mc_(engine.weights().config),
      tokens_(std::move(prompt)),
      opts_(std::move(opts)),
      hooks_(hooks) {
  res_.stop_reason = "length";
}

bool Sequence::IsEos(std::int32_t t) const {
  return !opts_.ignore_eos && std::find(mc_.eos_token_ids.begin(), mc_.eos_token_ids.end(), t) !=
                                  mc_.eos_token_ids.end();
}

Status Sequence::Setup() {
  const int V = mc_.n_vocab;
  if (tokens_.empty())
    return Status::InvalidArgument("prompt", "empty (at least one token is needed)");
  for (std::size_t i = 0; i < tokens_.size(); ++i)
    if (tokens_[i] < 0 || tokens_[i] >= V)
      return Status::InvalidArgument(
          "prompt", "token " + std::to_string(i) + " = " + std::to_string(tokens_[i]) +
                        " is outside the vocabulary (size " + std::to_string(V) + ")");
  LOCKSTEP_RETURN_IF_ERROR(MakeDrafters());
  cur_ = tokens_.back();
  prefill_begin_ = next_ = 0;
  prefill_end_ = static_cast<int>(tokens_.size()) - 1;
  return Status::Ok();
}

Status Sequence::MakeDrafters() {
  replay_.clear();
  if (!opts_.replay_path.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(replay_, ReadWindowRecords(opts_.replay_path));
  }
  speculative_ = opts_.spec > 0 || !replay_.empty();
  const bool use_mtp = speculative_ && opts_.mtp && engine_.has_mtp();
  if (!policy_ || opts_.draft_policy != policy_->name()) {
    policy_ = DraftPolicy::Create(opts_.draft_policy);
    if (!policy_)
      return Status::InvalidArgument("--draft-policy", "unknown '" + opts_.draft_policy + "'");
  }
  if (speculative_ && opts_.spec_max_suffix > 0 && !suffix_)
    suffix_ = std::make_unique<SuffixIndex>(
        opts_.suffix_index == "async" ? SuffixIndex::Mode::kAsync : SuffixIndex::Mode::kSync);
  if (use_mtp && !mtp_) {
    // The draft K/V must cover every row from 0: a conversation cannot start drafting later.
    if (admitted_)
      return Status::InvalidArgument("--mtp", "a conversation cannot turn MTP drafts on");
    mtp_ = std::make_unique<MtpDrafter>(engine_);
  }
  return Status::Ok();
}

int Sequence::MaxWindow() const {
  if (!speculative_) return 1;
  int t = 1 + std::max(opts_.spec, opts_.spec_max_suffix);
  for (const WindowRecord& r : replay_) t = std::max(t, r.T);
  return t;
}

void Sequence::OnAdmit() {
  engine_.UseSlot(slot_);
  engine_.SetOpObserver(hooks_ ? hooks_->observer : nullptr);
  admitted_ = true;
  admit_ns_ = MonotonicNs();
  ReserveScratch();
  if (!prefilling()) EndPrefill();
}

void Sequence::ReserveScratch() { ReserveWindowScratch(engine_, MaxWindow()); }

void Sequence::ResumeAt(int p, const MtpDrafterState* mtp) {
  next_ = std::min(p, prefill_end_);
  if (mtp_ && mtp) mtp_->LoadState(*mtp);
  if (!prefilling()) EndPrefill();
}

int Sequence::NextChunkRows() const {
  const int chunk = engine_.config().prefill_chunk;
  const int grid_end = (next_ / chunk + 1) * chunk;
  return std::min(grid_end, prefill_end_) - next_;
}

std::span<const std::int32_t> Sequence::ChunkTokens(int p, int T) const {
  return std::span<const std::int32_t>(tokens_).subspan(static_cast<std::size_t>(p),
                                                        static_cast<std::size_t>(T));
}

Status Sequence::OnPrefillChunk(int p, int T, const float* normed) {
  engine_.UseSlot(slot_);
  if (mtp_) {
    // Draft K/V for prompt rows: row q pairs h_q with the next prompt token.
    mtp_->Queue(p, T, normed, tokens_.data() + p + 1);
    mtp_->Extend(ForwardMode::kPrefill);
  }
  const bool recompute = p + T <= recompute_until_;
  next_ = p + T;
  if (!recompute && hooks_ != nullptr && hooks_->on_prefill)
    hooks_->on_prefill(next_, prefill_end_);
  if (!prefilling() && !prefill_ended_) EndPrefill();
  if (next_ == recompute_until_ && !recomputing()) EndRecompute();
  return Status::Ok();
}

void Sequence::EndPrefill() {
  prefill_ended_ = true;
  if (suffix_ && suffix_len_ < tokens_.size()) {
    suffix_->Append(std::vector<std::int32_t>(
        tokens_.begin() + static_cast<std::ptrdiff_t>(suffix_len_), tokens_.end()));
    suffix_len_ = tokens_.size();
  }
  decode_begin_ns_ = MonotonicNs();
  res_.prefill_ns = decode_begin_ns_ - admit_ns_;
  done_ = opts_.max_new <= 0;
}

bool Sequence::StopRequested() {
  if (!hooks_ || !hooks_->stop_check) return false;
  std::string why = hooks_->stop_check();
  if (why.empty()) return false;
  res_.stop_reason = why;
  done_ = true;
  return true;
}

Status Sequence::BeginWindow() {
  engine_.UseSlot(slot_);
  w_ = Window{};
  w_.rec.idx = idx_;
  w_.rec.p = engine_.position();
  w_.rec.chain_n = streak_;
  w_.rec.begin_ns = MonotonicNs();
  engine_.SetWindow(w_.rec.idx);  // before the MTP drafts: their op records belong to the window
  LOCKSTEP_RETURN_IF_ERROR(Draft());
  mtp_rows_after_draft_.push_back(engine_.mtp_position());
  LOCKSTEP_RETURN_IF_ERROR(engine_.ApplyGrafts(w_.rec.idx, CheckpointPoint::kPreVerify));
  Checkpoint(CheckpointPoint::kPreVerify, nullptr);
  WindowRecord& rec = w_.rec;
  window_tokens_.assign(1, cur_);
  window_tokens_.insert(window_tokens_.end(), rec.draft.begin(), rec.draft.end());
  rec.first_call = FirstVerifyOfSize(rec.T);
  engine_.SetWindow(rec.idx);
  engine_.SetCaptureHidden(w_.obs != nullptr &&
                           w_.obs->WantsCheckpoint(rec.idx, CheckpointPoint::kPostVerify));
  return Status::Ok();
}

Status Sequence::Draft() {
  WindowRecord& rec = w_.rec;
  std::vector<std::int32_t> draft;
  // Drafts beyond this are wasted.
  const int room = opts_.max_new - static_cast<int>(res_.output.size()) - 1;
  if (!replay_.empty()) {
    LOCKSTEP_RETURN_IF_ERROR(DraftFromReplay(draft));
  } else if (rec.idx > 0 && speculative_ && room > 0) {
    ProposeDraft(room, draft);
  }
  rec.draft = draft;
  rec.T = 1 + static_cast<int>(draft.size());
  const std::int64_t t_draft = MonotonicNs();
  rec.draft_ns = t_draft - rec.begin_ns;
  w_.obs = hooks_ ? hooks_->observer : nullptr;
  return Status::Ok();
}

Status Sequence::DraftFromReplay(std::vector<std::int32_t>& draft) {
  WindowRecord& rec = w_.rec;
  const int idx = rec.idx;
  if (idx >= static_cast<int>(replay_.size()))
    return Status::InvalidArgument(
        ReplayWhere(opts_.replay_path, idx),
        "the recorded path has only " + std::to_string(replay_.size()) + " windows");
  const WindowRecord& r = replay_[static_cast<std::size_t>(idx)];
  if (r.p != rec.p)
    return Status::InvalidArgument(
        ReplayWhere(opts_.replay_path, idx),
        "recorded at p=" + std::to_string(r.p) + ", this run is at p=" + std::to_string(rec.p) +
            " (the recorded path is inconsistent with this model's output)");
  rec.source = r.source;
  rec.T_mtp = r.T_mtp;
  rec.merged = r.merged;
  rec.from_sfx = r.from_sfx;
  draft = r.draft;
  if (mtp_ && r.T_mtp > 0) mtp_->Draft(rec.p, draft, 0);  // same MTP work, recorded tokens
  return Status::Ok();
}

void Sequence::ProposeDraft(int room, std::vector<std::int32_t>& draft) {
  WindowRecord& rec = w_.rec;
  SuffixProposal prop;
  if (suffix_) {
    prop = suffix_->Propose(opts_.spec_max_suffix, DraftPolicy::kMinSuffixMatch);
    ExtendPeriodic(prop, opts_.spec_max_suffix);  // a loop shorter than the draft budget
  }
  DraftPlan plan = policy_->Plan(prop, mtp_ != nullptr, opts_.spec, opts_.spec_max_suffix);
  plan.n_sfx = std::min(plan.n_sfx, room);
  plan.n_mtp = std::min(plan.n_mtp, room - plan.n_sfx);
  if (plan.source == DraftSource::kMerged && plan.n_mtp == 0) plan.source = DraftSource::kSuffix;
  std::span<const std::int32_t> sfx_part(prop.tokens.data(), static_cast<std::size_t>(plan.n_sfx));
  if (plan.source == DraftSource::kSuffix) {
    draft.assign(sfx_part.begin(), sfx_part.end());
  } else if (plan.source == DraftSource::kMtp || plan.source == DraftSource::kMerged) {
    draft = mtp_->Draft(
        rec.p, plan.source == DraftSource::kMerged ? sfx_part : std::span<const std::int32_t>(),
        plan.n_mtp);
  }
  rec.source = draft.empty() ? DraftSource::kNone : plan.source;
  rec.T_mtp =
      rec.source == DraftSource::kMtp || rec.source == DraftSource::kMerged ? plan.n_mtp : 0;
  rec.merged = rec.source == DraftSource::kMerged;
  rec.from_sfx = rec.source == DraftSource::kSuffix || rec.source == DraftSource::kMerged;
}

std::int64_t Sequence::Checkpoint(CheckpointPoint point, const float* logits) {
  if (w_.obs == nullptr || !w_.obs->WantsCheckpoint(w_.rec.idx, point)) return 0;
  const std::int64_t e0 = MonotonicNs();
  CheckpointInfo info;
  info.window = w_.rec.idx;
  info.point = point;
  info.p = w_.rec.p;
  info.T = w_.rec.T;
  info.recurrent_pos = engine_.position();
  info.committed_rows = engine_.position();
  info.spec_rows = point == CheckpointPoint::kPostVerify ? w_.rec.T : 0;
  EmitCheckpoint(engine_, *w_.obs, info, logits);
  const std::int64_t spent = MonotonicNs() - e0;
  w_.export_ns += spent;
  return spent;
}

Status Sequence::OnVerified(const float* logits, const float* normed, const StepContext& step) {
  engine_.UseSlot(slot_);
  WindowRecord& rec = w_.rec;
  rec.verify_ns = step.end_ns - step.begin_ns;
  rec.stages = engine_.stage_timings();
  for (const auto& s : rec.stages) rec.wait_ns += s.wait_ns, rec.compute_ns += s.compute_ns;
  rec.step = step.step;
  rec.step_rows = step.rows;
  rec.step_seqs = step.seqs;
  rec.step_prefill_rows = step.prefill_rows;
  if (hooks_ && hooks_->on_window) hooks_->on_window(rec.p, rec.T, logits);
  LOCKSTEP_RETURN_IF_ERROR(engine_.ApplyGrafts(rec.idx, CheckpointPoint::kPostVerify));
  Checkpoint(CheckpointPoint::kPostVerify, logits);
  LOCKSTEP_RETURN_IF_ERROR(AcceptAndCommit(logits));
  // Commit checkpoint: before the next MTP write (draft K/V extends lazily at the next draft).
  LOCKSTEP_RETURN_IF_ERROR(engine_.ApplyGrafts(rec.idx, CheckpointPoint::kCommit));
  w_.commit_export_ns = Checkpoint(CheckpointPoint::kCommit, nullptr);
  LOCKSTEP_RETURN_IF_ERROR(Advance(normed));
  return EndWindow();
}

Status Sequence::AcceptAndCommit(const float* logits) {
  w_.verify_end_ns = MonotonicNs();
  WindowRecord& rec = w_.rec;
  const int V = mc_.n_vocab;
  const std::size_t T = window_tokens_.size();
  int n = 0;  // rows kept
  for (std::size_t i = 0; i < T; ++i) {
    const float* row = logits + i * static_cast<std::size_t>(V);
    if (opts_.sampling.penalized()) {
      // Row i sees the history a plain decode would: every committed token, then this window's
      // tokens accepted so far (so speculation never changes a penalised draw).
      ApplyPenalties(row, V, opts_.sampling,
                     {.base = tokens_,
                      .more = rec.emitted,
                      .n_output = res_.output.size() + rec.emitted.size()},
                     &penalized_);
      row = penalized_.data();
    }
    const std::int32_t y =
        SampleToken(row, V, opts_.sampling, rec.p + static_cast<int>(i), &scratch_);
    rec.emitted.push_back(y);
    ++n;
    if (IsEos(y) || static_cast<int>(res_.output.size() + rec.emitted.size()) >= opts_.max_new)
      break;
    if (i + 1 == T || rec.draft[i] != y) break;
  }
  rec.accepted = n - 1;
  return engine_.Commit(n);
}

Status Sequence::Advance(const float* normed) {
  const WindowRecord& rec = w_.rec;
  if (!replay_.empty()) {
    const WindowRecord& r = replay_[static_cast<std::size_t>(rec.idx)];
    if (r.accepted != rec.accepted || r.emitted != rec.emitted)
      return Status::InvalidArgument(
          ReplayWhere(opts_.replay_path, rec.idx),
          "recorded " + std::to_string(r.accepted) + " accepted drafts, this run accepted " +
              std::to_string(rec.accepted) +
              " (the recorded path is inconsistent with this model's output)");
  }
  if (mtp_) {
    // Row q = p+i pairs h_q with the token emitted after it.
    mtp_->Queue(rec.p, rec.accepted + 1, normed, rec.emitted.data());
    if (mtp_->pending() >= 256) mtp_->Extend();
  }
  if (suffix_) {
    suffix_->Append(rec.emitted);
    suffix_len_ += rec.emitted.size();
  }
  res_.output.insert(res_.output.end(), rec.emitted.begin(), rec.emitted.end());
  tokens_.insert(tokens_.end(), rec.emitted.begin(), rec.emitted.end());
  cur_ = rec.emitted.back();
  return Status::Ok();
}

Status Sequence::EndWindow() {
  WindowRecord& rec = w_.rec;
  rec.end_ns = MonotonicNs();
  rec.commit_ns = rec.end_ns - w_.verify_end_ns;
  if (w_.obs != nullptr) {
    rec.export_ns = w_.export_ns;  // all three checkpoints, measured apart from model work
    rec.commit_ns -= w_.commit_export_ns;
    w_.obs->OnWindow(rec);
  }
  streak_ = rec.T > 1 && rec.accepted == rec.T - 1 ? streak_ + 1 : 0;
  policy_->Observe(rec);
  if (IsEos(cur_)) {
    res_.stop_reason = "eos";
    done_ = true;
  } else if (static_cast<int>(res_.output.size()) >= opts_.max_new) {
    done_ = true;
  }
  ++idx_;
  ++windows_total_;
  Status st = Status::Ok();
  if (hooks_ && hooks_->on_record) st = hooks_->on_record(rec);
  res_.windows.push_back(std::move(rec));
  ++res_.n_windows;
  return st;
}

GenerateResult Sequence::TakeResult() {
  res_.decode_ns = decode_begin_ns_ > 0 ? MonotonicNs() - decode_begin_ns_ : 0;
  GenerateResult out = std::move(res_);
  res_ = GenerateResult{};
  res_.stop_reason = "length";
  return out;
}

Status Sequence::Continue(std::vector<std::int32_t> more, RequestOptions opts,
                          const GenerateHooks* hooks) {
  const int V = mc_.n_vocab;
  if (more.empty()) return Status::InvalidArgument("continue", "no tokens (at least one)");
  for (std::size_t i = 0; i < more.size(); ++i)
    if (more[i] < 0 || more[i] >= V)
      return Status::InvalidArgument(
          "continue", "token " + std::to_string(i) + " = " + std::to_string(more[i]) +
                          " is outside the vocabulary (size " + std::to_string(V) + ")");
  opts_ = std::move(opts);
  hooks_ = hooks;
  LOCKSTEP_RETURN_IF_ERROR(MakeDrafters());
  prefill_begin_ = next_ = static_cast<int>(tokens_.size()) - 1;
  tokens_.insert(tokens_.end(), more.begin(), more.end());
  prefill_end_ = static_cast<int>(tokens_.size()) - 1;
  cur_ = tokens_.back();
  idx_ = 0;
  streak_ = 0;
  done_ = false;
  prefill_ended_ = false;
  mtp_rows_after_draft_.clear();
  recompute_until_ = replay_k_ = replay_end_ = replayed_rows_ = 0;
  res_ = GenerateResult{};
  res_.stop_reason = "length";
  decode_begin_ns_ = 0;
  OnAdmit();
  return Status::Ok();
}

MtpDrafterState Sequence::SaveMtp() const { return mtp_ ? mtp_->SaveState() : MtpDrafterState{}; }

DecoderState Sequence::SaveDecoder() const {
  DecoderState d;
  d.cur = cur_;
  d.streak = streak_;
  d.windows = windows_total_;
  if (policy_) d.policy_state = policy_->SaveState();
  return d;
}

Status Sequence::Restore(const ConversationState& state) {
  if (state.has_mtp != (mtp_ != nullptr))
    return Status::InvalidArgument("conversation", "MTP drafter state does not match the options");
  if (policy_) LOCKSTEP_RETURN_IF_ERROR(policy_->LoadState(state.decoder.policy_state));
  if (mtp_) mtp_->LoadState(state.mtp);
  cur_ = state.decoder.cur;
  streak_ = state.decoder.streak;
  windows_total_ = state.decoder.windows;
  next_ = prefill_end_;
  EndPrefill();
  done_ = true;
  return Status::Ok();
}

}  // namespace lockstep
