// GPU tests skip (GTEST_SKIP: reported as skipped, never as passed) where fewer CUDA devices are
// visible than they need: CI machines have the toolkit but no GPU. The emulator binary
// (tests/cuda_emu) reports EMU_DEVICES devices (four by default), so the same tests run there, the
// two-GPU NCCL hand-off included.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

namespace lockstep::test {

// Visible CUDA devices; 0 when the runtime or the driver is missing, with the reason in `why`.
inline int CudaDevices(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error for later calls
    return 0;
  }
  if (n == 0) *why = "cudaGetDeviceCount returned 0";
  return n;
}

}  // namespace lockstep::test

#define LOCKSTEP_REQUIRE_GPU(n)                                       \
  do {                                                                \
    std::string why_;                                                 \
    const int have_ = ::lockstep::test::CudaDevices(&why_);           \
    if (have_ < (n))                                                  \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), " << have_ \
                   << " visible (no GPU on this "                     \
                   << "machine?) " << why_;                           \
  } while (0)
