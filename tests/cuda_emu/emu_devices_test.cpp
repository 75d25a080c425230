// Several emulated devices (emu_runtime.cpp, EMU_DEVICES, default 4): the emulator's own checks
// of device affinity and of NCCL point-to-point, and the product's multi-GPU path through them.
//   * a kernel launched on another device's stream, a kernel argument in another device's memory
//     (or in pinned memory allocated there without cudaHostAllocPortable) and an event recorded
//     on another device's stream are findings;
//   * an ncclSend / ncclRecv pair moves the bytes in stream order on both sides: the receiver sees
//     what the sender's stream had written before the send, and the sender's later writes do not
//     reach it; a send without its receive, or a pair of different sizes, is a finding;
//   * `lockstep generate --backend cuda --devices 0,1,2,3` (three NCCL hand-offs) gives the tokens
//     and, under `lockstep diff` at NRMSE 0, the export of `--devices 0`.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda/ops.h"
#include "cuda_emu.h"
#include "test_util.h"

namespace lockstep {
namespace {

class EmuDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    if (n < 2) GTEST_SKIP() << "EMU_DEVICES=" << n << ": these tests need two emulated devices";
  }
  void TearDown() override { cudaSetDevice(0); }
};

float* DevFloats(int device, std::size_t n, float value) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  float* p = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)), cudaSuccess);
  const std::vector<float> h(n, value);
  EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

std::vector<float> Down(const float* p, std::size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST_F(EmuDevices, KernelOnAnotherDevicesStreamIsReported) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s1;
  ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
  float* p = DevFloats(1, 64, 1.0f);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  emu::ExpectWarnings w;
  cuda::Scale(p, 64, 2.0f, s1);
  EXPECT_TRUE(w.Saw("on a stream of device 1 while device 0 is current"));
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cuda::Scale(p, 64, 2.0f, s1);  // the right device: no finding, and it runs
  ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  EXPECT_EQ(Down(p, 64)[5], 2.0f);
  EXPECT_EQ(w.Count(), 1);
  cudaFree(p);
  cudaStreamDestroy(s1);
}

TEST_F(EmuDevices, KernelArgumentsOfAnotherDeviceAreReported) {
  float* on1 = DevFloats(1, 64, 1.0f);
  void *pinned1 = nullptr, *portable1 = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned1, 256, cudaHostAllocMapped), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(&portable1, 256, cudaHostAllocMapped | cudaHostAllocPortable),
            cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s0;
  ASSERT_EQ(cudaStreamCreate(&s0), cudaSuccess);
  {
    emu::ExpectWarnings w;
    cuda::Scale(on1, 64, 2.0f, s0);
    EXPECT_TRUE(w.Saw("is device memory of device 1 (no peer access"));
    cuda::Scale(static_cast<float*>(pinned1), 64, 2.0f, s0);
    EXPECT_TRUE(w.Saw("is pinned memory (not portable) of device 1"));
    EXPECT_EQ(w.Count(), 2);
  }
  {
    emu::ExpectWarnings w;
    cuda::Scale(static_cast<float*>(portable1), 64, 2.0f, s0);  // portable: every device may use it
    ASSERT_EQ(cudaStreamSynchronize(s0), cudaSuccess);
    EXPECT_EQ(w.Count(), 0);
  }
  cudaFree(on1);
  cudaFreeHost(pinned1);
  cudaFreeHost(portable1);
  cudaStreamDestroy(s0);
}

TEST_F(EmuDevices, EventOfAnotherDeviceIsReported) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaEvent_t e1;
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s0;
  ASSERT_EQ(cudaStreamCreate(&s0), cudaSuccess);
  emu::ExpectWarnings w;
  EXPECT_EQ(cudaEventRecord(e1, s0), cudaErrorInvalidResourceHandle);
  EXPECT_TRUE(w.Saw("cudaEventRecord of an event of device 1 on a stream of device 0"));
  cudaGetLastError();
  // Waiting on another device's event is allowed (the engine's hand-offs do it).
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s1;
  ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e1, s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s0, e1, 0), cudaSuccess);
  EXPECT_EQ(w.Count(), 1);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s0);
  cudaStreamDestroy(s1);
}

TEST_F(EmuDevices, NcclSendAndReceiveMoveTheBytesInStreamOrder) {
  const int devs[2] = {0, 1};
  ncclComm_t comms[2];
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess);
  const std::size_t n = 256;
  float* src = DevFloats(0, n, 1.0f);
  cudaStream_t s0, s1;
  ASSERT_EQ(cudaStreamCreate(&s0), cudaSuccess);  // device 0 (DevFloats left it current)
  float* dst = DevFloats(1, n, 0.0f);
  ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cuda::Scale(src, static_cast<std::int64_t>(n), 3.0f, s0);  // before the send: must arrive
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(src, n, ncclFloat32, 1, comms[0], s0), ncclSuccess);
  ASSERT_EQ(ncclRecv(dst, n, ncclFloat32, 0, comms[1], s1), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  cuda::Scale(src, static_cast<std::int64_t>(n), 5.0f, s0);  // after the send: must not arrive
  ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  const std::vector<float> got = Down(dst, n);
  EXPECT_EQ(got.front(), 3.0f);
  EXPECT_EQ(got.back(), 3.0f);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s0), cudaSuccess);
  EXPECT_EQ(Down(src, n)[0], 15.0f);
  {
    emu::ExpectWarnings w;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(src, n, ncclFloat32, 1, comms[0], s0), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_TRUE(w.Saw("ncclSend of rank 0 to peer 1 has no matching ncclRecv"));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(src, n, ncclFloat32, 1, comms[0], s0), ncclSuccess);
    ASSERT_EQ(ncclRecv(dst, n / 2, ncclFloat32, 0, comms[1], s1), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_TRUE(w.Saw("met an ncclRecv of 128"));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(dst, n, ncclFloat32, 1, comms[0], s0),
              ncclSuccess);  // device 1's buffer on rank 0
    ASSERT_EQ(ncclRecv(src, n, ncclFloat32, 0, comms[1], s1), ncclSuccess);
    ncclGroupEnd();
    EXPECT_TRUE(w.Saw("ncclSend of rank 0 (device 0): the buffer"));
  }
  ncclCommDestroy(comms[0]);
  ncclCommDestroy(comms[1]);
  cudaDeviceSynchronize();
  cudaFree(src);
  cudaFree(dst);
  cudaStreamDestroy(s0);
  cudaStreamDestroy(s1);
}

// The product on four emulated GPUs: one stage per device, three NCCL hand-offs per window.
TEST_F(EmuDevices, GenerateOnFourDevicesIsBitwiseOneDevice) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (n < 4) GTEST_SKIP() << "needs EMU_DEVICES >= 4";
  ASSERT_TRUE(std::filesystem::exists(LOCKSTEP_EMU_PLUGIN_DIR "/liblockstep_cuda.so"))
      << "build the plugin (target lockstep_cuda_emu) first";
  const std::string dir = test::NewDir("devices");
  ::setenv("LOCKSTEP_PLUGIN_DIR", LOCKSTEP_EMU_PLUGIN_DIR, 1);
  nlohmann::json tokens[2];
  for (int i = 0; i < 2; ++i) {
    const auto r = test::RunLockstep(
        "generate --model " + test::ModelDir("tiny") + " --prompt-file " +
        LOCKSTEP_SOURCE_DIR "/campaigns/prompts/demo.txt --backend cuda --max-new 6 " +
        "--spec 3 --devices " + (i == 0 ? "0" : "0,1,2,3") + " --export " + dir + "/d" +
        std::to_string(i) + ".h5 --export-windows all --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    tokens[i] = nlohmann::json::parse(r.out).at("output_ids");
  }
  const auto d = test::RunLockstep("diff " + dir + "/d0.h5 " + dir +
                                   "/d1.h5 --nrmse-max 0 --kl-max 0 --quiet");
  ::unsetenv("LOCKSTEP_PLUGIN_DIR");
  EXPECT_EQ(d.exit_code, 0) << d.out << d.err;
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(tokens[0].size(), 6u);
}

}  // namespace
}  // namespace lockstep
