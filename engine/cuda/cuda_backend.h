// The `cuda` backend: stages on one or several GPUs (cuBLAS + own kernels, engine/cuda/ops.h).
//
// Placement: with --devices D0,...,Dn-1 (default {0}), stage s runs on D[s * n / stages]; each
// stage has its own stream. Hand-off between stages (HandOff): on one GPU a stream-ordered
// device-to-device copy after waiting on the producer's event; across GPUs an NCCL send/recv
// pair issued in one group (communicators from ncclCommInitAll over the listed devices, one
// process, one driver thread).
//
// Deterministic mode (default, EngineConfig::deterministic): cuBLAS in default (non-TF32) math
// with a fixed per-stage workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8 is set for the process),
// used for prefill only; verify windows run the batch-invariant RowsMatmul; no kernel uses
// atomics. So two runs of the same config give bitwise-identical exports, and a verify row's
// bits do not depend on T. Off: verify windows also go through cuBLAS with TF32 tensor-op math,
// whose algorithm depends on the shape, so rows are no longer T-invariant (speculative and plain
// decoding may differ in the last bits, and A/A arms whose paths differ then diverge).
//
// Thread safety: one driver thread (the engine's).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_handles.h"
#include "lockstep/engine/backend.h"

namespace lockstep::cuda {

// Registers "cuda" in the backend registry (idempotent). Call once from main() / tests.
void RegisterCudaBackend();

// Activations living on a device: a borrowed pointer into the producing stage's buffer, valid
// until the consumer records `consumed` (the producer waits on it before overwriting).
struct CudaActivation final : DeviceActivation {
  const float* data = nullptr;  // f32 [T, H] on `device`
  int device = 0;
  int rows = 0;
  int cols = 0;
  cudaStream_t stream = nullptr;   // producer's stream
  cudaEvent_t ready = nullptr;     // recorded after the producer's last kernel
  cudaEvent_t consumed = nullptr;  // recorded by the consumer once it has its copy
  int rank = 0;                    // producer's index in the backend's device list
  std::size_t bytes() const override {
    return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * sizeof(float);
  }
};

class CudaBackend final : public Backend {
 public:
  // Checks the devices exist; creates the NCCL communicators when stages span several GPUs.
  // kNotSupported when no CUDA device is visible or a listed ordinal does not exist.
  static Result<BackendPtr> Create(const EngineConfig& cfg, const ModelWeights& weights);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  Result<StageSessionPtr> CreateStage(const StageParams& params) override;
  Result<TransportPtr> CreateTransport(int n_stages) override;
  std::string Describe() const override { return describe_; }

  bool deterministic() const { return deterministic_; }
  bool graphs() const { return graphs_; }
  int attn_split() const { return attn_split_; }  // EngineConfig::cuda_attn_split
  int device_of_stage(int is) const;
  int rank_of_device(int device) const;
  // Brings src (a CudaActivation) into dst f32 [rows, cols] on `dst_device`, ordered on
  // `dst_stream`; records src.consumed on dst_stream when done. Same device: wait + copy;
  // other device: NCCL send (src stream) / recv (dst stream) in one group.
  Status HandOff(const CudaActivation& src, int dst_device, cudaStream_t dst_stream, float* dst);

 private:
  CudaBackend() = default;
  std::vector<int> devices_;
  int n_stages_ = 1;
  bool deterministic_ = true;
  bool graphs_ = true;
  int attn_split_ = 0;
  std::vector<NcclCommPtr> comms_;  // [devices_.size()] when more than one device
  std::string describe_;
};

}  // namespace lockstep::cuda
