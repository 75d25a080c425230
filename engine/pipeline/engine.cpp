#include "lockstep/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "lockstep/engine/clock.h"
#include "pipeline/op_dispatch.h"
#include "util/check.h"

namespace lockstep {

Engine::Engine(const EngineConfig& cfg, const ModelWeights& w)
    : cfg_(cfg), w_(w), ops_(std::make_unique<OpDispatch>()) {}
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
  const int max_slots = e->stages_[0]->max_slots();
  if (cfg.slots > max_slots)
    return Status::NotSupported(
        "--slots " + std::to_string(cfg.slots),
        "the " + e->backend_->name() + " backend runs " + std::to_string(max_slots) +
            " sequence per engine (engine/cuda/README.md); use --backend cpu for slots");
  if (cfg.prefix_cache && e->backend_->name() != "cpu")
    return Status::NotSupported("--prefix-cache on",
                                "the " + e->backend_->name() + " backend has no prefix cache");
  e->slots_.resize(static_cast<std::size_t>(cfg.slots));
  for (Slot& sl : e->slots_) sl.hidden_out.resize(static_cast<std::size_t>(cfg.stages));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Injection> injections,
                            e->ParseInjectionList(cfg.inject, cfg.max_new));
  e->slots_[0].open = true;
  e->slots_[0].injections = std::move(injections);
  e->slots_[0].records.resize(e->slots_[0].injections.size());
  e->timings_.resize(static_cast<std::size_t>(cfg.stages));
  return e;
}

Result<std::vector<Injection>> Engine::ParseInjectionList(const std::vector<std::string>& texts,
                                                          int max_new) const {
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Injection> list, ParseInjections(texts));
  const ModelConfig& mc = w_.config;
  for (auto& inj : list) {
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("--inject '" + inj.text + "'", why);
    };
    if (inj.stage >= cfg_.stages)
      return bad("stage " + std::to_string(inj.stage) + " does not exist (" +
                 std::to_string(cfg_.stages) + " stages)");
    // Every verify window emits at least one token, so a request runs at most max_new windows.
    if (inj.window >= 0 && inj.window >= max_new)
      return bad("window " + std::to_string(inj.window) + " never runs: a request of max_new " +
                 std::to_string(max_new) + " runs at most " + std::to_string(max_new) +
                 " verify windows" +
                 (max_new > 0 ? " (0.." + std::to_string(max_new - 1) + ")" : ""));
    if (inj.kind == Injection::Kind::kPerturbOp) {
      LOCKSTEP_RETURN_IF_ERROR(CheckPerturbOp(inj));
      continue;
    }
    if (inj.kind != Injection::Kind::kPerturb) continue;
    if (inj.layer >= 0) {
      if (inj.layer >= mc.n_layers)
        return bad("layer " + std::to_string(inj.layer) + " does not exist (" +
                   std::to_string(mc.n_layers) + " layers)");
      int owner = 0;
      while (bounds_[static_cast<std::size_t>(owner) + 1] <= inj.layer) ++owner;
      if (inj.stage >= 0 && inj.stage != owner)
        return bad("layer " + std::to_string(inj.layer) + " belongs to stage " +
                   std::to_string(owner));
      inj.stage = owner;
      const bool attention = mc.is_full_attention(inj.layer);
      if ((inj.item == ItemKind::kK || inj.item == ItemKind::kV) && !attention)
        return bad("layer " + std::to_string(inj.layer) + " is a GDN layer (no K/V)");
      if ((inj.item == ItemKind::kConvState || inj.item == ItemKind::kSsmState) && attention)
        return bad("layer " + std::to_string(inj.layer) +
                   " is a full-attention layer (no recurrent state)");
    } else if (inj.item == ItemKind::kLogits) {
      if (inj.stage >= 0 && inj.stage != cfg_.stages - 1)
        return bad("logits live on the last stage");
      inj.stage = cfg_.stages - 1;
    } else if (inj.item == ItemKind::kHiddenOut) {
      if (inj.stage < 0) return bad("hidden_out needs stage=S");
      if (inj.stage == cfg_.stages - 1) return bad("the last stage hands no hidden_out on");
    }
  }
  return list;
}

Status Engine::OpenSlot(int s, std::vector<Injection> injections) {
  if (s < 0 || s >= max_slots())
    return Status::InvalidArgument(
        "slot", std::to_string(s) + " outside 0.." + std::to_string(max_slots() - 1));
  Slot& sl = slot_state(s);
  if (sl.open && sl.used)
    return Status::Runtime("slot " + std::to_string(s), "still holds a sequence");
  if (sl.dirty)
    return Status::NotSupported("slot " + std::to_string(s),
                                "the " + backend_->name() + " backend cannot reuse a slot");
  sl.open = true;
  sl.position = sl.pending = 0;
  sl.window = -1;
  sl.injections = std::move(injections);
  sl.records.assign(sl.injections.size(), InjectionRecord{});
  sl.capture_hidden = false;
  sl.op_observer = nullptr;
  sl.grafts.clear();
  sl.graft_records.clear();
  for (auto& h : sl.hidden_out) h.clear();
  return Status::Ok();
}

void Engine::CloseSlot(int s) {
  Slot& sl = slot_state(s);
  if (sl.used) {
    for (auto& st : stages_)
      if (!st->ResetSlot(s).ok()) sl.dirty = true;
  }
  sl.open = sl.used = false;
  sl.position = sl.pending = 0;
  sl.window = -1;
  sl.op_observer = nullptr;
  sl.grafts.clear();
  sl.graft_records.clear();
  for (auto& h : sl.hidden_out) h.clear();
}

void Engine::UseSlot(int s) {
  LOCKSTEP_CHECK(s >= 0 && s < max_slots()) << "slot " << s;
  cur_slot_ = s;
  for (auto& st : stages_) st->UseSlot(s);
}

Status Engine::CheckPlan(const StepPlan& plan, std::size_t n_tokens) const {
  auto bad = [](const std::string& why) { return Status::Runtime("engine step", why); };
  if (plan.groups.empty()) return bad("no rows");
  if (static_cast<std::size_t>(plan.rows()) != n_tokens)
    return bad(std::to_string(n_tokens) + " tokens for " + std::to_string(plan.rows()) + " rows");
  std::vector<bool> seen(slots_.size(), false);
  int row = 0, last_verify_slot = -1;
  bool prefill_seen = false;
  for (const RowGroup& g : plan.groups) {
    if (g.slot < 0 || g.slot >= max_slots()) return bad("slot " + std::to_string(g.slot));
    const Slot& sl = slots_[static_cast<std::size_t>(g.slot)];
    const std::string who = "slot " + std::to_string(g.slot);
    if (!sl.open) return bad(who + " is not open");
    if (seen[static_cast<std::size_t>(g.slot)]) return bad(who + " appears twice");
    seen[static_cast<std::size_t>(g.slot)] = true;
    if (g.T < 1 || g.row0 != row) return bad(who + ": rows are not contiguous");
    if (g.p != sl.position || sl.pending != 0)
      return bad(who + " is at " + std::to_string(sl.position) + " with " +
                 std::to_string(sl.pending) +
                 " rows pending, the step says p=" + std::to_string(g.p));
    if (g.mode == ForwardMode::kVerify) {
      if (prefill_seen || g.slot < last_verify_slot)
        return bad("verify groups come first, in ascending slot order");
      last_verify_slot = g.slot;
    } else {
      prefill_seen = true;
    }
    row += g.T;
  }
  return Status::Ok();
}

void Engine::ApplyDelays(int is, const StepPlan& plan) {
  for (const RowGroup& g : plan.groups) {
    if (g.mode != ForwardMode::kVerify) continue;
    Slot& sl = slot_state(g.slot);
    for (std::size_t i = 0; i < sl.injections.size(); ++i) {
      const Injection& inj = sl.injections[i];
      if (inj.kind == Injection::Kind::kDelay && (inj.stage < 0 || inj.stage == is) &&
          (inj.window < 0 || inj.window == sl.window)) {
        std::this_thread::sleep_for(
            std::chrono::microseconds(static_cast<std::int64_t>(inj.ms * 1000.0)));
        InjectionFiring f;
        f.window = sl.window, f.stage = is, f.p = g.p, f.T = g.T, f.ms = inj.ms;
        sl.records[i].Add(f);
      }
    }
  }
}

Status Engine::RunPipeline(const StepPlan& plan, std::span<const std::int32_t> tokens,
                           Activation& out) {
  Activation act;
  act.p = plan.groups[0].p;
  act.T = plan.rows();
  const bool verify = plan.verify_rows() > 0;
  std::vector<float> hidden;
  BeginOps(plan.groups);
  struct End {
    Engine* e;
    ~End() { e->EndOps(); }
  } end_ops{this};
  const std::int64_t t0 = MonotonicNs();
  for (int is = 0; is < n_stages(); ++is) {
    if (is > 0) {
      LOCKSTEP_ASSIGN_OR_RETURN(act, transport_->Recv(is));
    }
    StageTiming& tm = timings_[static_cast<std::size_t>(is)];
    const std::int64_t c0 = MonotonicNs(), u0 = ThreadCpuNs();
    tm.wait_ns = c0 - t0;  // in-process pipeline: stage is waits while stages < is compute
    if (verify) ApplyDelays(is, plan);
    LOCKSTEP_RETURN_IF_ERROR(stage(is).ForwardStep(plan, tokens.data(), act));
    if (verify) ApplyPerturbations(is, plan, act);
    tm.compute_ns = MonotonicNs() - c0;
    tm.cpu_ns = ThreadCpuNs() - u0;
    if (verify && is + 1 < n_stages()) {
      const std::size_t h = static_cast<std::size_t>(w_.config.n_embd);
      for (const RowGroup& g : plan.groups) {
        Slot& sl = slot_state(g.slot);
        if (g.mode != ForwardMode::kVerify || !sl.capture_hidden) continue;
        std::vector<float>& dst = sl.hidden_out[static_cast<std::size_t>(is)];
        if (plan.groups.size() == 1) {
          stage(is).HiddenToHost(act, &dst);
        } else {
          if (hidden.empty()) stage(is).HiddenToHost(act, &hidden);
          const auto first = hidden.begin() + static_cast<std::ptrdiff_t>(g.row0 * h);
          dst.assign(first, first + static_cast<std::ptrdiff_t>(g.T * h));
        }
      }
      hidden.clear();
    }
    if (is + 1 < n_stages()) LOCKSTEP_RETURN_IF_ERROR(transport_->Send(is, std::move(act)));
  }
  out = std::move(act);
  return Status::Ok();
}

void Engine::ApplyPerturbations(int is, const StepPlan& plan, Activation& act) {
  for (const RowGroup& g : plan.groups) {
    if (g.mode != ForwardMode::kVerify) continue;
    const Slot& sl = slot_state(g.slot);
    const bool any = std::any_of(sl.injections.begin(), sl.injections.end(), [&](auto& inj) {
      return inj.kind == Injection::Kind::kPerturb && inj.stage == is;
    });
    if (any) PerturbGroup(is, g, act);
  }
}

// One verify group's `perturb` injections after stage is. A one-group step perturbs `act` itself
// (its rows are the group's); otherwise the group's rows go through a view of their own.
void Engine::PerturbGroup(int is, const RowGroup& g, Activation& act) {
  Slot& sl = slot_state(g.slot);
  const bool whole = act.T == g.T;
  const std::size_t h = static_cast<std::size_t>(w_.config.n_embd);
  Activation sub;
  if (!whole) {
    sub.p = g.p;
    sub.T = g.T;
    const auto first = act.hidden.begin() + static_cast<std::ptrdiff_t>(g.row0 * h);
    sub.hidden.assign(first, first + static_cast<std::ptrdiff_t>(g.T * h));
  }
  Activation& target = whole ? act : sub;
  const int prev = stage(is).slot();
  stage(is).UseSlot(g.slot);
  for (std::size_t i = 0; i < sl.injections.size(); ++i) {
    const Injection& inj = sl.injections[i];
    if (inj.kind != Injection::Kind::kPerturb || inj.stage != is ||
        (inj.window >= 0 && inj.window != sl.window) || inj.item == ItemKind::kLogits)
      continue;
    stage(is).Perturb(inj.item, inj.layer, static_cast<float>(1.0 + inj.eps), target);
    InjectionFiring f;
    f.window = sl.window, f.stage = is, f.layer = inj.layer, f.p = g.p, f.T = g.T;
    f.factor = static_cast<double>(static_cast<float>(1.0 + inj.eps));
    sl.records[i].Add(f);
  }
  stage(is).UseSlot(prev);
  if (!whole)
    std::copy(sub.hidden.begin(), sub.hidden.end(),
              act.hidden.begin() + static_cast<std::ptrdiff_t>(g.row0 * h));
}

void Engine::PerturbLogits(Slot& sl, float* logits, std::size_t n) {
  for (std::size_t i = 0; i < sl.injections.size(); ++i) {
    const Injection& inj = sl.injections[i];
    if (inj.kind != Injection::Kind::kPerturb || inj.item != ItemKind::kLogits ||
        (inj.window >= 0 && inj.window != sl.window))
      continue;
    const float f = static_cast<float>(1.0 + inj.eps);
    for (std::size_t k = 0; k < n; ++k) logits[k] *= f;
    InjectionFiring fr;
    fr.window = sl.window, fr.stage = n_stages() - 1, fr.p = sl.position;
    fr.T = static_cast<int>(n / static_cast<std::size_t>(std::max(1, w_.config.n_vocab)));
    fr.factor = static_cast<double>(f);
    sl.records[i].Add(fr);
  }
}

std::vector<std::string> Engine::InjectionReport() const {
  std::vector<std::string> out;
  const Slot& sl = cur();
  for (std::size_t i = 0; i < sl.injections.size(); ++i)
    out.push_back(InjectionRecordJson(sl.injections[i], sl.records[i]));
  for (std::size_t i = 0; i < sl.grafts.size(); ++i)
    out.push_back(GraftRecordJson(sl.grafts[i], sl.graft_records[i]));
  return out;
}

Status Engine::Prefill(std::span<const std::int32_t> tokens, const PrefillHook& hook) {
  Slot& sl = cur();
  if (sl.pending != 0) return Status::Runtime("prefill", "a verify window is still uncommitted");
  const std::size_t chunk = static_cast<std::size_t>(cfg_.prefill_chunk);
  for (std::size_t b = 0; b < tokens.size(); b += chunk) {
    auto part = tokens.subspan(b, std::min(chunk, tokens.size() - b));
    Activation act;
    const int p = sl.position;
    StepPlan plan;
    plan.groups.push_back(
        RowGroup{cur_slot_, ForwardMode::kPrefill, p, 0, static_cast<int>(part.size())});
    sl.used = true;
    LOCKSTEP_RETURN_IF_ERROR(RunPipeline(plan, part, act));
    sl.position += static_cast<int>(part.size());
    if (hook) {
      normed_scratch_.resize(part.size() * static_cast<std::size_t>(w_.config.n_embd));
      BeginOps(plan.groups);
      stages_.back()->FinalNorm(act, normed_scratch_.data());
      EndOps();
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
  Slot& sl = cur();
  if (sl.pending != 0) return Status::Runtime("verify", "the previous window is still uncommitted");
  if (tokens.empty()) return Status::InvalidArgument("verify", "empty window");
  Activation act;
  StepPlan plan;
  plan.groups.push_back(
      RowGroup{cur_slot_, ForwardMode::kVerify, sl.position, 0, static_cast<int>(tokens.size())});
  sl.used = true;
  LOCKSTEP_RETURN_IF_ERROR(RunPipeline(plan, tokens, act));
  if (normed == nullptr) {
    normed_scratch_.resize(tokens.size() * static_cast<std::size_t>(w_.config.n_embd));
    normed = normed_scratch_.data();
  }
  BeginOps(plan.groups);
  stages_.back()->Logits(act, normed, logits);
  EndOps();
  LOCKSTEP_RETURN_IF_ERROR(StagesStatus());
  for (int is = 0; is < n_stages(); ++is)
    stage(is).FillDeviceTiming(&timings_[static_cast<std::size_t>(is)]);
  PerturbLogits(sl, logits, tokens.size() * static_cast<std::size_t>(w_.config.n_vocab));
  sl.pending = static_cast<int>(tokens.size());
  return Status::Ok();
}

Status Engine::RunStep(const StepPlan& plan, std::span<const std::int32_t> tokens,
                       StepOutputs* out) {
  LOCKSTEP_RETURN_IF_ERROR(CheckPlan(plan, tokens.size()));
  for (const RowGroup& g : plan.groups) slot_state(g.slot).used = true;
  for (int is = 0; is < n_stages(); ++is) stage(is).TakeStepWork();  // earlier calls' work
  last_step_work_ = StepWork{};
  Activation act;
  LOCKSTEP_RETURN_IF_ERROR(RunPipeline(plan, tokens, act));
  const std::size_t H = static_cast<std::size_t>(w_.config.n_embd),
                    V = static_cast<std::size_t>(w_.config.n_vocab);
  out->normed.resize(static_cast<std::size_t>(plan.rows()) * H);
  out->logits.resize(static_cast<std::size_t>(plan.verify_rows()) * V);
  BeginOps(plan.groups);
  stages_.back()->StepLogits(plan, act, out->normed.data(),
                             out->logits.empty() ? nullptr : out->logits.data());
  EndOps();
  LOCKSTEP_RETURN_IF_ERROR(StagesStatus());
  for (int is = 0; is < n_stages(); ++is) {
    stage(is).FillDeviceTiming(&timings_[static_cast<std::size_t>(is)]);
    const StepWork w = stage(is).TakeStepWork();
    last_step_work_.weight_bytes += w.weight_bytes;
    last_step_work_.flops += w.flops;
  }
  // Verify rows are [0, verify_rows) in plan order, so a verify group's logits start at row0.
  for (const RowGroup& g : plan.groups) {
    Slot& sl = slot_state(g.slot);
    if (g.mode == ForwardMode::kVerify) {
      PerturbLogits(sl, out->logits.data() + static_cast<std::size_t>(g.row0) * V,
                    static_cast<std::size_t>(g.T) * V);
      sl.pending = g.T;
    } else {
      sl.position += g.T;
    }
  }
  return Status::Ok();
}

Status Engine::Commit(int n) {
  Slot& sl = cur();
  if (n < 1 || n > sl.pending)
    return Status::Runtime("commit", "cannot keep " + std::to_string(n) + " rows of a " +
                                         std::to_string(sl.pending) + "-row window");
  for (auto& s : stages_) s->Commit(n);
  sl.position += n;
  sl.pending = 0;
  return StagesStatus();
}

void Engine::MtpForward(const float* h, const std::int32_t* next_tokens, int p, int T,
                        ForwardMode mode, float* m, float* logits, int n_logits) {
  BeginOps({RowGroup{cur_slot_, mode, p, 0, T}});
  stages_.back()->MtpForward(h, next_tokens, p, T, mode, m, logits, n_logits);
  EndOps();
}

void Engine::BeginOps(const std::vector<RowGroup>& groups) {
  std::vector<OpDispatch::Group> out;
  for (const RowGroup& g : groups) {
    Slot& sl = slot_state(g.slot);
    OpDispatch::Group og;
    og.window = g.mode == ForwardMode::kPrefill ? -1 : sl.window;
    og.p = g.p, og.row0 = g.row0, og.T = g.T;
    if (sl.op_observer != nullptr && sl.op_observer->WantsOps(og.window)) og.obs = sl.op_observer;
    for (std::size_t i = 0; i < sl.injections.size(); ++i)
      if (sl.injections[i].kind == Injection::Kind::kPerturbOp &&
          sl.injections[i].window == og.window && og.window >= 0) {
        og.inj.push_back(&sl.injections[i]);
        og.records.push_back(&sl.records[i]);
      }
    if (og.obs != nullptr || !og.inj.empty()) out.push_back(std::move(og));
  }
  if (out.empty() && !ops_->active()) return;
  ops_->Begin(std::move(out));
  OpSink* sink = ops_->active() ? ops_.get() : nullptr;
  for (auto& st : stages_) st->SetOpSink(sink);
}

void Engine::EndOps() {
  if (!ops_->active()) return;
  ops_->End();
  for (auto& st : stages_) st->SetOpSink(nullptr);
}

// A perturb-op that can never fire is refused here: a layer that does not exist, an op of another
// layer kind (attention / GDN, MoE / dense) or of the stage rather than a layer.
Status Engine::CheckPerturbOp(Injection& inj) const {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--inject '" + inj.text + "'", why);
  };
  const ModelConfig& mc = w_.config;
  const std::string op = inj.op;
  const bool stage_op = op == "embed" || op == "final_norm" || op == "lm_head";
  const bool mtp_op = op.rfind("mtp_", 0) == 0;
  const int last = cfg_.stages - 1;
  if (stage_op) {
    if (inj.layer != -1) return bad("op " + op + " is a stage op: give layer=-1");
    const int owner = op == "embed" ? 0 : last;
    if (inj.stage >= 0 && inj.stage != owner)
      return bad("op " + op + " runs on stage " + std::to_string(owner));
    inj.stage = owner;
    return Status::Ok();
  }
  const bool mtp_layer = inj.layer == mc.n_layers;
  if (mtp_layer && !w_.mtp.present) return bad("the model has no MTP layer");
  if (inj.layer < 0 || inj.layer > mc.n_layers)
    return bad("layer " + std::to_string(inj.layer) + " does not exist (" +
               std::to_string(mc.n_layers) + " layers; " + std::to_string(mc.n_layers) +
               " is the MTP layer)");
  if (mtp_op && !mtp_layer)
    return bad("op " + op + " runs in the MTP layer " + std::to_string(mc.n_layers));
  int owner = last;
  if (!mtp_layer) {
    owner = 0;
    while (bounds_[static_cast<std::size_t>(owner) + 1] <= inj.layer) ++owner;
  }
  if (inj.stage >= 0 && inj.stage != owner)
    return bad("layer " + std::to_string(inj.layer) + " belongs to stage " + std::to_string(owner));
  inj.stage = owner;
  if (mtp_op) return Status::Ok();
  const LayerWeights& lw =
      mtp_layer ? w_.mtp.layer : w_.layers[static_cast<std::size_t>(inj.layer)];
  static const std::vector<std::string> attn = {"q_proj", "k_proj",   "v_proj", "q_rope",
                                                "k_rope", "attn_out", "o_proj"};
  static const std::vector<std::string> gdn = {"in_proj", "in_proj_ba", "conv",       "gates",
                                               "l2norm",  "recurrence", "gated_norm", "out_proj"};
  static const std::vector<std::string> moe = {"router_logits", "topk", "expert_out",
                                               "shared_expert", "moe_combine"};
  auto in = [&](const std::vector<std::string>& v) {
    return std::find(v.begin(), v.end(), op) != v.end();
  };
  const bool attention = lw.type == LayerType::kFullAttention;
  if (in(attn) && !attention)
    return bad("layer " + std::to_string(inj.layer) + " is a GDN layer (no " + op + ")");
  if (in(gdn) && attention)
    return bad("layer " + std::to_string(inj.layer) + " is a full-attention layer (no " + op + ")");
  if (in(moe) && !lw.moe)
    return bad("layer " + std::to_string(inj.layer) + " has a dense FFN (no " + op + ")");
  if (op == "ffn_out" && lw.moe)
    return bad("layer " + std::to_string(inj.layer) + " is a MoE layer (no ffn_out)");
  if (op == "shared_expert" && lw.ffn_moe.shared.gate.rows <= 0)
    return bad("layer " + std::to_string(inj.layer) + " has no shared expert");
  return Status::Ok();
}

}  // namespace lockstep
