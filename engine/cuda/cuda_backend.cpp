#include "cuda/cuda_backend.h"

#include <cstdlib>

#include "cuda/cuda_stage.h"

namespace lockstep::cuda {

void RegisterCudaBackend() {
  RegisterBackend("cuda", [](const EngineConfig& cfg, const ModelWeights& w) {
    return CudaBackend::Create(cfg, w);
  });
}

Result<BackendPtr> CudaBackend::Create(const EngineConfig& cfg, const ModelWeights& weights) {
  (void)weights;
  int n_visible = 0;
  const cudaError_t e = cudaGetDeviceCount(&n_visible);
  if (e != cudaSuccess || n_visible == 0)
    return Status::NotSupported("--backend cuda",
                                std::string("no CUDA device is visible (") +
                                    (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") +
                                    "); use --backend cpu");
  std::unique_ptr<CudaBackend> b(new CudaBackend);
  b->devices_ = cfg.devices.empty() ? std::vector<int>{0} : cfg.devices;
  for (int d : b->devices_)
    if (d >= n_visible)
      return Status::NotSupported("--devices", "device " + std::to_string(d) + " does not exist (" +
                                                   std::to_string(n_visible) + " visible)");
  b->n_stages_ = cfg.stages;
  b->deterministic_ = cfg.deterministic;
  b->graphs_ = cfg.cuda_graphs;
  b->attn_split_ = cfg.cuda_attn_split;
  // env: CUBLAS_WORKSPACE_CONFIG — cuBLAS is bitwise reproducible run to run only with a fixed
  // workspace configuration; we set it for the process unless the user already did.
  if (cfg.deterministic) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
  if (b->devices_.size() > 1) {
    std::vector<ncclComm_t> comms(b->devices_.size(), nullptr);
    LOCKSTEP_NCCL_CHECK(
        ncclCommInitAll(comms.data(), static_cast<int>(comms.size()), b->devices_.data()));
    for (ncclComm_t c : comms) b->comms_.emplace_back(c);
  }
  cudaDeviceProp prop{};
  LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, b->devices_[0]));
  b->describe_ =
      std::string("cuda, ") + prop.name + " x" + std::to_string(b->devices_.size()) +
      (cfg.deterministic ? ", deterministic" : ", non-deterministic (--deterministic off)") +
      (b->devices_.size() > 1 ? ", NCCL hand-off" : ", stream/event hand-off") +
      (cfg.cuda_graphs ? ", CUDA graphs" : ", no CUDA graphs (--cuda-graphs off)") +
      (cfg.cuda_attn_split > 0
           ? ", attention split past " + std::to_string(cfg.cuda_attn_split) + " positions"
           : ", one attention block per row (--cuda-attn-split 0)");
  return BackendPtr(std::move(b));
}

CudaBackend::~CudaBackend() = default;

int CudaBackend::device_of_stage(int is) const {
  const int n = static_cast<int>(devices_.size());
  return devices_[static_cast<std::size_t>(is * n / n_stages_)];
}

int CudaBackend::rank_of_device(int device) const {
  for (std::size_t i = 0; i < devices_.size(); ++i)
    if (devices_[i] == device) return static_cast<int>(i);
  return -1;
}

Result<StageSessionPtr> CudaBackend::CreateStage(const StageParams& params) {
  return CudaStageSession::Create(params, this, device_of_stage(params.index));
}

Result<TransportPtr> CudaBackend::CreateTransport(int n_stages) {
  // The mailbox moves the CudaActivation handle; the bytes move in HandOff, on the consumer's
  // stream, when the next stage starts.
  return TransportPtr(std::make_unique<InProcessTransport>(n_stages));
}

Status CudaBackend::HandOff(const CudaActivation& src, int dst_device, cudaStream_t dst_stream,
                            float* dst) {
  const std::size_t n = static_cast<std::size_t>(src.rows) * static_cast<std::size_t>(src.cols);
  if (src.device == dst_device) {
    DeviceScope scope(dst_device);
    LOCKSTEP_CUDA_CHECK(cudaStreamWaitEvent(dst_stream, src.ready, 0));
    LOCKSTEP_CUDA_CHECK(
        cudaMemcpyAsync(dst, src.data, n * sizeof(float), cudaMemcpyDeviceToDevice, dst_stream));
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(src.consumed, dst_stream));
    return Status::Ok();
  }
  const int src_rank = src.rank, dst_rank = rank_of_device(dst_device);
  if (dst_rank < 0 || comms_.empty())
    return Status::Runtime("cuda hand-off",
                           "device " + std::to_string(dst_device) + " has no NCCL communicator");
  // The send is ordered after the producer's kernels by its own stream; the receive lands on the
  // consumer's stream. Both calls in one group so a single thread can drive both ranks.
  LOCKSTEP_NCCL_CHECK(ncclGroupStart());
  {
    DeviceScope s1(src.device);
    LOCKSTEP_NCCL_CHECK(ncclSend(src.data, n, ncclFloat32, dst_rank,
                                 comms_[static_cast<std::size_t>(src_rank)].get(), src.stream));
  }
  {
    DeviceScope s2(dst_device);
    LOCKSTEP_NCCL_CHECK(ncclRecv(dst, n, ncclFloat32, src_rank,
                                 comms_[static_cast<std::size_t>(dst_rank)].get(), dst_stream));
  }
  LOCKSTEP_NCCL_CHECK(ncclGroupEnd());
  {
    // The producer may overwrite its buffer once the send has left it: mark that on its stream.
    DeviceScope s1(src.device);
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(src.consumed, src.stream));
  }
  return Status::Ok();
}

}  // namespace lockstep::cuda
