// RAII for every CUDA-side C handle (STYLE D.18) and the one macro family that checks vendor calls
// (STYLE C.15). Feature code never calls a naked cudaFree / cudaStreamDestroy / ncclCommDestroy.
//
// LOCKSTEP_CUDA_CHECK(expr), LOCKSTEP_CUBLAS_CHECK(expr), LOCKSTEP_NCCL_CHECK(expr): on failure,
// return from the enclosing function a kRuntime Status naming the statement, the function,
// file:line and the vendor's error string. The _FATAL variants abort instead (destructors and
// other paths that cannot return).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "lockstep/engine/status.h"

namespace lockstep::cuda {

// ---- error text per vendor ----
inline const char* VendorErrorString(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* VendorErrorString(cublasStatus_t e) { return cublasGetStatusString(e); }
inline const char* VendorErrorString(ncclResult_t e) { return ncclGetErrorString(e); }
inline bool VendorOk(cudaError_t e) { return e == cudaSuccess; }
inline bool VendorOk(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }
inline bool VendorOk(ncclResult_t e) { return e == ncclSuccess; }

template <typename E>
Status VendorStatus(E e, const char* expr, const char* func, const char* file, int line) {
  return Status::Runtime(std::string(expr), std::string(VendorErrorString(e)) + " (in " + func +
                                                " at " + file + ":" + std::to_string(line) + ")");
}

// A failed cudaMalloc / cudaHostAlloc of `bytes` for `what` ("scratch arena block", ...): kRuntime
// naming the allocation, its size, the device and what it has free, e.g.
//   cuda: out of device memory: K/V cache growth to 1024 rows (1.0 MiB) on device 0;
//   cudaMemGetInfo: 0.4 MiB free of 300.0 MiB
// The error is cleared (allocation failures are not sticky) so the engine can report it and
// tear down.
inline Status AllocError(cudaError_t e, std::size_t bytes, std::string_view what, bool pinned) {
  cudaGetLastError();
  auto mib = [](std::size_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / 1048576.0);
    return std::string(buf);
  };
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) cudaGetLastError();
  std::size_t free_b = 0, total_b = 0;
  std::string mem;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    mem = "; cudaMemGetInfo: " + mib(free_b) + " free of " + mib(total_b);
  } else {
    cudaGetLastError();
  }
  const std::string where = pinned ? "pinned host memory" : "device memory";
  if (e != cudaErrorMemoryAllocation)
    return Status::Runtime("cuda: allocating " + where + " for " + std::string(what),
                           std::string(cudaGetErrorString(e)) + " (" + mib(bytes) + ")");
  return Status::Runtime("cuda: out of " + where, std::string(what) + " (" + mib(bytes) +
                                                      ") on device " + std::to_string(dev) + mem);
}

}  // namespace lockstep::cuda

#define LOCKSTEP_VENDOR_CHECK_IMPL(expr)                                                   \
  do {                                                                                     \
    auto lockstep_vendor_e_ = (expr);                                                      \
    if (!::lockstep::cuda::VendorOk(lockstep_vendor_e_))                                   \
      return ::lockstep::cuda::VendorStatus(lockstep_vendor_e_, #expr, __func__, __FILE__, \
                                            __LINE__);                                     \
  } while (0)
#define LOCKSTEP_VENDOR_FATAL_IMPL(expr)                                                     \
  do {                                                                                       \
    auto lockstep_vendor_e_ = (expr);                                                        \
    if (!::lockstep::cuda::VendorOk(lockstep_vendor_e_)) {                                   \
      std::fprintf(stderr, "%s:%d %s: %s failed: %s\n", __FILE__, __LINE__, __func__, #expr, \
                   ::lockstep::cuda::VendorErrorString(lockstep_vendor_e_));                 \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

#define LOCKSTEP_CUDA_CHECK(expr) LOCKSTEP_VENDOR_CHECK_IMPL(static_cast<cudaError_t>(expr))
#define LOCKSTEP_CUBLAS_CHECK(expr) LOCKSTEP_VENDOR_CHECK_IMPL(static_cast<cublasStatus_t>(expr))
#define LOCKSTEP_NCCL_CHECK(expr) LOCKSTEP_VENDOR_CHECK_IMPL(static_cast<ncclResult_t>(expr))
#define LOCKSTEP_CUDA_CHECK_FATAL(expr) LOCKSTEP_VENDOR_FATAL_IMPL(static_cast<cudaError_t>(expr))
#define LOCKSTEP_NCCL_CHECK_FATAL(expr) LOCKSTEP_VENDOR_FATAL_IMPL(static_cast<ncclResult_t>(expr))

namespace lockstep::cuda {

// ---- deleters: errors at teardown are reported but cannot be returned ----
struct StreamDeleter {
  void operator()(cudaStream_t s) const {
    if (s) cudaStreamDestroy(s);
  }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const {
    if (e) cudaEventDestroy(e);
  }
};
struct CublasDeleter {
  void operator()(cublasHandle_t h) const {
    if (h) cublasDestroy(h);
  }
};
struct NcclDeleter {
  void operator()(ncclComm_t c) const {
    if (c) ncclCommDestroy(c);
  }
};
struct GraphDeleter {
  void operator()(cudaGraph_t g) const {
    if (g) cudaGraphDestroy(g);
  }
};
struct GraphExecDeleter {
  void operator()(cudaGraphExec_t g) const {
    if (g) cudaGraphExecDestroy(g);
  }
};
struct DeviceFree {
  void operator()(void* p) const {
    if (p) cudaFree(p);
  }
};
struct HostFree {
  void operator()(void* p) const {
    if (p) cudaFreeHost(p);
  }
};

using StreamPtr = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
using EventPtr = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;
using CublasPtr = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDeleter>;
using NcclCommPtr = std::unique_ptr<std::remove_pointer_t<ncclComm_t>, NcclDeleter>;
using GraphPtr = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDeleter>;
using GraphExecPtr = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDeleter>;
using DevicePtr = std::unique_ptr<void, DeviceFree>;
using PinnedPtr = std::unique_ptr<void, HostFree>;

// An owned, non-copyable allocation of `bytes` (contents uninitialised): device memory
// (DeviceBuffer) or pinned, device-mapped host memory (PinnedBuffer).
template <typename Ptr>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  void* get() const { return ptr_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }
  std::size_t bytes() const { return bytes_; }

 protected:
  // Takes ownership of p (nullptr when bytes == 0).
  static CudaBuffer Own(void* p, std::size_t bytes) {
    CudaBuffer b;
    b.ptr_.reset(p);
    b.bytes_ = bytes;
    return b;
  }
  Ptr ptr_;
  std::size_t bytes_ = 0;
};

class DeviceBuffer : public CudaBuffer<DevicePtr> {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` on the current device for `what` (named in the error). kRuntime when out
  // of memory (AllocError).
  static Result<DeviceBuffer> Alloc(std::size_t bytes, std::string_view what) {
    void* p = nullptr;
    if (bytes > 0) {
      if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess)
        return AllocError(e, bytes, what, false);
    }
    return DeviceBuffer(Own(p, bytes));
  }

 private:
  explicit DeviceBuffer(CudaBuffer b) : CudaBuffer(std::move(b)) {}
};

// Pinned, device-mapped host memory (cudaHostAllocMapped | Portable): readable by kernels over
// PCIe through device_ptr() and by the host through get().
class PinnedBuffer : public CudaBuffer<PinnedPtr> {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> Alloc(std::size_t bytes, std::string_view what) {
    void* p = nullptr;
    if (bytes > 0) {
      if (cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
          e != cudaSuccess)
        return AllocError(e, bytes, what, true);
    }
    return PinnedBuffer(Own(p, bytes));
  }
  // The address kernels use (unified addressing: the same value on 64-bit Linux).
  Result<void*> device_ptr() const {
    void* d = nullptr;
    if (ptr_) LOCKSTEP_CUDA_CHECK(cudaHostGetDevicePointer(&d, ptr_.get(), 0));
    return d;
  }

 private:
  explicit PinnedBuffer(CudaBuffer b) : CudaBuffer(std::move(b)) {}
};

inline Result<StreamPtr> MakeStream() {
  cudaStream_t s = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return StreamPtr(s);
}
// Timing events (cudaEventDefault) or synchronisation-only events (disable_timing).
inline Result<EventPtr> MakeEvent(bool timing) {
  cudaEvent_t e = nullptr;
  LOCKSTEP_CUDA_CHECK(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return EventPtr(e);
}

// Scoped cudaSetDevice that restores the previous device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&prev_);
    if (device != prev_) cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(prev_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace lockstep::cuda
