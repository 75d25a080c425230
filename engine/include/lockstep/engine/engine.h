// Engine: the pipeline of stage sessions for one sequence.
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
#include "lockstep/engine/inject.h"
#include "lockstep/engine/stage.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/transport.h"
#include "lockstep/engine/weights.h"
#include "lockstep/engine/window.h"

namespace lockstep {

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
  int position() const { return position_; }  // committed tokens
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

  // Window index for fault injection and timing (set by the generation loop before Verify).
  void SetWindow(int idx) { window_ = idx; }
  // The run's --inject list and, index for index, what each did so far (inject.h).
  const std::vector<Injection>& injections() const { return injections_; }
  const std::vector<InjectionRecord>& injection_records() const { return injection_records_; }
  // InjectionRecordJson of each injection, in order (empty without injections).
  std::vector<std::string> InjectionReport() const;
  // Per-stage timing of the last Verify (wait for input vs compute).
  const std::vector<StageTiming>& stage_timings() const { return timings_; }
  // When on, Verify keeps a copy of the activations each stage hands to the next
  // (hidden_out f32 [T, H] per stage but the last) for observers. Off by default (no copies).
  void SetCaptureHidden(bool on) { capture_hidden_ = on; }
  const std::vector<float>& hidden_out(int is) const {
    return hidden_out_[static_cast<std::size_t>(is)];
  }

  // ---- MTP (on the last stage) ----
  bool has_mtp() const { return stages_.back()->has_mtp(); }
  // MTP rows at positions p..p+T-1 from final-normed hidden h f32 [T, H] and the next tokens [T];
  // writes draft K/V rows (speculative until MtpCommit); m f32 [T, H], logits of the last
  // n_logits rows f32 [n_logits, V].
  void MtpForward(const float* h, const std::int32_t* next_tokens, int p, int T, ForwardMode mode,
                  float* m, float* logits, int n_logits = 1) {
    stages_.back()->MtpForward(h, next_tokens, p, T, mode, m, logits, n_logits);
  }
  void MtpCommit(int rows) { stages_.back()->MtpCommit(rows); }
  // Draft K/V rows whose inputs were true (h, next token) pairs.
  int mtp_position() const {
    return stages_.back()->mtp_kv() ? stages_.back()->mtp_kv()->rows_committed() : 0;
  }

 private:
  Engine(const EngineConfig& cfg, const ModelWeights& w);
  Status RunPipeline(ForwardMode mode, std::span<const std::int32_t> tokens, Activation& out);
  // `perturb` injections of the current window: stage is's items after its verify forward.
  void ApplyPerturbations(int is, Activation& act);
  void PerturbLogits(float* logits, std::size_t n);
  // The first recorded failure of any stage (device backends), else Ok.
  Status StagesStatus() const;

  EngineConfig cfg_;
  const ModelWeights& w_;
  BackendPtr backend_;  // outlives stages_ and transport_ (declared first, destroyed last)
  std::unique_ptr<ThreadPool> pool_;
  std::vector<int> bounds_;
  std::vector<std::unique_ptr<StageSession>> stages_;
  TransportPtr transport_;
  int position_ = 0;
  int pending_ = 0;  // rows of the uncommitted verify window
  int window_ = -1;
  std::vector<Injection> injections_;
  std::vector<InjectionRecord> injection_records_;  // parallel to injections_
  std::vector<StageTiming> timings_;
  bool capture_hidden_ = false;
  std::vector<std::vector<float>> hidden_out_;  // [n_stages] f32 [T, H] of the last Verify
  std::vector<float> normed_scratch_;
};
using EnginePtr = std::unique_ptr<Engine>;

}  // namespace lockstep
