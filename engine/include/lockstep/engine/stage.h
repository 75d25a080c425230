// StageSession: one pipeline stage. It owns its layers' K/V caches, GDN recurrent states,
// expert-residency map and scratch; the last stage also owns the final norm + lm_head and the
// MTP layer with its draft K/V cache.
//
// Borrowed: `weights` and `pool` must outlive the session. Not thread-safe: one driver thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/engine/arena.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/expert_cache.h"
#include "lockstep/engine/gdn_state.h"
#include "lockstep/engine/kv_cache.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/transport.h"
#include "lockstep/engine/weights.h"

namespace lockstep {

namespace cpu {
class Rope;
}

enum class ForwardMode {
  kPrefill,  // chunked GDN, GEMM products; rows committed when the chunk completes
  kVerify,   // batch-invariant kernels; K/V rows speculative, GDN steps in scratch until Commit
};

class StageSession {
 public:
  StageSession(const ModelWeights& weights, const EngineConfig& cfg, int index, int n_stages, int layer_begin,
               int layer_end, ThreadPool* pool);
  ~StageSession();
  StageSession(const StageSession&) = delete;
  StageSession& operator=(const StageSession&) = delete;

  int index() const { return index_; }
  int layer_begin() const { return layer_begin_; }
  int layer_end() const { return layer_end_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == n_stages_ - 1; }

  // Runs act.T rows (positions act.p ..) through this stage's layers, in place on act.hidden.
  // The first stage fills act.hidden from `tokens` [T] first. Prefill commits the rows; verify
  // leaves them speculative. Requires act.p == committed position.
  Status Forward(ForwardMode mode, const std::int32_t* tokens, Activation& act);
  // Keeps n of the current window's rows (1 <= n <= T) and discards the rest.
  void Commit(int n);
  // Last stage: final RMSNorm (normed f32 [T, H], the MTP input) and lm_head (logits f32 [T, V]).
  void Logits(const Activation& act, float* normed, float* logits);
  // Last stage: the final RMSNorm only.
  void FinalNorm(const Activation& act, float* normed);

  // ---- MTP (last stage, when the checkpoint ships it) ----
  bool has_mtp() const { return mtp_kv_ != nullptr; }
  // One MTP step for T rows at positions p..: inputs the final-normed hidden h f32 [T, H] and the
  // next tokens [T]; writes draft K/V rows [p, p+T) (speculative until MtpCommit), returns
  // m f32 [T, H] (post mtp.norm) and, for the last `n_logits` rows only, logits f32 [n_logits, V]
  // (drafting needs the last row; lm_head is the MTP step's largest weight).
  void MtpForward(const float* h, const std::int32_t* next_tokens, int p, int T, ForwardMode mode, float* m,
                  float* logits, int n_logits);
  void MtpCommit(int rows);
  KvCache* mtp_kv() { return mtp_kv_.get(); }

  // ---- state views (read-only use by tests and instrumentation) ----
  int position() const { return position_; }
  KvCache* kv(int il);        // global layer index; nullptr for GDN layers / other stages
  GdnState* gdn(int il);      // global layer index; nullptr for attention layers / other stages
  const ExpertCache& experts() const { return *experts_; }

 private:
  // One decoder layer in place on act.hidden; local_moe < 0 selects the MTP expert map.
  void LayerForward(const LayerWeights& lw, int local_moe, Activation& act, ForwardMode mode, KvCache* kv,
                    GdnState* gdn);

  const ModelWeights& w_;
  const ModelConfig& c_;
  int index_, n_stages_, layer_begin_, layer_end_;
  ThreadPool* pool_;
  std::unique_ptr<cpu::Rope> rope_;
  std::vector<std::unique_ptr<KvCache>> kv_;    // [layers in stage], null for GDN layers
  std::vector<std::unique_ptr<GdnState>> gdn_;  // [layers in stage], null for attention layers
  std::vector<int> moe_local_;                  // [layers in stage] index into the expert cache or -1
  std::unique_ptr<ExpertCache> experts_;
  std::unique_ptr<KvCache> mtp_kv_;
  std::unique_ptr<ExpertCache> mtp_experts_;
  Arena arena_;
  int position_ = 0;       // committed rows
  int pending_rows_ = 0;   // rows of the current verify window
};

}  // namespace lockstep
