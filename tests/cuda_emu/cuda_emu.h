// CPU emulation of the CUDA execution model: the kernel side (test only, never part of a
// product build). Included first by every kernel file that conv.py converts from
// engine/cuda/*.cu to host C++; the runtime side (libcudart / cuBLAS / NCCL replacement, the
// scheduler) is emu_runtime.cpp, which also documents what the emulator checks and what it
// cannot (README.md here has the summary).
//
// Model: a launch runs its blocks one after another on the calling OS thread; inside a block
// every CUDA thread is a fiber. __syncthreads() is a block barrier and each warp shuffle a warp
// barrier, so a kernel runs exactly the per-thread code it runs on a GPU (same expressions, same
// reduction orders), only sequentially. Shared memory is per block and poisoned at each block's
// start (EMU_FILL byte), like the uninitialised shared memory of a real block.
//
// What conv.py rewrites (nothing else is touched, so the kernel bodies are the real ones):
//   extern __shared__ T name[];   -> T* name = emu::DynSmem<T>();
//   __shared__ T name[N];         -> static T name[N]; + per-block poisoning (EMU_SHARED)
//   #pragma unroll                -> removed (host compilers warn about it)
//   kernel<<<grid, block, smem, stream>>>(args);
//                                 -> argument-pointer checks + emu::Launch(..., lambda)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

// The CUDA headers define the execution-space keywords as attributes nvcc understands; on the
// host they are nothing.
#undef __host__
#undef __device__
#undef __global__
#undef __shared__
#undef __launch_bounds__
#define __host__
#define __device__
#define __global__
#define __launch_bounds__(...)
// The kernel sources select their device-side helpers with __CUDACC__ (kernel_math.h) and their
// bit casts with __CUDA_ARCH__; the emulation takes the __CUDACC__ branches (warp helpers) and
// the host bit casts (memcpy).
#ifndef __CUDACC__
#define __CUDACC__ 1
#endif
// kernel_math.h's warp butterflies take their emulator form (emu::WarpGather) under this.
#define LOCKSTEP_CUDA_EMU 1

namespace emu {

// The executing thread's coordinates (set by the scheduler before each fiber switch).
extern uint3 tIdx, bIdx;
extern dim3 bDim, gDim;
// The running block's dynamic shared memory (poisoned at each block's start).
extern char* dyn_smem;
// Counts blocks started; a __shared__ variable is re-poisoned the first time a thread of a new
// block reaches its declaration.
extern std::uint64_t block_serial;
int FillByte();

template <class T>
inline T* DynSmem() {
  return reinterpret_cast<T*>(dyn_smem);
}

// One per converted __shared__ declaration (a function-local static beside the variable).
struct SharedSlot {
  std::uint64_t serial = 0;
  void Enter(void* p, std::size_t n) {
    if (serial != block_serial) {
      serial = block_serial;
      std::memset(p, FillByte(), n);
    }
  }
};

void BlockSync();
void WarpSync();
std::uint64_t ShflRaw(std::uint64_t v, int off);
// The warp collective behind kernel_math.h's butterflies on the emulator: this lane's n floats
// (n <= kMaxGather) go to the warp, one warp barrier, then all[i * 32 + l] = lane l's mine[i] for
// the 32 lanes; returns this lane's index. A lane missing from it (exited or diverged) is
// reported, like a shuffle from it.
constexpr int kMaxGather = 16;
int WarpGather(const float* mine, int n, float* all);
template <class T>
inline T Shfl(T v, int off) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  std::uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  u = ShflRaw(u, off);
  T r;
  std::memcpy(&r, &u, sizeof(T));
  return r;
}

// Queues (or runs) `body` for every thread of the grid on stream s. max_threads: the kernel's
// __launch_bounds__ (0: none); a larger block is a launch failure on a GPU, and here.
void Launch(dim3 grid, dim3 block, std::size_t smem, cudaStream_t s, unsigned max_threads,
            const char* name, std::function<void()> body);

// Launch-site check that every pointer argument is null or inside a live cudaMalloc /
// cudaHostAlloc allocation (host pointers passed to a kernel are a crash on a GPU). It also
// collects the non-null ones for the Launch that follows: a launch captured into a CUDA graph
// keeps them, and every replay re-checks them against the live allocations.
void CheckPtr(const char* file, int line, const char* kern, int idx, const void* p);
template <class T>
inline void CheckOne(const char* file, int line, const char* kern, int idx, const T& v) {
  if constexpr (std::is_pointer_v<T>)
    CheckPtr(file, line, kern, idx, reinterpret_cast<const void*>(v));
}
template <class... A>
inline void CheckArgs(const char* file, int line, const char* kern, const A&... a) {
  int i = 0;
  (CheckOne(file, line, kern, i++, a), ...);
}

// Test-only: while one exists, emulator findings are collected here instead of failing the
// running test, for tests that provoke a finding on purpose (emu_graph_test.cpp).
class ExpectWarnings {
 public:
  ExpectWarnings();
  ~ExpectWarnings();
  ExpectWarnings(const ExpectWarnings&) = delete;
  ExpectWarnings& operator=(const ExpectWarnings&) = delete;
  int Count() const;                 // findings since construction
  bool Saw(const char* text) const;  // whether one of them contains `text`

 private:
  std::size_t first_;
};

// Test-only fault injection: makes CUDA graph captures fail the way a driver can refuse them, to
// test a caller's fallback. kBegin: cudaStreamBeginCapture fails; kDuring: the capture's 5th
// operation is refused and invalidates it (cudaStreamEndCapture then fails); kInstantiate:
// cudaGraphInstantiate fails. None of these is reported as a finding.
enum class CaptureFault { kNone, kBegin, kDuring, kInstantiate };
void InjectCaptureFault(CaptureFault f);

// Kernels run so far in this process (eager launches and graph nodes alike; cuBLAS calls not
// counted): what a launch budget test measures.
long KernelsRun();

}  // namespace emu

#define threadIdx emu::tIdx
#define blockIdx emu::bIdx
#define blockDim emu::bDim
#define gridDim emu::gDim
#define __syncthreads() emu::BlockSync()
// Full-warp masks only, like the shuffles: a barrier of the warp's live lanes.
#define __syncwarp(...) emu::WarpSync()
// Full-warp masks only (every kernel here uses 0xffffffff); a shuffle from an exited lane warns.
#define __shfl_xor_sync(mask, v, off) emu::Shfl((v), (off))
