#include "lockstep/engine/generate.h"

#include <algorithm>
#include <ctime>
#include <memory>
#include <mutex>
#include <set>

#include "lockstep/engine/backend.h"
#include "decode/draft_policy.h"
#include "lockstep/engine/gdn_state.h"
#include "decode/mtp_drafter.h"
#include "observe/checkpoint.h"
#include "decode/suffix_index.h"

namespace lockstep {

namespace {

std::int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

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

}  // namespace

SamplingParams SamplingFrom(const EngineConfig& cfg) {
  SamplingParams p;
  p.temperature = cfg.temperature;
  p.top_k = cfg.top_k;
  p.top_p = cfg.top_p;
  p.seed = cfg.seed;
  return p;
}

Result<GenerateResult> Generate(Engine& engine, std::span<const std::int32_t> prompt, const GenerateHooks* hooks) {
  const EngineConfig& cfg = engine.config();
  const ModelConfig& mc = engine.weights().config;
  const int V = mc.n_vocab, H = mc.n_embd;
  if (prompt.empty()) return Status::InvalidArgument("prompt", "empty (at least one token is needed)");
  if (engine.position() != 0) return Status::Runtime("generate", "the engine is not fresh");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= V)
      return Status::InvalidArgument("prompt", "token " + std::to_string(i) + " = " + std::to_string(prompt[i]) +
                                                   " is outside the vocabulary (size " + std::to_string(V) + ")");
  std::vector<WindowRecord> replay;
  if (!cfg.replay_path.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(replay, ReadWindowRecords(cfg.replay_path));
  }
  const bool speculative = cfg.spec > 0 || !replay.empty();
  const bool use_mtp = speculative && cfg.mtp && engine.has_mtp();
  std::unique_ptr<DraftPolicy> policy = DraftPolicy::Create(cfg.draft_policy);
  if (!policy) return Status::InvalidArgument("--draft-policy", "unknown '" + cfg.draft_policy + "'");
  std::unique_ptr<SuffixIndex> suffix;
  if (speculative && cfg.spec_max_suffix > 0)
    suffix = std::make_unique<SuffixIndex>(cfg.suffix_index == "async" ? SuffixIndex::Mode::kAsync : SuffixIndex::Mode::kSync);
  std::unique_ptr<MtpDrafter> mtp;
  if (use_mtp) mtp = std::make_unique<MtpDrafter>(engine);

  GenerateResult res;
  res.stop_reason = "length";
  const std::int64_t t0 = NowNs();
  ReserveWindowScratch(engine, MaxWindow(cfg, speculative, replay));
  const auto prefix = prompt.first(prompt.size() - 1);
  Engine::PrefillHook hook = nullptr;
  const bool progress = hooks != nullptr && hooks->on_prefill != nullptr;
  if (mtp || progress) {
    hook = [&](int p, int T, const float* normed) {
      if (mtp) {
        // Draft K/V for prompt rows: row q pairs h_q with the next prompt token.
        mtp->Queue(p, T, normed, prompt.data() + p + 1);
        mtp->Extend(ForwardMode::kPrefill);
      }
      if (progress) hooks->on_prefill(p + T, static_cast<int>(prefix.size()));
      return Status::Ok();
    };
  }
  LOCKSTEP_RETURN_IF_ERROR(engine.Prefill(prefix, hook));
  if (suffix) suffix->Append(std::vector<std::int32_t>(prompt.begin(), prompt.end()));
  const std::int64_t t1 = NowNs();
  res.prefill_ns = t1 - t0;

  const SamplingParams sp = SamplingFrom(cfg);
  std::vector<float> logits, normed;
  std::vector<int> scratch;
  std::vector<std::int32_t> window_tokens;
  std::int32_t cur = prompt.back();
  int streak = 0;  // preceding windows that accepted all of their drafts
  auto is_eos = [&](std::int32_t t) {
    return !cfg.ignore_eos && std::find(mc.eos_token_ids.begin(), mc.eos_token_ids.end(), t) != mc.eos_token_ids.end();
  };
  bool done = cfg.max_new <= 0;
  for (int idx = 0; !done; ++idx) {
    if (hooks && hooks->stop_check) {
      std::string why = hooks->stop_check();
      if (!why.empty()) {
        res.stop_reason = why;
        break;
      }
    }
    WindowRecord rec;
    rec.idx = idx;
    rec.p = engine.position();
    rec.chain_n = streak;
    rec.begin_ns = NowNs();
    // ---- draft ----
    std::vector<std::int32_t> draft;
    const int room = cfg.max_new - static_cast<int>(res.output.size()) - 1;  // drafts beyond this are wasted
    if (!replay.empty()) {
      if (idx >= static_cast<int>(replay.size()))
        return Status::InvalidArgument(ReplayWhere(cfg.replay_path, idx), "the recorded path has only " +
                                                                          std::to_string(replay.size()) + " windows");
      const WindowRecord& r = replay[static_cast<std::size_t>(idx)];
      if (r.p != rec.p)
        return Status::InvalidArgument(ReplayWhere(cfg.replay_path, idx),
                                       "recorded at p=" + std::to_string(r.p) + ", this run is at p=" + std::to_string(rec.p) +
                                           " (the recorded path is inconsistent with this model's output)");
      rec.source = r.source;
      rec.T_mtp = r.T_mtp;
      rec.merged = r.merged;
      rec.from_sfx = r.from_sfx;
      draft = r.draft;
      if (mtp && r.T_mtp > 0) mtp->Draft(rec.p, draft, 0);  // same MTP work, recorded tokens
    } else if (idx > 0 && speculative && room > 0) {
      SuffixProposal prop;
      if (suffix) {
        prop = suffix->Propose(cfg.spec_max_suffix, DraftPolicy::kMinSuffixMatch);
        ExtendPeriodic(prop, cfg.spec_max_suffix);  // a loop shorter than the draft budget
      }
      DraftPlan plan = policy->Plan(prop, mtp != nullptr, cfg.spec, cfg.spec_max_suffix);
      plan.n_sfx = std::min(plan.n_sfx, room);
      plan.n_mtp = std::min(plan.n_mtp, room - plan.n_sfx);
      if (plan.source == DraftSource::kMerged && plan.n_mtp == 0) plan.source = DraftSource::kSuffix;
      std::span<const std::int32_t> sfx_part(prop.tokens.data(), static_cast<std::size_t>(plan.n_sfx));
      if (plan.source == DraftSource::kSuffix) {
        draft.assign(sfx_part.begin(), sfx_part.end());
      } else if (plan.source == DraftSource::kMtp || plan.source == DraftSource::kMerged) {
        draft = mtp->Draft(rec.p, plan.source == DraftSource::kMerged ? sfx_part : std::span<const std::int32_t>(), plan.n_mtp);
      }
      rec.source = draft.empty() ? DraftSource::kNone : plan.source;
      rec.T_mtp = rec.source == DraftSource::kMtp || rec.source == DraftSource::kMerged ? plan.n_mtp : 0;
      rec.merged = rec.source == DraftSource::kMerged;
      rec.from_sfx = rec.source == DraftSource::kSuffix || rec.source == DraftSource::kMerged;
    }
    rec.draft = draft;
    rec.T = 1 + static_cast<int>(draft.size());
    const std::int64_t t_draft = NowNs();
    rec.draft_ns = t_draft - rec.begin_ns;

    // ---- observer: pre_verify ----
    Observer* obs = hooks ? hooks->observer : nullptr;
    std::int64_t export_ns = 0;
    // Emits one checkpoint; returns the ns spent (added to export_ns).
    auto emit = [&](CheckpointPoint point, const float* lg) -> std::int64_t {
      if (obs == nullptr || !obs->WantsCheckpoint(idx, point)) return 0;
      const std::int64_t e0 = NowNs();
      CheckpointInfo info;
      info.window = idx;
      info.point = point;
      info.p = rec.p;
      info.T = rec.T;
      info.recurrent_pos = engine.position();
      info.committed_rows = engine.position();
      info.spec_rows = point == CheckpointPoint::kPostVerify ? rec.T : 0;
      EmitCheckpoint(engine, *obs, info, lg);
      const std::int64_t spent = NowNs() - e0;
      export_ns += spent;
      return spent;
    };
    emit(CheckpointPoint::kPreVerify, nullptr);

    // ---- verify ----
    window_tokens.assign(1, cur);
    window_tokens.insert(window_tokens.end(), draft.begin(), draft.end());
    const std::size_t T = window_tokens.size();
    logits.resize(T * static_cast<std::size_t>(V));
    normed.resize(T * static_cast<std::size_t>(H));
    rec.first_call = FirstVerifyOfSize(rec.T);
    engine.SetWindow(idx);
    engine.SetCaptureHidden(obs != nullptr && obs->WantsCheckpoint(idx, CheckpointPoint::kPostVerify));
    const std::int64_t t_verify0 = NowNs();
    LOCKSTEP_RETURN_IF_ERROR(engine.Verify(window_tokens, logits.data(), normed.data()));
    const std::int64_t t_verify1 = NowNs();
    rec.verify_ns = t_verify1 - t_verify0;
    rec.stages = engine.stage_timings();
    for (const auto& s : rec.stages) rec.wait_ns += s.wait_ns, rec.compute_ns += s.compute_ns;
    if (hooks && hooks->on_window) hooks->on_window(rec.p, rec.T, logits.data());
    emit(CheckpointPoint::kPostVerify, logits.data());
    const std::int64_t t_verify = NowNs();

    // ---- accept + commit ----
    int n = 0;  // rows kept
    for (std::size_t i = 0; i < T; ++i) {
      const std::int32_t y = SampleToken(logits.data() + i * static_cast<std::size_t>(V), V, sp, rec.p + static_cast<int>(i), &scratch);
      rec.emitted.push_back(y);
      ++n;
      if (is_eos(y) || static_cast<int>(res.output.size() + rec.emitted.size()) >= cfg.max_new) break;
      if (i + 1 == T || draft[i] != y) break;
    }
    rec.accepted = n - 1;
    LOCKSTEP_RETURN_IF_ERROR(engine.Commit(n));
    // Commit checkpoint: before the next MTP write (draft K/V extends lazily at the next draft).
    const std::int64_t commit_export_ns = emit(CheckpointPoint::kCommit, nullptr);
    if (!replay.empty()) {
      const WindowRecord& r = replay[static_cast<std::size_t>(idx)];
      if (r.accepted != rec.accepted || r.emitted != rec.emitted)
        return Status::InvalidArgument(ReplayWhere(cfg.replay_path, idx),
                                       "recorded " + std::to_string(r.accepted) + " accepted drafts, this run accepted " +
                                           std::to_string(rec.accepted) +
                                           " (the recorded path is inconsistent with this model's output)");
    }
    if (mtp) {
      // Row q = p+i pairs h_q with the token emitted after it.
      mtp->Queue(rec.p, n, normed.data(), rec.emitted.data());
      if (mtp->pending() >= 256) mtp->Extend();
    }
    if (suffix) suffix->Append(rec.emitted);
    res.output.insert(res.output.end(), rec.emitted.begin(), rec.emitted.end());
    cur = rec.emitted.back();
    rec.end_ns = NowNs();
    rec.commit_ns = rec.end_ns - t_verify;
    if (obs != nullptr) {
      rec.export_ns = export_ns;  // all three checkpoints, measured apart from model work
      rec.commit_ns -= commit_export_ns;
      obs->OnWindow(rec);
    }
    streak = rec.T > 1 && rec.accepted == rec.T - 1 ? streak + 1 : 0;
    policy->Observe(rec);
    if (is_eos(cur)) {
      res.stop_reason = "eos";
      done = true;
    } else if (static_cast<int>(res.output.size()) >= cfg.max_new) {
      done = true;
    }
    if (hooks && hooks->on_record) LOCKSTEP_RETURN_IF_ERROR(hooks->on_record(rec));
    res.windows.push_back(std::move(rec));
    ++res.n_windows;
  }
  res.decode_ns = NowNs() - t1;
  return res;
}

}  // namespace lockstep
