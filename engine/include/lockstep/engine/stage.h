// StageSession: one pipeline stage of one sequence, on one backend (interface).
//
// A stage owns its layers' K/V caches, GDN recurrent states, expert-residency map and scratch;
// the last stage also owns the final norm + lm_head and the MTP layer with its draft K/V cache.
// Implementations: CpuStageSession (engine/cpu/cpu_stage.h, the reference) and
// CudaStageSession (engine/cuda/cuda_stage.h). The engine creates them through a Backend
// (backend.h), chosen at run time by name.
//
// State views (kv(), gdn(), mtp_kv()) are host objects in the CPU layout. A device backend keeps
// them as mirrors and brings them up to date when they are asked for, so observers, exports and
// tests read every backend the same way; reading them costs a device-to-host copy of what
// changed since the last read.
//
// Errors: Forward returns a Status. The void calls (Commit, Logits, MTP) cannot fail on the CPU;
// a device backend records its first failure and reports it from status(), which the engine
// checks after every pipeline call.
//
// Not thread-safe: one driver thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/engine/expert_cache.h"
#include "lockstep/engine/gdn_state.h"
#include "lockstep/engine/graft.h"
#include "lockstep/engine/kv_cache.h"
#include "lockstep/engine/observer.h"
#include "lockstep/engine/op_table.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/transport.h"
#include "lockstep/engine/window.h"

namespace lockstep {

enum class ForwardMode {
  kPrefill,  // chunked GDN, GEMM products; rows committed when the chunk completes
  kVerify,   // batch-invariant kernels; K/V rows speculative, GDN steps in scratch until Commit
};

// ---- engine steps (continuous batching) ----
//
// One engine step carries the rows of several sequences ("slots") through every stage together:
// first each decoding slot's verify window (kVerify, ascending slot order), then prefill chunks of
// admitted requests (kPrefill). Rows are contiguous per group in the step's activation.
struct RowGroup {
  int slot = 0;
  ForwardMode mode = ForwardMode::kVerify;
  int p = 0;     // position of the group's first row (== that slot's position())
  int row0 = 0;  // first row of the group in the step's activation
  int T = 0;     // rows
};

struct StepPlan {
  std::vector<RowGroup> groups;
  // batch_invariant = off with >= 2 groups: every linear product of the step may run as one GEMM
  // over all its rows (prefill and verify), so a row's bits depend on what shares the step.
  // false: verify rows share only batch-invariant products; each prefill chunk keeps its own.
  bool fuse_all = false;
  int rows() const {
    int n = 0;
    for (const RowGroup& g : groups) n += g.T;
    return n;
  }
  int verify_rows() const {
    int n = 0;
    for (const RowGroup& g : groups) n += g.mode == ForwardMode::kVerify ? g.T : 0;
    return n;
  }
};

// ---- slot snapshots (prefix cache, slot save / restore) ----
//
// A sequence's committed state at `position` in one stage: its attention layers' K/V rows
// [0, position) as shared pages, each GDN layer's checkpoint (conv + ssm after `position`
// tokens), and on the last stage the MTP draft K/V rows [0, mtp_rows). Restoring it gives a slot
// bitwise the state the snapshot was taken from.
struct GdnCheckpoint {
  std::vector<float> conv;  // f32 [K-1, conv_dim]
  std::vector<float> ssm;   // f32 [Hv, Dk, Dv]
};
struct StageSlotSnapshot {
  int position = 0;
  std::vector<std::pair<int, KvPrefixPtr>> kv;     // (global layer, rows [0, position))
  std::vector<std::pair<int, GdnCheckpoint>> gdn;  // (global layer, checkpoint at position)
  KvPrefixPtr mtp_kv;                              // null without MTP
  int mtp_rows = 0;
  std::size_t bytes() const;  // GDN floats + K/V page bytes referenced
};

// Set-up work a backend can separate from model work; -1 = not measured (the CPU backend).
struct StageInitCounters {
  std::int64_t first_calls = -1;     // calls that paid one-time set-up (handles, allocations)
  std::int64_t first_call_ns = -1;   // host ns spent in that set-up, summed
  std::int64_t graph_captures = -1;  // CUDA graph captures (0 when the backend uses none)
  std::int64_t graph_launches = -1;  // forwards replayed from a captured graph
};

// What a stage's linear products did since the last TakeStepWork: the bytes of every weight
// matrix a product read (once per product call; a routed expert once per call that uses it) and
// 2 x their multiply-adds (rows x weight elements). Attention scores and the recurrences are not
// products of weights and are left out. Backends that do not count report zeros.
struct StepWork {
  std::uint64_t weight_bytes = 0;
  std::uint64_t flops = 0;
};

class StageSession {
 public:
  StageSession(int index, int n_stages, int layer_begin, int layer_end)
      : index_(index), n_stages_(n_stages), layer_begin_(layer_begin), layer_end_(layer_end) {}
  virtual ~StageSession() = default;
  StageSession(const StageSession&) = delete;
  StageSession& operator=(const StageSession&) = delete;

  int index() const { return index_; }
  int layer_begin() const { return layer_begin_; }
  int layer_end() const { return layer_end_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == n_stages_ - 1; }

  // ---- slots ----
  //
  // A stage holds the state of up to max_slots() sequences (K/V pages, GDN checkpoints and
  // scratch, MTP draft K/V, expert counters). UseSlot(s) selects the slot every single-sequence
  // call below acts on (Forward, Commit, Logits, MTP, the state views); slot 0 is selected at
  // creation, so a one-sequence caller never needs to know slots exist.
  virtual int max_slots() const { return 1; }
  virtual void UseSlot(int s) { (void)s; }
  virtual int slot() const { return 0; }
  // Frees slot s's state; its next use starts fresh (position 0, zero recurrent state).
  // kNotSupported on a backend that cannot (the engine then refuses to reuse a slot).
  virtual Status ResetSlot(int s) {
    (void)s;
    return Status::NotSupported("slots", "this backend cannot reset a sequence's state");
  }
  // Slot s's committed state (no verify window pending), sharing its K/V pages.
  // kNotSupported by default (backends without a host copy of their state).
  virtual Result<StageSlotSnapshot> SnapshotSlot(int s) {
    (void)s;
    return Status::NotSupported("slot snapshot", "this backend cannot snapshot a sequence");
  }
  // Slot s (fresh: nothing written since it was opened) takes `snap`'s state.
  virtual Status RestoreSlot(int s, const StageSlotSnapshot& snap) {
    (void)s, (void)snap;
    return Status::NotSupported("slot restore", "this backend cannot restore a sequence");
  }
  // One engine step: every group's rows through this stage, in place on act (act.T = plan.rows(),
  // act.p unused). The first stage embeds `tokens` [plan.rows()]. Prefill groups commit their
  // rows; verify groups leave theirs speculative in their slot. Leaves slot() unchanged.
  // Default: a one-group plan is Forward on that slot; more groups are kNotSupported.
  virtual Status ForwardStep(const StepPlan& plan, const std::int32_t* tokens, Activation& act);
  // Last stage, after ForwardStep: final-normed hidden of every row (normed f32 [rows, H]) and
  // logits of the verify rows in plan order (logits f32 [verify_rows, V]; null when there are
  // none), host memory.
  virtual void StepLogits(const StepPlan& plan, const Activation& act, float* normed,
                          float* logits);

  // ---- the forward ----

  // Runs act.T rows (positions act.p ..) through this stage's layers, in place on act. The first
  // stage fills the activations from `tokens` [T] first. Prefill commits the rows; verify leaves
  // them speculative. Requires act.p == position(). kInvalidArgument for a token outside the
  // vocabulary; kRuntime for a device failure.
  virtual Status Forward(ForwardMode mode, const std::int32_t* tokens, Activation& act) = 0;
  // Keeps n of the current window's rows (1 <= n <= T) and discards the rest.
  virtual void Commit(int n) = 0;
  // Last stage: final RMSNorm (normed f32 [T, H], the MTP input) and lm_head (logits f32 [T, V]),
  // both written to host memory.
  virtual void Logits(const Activation& act, float* normed, float* logits) = 0;
  // Last stage: the final RMSNorm only (normed f32 [T, H], host).
  virtual void FinalNorm(const Activation& act, float* normed) = 0;
  // The activations this stage hands on, f32 [T, H] in host memory (a copy for observers).
  virtual void HiddenToHost(const Activation& act, std::vector<float>* out) = 0;
  // Fault injection (inject.h `perturb`), after this stage's verify forward: multiplies `item`
  // (kK, kV, kConvState, kSsmState of global layer `layer`, or kHiddenOut of act) by `factor`.
  // K/V: the window's speculative rows; GDN: every per-step state of the window. Other kinds:
  // no-op (logits are perturbed by the engine on the host).
  virtual void Perturb(ItemKind item, int layer, float factor, Activation& act) = 0;
  // State transplant (graft.h): the current slot's `g.item` of layer `g.layer` (or the MTP
  // draft K/V) takes g's value. kInvalidArgument when g's rows are not this slot's committed
  // rows there (K/V) or its shape is not the item's; kNotSupported by default (backends whose
  // state lives on a device: cuda today).
  virtual Status Graft(const lockstep::Graft& g);
  // Device backends: overwrites the dev_* fields of `t` with the device-event timings of the
  // last verify forward (called after the window's logits reached the host). No-op on the CPU.
  virtual void FillDeviceTiming(StageTiming* t) { (void)t; }
  // The products' work since the previous call (StepWork), and resets it; zeros by default.
  virtual StepWork TakeStepWork() { return {}; }
  // One-time set-up counters over the session's life (exports' /counters/stage{S}).
  virtual StageInitCounters init_counters() const { return {}; }
  // Op reports (op_table.h): while `sink` is set, every forward call reports each named op's
  // output rows and the state items it reads to it; null: none (the default). A backend that does
  // not report ops (cuda today) ignores it.
  virtual void SetOpSink(OpSink* sink) { (void)sink; }
  // First failure of a call that returns void (device backends); Ok on the CPU.
  virtual Status status() const { return Status::Ok(); }

  // ---- MTP (last stage, when the checkpoint ships it) ----
  virtual bool has_mtp() const = 0;
  // One MTP step for T rows at positions p..: inputs the final-normed hidden h f32 [T, H] and the
  // next tokens [T] (host); writes draft K/V rows [p, p+T) (speculative until MtpCommit), returns
  // m f32 [T, H] (post mtp.norm) and, for the last `n_logits` rows only, logits f32 [n_logits, V]
  // (host; drafting needs the last row; lm_head is the MTP step's largest weight).
  virtual void MtpForward(const float* h, const std::int32_t* next_tokens, int p, int T,
                          ForwardMode mode, float* m, float* logits, int n_logits) = 0;
  virtual void MtpCommit(int rows) = 0;
  virtual KvCache* mtp_kv() = 0;

  // ---- state views (read-only use by tests and instrumentation) ----
  virtual int position() const = 0;
  virtual KvCache* kv(int il) = 0;  // global layer index; nullptr for GDN layers / other stages
  virtual GdnState* gdn(
      int il) = 0;  // global layer index; nullptr for attention layers / other stages
  virtual const ExpertCache& experts() const = 0;

 private:
  int index_, n_stages_, layer_begin_, layer_end_;
};
using StageSessionPtr = std::unique_ptr<StageSession>;

}  // namespace lockstep
