#include "lockstep/engine/generate.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>

#include "decode/draft_policy.h"
#include "decode/mtp_drafter.h"
#include "decode/suffix_index.h"
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

// The largest verify window a run can ask for: the current token plus the longest draft.
int MaxWindow(const EngineConfig& cfg, bool speculative, const std::vector<WindowRecord>& replay) {
  if (!speculative) return 1;
  int t = 1 + std::max(cfg.spec, cfg.spec_max_suffix);
  for (const WindowRecord& r : replay) t = std::max(t, r.T);
  return t;
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

// One window in flight: its record and what one phase hands the next.
struct WindowState {
  WindowRecord rec;
  Observer* obs = nullptr;     // hooks->observer, read once per window; may be null
  std::int64_t export_ns = 0;  // the checkpoints' time so far, measured apart from model work
  std::int64_t commit_export_ns = 0;  // the commit checkpoint's share of export_ns
  std::int64_t verify_end_ns = 0;     // after the post-verify checkpoint: where commit time starts
};

// One Generate() call: the drafters, the buffers every window reuses and the result so far. Each
// public method is one phase; Generate() runs them in order, so its loop reads as the algorithm.
class Decoder {
 public:
  Decoder(Engine& engine, std::span<const std::int32_t> prompt, const GenerateHooks* hooks)
      : engine_(engine),
        cfg_(engine.config()),
        mc_(engine.weights().config),
        prompt_(prompt),
        hooks_(hooks),
        sp_(SamplingFrom(cfg_)) {
    res_.stop_reason = "length";
  }

  // Checks the prompt and the engine, reads --replay-path and makes the drafters.
  Status Setup();
  // Prefill of the prompt's first n-1 rows (with the MTP head's draft K/V for them), then the
  // suffix index over the whole prompt. Times prefill_ns.
  Status Prefill();
  // Polls hooks->stop_check: true, with the stop reason set, when the request should end here.
  bool StopRequested();
  WindowState BeginWindow(int idx);
  // ---- draft ---- the recorded draft (--replay-path) or the policy's plan over suffix and MTP.
  Status Draft(WindowState& w);
  // ---- observer ---- one checkpoint if the observer wants it; returns the ns spent.
  std::int64_t Checkpoint(WindowState& w, CheckpointPoint point, const float* logits);
  // ---- verify ---- the current token and the drafts through every stage; logits() after it.
  Status Verify(WindowState& w);
  const float* logits() const { return logits_.data(); }
  // ---- accept + commit ---- sampled rows while they match the drafts, Commit(accepted + 1).
  Status AcceptAndCommit(WindowState& w);
  // After the commit checkpoint: checks a replayed window, feeds the drafters the emitted rows
  // and appends them to the output.
  Status Advance(WindowState& w);
  // Times the commit, hands the record to the observer, the policy and hooks->on_record; true
  // when the request is done (eos or max_new).
  Result<bool> EndWindow(WindowState w);
  GenerateResult TakeResult();

 private:
  bool IsEos(std::int32_t t) const {
    return !cfg_.ignore_eos && std::find(mc_.eos_token_ids.begin(), mc_.eos_token_ids.end(), t) !=
                                   mc_.eos_token_ids.end();
  }
  Status DraftFromReplay(WindowState& w, std::vector<std::int32_t>& draft);
  void ProposeDraft(WindowState& w, int room, std::vector<std::int32_t>& draft);

  Engine& engine_;
  const EngineConfig& cfg_;
  const ModelConfig& mc_;
  const std::span<const std::int32_t> prompt_;
  const GenerateHooks* const hooks_;
  const SamplingParams sp_;

  std::vector<WindowRecord> replay_;  // --replay-path's windows; empty = draft live
  bool speculative_ = false;
  std::unique_ptr<DraftPolicy> policy_;
  std::unique_ptr<SuffixIndex> suffix_;  // null without suffix drafts
  std::unique_ptr<MtpDrafter> mtp_;      // null without MTP drafts

  GenerateResult res_;
  std::int64_t decode_begin_ns_ = 0;  // end of prefill
  std::vector<float> logits_;         // f32 [T, V] of the last verify
  std::vector<float> normed_;         // f32 [T, H] final-normed hidden of the last verify
  std::vector<int> scratch_;          // SampleToken's
  std::vector<std::int32_t> window_tokens_;
  std::int32_t cur_ = 0;  // the token the next window starts with
  int streak_ = 0;        // preceding windows that accepted all of their drafts
};

Status Decoder::Setup() {
  const int V = mc_.n_vocab;
  if (prompt_.empty())
    return Status::InvalidArgument("prompt", "empty (at least one token is needed)");
  if (engine_.position() != 0) return Status::Runtime("generate", "the engine is not fresh");
  for (std::size_t i = 0; i < prompt_.size(); ++i)
    if (prompt_[i] < 0 || prompt_[i] >= V)
      return Status::InvalidArgument(
          "prompt", "token " + std::to_string(i) + " = " + std::to_string(prompt_[i]) +
                        " is outside the vocabulary (size " + std::to_string(V) + ")");
  if (!cfg_.replay_path.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(replay_, ReadWindowRecords(cfg_.replay_path));
  }
  speculative_ = cfg_.spec > 0 || !replay_.empty();
  const bool use_mtp = speculative_ && cfg_.mtp && engine_.has_mtp();
  policy_ = DraftPolicy::Create(cfg_.draft_policy);
  if (!policy_)
    return Status::InvalidArgument("--draft-policy", "unknown '" + cfg_.draft_policy + "'");
  if (speculative_ && cfg_.spec_max_suffix > 0)
    suffix_ = std::make_unique<SuffixIndex>(
        cfg_.suffix_index == "async" ? SuffixIndex::Mode::kAsync : SuffixIndex::Mode::kSync);
  if (use_mtp) mtp_ = std::make_unique<MtpDrafter>(engine_);
  cur_ = prompt_.back();
  return Status::Ok();
}

Status Decoder::Prefill() {
  const std::int64_t t0 = MonotonicNs();
  ReserveWindowScratch(engine_, MaxWindow(cfg_, speculative_, replay_));
  const auto prefix = prompt_.first(prompt_.size() - 1);
  Engine::PrefillHook hook = nullptr;
  const bool progress = hooks_ != nullptr && hooks_->on_prefill != nullptr;
  if (mtp_ || progress) {
    hook = [&](int p, int T, const float* normed) {
      if (mtp_) {
        // Draft K/V for prompt rows: row q pairs h_q with the next prompt token.
        mtp_->Queue(p, T, normed, prompt_.data() + p + 1);
        mtp_->Extend(ForwardMode::kPrefill);
      }
      if (progress) hooks_->on_prefill(p + T, static_cast<int>(prefix.size()));
      return Status::Ok();
    };
  }
  LOCKSTEP_RETURN_IF_ERROR(engine_.Prefill(prefix, hook));
  if (suffix_) suffix_->Append(std::vector<std::int32_t>(prompt_.begin(), prompt_.end()));
  decode_begin_ns_ = MonotonicNs();
  res_.prefill_ns = decode_begin_ns_ - t0;
  return Status::Ok();
}

bool Decoder::StopRequested() {
  if (!hooks_ || !hooks_->stop_check) return false;
  std::string why = hooks_->stop_check();
  if (why.empty()) return false;
  res_.stop_reason = why;
  return true;
}

WindowState Decoder::BeginWindow(int idx) {
  WindowState w;
  w.rec.idx = idx;
  w.rec.p = engine_.position();
  w.rec.chain_n = streak_;
  w.rec.begin_ns = MonotonicNs();
  return w;
}

Status Decoder::Draft(WindowState& w) {
  WindowRecord& rec = w.rec;
  std::vector<std::int32_t> draft;
  // Drafts beyond this are wasted.
  const int room = cfg_.max_new - static_cast<int>(res_.output.size()) - 1;
  if (!replay_.empty()) {
    LOCKSTEP_RETURN_IF_ERROR(DraftFromReplay(w, draft));
  } else if (rec.idx > 0 && speculative_ && room > 0) {
    ProposeDraft(w, room, draft);
  }
  rec.draft = draft;
  rec.T = 1 + static_cast<int>(draft.size());
  const std::int64_t t_draft = MonotonicNs();
  rec.draft_ns = t_draft - rec.begin_ns;
  w.obs = hooks_ ? hooks_->observer : nullptr;
  return Status::Ok();
}

Status Decoder::DraftFromReplay(WindowState& w, std::vector<std::int32_t>& draft) {
  WindowRecord& rec = w.rec;
  const int idx = rec.idx;
  if (idx >= static_cast<int>(replay_.size()))
    return Status::InvalidArgument(
        ReplayWhere(cfg_.replay_path, idx),
        "the recorded path has only " + std::to_string(replay_.size()) + " windows");
  const WindowRecord& r = replay_[static_cast<std::size_t>(idx)];
  if (r.p != rec.p)
    return Status::InvalidArgument(
        ReplayWhere(cfg_.replay_path, idx),
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

void Decoder::ProposeDraft(WindowState& w, int room, std::vector<std::int32_t>& draft) {
  WindowRecord& rec = w.rec;
  SuffixProposal prop;
  if (suffix_) {
    prop = suffix_->Propose(cfg_.spec_max_suffix, DraftPolicy::kMinSuffixMatch);
    ExtendPeriodic(prop, cfg_.spec_max_suffix);  // a loop shorter than the draft budget
  }
  DraftPlan plan = policy_->Plan(prop, mtp_ != nullptr, cfg_.spec, cfg_.spec_max_suffix);
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

std::int64_t Decoder::Checkpoint(WindowState& w, CheckpointPoint point, const float* logits) {
  if (w.obs == nullptr || !w.obs->WantsCheckpoint(w.rec.idx, point)) return 0;
  const std::int64_t e0 = MonotonicNs();
  CheckpointInfo info;
  info.window = w.rec.idx;
  info.point = point;
  info.p = w.rec.p;
  info.T = w.rec.T;
  info.recurrent_pos = engine_.position();
  info.committed_rows = engine_.position();
  info.spec_rows = point == CheckpointPoint::kPostVerify ? w.rec.T : 0;
  EmitCheckpoint(engine_, *w.obs, info, logits);
  const std::int64_t spent = MonotonicNs() - e0;
  w.export_ns += spent;
  return spent;
}

Status Decoder::Verify(WindowState& w) {
  WindowRecord& rec = w.rec;
  const int V = mc_.n_vocab, H = mc_.n_embd;
  window_tokens_.assign(1, cur_);
  window_tokens_.insert(window_tokens_.end(), rec.draft.begin(), rec.draft.end());
  const std::size_t T = window_tokens_.size();
  logits_.resize(T * static_cast<std::size_t>(V));
  normed_.resize(T * static_cast<std::size_t>(H));
  rec.first_call = FirstVerifyOfSize(rec.T);
  engine_.SetWindow(rec.idx);
  engine_.SetCaptureHidden(w.obs != nullptr &&
                           w.obs->WantsCheckpoint(rec.idx, CheckpointPoint::kPostVerify));
  const std::int64_t t_verify0 = MonotonicNs();
  LOCKSTEP_RETURN_IF_ERROR(engine_.Verify(window_tokens_, logits_.data(), normed_.data()));
  const std::int64_t t_verify1 = MonotonicNs();
  rec.verify_ns = t_verify1 - t_verify0;
  rec.stages = engine_.stage_timings();
  for (const auto& s : rec.stages) rec.wait_ns += s.wait_ns, rec.compute_ns += s.compute_ns;
  if (hooks_ && hooks_->on_window) hooks_->on_window(rec.p, rec.T, logits_.data());
  return Status::Ok();
}

Status Decoder::AcceptAndCommit(WindowState& w) {
  w.verify_end_ns = MonotonicNs();
  WindowRecord& rec = w.rec;
  const int V = mc_.n_vocab;
  const std::size_t T = window_tokens_.size();
  int n = 0;  // rows kept
  for (std::size_t i = 0; i < T; ++i) {
    const std::int32_t y = SampleToken(logits_.data() + i * static_cast<std::size_t>(V), V, sp_,
                                       rec.p + static_cast<int>(i), &scratch_);
    rec.emitted.push_back(y);
    ++n;
    if (IsEos(y) || static_cast<int>(res_.output.size() + rec.emitted.size()) >= cfg_.max_new)
      break;
    if (i + 1 == T || rec.draft[i] != y) break;
  }
  rec.accepted = n - 1;
  return engine_.Commit(n);
}

Status Decoder::Advance(WindowState& w) {
  const WindowRecord& rec = w.rec;
  if (!replay_.empty()) {
    const WindowRecord& r = replay_[static_cast<std::size_t>(rec.idx)];
    if (r.accepted != rec.accepted || r.emitted != rec.emitted)
      return Status::InvalidArgument(
          ReplayWhere(cfg_.replay_path, rec.idx),
          "recorded " + std::to_string(r.accepted) + " accepted drafts, this run accepted " +
              std::to_string(rec.accepted) +
              " (the recorded path is inconsistent with this model's output)");
  }
  if (mtp_) {
    // Row q = p+i pairs h_q with the token emitted after it.
    mtp_->Queue(rec.p, rec.accepted + 1, normed_.data(), rec.emitted.data());
    if (mtp_->pending() >= 256) mtp_->Extend();
  }
  if (suffix_) suffix_->Append(rec.emitted);
  res_.output.insert(res_.output.end(), rec.emitted.begin(), rec.emitted.end());
  cur_ = rec.emitted.back();
  return Status::Ok();
}

Result<bool> Decoder::EndWindow(WindowState w) {
  WindowRecord& rec = w.rec;
  rec.end_ns = MonotonicNs();
  rec.commit_ns = rec.end_ns - w.verify_end_ns;
  if (w.obs != nullptr) {
    rec.export_ns = w.export_ns;  // all three checkpoints, measured apart from model work
    rec.commit_ns -= w.commit_export_ns;
    w.obs->OnWindow(rec);
  }
  streak_ = rec.T > 1 && rec.accepted == rec.T - 1 ? streak_ + 1 : 0;
  policy_->Observe(rec);
  bool done = false;
  if (IsEos(cur_)) {
    res_.stop_reason = "eos";
    done = true;
  } else if (static_cast<int>(res_.output.size()) >= cfg_.max_new) {
    done = true;
  }
  if (hooks_ && hooks_->on_record) LOCKSTEP_RETURN_IF_ERROR(hooks_->on_record(rec));
  res_.windows.push_back(std::move(rec));
  ++res_.n_windows;
  return done;
}

GenerateResult Decoder::TakeResult() {
  res_.decode_ns = MonotonicNs() - decode_begin_ns_;
  return std::move(res_);
}

}  // namespace

SamplingParams SamplingFrom(const EngineConfig& cfg) {
  SamplingParams p;
  p.temperature = cfg.temperature;
  p.top_k = cfg.top_k;
  p.top_p = cfg.top_p;
  p.seed = cfg.seed;
  return p;
}

Result<GenerateResult> Generate(Engine& engine, std::span<const std::int32_t> prompt,
                                const GenerateHooks* hooks) {
  Decoder d(engine, prompt, hooks);
  LOCKSTEP_RETURN_IF_ERROR(d.Setup());
  LOCKSTEP_RETURN_IF_ERROR(d.Prefill());
  bool done = engine.config().max_new <= 0;
  for (int idx = 0; !done; ++idx) {
    if (d.StopRequested()) break;
    WindowState w = d.BeginWindow(idx);
    LOCKSTEP_RETURN_IF_ERROR(d.Draft(w));
    d.Checkpoint(w, CheckpointPoint::kPreVerify, nullptr);
    LOCKSTEP_RETURN_IF_ERROR(d.Verify(w));
    d.Checkpoint(w, CheckpointPoint::kPostVerify, d.logits());
    LOCKSTEP_RETURN_IF_ERROR(d.AcceptAndCommit(w));
    // Commit checkpoint: before the next MTP write (draft K/V extends lazily at the next draft).
    w.commit_export_ns = d.Checkpoint(w, CheckpointPoint::kCommit, nullptr);
    LOCKSTEP_RETURN_IF_ERROR(d.Advance(w));
    LOCKSTEP_ASSIGN_OR_RETURN(done, d.EndWindow(std::move(w)));
  }
  return d.TakeResult();
}

}  // namespace lockstep
