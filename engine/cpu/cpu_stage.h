// CpuStageSession: the reference stage session (Eigen + own vectorised kernels, host memory).
//
// Bitwise deterministic for a fixed thread count; verify windows use the batch-invariant
// kernels (cpu/matmul.h kInvariant), so a row's result does not depend on T, nor on the other
// sequences' verify rows that share a fused engine step. ForwardStep with more than one group:
// without plan.fuse_all the verify groups (rows [0, verify_rows), one per slot) run each layer's
// products once over all their rows (kInvariant) and their cores per slot, so every group's rows,
// state and expert counters are bitwise what it gets alone; each prefill chunk runs its own
// single-sequence forward. With fuse_all every group shares one kGemm pass (cores per group in
// their own mode). One group: exactly Forward.
//
// Borrowed: weights, cfg and pool (StageParams) outlive the session.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/engine/backend.h"
#include "lockstep/engine/stage.h"
#include "util/arena.h"

namespace lockstep {

namespace cpu {
class Rope;
enum class MatmulKind;
}  // namespace cpu

class CpuStageSession final : public StageSession {
 public:
  explicit CpuStageSession(const StageParams& params);
  ~CpuStageSession() override;

  Status Forward(ForwardMode mode, const std::int32_t* tokens, Activation& act) override;
  void Commit(int n) override;
  void Logits(const Activation& act, float* normed, float* logits) override;
  void FinalNorm(const Activation& act, float* normed) override;
  void HiddenToHost(const Activation& act, std::vector<float>* out) override { *out = act.hidden; }
  void Perturb(ItemKind item, int layer, float factor, Activation& act) override;
  Status Graft(const lockstep::Graft& g) override;

  bool has_mtp() const override { return has_mtp_; }
  void MtpForward(const float* h, const std::int32_t* next_tokens, int p, int T, ForwardMode mode,
                  float* m, float* logits, int n_logits) override;
  void MtpCommit(int rows) override;
  KvCache* mtp_kv() override { return cur_->mtp_kv.get(); }

  int position() const override { return cur_->position; }
  KvCache* kv(int il) override;
  GdnState* gdn(int il) override;
  const ExpertCache& experts() const override { return *cur_->experts; }

  int max_slots() const override { return max_slots_; }
  void UseSlot(int s) override;
  int slot() const override { return cur_index_; }
  Status ResetSlot(int s) override;
  // Slot snapshots: engine/cpu/cpu_stage_slots.cpp.
  Result<StageSlotSnapshot> SnapshotSlot(int s) override;
  Status RestoreSlot(int s, const StageSlotSnapshot& snap) override;
  Status ForwardStep(const StepPlan& plan, const std::int32_t* tokens, Activation& act) override;
  void StepLogits(const StepPlan& plan, const Activation& act, float* normed,
                  float* logits) override;
  StepWork TakeStepWork() override;
  void SetOpSink(OpSink* sink) override { op_sink_ = sink; }

 private:
  // Everything one sequence owns in this stage. Built fresh on a slot's first use.
  struct SlotState {
    std::vector<std::unique_ptr<KvCache>> kv;    // [layers in stage], null for GDN layers
    std::vector<std::unique_ptr<GdnState>> gdn;  // [layers in stage], null for attention layers
    std::unique_ptr<ExpertCache> experts;        // residency map (shared values) + counters
    std::unique_ptr<KvCache> mtp_kv;             // last stage with MTP only
    std::unique_ptr<ExpertCache> mtp_experts;
    int position = 0;      // committed rows
    int pending_rows = 0;  // rows of the current verify window
  };
  std::unique_ptr<SlotState> NewSlot() const;

  // One sequence's rows inside a layer call: rows [row0, row0 + T) at positions p.., its mode and
  // this layer's state of its slot (kv for attention, gdn for GDN layers, experts may be null).
  struct LayerSeq {
    int row0 = 0;
    int T = 0;
    int p = 0;
    ForwardMode mode = ForwardMode::kVerify;
    KvCache* kv = nullptr;
    GdnState* gdn = nullptr;
    ExpertCache* experts = nullptr;
  };

  // One decoder layer in place on act.hidden; local_moe < 0 selects the MTP expert map.
  void LayerForward(const LayerWeights& lw, int local_moe, Activation& act, ForwardMode mode,
                    KvCache* kv, GdnState* gdn);
  // One decoder layer in place on x f32 [n_rows, H] for several sequences: every linear product
  // is one `kind` product over all rows, norms and residuals per row, each mixer core per
  // sequence on its own state (cpu/attention.h, cpu/gdn.h, cpu/moe.h *Seqs).
  void LayerRows(const LayerWeights& lw, int local_moe, float* x, int n_rows,
                 const std::vector<LayerSeq>& seqs, cpu::MatmulKind kind);
  // Counts one product of `rows` rows with m into work_.
  void CountProduct(const Mat& m, int rows);
  // Rows of one LayerRows call inside a multi-part layer.
  struct RowsPart {
    float* x;
    int n_rows;
    const std::vector<LayerSeq>* seqs;
    cpu::MatmulKind kind;
    int row0;  // x's first row in the step (op reports)
  };
  // One decoder layer for several parts, each bitwise its own LayerRows call: every part's mixer
  // half, then one MoE call over all parts (cpu::MoeForwardParts: each expert over every part's
  // rows back to back) or each part's dense FFN, then the residuals.
  void LayerParts(const LayerWeights& lw, int local_moe, const std::vector<RowsPart>& parts);
  // The mixer half of a layer on x f32 [n_rows, H]: x += mixer(norm(x)), then a := post_norm(x)
  // (a, mix: f32 [n_rows, H] scratch).
  void LayerMixer(const LayerWeights& lw, float* x, int n_rows, const std::vector<LayerSeq>& seqs,
                  cpu::MatmulKind kind, float* a, float* mix);
  // Embeds tokens [T] into x f32 [T, H]; kInvalidArgument for a token outside the vocabulary.
  Status Embed(const std::int32_t* tokens, int T, float* x) const;
  // A fused engine step: this stage's layers over `groups` (rows [0, n_rows) of x, contiguous in
  // order) with `kind` products and, layer by layer after them, each group of `own` alone on its
  // rows of x (its single-sequence layer: the bits of its own Forward); then each group's
  // bookkeeping (prefill commits, verify pending).
  void FusedStep(const std::vector<const RowGroup*>& groups,
                 const std::vector<const RowGroup*>& own, float* x, int n_rows,
                 cpu::MatmulKind kind);

  const ModelWeights& w_;
  const ModelConfig& c_;
  const EngineConfig& cfg_;
  // quant_dot = ggml: the products on 8-bit-kernel weights take kInvariantQ8 / kGemmQ8.
  bool q8_ = false;
  ThreadPool* pool_;
  std::unique_ptr<cpu::Rope> rope_;
  std::vector<int> moe_local_;      // [layers in stage] index into the expert cache or -1
  std::vector<int> moe_layers_;     // global indices of this stage's MoE layers
  std::uint64_t expert_bytes_ = 0;  // bytes of one routed expert
  bool has_mtp_ = false;
  int max_slots_ = 1;
  std::vector<std::unique_ptr<SlotState>> slots_;  // [max_slots], null until first used
  SlotState* cur_ = nullptr;                       // slots_[cur_index_]
  int cur_index_ = 0;
  Arena arena_;
  StepWork work_;              // products since the last TakeStepWork
  OpSink* op_sink_ = nullptr;  // op reports (op_table.h) while the engine sets one
};

// The `cpu` backend: stages are CpuStageSessions sharing the engine's thread pool; the transport
// is the in-process hand-off.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) {}
  std::string name() const override { return "cpu"; }
  Result<StageSessionPtr> CreateStage(const StageParams& params) override;
  Result<TransportPtr> CreateTransport(int n_stages) override;
  std::string Describe() const override;

 private:
  int threads_;
};

}  // namespace lockstep
