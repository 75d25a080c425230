// CudaStageSession: one pipeline stage on one GPU (the `cuda` backend's StageSession).
//
// Device state: the stage's weights (one device buffer; routed experts that are not resident,
// per the stage's ExpertCache map, stay in pinned host memory and are read by the kernels over
// PCIe), K/V caches f32/bf16/int8 [capacity, Hkv, D] per attention layer (grown by doubling),
// GDN checkpoints and per-step scratch, the residual stream [T, H] and a scratch arena.
// Host state: mirrors of the K/V caches and GDN states in the CPU layout, brought up to date when
// kv() / gdn() / mtp_kv() are called (a stream sync plus the rows that changed), and the expert
// counters, updated from the routing the device copies back each window.
//
// The math is the CPU reference's (engine/cpu), op for op; verify windows run the batch-
// invariant kernels of ops.h, prefill runs cuBLAS GEMMs and the chunked GDN form. With CUDA graphs
// on (EngineConfig::cuda_graphs), a verify window's layer loop is captured once per window size
// and replayed, and so is the MTP head's draft step: same kernels and arguments, the position read
// from device memory (ops.h Pos).
// Errors of void calls are kept in status().
//
// Borrowed: params.weights, params.cfg and `backend` outlive the session. One driver thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_handles.h"
#include "lockstep/engine/stage.h"

namespace lockstep::cuda {

namespace detail {
struct DeviceStageImpl;  // device-side members (cuda_stage_impl.h)
struct Ctx;
struct SectionGraph;
}  // namespace detail

class CudaStageSession final : public StageSession {
 public:
  // Uploads the stage's weights to `device` and allocates its state. kRuntime on device errors.
  static Result<StageSessionPtr> Create(const StageParams& params, CudaBackend* backend,
                                        int device);
  ~CudaStageSession() override;

  Status Forward(ForwardMode mode, const std::int32_t* tokens, Activation& act) override;
  void Commit(int n) override;
  void Logits(const Activation& act, float* normed, float* logits) override;
  void FinalNorm(const Activation& act, float* normed) override;
  void HiddenToHost(const Activation& act, std::vector<float>* out) override;
  void Perturb(ItemKind item, int layer, float factor, Activation& act) override;
  void FillDeviceTiming(StageTiming* t) override;
  Status status() const override { return error_; }
  StageInitCounters init_counters() const override;

  bool has_mtp() const override;
  void MtpForward(const float* h, const std::int32_t* next_tokens, int p, int T, ForwardMode mode,
                  float* m, float* logits, int n_logits) override;
  void MtpCommit(int rows) override;
  KvCache* mtp_kv() override;

  int position() const override { return position_; }
  KvCache* kv(int il) override;
  GdnState* gdn(int il) override;
  const ExpertCache& experts() const override;

  int device() const { return device_; }
  // Matrices held as bf16 on the device (lossless: the stage's matrices are all bf16 values).
  bool weights_bf16() const;

 private:
  CudaStageSession(const StageParams& params, CudaBackend* backend, int device);
  // Stream, events, weights (cuda_weights.cpp), RoPE table and state: the device side of Create.
  Status Init();
  // ---- CUDA graphs (cuda_graphs.cpp) ----
  // The stage's layers on x's rows at position p: launched one by one, or (verify windows, CUDA
  // graphs on) replayed from / captured into the graph for this window size.
  Status RunLayers(detail::Ctx& x, int T, int p);
  Status EagerLayers(detail::Ctx& x, int T, int p);
  // Runs a section of a forward (`body`: launches and the host bookkeeping beside them) through
  // `gr`: eagerly while its layout key (key_of) is new, captured on the next call with the same
  // key, replayed after that (`replay` redoes the host bookkeeping); *use says which.
  Status Graphed(detail::SectionGraph& gr,
                 const std::function<std::vector<std::uintptr_t>()>& key_of,
                 const std::function<Status()>& body, const std::function<void()>& replay,
                 GraphUse* use);
  // Stops using graphs for the rest of the session (a capture or instantiation failed).
  void GraphsOff(const std::string& why);
  // Keeps the first failure; later calls become no-ops once an error is recorded.
  void Keep(const Status& s) {
    if (error_.ok() && !s.ok()) error_ = s.WithContext("stage " + std::to_string(index()));
  }

  const ModelWeights& w_;
  const ModelConfig& c_;
  const EngineConfig& cfg_;
  CudaBackend* backend_;
  int device_;
  std::unique_ptr<detail::DeviceStageImpl> d_;
  int position_ = 0;      // committed rows
  int pending_rows_ = 0;  // rows of the current verify window
  Status error_;
  std::int64_t first_calls_ = 0;    // Forward calls with one-time set-up in them
  std::int64_t first_call_ns_ = 0;  // host ns of that set-up
};

}  // namespace lockstep::cuda
