// EmuGraph.*: the emulator's CUDA graphs (stream capture, emu_runtime.cpp), which the CUDA
// backend's verify-window graphs run on in cuda_emu_tests. A capture runs nothing; each
// cudaGraphLaunch runs the captured nodes in order with the captured arguments, after the work
// queued before the capture (and, in the lazy mode, only when something waits for it); calls that
// are illegal during a capture are reported with CUDA's error and fail cudaStreamEndCapture; a
// replay after a captured buffer was freed (or reallocated with another size) is reported.
// Emulator-only: the findings are asserted through emu::ExpectWarnings.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <vector>

#include "cuda/ops.h"
#include "cuda_emu.h"

namespace lockstep::cuda {
namespace {

constexpr std::int64_t kN = 1000;  // several blocks of the elementwise kernels
constexpr std::size_t kBytes = kN * sizeof(float);

std::vector<float> Iota(float first) {
  std::vector<float> v(kN);
  for (std::int64_t i = 0; i < kN; ++i)
    v[static_cast<std::size_t>(i)] = first + static_cast<float>(i);
  return v;
}
std::vector<float> Filled(float x) { return std::vector<float>(kN, x); }

int AsyncLevel() {
  const char* e = std::getenv("EMU_ASYNC");
  return e ? std::atoi(e) : 0;
}

class EmuGraph : public ::testing::Test {
 protected:
  // A non-blocking stream, as the engine's: the legacy-stream copies below do not wait for it.
  void SetUp() override {
    cudaGetLastError();  // an earlier test's
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    for (float* p : bufs_) EXPECT_EQ(cudaFree(p), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(s_), cudaSuccess);
  }

  float* Dev(const std::vector<float>& h) {
    float* d = nullptr;
    const std::size_t bytes = h.size() * sizeof(float);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    bufs_.push_back(d);
    return d;
  }
  void Free(float* d) {
    bufs_.erase(std::find(bufs_.begin(), bufs_.end(), d));
    EXPECT_EQ(cudaFree(d), cudaSuccess);
  }
  // The first kN floats at d, read without waiting for s_ (the legacy stream only waits for
  // blocking streams).
  static std::vector<float> Host(const float* d) {
    std::vector<float> h(kN);
    EXPECT_EQ(cudaMemcpy(h.data(), d, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  // `work` captured on s_ (ThreadLocal mode, as the engine) and instantiated.
  cudaGraphExec_t Capture(const std::function<void()>& work) {
    EXPECT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    work();
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s_, &g), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);  // the exec does not need it
    return exec;
  }
  // Begins a capture on `s`, runs `illegal` (which must be reported once and return `want`), and
  // checks that the capture was invalidated: cudaStreamEndCapture fails without a graph.
  static void ExpectCaptureFails(cudaStream_t s, cudaStreamCaptureMode mode, cudaError_t want,
                                 const char* text, const std::function<cudaError_t()>& illegal) {
    SCOPED_TRACE(text);
    ASSERT_EQ(cudaStreamBeginCapture(s, mode), cudaSuccess);
    {
      emu::ExpectWarnings w;
      EXPECT_EQ(illegal(), want);
      EXPECT_EQ(w.Count(), 1);
      EXPECT_TRUE(w.Saw(text));
    }
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(g, nullptr);
    cudaGetLastError();  // clears the failed calls' error
  }

  cudaStream_t s_ = nullptr;
  std::vector<float*> bufs_;
};

TEST_F(EmuGraph, CaptureRunsNothing) {
  float* x = Dev(Iota(1.0f));
  float* y = Dev(Filled(1.0f));
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamIsCapturing(s_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  Scale(x, kN, 2.0f, s_);
  AddInPlace(x, y, kN, s_);
  EXPECT_EQ(cudaMemsetAsync(y, 0, kBytes, s_), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(y, x, kBytes, cudaMemcpyDeviceToDevice, s_), cudaSuccess);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s_, &g), cudaSuccess);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(cudaStreamIsCapturing(s_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(Host(x), Iota(1.0f));
  EXPECT_EQ(Host(y), Filled(1.0f));
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
}

TEST_F(EmuGraph, EachLaunchRunsTheCapturedNodesInOrderAfterEarlierWork) {
  float* x = Dev(Iota(1.0f));
  float* y = Dev(Filled(1.0f));
  AddInPlace(x, y, kN, s_);  // queued before the capture (still pending in the lazy mode)
  cudaGraphExec_t exec = Capture([&] {
    Scale(x, kN, 2.0f, s_);
    AddInPlace(x, y, kN, s_);
  });
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
    if (i == 0) Scale(x, kN, -1.0f, s_);  // not captured: runs once, between the first two launches
  }
  // Lazy streams: nothing ran yet, not even the work queued before the capture.
  if (AsyncLevel() == 1) {
    EXPECT_EQ(Host(x), Iota(1.0f));
  }
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  // a = (i + 1) + 1 before the capture; each launch x -> 2x + 1, negated after the first:
  // -8a - 1 (the nodes swapped would give -8a - 2, the graph before the first add -8a + 7).
  std::vector<float> want(kN);
  for (std::int64_t i = 0; i < kN; ++i)
    want[static_cast<std::size_t>(i)] = -8.0f * (static_cast<float>(i) + 2.0f) - 1.0f;
  EXPECT_EQ(Host(x), want);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

TEST_F(EmuGraph, CopyAndMemsetNodes) {
  float* x = Dev(Iota(1.0f));
  float* z = Dev(Filled(0.0f));
  cudaGraphExec_t exec = Capture([&] {
    EXPECT_EQ(cudaMemcpyAsync(z, x, kBytes, cudaMemcpyDeviceToDevice, s_), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(x, 0, kBytes, s_), cudaSuccess);
  });
  EXPECT_EQ(Host(z), Filled(0.0f));
  EXPECT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(Host(z), Iota(1.0f));
  EXPECT_EQ(Host(x), Filled(0.0f));
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

TEST_F(EmuGraph, SyncInsideCaptureIsReportedAndFailsTheCapture) {
  float* x = Dev(Filled(1.0f));
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  Scale(x, kN, 2.0f, s_);
  {
    emu::ExpectWarnings w;
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(w.Count(), 1);
    EXPECT_TRUE(w.Saw("cudaStreamSynchronize of the capturing stream"));
  }
  Scale(x, kN, 2.0f, s_);  // dropped: the capture is invalidated (not reported again)
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s_, &g), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  // Nothing of the failed capture ran; the stream runs its work again.
  Scale(x, kN, 3.0f, s_);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(Host(x), Filled(3.0f));
}

TEST_F(EmuGraph, IllegalCallsDuringCaptureAreReported) {
  const auto tl = cudaStreamCaptureModeThreadLocal;
  const auto unsupported = cudaErrorStreamCaptureUnsupported;
  float* x = Dev(Filled(1.0f));
  std::vector<float> pageable(kN);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ev = nullptr;
  ASSERT_EQ(cudaEventCreate(&ev), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, other), cudaSuccess);

  void* p = nullptr;
  ExpectCaptureFails(s_, tl, unsupported, "cudaMalloc", [&] { return cudaMalloc(&p, 64); });
  ExpectCaptureFails(s_, tl, unsupported, "cudaFree", [&] { return cudaFree(x); });
  ExpectCaptureFails(s_, tl, unsupported, "cudaDeviceSynchronize",
                     [] { return cudaDeviceSynchronize(); });
  ExpectCaptureFails(s_, tl, unsupported, "cudaStreamSynchronize",
                     [&] { return cudaStreamSynchronize(other); });
  ExpectCaptureFails(s_, tl, unsupported, "cudaEventSynchronize",
                     [&] { return cudaEventSynchronize(ev); });
  ExpectCaptureFails(s_, tl, unsupported, "cudaMemcpy on the legacy default stream", [&] {
    return cudaMemcpy(pageable.data(), x, kBytes, cudaMemcpyDeviceToHost);
  });
  ExpectCaptureFails(s_, tl, unsupported, "cudaMemcpyAsync with a pageable host side", [&] {
    return cudaMemcpyAsync(x, pageable.data(), kBytes, cudaMemcpyHostToDevice, s_);
  });
  ExpectCaptureFails(s_, tl, unsupported, "cudaEventRecord on the capturing stream",
                     [&] { return cudaEventRecord(ev, s_); });
  ExpectCaptureFails(s_, tl, cudaErrorStreamCaptureIsolation, "event recorded outside the capture",
                     [&] { return cudaStreamWaitEvent(s_, ev, 0); });
  ExpectCaptureFails(s_, tl, unsupported, "ScaleKernel on the legacy default stream", [&] {
    Scale(x, kN, 2.0f, nullptr);
    return cudaGetLastError();
  });
  // Legacy-stream work would wait for a blocking capturing stream: cudaErrorStreamCaptureImplicit,
  // in Relaxed mode too.
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ExpectCaptureFails(blocking, cudaStreamCaptureModeRelaxed, cudaErrorStreamCaptureImplicit,
                     "cudaMemset on the legacy default stream",
                     [&] { return cudaMemset(x, 0, kBytes); });
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);

  // Relaxed mode allows allocation; work on other streams is never captured.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  float* y = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&y), kBytes), cudaSuccess);
  EXPECT_EQ(cudaFree(y), cudaSuccess);
  Scale(x, kN, 5.0f, other);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s_, &g), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  EXPECT_EQ(Host(x), Filled(5.0f));

  EXPECT_EQ(cudaEventDestroy(ev), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

TEST_F(EmuGraph, ReplayAfterACapturedBufferWasFreedIsReported) {
  float* x = Dev(Filled(1.0f));
  float* y = Dev(Filled(1.0f));
  cudaGraphExec_t exec = Capture([&] {
    Scale(x, kN, 2.0f, s_);
    AddInPlace(y, x, kN, s_);
  });
  EXPECT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(Host(y), Filled(3.0f));

  Free(x);
  {
    emu::ExpectWarnings w;
    EXPECT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    EXPECT_EQ(w.Count(), 2);
    EXPECT_TRUE(w.Saw("graph node 0 (kernel ScaleKernel): argument 0"));
    EXPECT_TRUE(w.Saw("graph node 1 (kernel AddKernel): argument 1"));
    EXPECT_TRUE(w.Saw("no longer in a live allocation"));
  }
  EXPECT_EQ(Host(y), Filled(3.0f));  // the stale nodes did not run
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

TEST_F(EmuGraph, ReplayAfterACapturedBufferWasReallocatedIsReported) {
  // 4 MiB: the emulator maps allocations of 2 MiB and more on their own and unmaps them when
  // freed; a mapping of the same length usually lands at the same address again. The buffer is
  // reallocated 256 bytes smaller (same mapping length): the captured pointer is then usually
  // inside a live allocation, but not the one it was in at capture.
  const std::vector<float> big(std::size_t{1} << 20, 1.0f);
  const std::vector<float> smaller(big.size() - 64, 1.0f);
  float* a = Dev(big);
  float* z = Dev(Filled(0.0f));
  cudaGraphExec_t exec = Capture([&] {
    Scale(a, kN, 2.0f, s_);
    EXPECT_EQ(cudaMemcpyAsync(z, a, kBytes, cudaMemcpyDeviceToDevice, s_), cudaSuccess);
  });
  Free(a);
  float* b = Dev(smaller);
  {
    emu::ExpectWarnings w;
    EXPECT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    EXPECT_EQ(w.Count(), 2);
    EXPECT_TRUE(w.Saw("graph node 0 (kernel ScaleKernel): argument 0"));
    EXPECT_TRUE(w.Saw("graph node 1 (cudaMemcpyAsync): src"));
    if (b == a) {
      EXPECT_TRUE(w.Saw("in another allocation than at capture"));
    }
  }
  EXPECT_EQ(Host(b), Filled(1.0f));
  EXPECT_EQ(Host(z), Filled(0.0f));
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

TEST_F(EmuGraph, DestroyedGraphsAreReported) {
  float* x = Dev(Filled(1.0f));
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  Scale(x, kN, 2.0f, s_);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s_, &g), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  emu::ExpectWarnings w;
  EXPECT_EQ(cudaGraphDestroy(g), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphLaunch(exec, s_), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaErrorInvalidValue);
  EXPECT_EQ(w.Count(), 4);
  cudaGetLastError();
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(Host(x), Filled(1.0f));
}

}  // namespace
}  // namespace lockstep::cuda
