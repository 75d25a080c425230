// Engine: the pipeline of stage sessions for up to `slots` sequences.
//
// Slots: each live sequence owns a slot (its K/V pages, GDN state, MTP draft K/V, position,
// injections). UseSlot(s) selects the slot the single-sequence API below acts on; slot 0 is open
// and selected from the start, so a one-request caller (generate, the tests) never sees slots.
// RunStep() is the multi-sequence call: one engine step over several slots' rows (stage.h
// StepPlan), which the serving scheduler (engine/serve) drives.
//
// Prefill is chunked and chunk-major: each chunk of `prefill_chunk` tokens goes through all
// stages before the next one starts. A verify window runs T tokens at the committed position p
// through all stages and leaves its rows speculative until Commit(n) keeps n of them.
//
// Borrowed: `weights` must outlive the engine. Not thread-safe: one driver thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "lockstep/engine/backend.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/graft.h"
#include "lockstep/engine/inject.h"
#include "lockstep/engine/stage.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/transport.h"
#include "lockstep/engine/weights.h"
#include "lockstep/engine/window.h"

namespace lockstep {

class OpDispatch;  // engine/pipeline/op_dispatch.h

class Engine {
 public:
  // Validates `cfg` against the model (split, dtype, backend) and builds the stage sessions.
  // Errors: kInvalidArgument (bad split/options), kNotSupported (backend not built).
  static Result<std::unique_ptr<Engine>> Create(const EngineConfig& cfg,
                                                const ModelWeights& weights);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The effective configuration (threads resolved).
  const EngineConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  const Backend& backend() const { return *backend_; }
  int position() const { return cur().position; }  // committed tokens of the current slot
  int n_stages() const { return static_cast<int>(stages_.size()); }
  StageSession& stage(int is) { return *stages_[static_cast<std::size_t>(is)]; }
  const std::vector<int>& boundaries() const { return bounds_; }
  Transport& transport() { return *transport_; }

  // Called after each prefill chunk with its position, row count and final-normed hidden
  // f32 [T, H] (the MTP input), when given to Prefill.
  using PrefillHook = std::function<Status(int p, int T, const float* normed)>;
  // Processes `tokens` at positions [position(), position() + n) in prefill chunks; commits them.
  Status Prefill(std::span<const std::int32_t> tokens, const PrefillHook& hook = nullptr);
  // Verify window of T = tokens.size() tokens at p = position(). Writes logits f32 [T, V] and, when
  // `normed` is not null, the final-normed hidden f32 [T, H]. Rows stay speculative until Commit.
  Status Verify(std::span<const std::int32_t> tokens, float* logits, float* normed = nullptr);
  // Keeps the first n rows of the last verify window (1 <= n <= T).
  Status Commit(int n);

  // ---- slots ----
  int max_slots() const { return static_cast<int>(slots_.size()); }
  // Opens slot s for a new sequence (position 0) with its own fault injections (validated by
  // ParseInjectionList). A slot that is open but untouched (slot 0 at creation) is reused.
  // kRuntime when the slot holds a sequence; kNotSupported when the backend cannot reset a
  // closed slot's state.
  Status OpenSlot(int s, std::vector<Injection> injections = {});
  // Ends slot s's sequence and frees its state in every stage (at once: pages, recurrent state).
  void CloseSlot(int s);
  bool slot_open(int s) const { return slots_[static_cast<std::size_t>(s)].open; }
  // Selects the slot the single-sequence calls act on (in every stage).
  void UseSlot(int s);
  int slot() const { return cur_slot_; }
  // The committed state of slot s in every stage (no window pending), K/V pages shared.
  struct SlotSnapshot {
    int position = 0;
    std::vector<StageSlotSnapshot> stages;  // [n_stages]
    std::size_t bytes() const;
  };
  Result<SlotSnapshot> SnapshotSlot(int s);
  // OpenSlot, then the slot takes `snap`'s state (position = snap.position). All or nothing:
  // on error the slot is closed again.
  Status OpenSlotFrom(int s, const SlotSnapshot& snap, std::vector<Injection> injections = {});
  // Parses and checks --inject texts against this engine (stages, layers, max_new windows).
  Result<std::vector<Injection>> ParseInjectionList(const std::vector<std::string>& texts,
                                                    int max_new) const;

  // One engine step over several slots (stage.h StepPlan): verify groups first in ascending slot
  // order, each at its slot's position with no window pending, then prefill groups; every slot
  // at most once; rows contiguous from 0; tokens [plan.rows()]. Verify groups stay pending in
  // their slots until UseSlot(s) + Commit(n); prefill groups are committed. A one-group step runs
  // exactly what Verify() or one Prefill() chunk runs. Leaves slot() unchanged.
  struct StepOutputs {
    std::vector<float> logits;  // f32 [verify rows, V] (verify groups in plan order)
    std::vector<float> normed;  // f32 [rows, H] final-normed hidden of every row
  };
  Status RunStep(const StepPlan& plan, std::span<const std::int32_t> tokens, StepOutputs* out);
  // The last RunStep's product work over all stages (stage.h StepWork; zeros on backends that do
  // not count).
  StepWork last_step_work() const { return last_step_work_; }

  // Window index for fault injection and timing (set by the generation loop before Verify).
  void SetWindow(int idx) { cur().window = idx; }
  // The current slot's --inject list and, index for index, what each did so far (inject.h).
  const std::vector<Injection>& injections() const { return cur().injections; }
  const std::vector<InjectionRecord>& injection_records() const { return cur().records; }
  // InjectionRecordJson of each injection, in order, then GraftRecordJson of each graft (empty
  // without either).
  std::vector<std::string> InjectionReport() const;
  // ---- state transplant (graft.h) ----
  // Installs `grafts` in the current slot (OpenSlot and CloseSlot clear them). Checks each
  // against this engine: the stage and layer exist and hold that kind of item, and the value's
  // dtype and row shape are the item's here (rows are checked when the graft fires).
  // kInvalidArgument naming the --graft text otherwise; kNotSupported on the cuda backend.
  Status SetGrafts(std::vector<Graft> grafts);
  // The current slot's grafts for (window, point): each item takes its value (StageSession::
  // Graft) and the firing is recorded. Called by the generation loop before the checkpoint's
  // observer calls. Errors: the stage's (a row count that is not this run's).
  Status ApplyGrafts(int window, CheckpointPoint point);
  const std::vector<Graft>& grafts() const { return cur().grafts; }
  const std::vector<GraftRecord>& graft_records() const { return cur().graft_records; }
  // Per-stage timing of the last Verify or step (wait for input vs compute).
  const std::vector<StageTiming>& stage_timings() const { return timings_; }
  // When on, Verify (or a step's verify group of this slot) keeps a copy of the activations each
  // stage hands to the next (hidden_out f32 [T, H] per stage but the last) for observers. Per
  // slot; off by default (no copies).
  void SetCaptureHidden(bool on) { cur().capture_hidden = on; }
  // The current slot's op observer (op_table.h, Observer::WantsOps / OnOp): every forward call
  // with rows of this slot reports its ops to it while it wants them. Borrowed; null (the
  // default, and after OpenSlot / CloseSlot): none.
  void SetOpObserver(Observer* obs) { cur().op_observer = obs; }
  const std::vector<float>& hidden_out(int is) const {
    return cur().hidden_out[static_cast<std::size_t>(is)];
  }

  // ---- MTP (on the last stage) ----
  bool has_mtp() const { return stages_.back()->has_mtp(); }
  // MTP rows at positions p..p+T-1 from final-normed hidden h f32 [T, H] and the next tokens [T];
  // writes draft K/V rows (speculative until MtpCommit); m f32 [T, H], logits of the last
  // n_logits rows f32 [n_logits, V].
  void MtpForward(const float* h, const std::int32_t* next_tokens, int p, int T, ForwardMode mode,
                  float* m, float* logits, int n_logits = 1);
  void MtpCommit(int rows) { stages_.back()->MtpCommit(rows); }
  // Draft K/V rows whose inputs were true (h, next token) pairs.
  int mtp_position() const {
    return stages_.back()->mtp_kv() ? stages_.back()->mtp_kv()->rows_committed() : 0;
  }

 private:
  // What the engine keeps per slot (the stages keep the model state).
  struct Slot {
    bool open = false;
    bool used = false;   // rows computed since it was opened
    bool dirty = false;  // closed on a backend that could not reset it
    int position = 0;
    int pending = 0;  // rows of the uncommitted verify window
    int window = -1;
    std::vector<Injection> injections;
    std::vector<InjectionRecord> records;  // parallel to injections
    bool capture_hidden = false;
    std::vector<std::vector<float>> hidden_out;  // [n_stages] f32 [T, H] of the last verify
    Observer* op_observer = nullptr;
    std::vector<Graft> grafts;
    std::vector<GraftRecord> graft_records;  // parallel to grafts
  };
  Slot& cur() { return slots_[static_cast<std::size_t>(cur_slot_)]; }
  const Slot& cur() const { return slots_[static_cast<std::size_t>(cur_slot_)]; }
  Slot& slot_state(int s) { return slots_[static_cast<std::size_t>(s)]; }

  Engine(const EngineConfig& cfg, const ModelWeights& w);
  Status CheckPlan(const StepPlan& plan, std::size_t n_tokens) const;
  // Every stage's ForwardStep in order with the hand-offs, delays, perturbations and captures.
  Status RunPipeline(const StepPlan& plan, std::span<const std::int32_t> tokens, Activation& out);
  // Delay injections of the verify groups' slots and windows before stage is.
  void ApplyDelays(int is, const StepPlan& plan);
  // `perturb` injections of each verify group's window: stage is's items after its forward.
  void ApplyPerturbations(int is, const StepPlan& plan, Activation& act);
  void PerturbGroup(int is, const RowGroup& g, Activation& act);
  void PerturbLogits(Slot& sl, float* logits, std::size_t n);
  // The first recorded failure of any stage (device backends), else Ok.
  Status StagesStatus() const;
  // Op reports for the next stage calls over `groups` (row groups of one call; mtp: an MTP
  // step): installs the dispatcher in every stage when a group's request wants op records or has
  // a perturb-op injection for its window; EndOps uninstalls it.
  void BeginOps(const std::vector<RowGroup>& groups);
  void EndOps();
  Status CheckPerturbOp(Injection& inj) const;
  Status CheckGraft(const Graft& g);

  EngineConfig cfg_;
  const ModelWeights& w_;
  BackendPtr backend_;  // outlives stages_ and transport_ (declared first, destroyed last)
  std::unique_ptr<ThreadPool> pool_;
  std::vector<int> bounds_;
  std::vector<std::unique_ptr<StageSession>> stages_;
  TransportPtr transport_;
  std::vector<Slot> slots_;  // [max_slots]
  int cur_slot_ = 0;
  std::vector<StageTiming> timings_;
  StepWork last_step_work_;
  std::vector<float> normed_scratch_;
  std::unique_ptr<OpDispatch> ops_;
};
using EnginePtr = std::unique_ptr<Engine>;

}  // namespace lockstep
