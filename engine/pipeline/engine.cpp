#include "lockstep/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "lockstep/engine/clock.h"

namespace lockstep {

Engine::Engine(const EngineConfig& cfg, const ModelWeights& w) : cfg_(cfg), w_(w) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& cfg_in,
                                               const ModelWeights& weights) {
  LOCKSTEP_RETURN_IF_ERROR(cfg_in.Validate());
  EngineConfig cfg = cfg_in;
  if (cfg.threads == 0) cfg.threads = ThreadPool::HardwareThreads();
  std::unique_ptr<Engine> e(new Engine(cfg, weights));
  LOCKSTEP_ASSIGN_OR_RETURN(e->bounds_, cfg.StageBoundaries(weights.config));
  LOCKSTEP_ASSIGN_OR_RETURN(e->backend_, CreateBackend(e->cfg_, weights));
  e->pool_ = std::make_unique<ThreadPool>(cfg.threads);
  for (int is = 0; is < cfg.stages; ++is) {
    StageParams sp;
    sp.weights = &weights;
    sp.cfg = &e->cfg_;
    sp.index = is;
    sp.n_stages = cfg.stages;
    sp.layer_begin = e->bounds_[static_cast<std::size_t>(is)];
    sp.layer_end = e->bounds_[static_cast<std::size_t>(is) + 1];
    sp.pool = e->pool_.get();
    LOCKSTEP_ASSIGN_OR_RETURN(StageSessionPtr st, e->backend_->CreateStage(sp));
    e->stages_.push_back(std::move(st));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(e->transport_, e->backend_->CreateTransport(cfg.stages));
  LOCKSTEP_ASSIGN_OR_RETURN(e->injections_, ParseInjections(cfg.inject));
  for (auto& inj : e->injections_) {
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("--inject '" + inj.text + "'", why);
    };
    if (inj.stage >= cfg.stages)
      return bad("stage " + std::to_string(inj.stage) + " does not exist (" +
                 std::to_string(cfg.stages) + " stages)");
    // Every verify window emits at least one token, so a request runs at most max_new windows.
    if (inj.window >= 0 && inj.window >= cfg.max_new)
      return bad("window " + std::to_string(inj.window) + " never runs: a request of max_new " +
                 std::to_string(cfg.max_new) + " runs at most " + std::to_string(cfg.max_new) +
                 " verify windows" +
                 (cfg.max_new > 0 ? " (0.." + std::to_string(cfg.max_new - 1) + ")" : ""));
    if (inj.kind != Injection::Kind::kPerturb) continue;
    if (inj.layer >= 0) {
      if (inj.layer >= weights.config.n_layers)
        return bad("layer " + std::to_string(inj.layer) + " does not exist (" +
                   std::to_string(weights.config.n_layers) + " layers)");
      int owner = 0;
      while (e->bounds_[static_cast<std::size_t>(owner) + 1] <= inj.layer) ++owner;
      if (inj.stage >= 0 && inj.stage != owner)
        return bad("layer " + std::to_string(inj.layer) + " belongs to stage " +
                   std::to_string(owner));
      inj.stage = owner;
      const bool attention = weights.config.is_full_attention(inj.layer);
      if ((inj.item == ItemKind::kK || inj.item == ItemKind::kV) && !attention)
        return bad("layer " + std::to_string(inj.layer) + " is a GDN layer (no K/V)");
      if ((inj.item == ItemKind::kConvState || inj.item == ItemKind::kSsmState) && attention)
        return bad("layer " + std::to_string(inj.layer) +
                   " is a full-attention layer (no recurrent state)");
    } else if (inj.item == ItemKind::kLogits) {
      if (inj.stage >= 0 && inj.stage != cfg.stages - 1)
        return bad("logits live on the last stage");
      inj.stage = cfg.stages - 1;
    } else if (inj.item == ItemKind::kHiddenOut) {
      if (inj.stage < 0) return bad("hidden_out needs stage=S");
      if (inj.stage == cfg.stages - 1) return bad("the last stage hands no hidden_out on");
    }
  }
  e->injection_records_.resize(e->injections_.size());
  e->timings_.resize(static_cast<std::size_t>(cfg.stages));
  e->hidden_out_.resize(static_cast<std::size_t>(cfg.stages));
  return e;
}

Status Engine::RunPipeline(ForwardMode mode, std::span<const std::int32_t> tokens,
                           Activation& out) {
  Activation act;
  act.p = position_;
  act.T = static_cast<int>(tokens.size());
  const std::int64_t t0 = MonotonicNs();
  for (int is = 0; is < n_stages(); ++is) {
    if (is > 0) {
      LOCKSTEP_ASSIGN_OR_RETURN(act, transport_->Recv(is));
    }
    StageTiming& tm = timings_[static_cast<std::size_t>(is)];
    const std::int64_t c0 = MonotonicNs(), u0 = ThreadCpuNs();
    tm.wait_ns = c0 - t0;  // in-process pipeline: stage is waits while stages < is compute
    if (mode == ForwardMode::kVerify) {
      for (std::size_t i = 0; i < injections_.size(); ++i) {
        const Injection& inj = injections_[i];
        if (inj.kind == Injection::Kind::kDelay && (inj.stage < 0 || inj.stage == is) &&
            (inj.window < 0 || inj.window == window_)) {
          std::this_thread::sleep_for(
              std::chrono::microseconds(static_cast<std::int64_t>(inj.ms * 1000.0)));
          InjectionFiring f;
          f.window = window_, f.stage = is, f.p = act.p, f.T = act.T, f.ms = inj.ms;
          injection_records_[i].Add(f);
        }
      }
    }
    LOCKSTEP_RETURN_IF_ERROR(stage(is).Forward(mode, tokens.data(), act));
    if (mode == ForwardMode::kVerify) ApplyPerturbations(is, act);
    tm.compute_ns = MonotonicNs() - c0;
    tm.cpu_ns = ThreadCpuNs() - u0;
    if (capture_hidden_ && mode == ForwardMode::kVerify && is + 1 < n_stages())
      stage(is).HiddenToHost(act, &hidden_out_[static_cast<std::size_t>(is)]);
    if (is + 1 < n_stages()) LOCKSTEP_RETURN_IF_ERROR(transport_->Send(is, std::move(act)));
  }
  out = std::move(act);
  return Status::Ok();
}

void Engine::ApplyPerturbations(int is, Activation& act) {
  for (std::size_t i = 0; i < injections_.size(); ++i) {
    const Injection& inj = injections_[i];
    if (inj.kind != Injection::Kind::kPerturb || inj.stage != is ||
        (inj.window >= 0 && inj.window != window_) || inj.item == ItemKind::kLogits)
      continue;
    stage(is).Perturb(inj.item, inj.layer, static_cast<float>(1.0 + inj.eps), act);
    InjectionFiring f;
    f.window = window_, f.stage = is, f.layer = inj.layer, f.p = act.p, f.T = act.T;
    f.factor = static_cast<double>(static_cast<float>(1.0 + inj.eps));
    injection_records_[i].Add(f);
  }
}

void Engine::PerturbLogits(float* logits, std::size_t n) {
  for (std::size_t i = 0; i < injections_.size(); ++i) {
    const Injection& inj = injections_[i];
    if (inj.kind != Injection::Kind::kPerturb || inj.item != ItemKind::kLogits ||
        (inj.window >= 0 && inj.window != window_))
      continue;
    const float f = static_cast<float>(1.0 + inj.eps);
    for (std::size_t k = 0; k < n; ++k) logits[k] *= f;
    InjectionFiring fr;
    fr.window = window_, fr.stage = n_stages() - 1, fr.p = position_;
    fr.T = static_cast<int>(n / static_cast<std::size_t>(std::max(1, w_.config.n_vocab)));
    fr.factor = static_cast<double>(f);
    injection_records_[i].Add(fr);
  }
}

std::vector<std::string> Engine::InjectionReport() const {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < injections_.size(); ++i)
    out.push_back(InjectionRecordJson(injections_[i], injection_records_[i]));
  return out;
}

Status Engine::Prefill(std::span<const std::int32_t> tokens, const PrefillHook& hook) {
  if (pending_ != 0) return Status::Runtime("prefill", "a verify window is still uncommitted");
  const std::size_t chunk = static_cast<std::size_t>(cfg_.prefill_chunk);
  for (std::size_t b = 0; b < tokens.size(); b += chunk) {
    auto part = tokens.subspan(b, std::min(chunk, tokens.size() - b));
    Activation act;
    const int p = position_;
    LOCKSTEP_RETURN_IF_ERROR(RunPipeline(ForwardMode::kPrefill, part, act));
    position_ += static_cast<int>(part.size());
    if (hook) {
      normed_scratch_.resize(part.size() * static_cast<std::size_t>(w_.config.n_embd));
      stages_.back()->FinalNorm(act, normed_scratch_.data());
      LOCKSTEP_RETURN_IF_ERROR(StagesStatus());
      LOCKSTEP_RETURN_IF_ERROR(hook(p, static_cast<int>(part.size()), normed_scratch_.data()));
    }
  }
  return StagesStatus();
}

Status Engine::StagesStatus() const {
  for (const auto& s : stages_) LOCKSTEP_RETURN_IF_ERROR(s->status());
  return Status::Ok();
}

Status Engine::Verify(std::span<const std::int32_t> tokens, float* logits, float* normed) {
  if (pending_ != 0) return Status::Runtime("verify", "the previous window is still uncommitted");
  if (tokens.empty()) return Status::InvalidArgument("verify", "empty window");
  Activation act;
  LOCKSTEP_RETURN_IF_ERROR(RunPipeline(ForwardMode::kVerify, tokens, act));
  if (normed == nullptr) {
    normed_scratch_.resize(tokens.size() * static_cast<std::size_t>(w_.config.n_embd));
    normed = normed_scratch_.data();
  }
  stages_.back()->Logits(act, normed, logits);
  LOCKSTEP_RETURN_IF_ERROR(StagesStatus());
  for (int is = 0; is < n_stages(); ++is)
    stage(is).FillDeviceTiming(&timings_[static_cast<std::size_t>(is)]);
  PerturbLogits(logits, tokens.size() * static_cast<std::size_t>(w_.config.n_vocab));
  pending_ = static_cast<int>(tokens.size());
  return Status::Ok();
}

Status Engine::Commit(int n) {
  if (n < 1 || n > pending_)
    return Status::Runtime("commit", "cannot keep " + std::to_string(n) + " rows of a " +
                                         std::to_string(pending_) + "-row window");
  for (auto& s : stages_) s->Commit(n);
  position_ += n;
  pending_ = 0;
  return StagesStatus();
}

}  // namespace lockstep
