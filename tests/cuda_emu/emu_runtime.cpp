// CPU emulator of CUDA for tests (tests/cuda_emu): the runtime side. It replaces libcudart,
// cuBLAS and NCCL (this file defines the C API functions the CUDA backend calls, with the
// signatures of the toolkit's headers; the test binary is not linked with the real libraries), and
// runs the kernels that conv.py converted from engine/cuda/*.cu: every CUDA thread of a block is
// a fiber (cuda_emu.h), switched by a few lines of x86-64 assembly below. EMU_DEVICES emulated
// devices (default 4, as `--devices 0,1,2,3`; compute capability 9.0), all in this process's
// memory, with NCCL send / receive between them.
//
// What it checks (each problem is a failure of the running GoogleTest test, printed with
// "[EMU WARN]"; a deadlock aborts the process):
//   * pointer ranges: every pointer argument of a kernel launch is null or inside a live
//     cudaMalloc / cudaHostAlloc allocation; both sides of every cudaMemcpy* / cudaMemset* and
//     the operands of cublasSgemm lie entirely inside one allocation.
//   * launch shapes: block size 1..1024 (z <= 64), grid y/z <= 65535, no empty grid, the
//     kernel's __launch_bounds__, dynamic shared memory <= 48 KiB.
//   * copy kinds: cudaMemcpyHostToDevice / DeviceToHost / DeviceToDevice agree with where the
//     pointers live (pinned host memory counts as device-accessible).
//   * uninitialised memory: fresh cudaMalloc / cudaHostAlloc memory and each block's shared
//     memory are filled with EMU_FILL (0xFF: every float a NaN), so reads of never-written data
//     show up in the results instead of reading as zeros; freed memory is poisoned (0xEE) or,
//     for allocations of 2 MiB and more, unmapped (a stale pointer faults).
//   * synchronisation: with EMU_ASYNC=1/2 stream work is deferred, so a missing stream / event
//     wait shows up as wrong (or NaN) data; a cross-stream wait cycle is reported.
//   * deadlocks: threads of a block stuck at __syncthreads / a warp shuffle that not every thread
//     reaches; a shuffle reading an exited lane.
//   * handle lifetimes: use of destroyed streams, events, cuBLAS handles, graphs and graph execs;
//     cudaFree of a pointer that cudaMalloc did not return.
//   * devices: a kernel launched on a stream of another device than the current
//     one; a kernel argument in device memory of another device (no peer access is enabled, so
//     a GPU would fault), or in pinned memory allocated on another device without
//     cudaHostAllocPortable; an event recorded on a stream of another device than its own; NCCL
//     sends / receives that do not pair up within a group (a hang on GPUs), pair with another
//     size or type, use a stream or buffer of another device than their communicator's, or
//     are issued while a stream captures.
//   * CUDA graphs (stream capture): calls that are illegal while a stream captures (see
//     CaptureConflict: synchronisation, allocation, synchronous copies, pageable async copies and
//     event records on the capturing stream, waits on events recorded outside the capture, work on
//     the legacy stream) fail with CUDA's error and invalidate the capture; every replay re-checks
//     that each pointer a node uses is still in the allocation it was in at capture (RunGraph).
//
// What it cannot check:
//   * real concurrency between blocks (blocks run one after another, in order) and between
//     streams (work is serialised; only the schedules EMU_ASYNC produces are tried), so races
//     between blocks of one grid or inter-block communication through global memory are unseen.
//   * hardware races inside a block (threads run until they reach a barrier, in thread order),
//     warp-synchronous code without __syncwarp, memory-model / fence issues.
//   * out-of-bounds accesses inside a kernel (only launch arguments are range-checked).
//   * timing and performance (event times are host wall time; cudaEventElapsedTime is not a
//     measurement of the GPU), occupancy, register / shared-memory limits beyond the above.
//   * device math ulps: expf / sinf / cosf / log1pf are the host C library's, not CUDA's
//     (<= 2 ulp apart); everything IEEE-exact (+ - * / sqrtf) gives the GPU's bits, since the
//     kernels build with -ffp-contract=off here and --fmad=false under nvcc.
//   * cuBLAS (cublasSgemm is a plain triple loop with TF32 rounding of the inputs when asked),
//     NCCL beyond ncclCommInitAll / ncclSend / ncclRecv in groups (no collectives; a send and
//     its receive complete together, in stream order on both sides), several host threads using the
//     device at once (every API call takes one lock).
//   * graphs beyond one captured stream: the nodes are a chain in capture order, run in order
//     (no node-level concurrency, no cross-stream fork / join in a capture, no event nodes, no
//     cudaGraphExecUpdate or explicit graph building); a capture's thread is not tracked
//     (ThreadLocal counts as Global). Stale values a graph captured other than pointers (sizes,
//     positions passed by value) and pointers stored in device memory are not checked, nor a
//     captured buffer freed and allocated again with the same size at the same address (taken
//     for the same buffer).
//
// env: EMU_ASYNC  stream scheduling: 0 (default) immediate, every operation runs at the call;
//                 1 lazy, stream work runs only when something waits for it (stream / event /
//                 device synchronisation, a cross-stream wait being reached, cudaFree, a copy to
//                 pageable memory), exposing missing waits before reads; 2 random, each stream
//                 drawn eager (runs its work at once) or lazy from EMU_SEED, exposing producers
//                 that overwrite data a lazy consumer has not read yet.
// env: EMU_SEED   seed of the EMU_ASYNC=2 draws (default 1).
// env: EMU_FILL   fill byte of fresh allocations and shared memory (default 0xFF).
// env: EMU_STATS  when set: per-kernel launch counts and host time, allocation and graph totals
//                 at exit.
// env: EMU_DEVICE_MIB  device memory of each emulated GPU in MiB (default 81920): a cudaMalloc
//                 that would pass it fails with cudaErrorMemoryAllocation, as on a full device;
//                 cudaMemGetInfo reports it and what is left on the current device.
// env: EMU_DEVICES  emulated devices (default 4, at most 8).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#ifndef EMU_NO_GTEST
#include <gtest/gtest.h>
#endif
#include <nccl.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is x86-64 only"
#endif

namespace emu {
uint3 tIdx, bIdx;
dim3 bDim, gDim;
char* dyn_smem = nullptr;
std::uint64_t block_serial = 0;

// One lock around every API call: the emulator's state is global (the engine drives the device
// from one thread today; this keeps it correct if that changes).
static std::recursive_mutex g_mu;
#define EMU_API std::lock_guard<std::recursive_mutex> emu_api_lock(g_mu)

static int g_warnings = 0;
// While an emu::ExpectWarnings exists, findings are collected for it instead of failing the test.
static int g_expecting = 0;
static std::vector<std::string> g_expected;
__attribute__((format(printf, 1, 2))) static void Warn(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (g_expecting > 0) {
    g_expected.emplace_back(buf);
    std::fprintf(stderr, "[EMU WARN] (expected by the test) %s\n", buf);
    return;
  }
  ++g_warnings;
  std::fprintf(stderr, "[EMU WARN] %s\n", buf);
#ifdef EMU_NO_GTEST
  // The plugin build (LOCKSTEP_PLUGIN_DIR): no test to fail, so the process stops here; a finding
  // must never let a rehearsal pass.
  std::fprintf(stderr, "[EMU] aborting on the first finding (plugin build)\n");
  std::abort();
#else
  ADD_FAILURE() << "CUDA emulator: " << buf;
#endif
}
ExpectWarnings::ExpectWarnings() {
  EMU_API;
  ++g_expecting;
  first_ = g_expected.size();
}
ExpectWarnings::~ExpectWarnings() {
  EMU_API;
  if (--g_expecting == 0) g_expected.clear();
}
int ExpectWarnings::Count() const {
  EMU_API;
  return static_cast<int>(g_expected.size() - first_);
}
bool ExpectWarnings::Saw(const char* text) const {
  EMU_API;
  return std::any_of(g_expected.begin() + static_cast<std::ptrdiff_t>(first_), g_expected.end(),
                     [&](const std::string& m) { return m.find(text) != std::string::npos; });
}

static std::int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
static int AsyncLevel() {
  static const int v = [] {
    const char* e = std::getenv("EMU_ASYNC");
    return e ? std::atoi(e) : 0;
  }();
  return v;
}
static bool AsyncMode() { return AsyncLevel() != 0; }
static std::uint64_t Rand() {
  static std::uint64_t s = [] {
    const char* e = std::getenv("EMU_SEED");
    return e ? std::strtoull(e, nullptr, 0) : 1ull;
  }();
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 33;
}
int FillByte() {
  static const int v = [] {
    const char* e = std::getenv("EMU_FILL");
    return e ? static_cast<int>(std::strtol(e, nullptr, 0)) : 0xFF;
  }();
  return v;
}

// ---------------- allocations ----------------
enum class Kind { kDevice, kPinned };
struct Alloc {
  std::size_t size;
  Kind kind;
  int device = 0;         // the device current at the allocation
  bool portable = false;  // pinned: cudaHostAllocPortable (usable from every device)
};
static std::map<std::uintptr_t, Alloc> g_allocs;
static struct {
  long count = 0;
  std::size_t bytes = 0, live = 0, peak = 0, largest = 0;
} g_alloc_stats;
static constexpr int kMaxDevices = 8;
static std::size_t g_device_live[kMaxDevices] =
    {};  // bytes of live cudaMalloc allocations per device
static int DeviceCount() {
  static const int v = [] {
    const char* e = std::getenv("EMU_DEVICES");
    const int n = e ? std::atoi(e) : 4;
    return n < 1 ? 1 : n > kMaxDevices ? kMaxDevices : n;
  }();
  return v;
}
static thread_local int t_device = 0;  // cudaSetDevice's device, per host thread as in CUDA
static std::size_t DeviceBytes() {
  static const std::size_t v = [] {
    const char* e = std::getenv("EMU_DEVICE_MIB");
    const unsigned long long mib = e ? std::strtoull(e, nullptr, 0) : 81920ull;
    return static_cast<std::size_t>(mib) << 20;
  }();
  return v;
}
static void NoteAlloc(std::size_t n) {
  ++g_alloc_stats.count;
  g_alloc_stats.bytes += n;
  g_alloc_stats.live += n;
  g_alloc_stats.peak = std::max(g_alloc_stats.peak, g_alloc_stats.live);
  g_alloc_stats.largest = std::max(g_alloc_stats.largest, n);
}
// Host memory behind an allocation. Large ones are their own 2 MiB-aligned mappings with
// transparent huge pages requested: the engine allocates hundreds of MiB per stage (arena blocks,
// cuBLAS workspace) and filling them 4 KiB page by page costs more than the kernels; freeing one
// unmaps it, so a stale pointer faults.
static constexpr std::size_t kHuge = std::size_t{2} << 20;
static void* MemAlloc(std::size_t n, std::size_t align) {
  if (n < kHuge)
    return std::aligned_alloc(align, (std::max<std::size_t>(n, 1) + align - 1) & ~(align - 1));
  const std::size_t len = (n + kHuge - 1) & ~(kHuge - 1);
  void* m = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t start = (base + kHuge - 1) & ~std::uintptr_t{kHuge - 1};
  if (start > base) munmap(m, start - base);
  if (base + kHuge > start) munmap(reinterpret_cast<void*>(start + len), base + kHuge - start);
  void* p = reinterpret_cast<void*>(start);
  madvise(p, len, MADV_HUGEPAGE);  // best effort
  return p;
}
static void MemFree(void* p, std::size_t n) {
  if (n < kHuge) {
    std::memset(p, 0xEE, n);  // poison for anything still holding the pointer (until reused)
    std::free(p);
  } else {
    munmap(p, (n + kHuge - 1) & ~(kHuge - 1));
  }
}

// The allocation containing [p, p+n) (n may be 0: p may then be one past the end), and its start.
static const Alloc* Find(const void* p, std::size_t n, std::uintptr_t* base = nullptr) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  auto it = g_allocs.upper_bound(u);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  if (u + n > it->first + it->second.size) return nullptr;
  if (n == 0 && u > it->first + it->second.size) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

// The non-null pointer arguments of the launch being set up (CheckArgs), taken by the Launch
// that follows it at the launch site.
static thread_local std::vector<std::pair<int, const void*>> t_launch_ptrs;

void CheckPtr(const char* file, int line, const char* kern, int idx, const void* p) {
  EMU_API;
  if (p == nullptr) return;
  t_launch_ptrs.emplace_back(idx, p);
  if (!Find(p, 0))
    Warn("%s:%d launch of %s: argument %d (%p) is not device / mapped memory", file, line, kern,
         idx, p);
}

// ---------------- streams / events ----------------
// An operation captured into a CUDA graph: what the stream would have run, and the memory it uses.
struct Node {
  const char* kind;  // "kernel", "cudaMemcpyAsync", ...
  const char* name;  // the kernel's name; nullptr for the others
  std::function<void()> fn;
  struct Ref {
    const char* arg;  // "argument" (a kernel's, numbered by idx), "dst", "src", "A", ...
    int idx;          // the kernel argument's index; -1 for the others
    const void* p;
    std::size_t n;  // bytes used from p (0 for a kernel argument: only p itself is known)
    // The allocation holding [p, p + n) at capture: its start and size.
    std::uintptr_t base;
    std::size_t size;
  };
  std::vector<Ref> refs;
};
struct Capture {
  cudaStreamCaptureMode mode;
  bool invalidated = false;  // an illegal call during the capture: cudaStreamEndCapture fails
  std::vector<Node> nodes;   // a chain, in stream order
};
// cudaGraph_t and cudaGraphExec_t. An instantiation shares the graph's nodes (neither changes
// after capture; a launch in flight keeps them too). Kept (never freed) after destruction to
// catch later use.
using Nodes = std::shared_ptr<const std::vector<Node>>;
struct Graph {
  Nodes nodes;
  bool destroyed = false;
};
struct GraphExec {
  Nodes nodes;
  bool destroyed = false;
};
static struct { long captures = 0, launches = 0, nodes = 0; } g_graph_stats;

struct Stream {
  struct Op {
    std::uint64_t seq;
    std::function<void()> fn;
  };
  std::deque<Op> q;
  std::uint64_t next_seq = 1;
  bool flushing = false;
  bool destroyed = false;
  bool eager = false;
  unsigned flags = 0;
  int device = -1;  // the device current at creation; -1: the legacy stream (any device)
  std::unique_ptr<Capture> cap;  // from cudaStreamBeginCapture to cudaStreamEndCapture
};
struct Event {
  unsigned flags = 0;
  int device = 0;  // the device current at creation
  Stream* s = nullptr;
  std::uint64_t seq = 0;
  std::uint64_t gen = 0;
  bool recorded = false;
  bool completed = false;
  bool destroyed = false;
  int polls = 0;
  std::int64_t ns = 0;
};

static std::vector<Stream*> g_streams;  // never freed: later use of a destroyed one is reported
static Stream g_legacy;                 // the legacy default stream (stream 0)

static Stream* S(cudaStream_t s) { return s ? reinterpret_cast<Stream*>(s) : &g_legacy; }
// Runs s's queued work up to sequence number `upto`.
static void Flush(Stream* s, std::uint64_t upto) {
  if (s->q.empty() || s->q.front().seq > upto) return;
  if (s->flushing) {
    Warn("re-entrant flush of a stream (cyclic cross-stream wait: a deadlock on a GPU)");
    return;
  }
  s->flushing = true;
  while (!s->q.empty() && s->q.front().seq <= upto) {
    auto op = std::move(s->q.front());
    s->q.pop_front();
    op.fn();
  }
  s->flushing = false;
}
static void FlushAll() {
  for (Stream* s : g_streams) Flush(s, UINT64_MAX);
}
// Work on the legacy default stream waits for all blocking streams (created without
// cudaStreamNonBlocking); it runs at once, so later work of those streams follows it.
static void FlushBlocking() {
  for (Stream* s : g_streams)
    if (!(s->flags & cudaStreamNonBlocking)) Flush(s, UINT64_MAX);
}
static std::uint64_t Enqueue(Stream* s, std::function<void()> fn) {
  const std::uint64_t seq = s->next_seq++;
  if (s == &g_legacy) {
    FlushBlocking();
    fn();
  } else if (!AsyncMode()) {
    fn();
  } else {
    s->q.push_back({seq, std::move(fn)});
    // EMU_ASYNC=2: an eager stream runs its work at once (its waits included); a lazy one on
    // demand. Eager producers + lazy consumers expose missing write-after-read waits.
    if (AsyncLevel() == 2 && s->eager && !s->flushing) Flush(s, UINT64_MAX);
  }
  return seq;
}

// Calls that are illegal while streams capture: the call fails with CUDA's error, and the
// captures it conflicts with are invalidated (their cudaStreamEndCapture fails, as in CUDA):
//   kOwn     the capture of stream s itself, in any mode (synchronising the capturing stream, an
//            operation on it that cannot be captured).
//   kUnsafe  captures in Global / ThreadLocal mode: CUDA's "potentially unsafe" calls
//            (allocating, freeing, synchronising other streams or events); Relaxed allows them.
//            One lock serialises every caller, so ThreadLocal counts as Global.
//   kDevice  every capture (cudaDeviceSynchronize).
//   kLegacy  work on, or synchronisation of, the legacy default stream: it would wait for the
//            blocking capturing streams (cudaErrorStreamCaptureImplicit), and is unsafe for
//            Global / ThreadLocal captures of the others.
enum class Conflict { kOwn, kUnsafe, kDevice, kLegacy };
static cudaError_t CaptureConflict(Conflict c, const Stream* s, const std::string& what) {
  cudaError_t e = cudaSuccess;
  for (Stream* t : g_streams) {
    if (!t->cap) continue;
    const bool strict = t->cap->mode != cudaStreamCaptureModeRelaxed;
    const bool blocking = !(t->flags & cudaStreamNonBlocking);
    bool hit = false;
    switch (c) {
      case Conflict::kOwn:
        hit = t == s;
        break;
      case Conflict::kUnsafe:
        hit = strict;
        break;
      case Conflict::kDevice:
        hit = true;
        break;
      case Conflict::kLegacy:
        hit = blocking || strict;
        break;
    }
    if (!hit) continue;
    t->cap->invalidated = true;
    if (e != cudaErrorStreamCaptureImplicit)
      e = c == Conflict::kLegacy && blocking ? cudaErrorStreamCaptureImplicit
                                             : cudaErrorStreamCaptureUnsupported;
  }
  if (e != cudaSuccess)
    Warn(
        "%s during a CUDA graph capture: %s; the capture is invalidated (cudaStreamEndCapture "
        "fails)",
        what.c_str(),
        e == cudaErrorStreamCaptureImplicit ? "cudaErrorStreamCaptureImplicit"
                                            : "cudaErrorStreamCaptureUnsupported");
  return e;
}
static cudaError_t LegacyConflict(const Stream* s, const char* what) {
  return s == &g_legacy ? CaptureConflict(Conflict::kLegacy, s,
                                          std::string(what) + " on the legacy default stream")
                        : cudaSuccess;
}

// Test-only (cuda_emu.h): captures made to fail on purpose.
static CaptureFault g_capture_fault = CaptureFault::kNone;
void InjectCaptureFault(CaptureFault f) {
  EMU_API;
  g_capture_fault = f;
}

// Stream work. While s captures it becomes a node (nothing runs: the closure holds its arguments
// by value, as the graph does), with the allocation of each pointer it uses for the replay
// check; otherwise it is queued / run (Enqueue).
static cudaError_t Submit(Stream* s, Node node) {
  if (!s->cap) {
    Enqueue(s, std::move(node.fn));
    return cudaSuccess;
  }
  // Work after a violation is dropped, as in CUDA (the violation itself was reported).
  if (s->cap->invalidated) return cudaErrorStreamCaptureInvalidated;
  if (g_capture_fault == CaptureFault::kDuring && s->cap->nodes.size() == 4) {
    s->cap->invalidated = true;  // injected: a refused operation, not a finding
    return cudaErrorStreamCaptureInvalidated;
  }
  // A pointer outside every allocation was reported at the call; it is not re-checked per replay.
  std::erase_if(node.refs, [](Node::Ref& r) {
    const Alloc* a = Find(r.p, r.n, &r.base);
    r.size = a ? a->size : 0;
    return a == nullptr;
  });
  s->cap->nodes.push_back(std::move(node));
  return cudaSuccess;
}

static std::string Describe(const Node& n) {
  return n.name ? std::string(n.kind) + " " + n.name : n.kind;
}
// A graph launch reached on its stream: the nodes in capture order. A graph holds addresses, so
// each pointer a node uses must still lie in the allocation it was in at capture (same start and
// size); a buffer freed or reallocated since is the classic stale-graph bug. Such a node is
// reported and skipped (it would touch freed memory; unmapped, for a large allocation). A buffer
// freed and allocated again with the same size at the same address passes: the graph is then
// right if it is the same buffer (the engine keys its graphs by address and size for that), and
// the emulator cannot tell it from another buffer that took the address.
static void RunGraph(const std::vector<Node>& nodes) {
  ++g_graph_stats.launches;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& nd = nodes[i];
    bool stale = false;
    for (const Node::Ref& r : nd.refs) {
      std::uintptr_t base = 0;
      const Alloc* a = Find(r.p, r.n, &base);
      if (a && base == r.base && a->size == r.size) continue;
      stale = true;
      const std::string arg = r.idx >= 0 ? std::string(r.arg) + " " + std::to_string(r.idx) : r.arg;
      Warn("graph node %zu (%s): %s (%p) is %s", i, Describe(nd).c_str(), arg.c_str(), r.p,
           a ? "in another allocation than at capture (its own was freed and the memory "
               "reallocated since)"
             : "no longer in a live allocation (freed / reallocated since capture)");
    }
    if (stale) continue;
    ++g_graph_stats.nodes;
    nd.fn();
  }
}

// ---------------- fibers ----------------
extern "C" void emu_switch(void** save_sp, void* to_sp);
// Saves the callee-saved registers on the current stack, stores its pointer to *save_sp,
// switches to to_sp and restores the registers saved there.
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");

struct Bar {
  int expected = 0, count = 0;
  unsigned gen = 0;
};
struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;
  bool done = false;
  std::uint64_t shuffles = 0;  // warp shuffles this thread has done in the current block
  uint3 tid{};
};
static constexpr std::size_t kStack = 256 * 1024;
// Each fiber's stack top is moved down by a different number of cache lines. Tops at the same
// offset in equally sized mmap'd stacks map to the same cache sets, so a block's fibers (up to
// 1024, each switched to once per barrier or shuffle) evicted each other's hot frames from
// L1 / L2 on every switch. Stagger(t) spreads the tops over 509 distinct line offsets (~100 KB).
static constexpr std::size_t kStaggerLine = 64 * 3 + 16;
static constexpr std::size_t Stagger(unsigned t) { return (t % 509) * kStaggerLine; }
static constexpr std::size_t kStackMapped = kStack + Stagger(508);
static std::vector<Fiber> g_fibers;
static Fiber* g_cur = nullptr;
static unsigned g_cur_idx = 0;
static void* g_sched_sp = nullptr;
static const std::function<void()>* g_body = nullptr;
static Bar g_block_bar;
static std::vector<Bar> g_warp_bar;
static std::vector<std::uint64_t> g_shfl, g_shfl_stamp;  // [warps][2][32]: value, writer's count
static std::uint64_t g_progress = 0;
static const char* g_kernel = "";

static void Yield() { emu_switch(&g_cur->sp, g_sched_sp); }
static void Wait(Bar& b) {
  const unsigned g = b.gen;
  ++g_progress;
  if (++b.count >= b.expected) {
    b.count = 0;
    ++b.gen;
    return;
  }
  while (b.gen == g) Yield();
}
// A thread exits: barriers stop waiting for it (as on sm_70+, where exited threads do not
// block __syncthreads).
static void Drop(Bar& b) {
  --b.expected;
  if (b.count > 0 && b.count >= b.expected) {
    b.count = 0;
    ++b.gen;
  }
}
void BlockSync() { Wait(g_block_bar); }
void WarpSync() { Wait(g_warp_bar[g_cur_idx / 32]); }
// Two exchange buffers per warp, used alternately: a lane can only write buffer b again two
// shuffles later, after every lane has passed the barrier of the shuffle in between (and so has
// read b), so one barrier per shuffle suffices. Each slot carries the writer's shuffle count: a
// source lane that exited or is in another shuffle (divergence) is reported.
std::uint64_t ShflRaw(std::uint64_t v, int off) {
  const unsigned w = g_cur_idx / 32, lane = g_cur_idx % 32;
  Fiber& me = g_fibers[g_cur_idx];
  const std::uint64_t n = me.shuffles++;
  const std::size_t base = (w * 2 + (n & 1)) * 32;
  g_shfl[base + lane] = v;
  g_shfl_stamp[base + lane] = n;
  Wait(g_warp_bar[w]);
  const unsigned src = lane ^ static_cast<unsigned>(off);
  if (src >= 32 || g_shfl_stamp[base + src] != n)
    Warn(
        "%s: shuffle of lane %u reads lane %u, which is not in the same shuffle (exited or "
        "diverged)",
        g_kernel, lane, src);
  return g_shfl[base + src % 32];
}
// [warps][2][kMaxGather][32]: value i of lane l at [i][l], so a lane reads the whole gather in
// one copy; the two halves alternate with the shuffles' parity (ShflRaw).
static std::vector<float> g_gather;
int WarpGather(const float* mine, int n, float* all) {
  if (n < 0 || n > kMaxGather) {
    std::fprintf(stderr, "[EMU FATAL] %s: WarpGather of %d values (at most %d)\n", g_kernel, n,
                 kMaxGather);
    std::abort();
  }
  const unsigned w = g_cur_idx / 32, lane = g_cur_idx % 32;
  Fiber& me = g_fibers[g_cur_idx];
  const std::uint64_t c = me.shuffles++;  // one count with the shuffles: they share the parity
  const std::size_t slot = w * 2 + (c & 1);
  float* buf = &g_gather[slot * kMaxGather * 32];
  for (int i = 0; i < n; ++i) buf[i * 32 + static_cast<int>(lane)] = mine[i];
  g_shfl_stamp[slot * 32 + lane] = c;
  Wait(g_warp_bar[w]);
  for (unsigned l = 0; l < 32; ++l)
    if (g_shfl_stamp[slot * 32 + l] != c)
      Warn(
          "%s: warp collective of lane %u reads lane %u, which is not in the same collective "
          "(exited or diverged)",
          g_kernel, lane, l);
  std::memcpy(all, buf, static_cast<std::size_t>(n) * 32 * sizeof(float));
  return static_cast<int>(lane);
}
[[noreturn]] static void FiberMain() {
  (*g_body)();
  g_cur->done = true;
  ++g_progress;
  Drop(g_block_bar);
  Drop(g_warp_bar[g_cur_idx / 32]);
  emu_switch(&g_cur->sp, g_sched_sp);
  std::abort();  // never resumed
}

static void RunGrid(dim3 grid, dim3 block, std::size_t smem, const char* name,
                    const std::function<void()>& body) {
  const unsigned nt = block.x * block.y * block.z;
  const unsigned nw = (nt + 31) / 32;
  while (g_fibers.size() < nt) {
    Fiber f;
    void* m = mmap(nullptr, kStackMapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) std::abort();
    mprotect(m, 4096, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
    f.stack = static_cast<char*>(m);
    g_fibers.push_back(f);
  }
  g_warp_bar.assign(nw, Bar{});
  g_shfl.assign(nw * 2 * 32, 0);
  g_shfl_stamp.resize(nw * 2 * 32);
  g_gather.resize(nw * 2 * 32 * kMaxGather);
  std::vector<char> sm(smem + 16);
  bDim = block;
  gDim = grid;
  g_body = &body;
  g_kernel = name;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::memset(sm.data(), FillByte(), sm.size());  // uninitialised shared memory
        dyn_smem = sm.data();
        ++block_serial;  // static __shared__ variables re-poison (cuda_emu.h SharedSlot)
        bIdx = uint3{bx, by, bz};
        std::fill(g_shfl_stamp.begin(), g_shfl_stamp.end(), UINT64_MAX);
        g_block_bar = Bar{static_cast<int>(nt), 0, 0};
        for (unsigned w = 0; w < nw; ++w)
          g_warp_bar[w] = Bar{static_cast<int>(std::min(32u, nt - 32 * w)), 0, 0};
        for (unsigned t = 0; t < nt; ++t) {
          Fiber& f = g_fibers[t];
          f.done = false;
          f.shuffles = 0;
          f.tid = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
          auto top = reinterpret_cast<std::uintptr_t>(f.stack + kStackMapped - Stagger(t)) &
                     ~std::uintptr_t{15};
          auto* w = reinterpret_cast<void**>(top);
          w[-1] = nullptr;                               // FiberMain's (never used) return address
          w[-2] = reinterpret_cast<void*>(&FiberMain);   // where emu_switch's `ret` goes
          for (int i = 3; i <= 8; ++i) w[-i] = nullptr;  // rbp rbx r12..r15
          f.sp = &w[-8];
        }
        unsigned alive = nt;
        while (alive > 0) {
          const std::uint64_t before = g_progress;
          alive = 0;
          for (unsigned t = 0; t < nt; ++t) {
            Fiber& f = g_fibers[t];
            if (f.done) continue;
            g_cur = &f;
            g_cur_idx = t;
            tIdx = f.tid;
            emu_switch(&g_sched_sp, f.sp);
            if (!f.done) ++alive;
          }
          if (alive > 0 && g_progress == before) {
            std::fprintf(
                stderr,
                "[EMU FATAL] %s: deadlock in block (%u,%u,%u): %u threads stuck at barriers\n",
                name, bx, by, bz, alive);
            std::abort();
          }
        }
      }
  dyn_smem = nullptr;
}

static thread_local cudaError_t g_last = cudaSuccess;
static cudaError_t Err(cudaError_t e) {
  if (e != cudaSuccess) g_last = e;
  return e;
}

struct KStat {
  long launches = 0;
  std::int64_t ns = 0;
};
static std::map<std::string, KStat> g_kstats;
static void AddStat(const char* name, std::int64_t ns) {
  KStat& k = g_kstats[name];
  ++k.launches;
  k.ns += ns;
}
long KernelsRun() {
  long n = 0;
  for (const auto& [name, k] : g_kstats)
    if (name != "cublasSgemm") n += k.launches;
  return n;
}
static struct Reporter {
  ~Reporter() {
    if (std::getenv("EMU_STATS")) {
      for (auto& [k, v] : g_kstats)
        std::fprintf(stderr, "[EMU STAT] %-40s %8ld launches %10.1f ms\n", k.c_str(), v.launches,
                     static_cast<double>(v.ns) / 1e6);
      std::fprintf(
          stderr,
          "[EMU STAT] %ld allocations, %.1f MiB in all, peak %.1f MiB live, largest %.1f MiB\n",
          g_alloc_stats.count, static_cast<double>(g_alloc_stats.bytes) / 1048576.0,
          static_cast<double>(g_alloc_stats.peak) / 1048576.0,
          static_cast<double>(g_alloc_stats.largest) / 1048576.0);
      std::fprintf(stderr,
                   "[EMU STAT] %ld graph captures, %ld graph launches run, %ld graph nodes run\n",
                   g_graph_stats.captures, g_graph_stats.launches, g_graph_stats.nodes);
    }
    if (g_warnings > 0 || std::getenv("EMU_STATS"))
      std::fprintf(stderr, "[EMU] %d warnings\n", g_warnings);
  }
} g_reporter;

void Launch(dim3 grid, dim3 block, std::size_t smem, cudaStream_t s, unsigned max_threads,
            const char* name, std::function<void()> body) {
  EMU_API;
  std::vector<std::pair<int, const void*>> ptrs;
  ptrs.swap(t_launch_ptrs);  // this launch's pointer arguments (CheckPtr)
  const unsigned long long nt = 1ull * block.x * block.y * block.z;
  if (nt == 0 || nt > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    Warn("launch of %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)", name, grid.x,
         grid.y, grid.z, block.x, block.y, block.z);
    Err(cudaErrorInvalidConfiguration);
    return;
  }
  if (max_threads != 0 && nt > max_threads) {
    Warn("launch of %s: %llu threads per block > __launch_bounds__(%u)", name, nt, max_threads);
    Err(cudaErrorLaunchOutOfResources);
    return;
  }
  if (smem > 48 * 1024) {
    Warn("launch of %s: %zu bytes of dynamic shared memory (> 48 KiB without cudaFuncSetAttribute)",
         name, smem);
    Err(cudaErrorInvalidValue);
    return;
  }
  Stream* st = S(s);
  if (st->destroyed) {
    Warn("launch of %s on a destroyed stream", name);
    Err(cudaErrorInvalidResourceHandle);
    return;
  }
  if (Err(LegacyConflict(st, name)) != cudaSuccess) return;
  const int dev = st->device >= 0 ? st->device : t_device;
  if (dev != t_device) {
    Warn("launch of %s on a stream of device %d while device %d is current", name, dev, t_device);
    Err(cudaErrorInvalidResourceHandle);
    return;
  }
  for (const auto& [i, p] : ptrs) {
    const Alloc* a = Find(p, 0);
    if (a == nullptr || a->device == dev || (a->kind == Kind::kPinned && a->portable)) continue;
    Warn(
        "launch of %s on device %d: argument %d (%p) is %s of device %d (no peer access: a GPU "
        "would fault)",
        name, dev, i, p,
        a->kind == Kind::kDevice ? "device memory" : "pinned memory (not portable)", a->device);
  }
  auto run = [grid, block, smem, name, body = std::move(body)]() {
    const std::int64_t t0 = NowNs();
    RunGrid(grid, block, smem, name, body);
    AddStat(name, NowNs() - t0);
  };
  Node node{"kernel", name, std::move(run), {}};
  for (const auto& [i, p] : ptrs) node.refs.push_back({"argument", i, p, 0, 0, 0});
  Err(Submit(st, std::move(node)));
}

}  // namespace emu

using namespace emu;

// ---------------- CUDA runtime ----------------
extern "C" {

cudaError_t cudaGetDeviceCount(int* n) {
  *n = DeviceCount();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= DeviceCount()) return Err(cudaErrorInvalidDevice);
  t_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = t_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d < 0 || d >= DeviceCount()) return Err(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof(*p));
  std::snprintf(p->name, sizeof p->name, "%s", "CPU emulator (tests/cuda_emu)");
  p->totalGlobalMem = std::size_t{8} << 30;
  p->sharedMemPerBlock = 48 * 1024;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 1;
  p->unifiedAddressing = 1;
  p->canMapHostMemory = 1;
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error (emulated)";
    case cudaErrorInvalidValue:
      return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation:
      return "out of memory (emulated)";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument (emulated)";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch (emulated)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (emulated)";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle (emulated)";
    case cudaErrorNotReady:
      return "device not ready (emulated)";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected (emulated)";
    case cudaErrorIllegalState:
      return "the operation is not permitted in the current state (emulated)";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing (emulated)";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture (emulated)";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream (emulated)";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream "
             "(emulated)";
    default:
      return "unknown error (emulated)";
  }
}
const char* cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }
cudaError_t cudaGetLastError() {
  const cudaError_t e = g_last;
  g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return g_last; }

cudaError_t cudaMalloc(void** p, size_t n) {
  EMU_API;
  if (cudaError_t e = CaptureConflict(Conflict::kUnsafe, nullptr, "cudaMalloc")) return Err(e);
  if (n == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  if (n > DeviceBytes() - g_device_live[t_device]) return Err(cudaErrorMemoryAllocation);
  void* m = MemAlloc(n, 256);
  if (!m) return Err(cudaErrorMemoryAllocation);
  std::memset(m, FillByte(), n);
  g_device_live[t_device] += n;
  g_allocs[reinterpret_cast<std::uintptr_t>(m)] = {n, Kind::kDevice, t_device, false};
  NoteAlloc(n);
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  EMU_API;
  if (!p) return cudaSuccess;
  if (cudaError_t e = CaptureConflict(Conflict::kUnsafe, nullptr, "cudaFree")) return Err(e);
  FlushAll();  // cudaFree synchronises the device
  auto it = g_allocs.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == g_allocs.end() || it->second.kind != Kind::kDevice) {
    Warn("cudaFree(%p): not a cudaMalloc pointer", p);
    return Err(cudaErrorInvalidValue);
  }
  g_alloc_stats.live -= it->second.size;
  g_device_live[it->second.device] -= it->second.size;
  MemFree(p, it->second.size);
  g_allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  EMU_API;
  *total_bytes = DeviceBytes();
  *free_bytes = DeviceBytes() - g_device_live[t_device];
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int flags) {
  EMU_API;
  if (cudaError_t e = CaptureConflict(Conflict::kUnsafe, nullptr, "cudaHostAlloc")) return Err(e);
  void* m = MemAlloc(n, 4096);
  if (!m) return Err(cudaErrorMemoryAllocation);
  std::memset(m, FillByte(), n);
  g_allocs[reinterpret_cast<std::uintptr_t>(m)] = {n, Kind::kPinned, t_device,
                                                   (flags & cudaHostAllocPortable) != 0};
  NoteAlloc(n);
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t n) { return cudaHostAlloc(p, n, 0); }
cudaError_t cudaFreeHost(void* p) {
  EMU_API;
  if (!p) return cudaSuccess;
  if (cudaError_t e = CaptureConflict(Conflict::kUnsafe, nullptr, "cudaFreeHost")) return Err(e);
  FlushAll();
  auto it = g_allocs.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == g_allocs.end() || it->second.kind != Kind::kPinned) {
    Warn("cudaFreeHost(%p): not a cudaHostAlloc pointer", p);
    return Err(cudaErrorInvalidValue);
  }
  g_alloc_stats.live -= it->second.size;
  MemFree(p, it->second.size);
  g_allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned int flags) {
  EMU_API;
  const Alloc* a = Find(h, 0);
  if (flags != 0 || !a || a->kind != Kind::kPinned) {
    Warn("cudaHostGetDevicePointer(%p): not pinned memory", h);
    return Err(cudaErrorInvalidValue);
  }
  *d = h;  // unified addressing: the same address on both sides
  return cudaSuccess;
}

// Validates a copy; false (after a warning) when a side is not where `kind` says.
static bool CheckCopy(const char* fn, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return true;
  const Alloc* ad = Find(dst, n);
  const Alloc* as = Find(src, n);
  const bool dst_dev = ad != nullptr,
             src_dev = as != nullptr;  // pinned counts as device-accessible
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = dst_dev && (!as || as->kind == Kind::kPinned);
      break;
    case cudaMemcpyDeviceToHost:
      ok = src_dev && (!ad || ad->kind == Kind::kPinned);
      break;
    case cudaMemcpyDeviceToDevice:
      ok = dst_dev && src_dev;
      break;
    default:
      ok = true;  // HostToHost, Default: anything goes
  }
  if (!ok) {
    const bool d_in = Find(dst, 0) != nullptr, s_in = Find(src, 0) != nullptr;
    Warn(
        "%s(dst=%p%s, src=%p%s, %zu bytes, kind %d): a side is not in a valid allocation for this "
        "kind",
        fn, dst, dst_dev ? "" : (d_in ? " [OUT OF RANGE]" : " [host]"), src,
        src_dev ? "" : (s_in ? " [OUT OF RANGE]" : " [host]"), n, static_cast<int>(kind));
  }
  return ok;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  EMU_API;
  if (!CheckCopy("cudaMemcpy", dst, src, n, kind)) return Err(cudaErrorInvalidValue);
  if (cudaError_t e = LegacyConflict(&g_legacy, "cudaMemcpy")) return Err(e);
  // The legacy default stream: waits for blocking streams, not for cudaStreamNonBlocking ones.
  FlushBlocking();
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
  EMU_API;
  if (!CheckCopy("cudaMemcpyAsync", dst, src, n, kind)) return Err(cudaErrorInvalidValue);
  Stream* st = S(s);
  if (st->destroyed) {
    Warn("cudaMemcpyAsync on a destroyed stream");
    return Err(cudaErrorInvalidResourceHandle);
  }
  if (cudaError_t e = LegacyConflict(st, "cudaMemcpyAsync")) return Err(e);
  const bool src_pageable = Find(src, n) == nullptr, dst_pageable = Find(dst, n) == nullptr;
  if (st->cap && (src_pageable || dst_pageable))
    return Err(CaptureConflict(
        Conflict::kOwn, st, "cudaMemcpyAsync with a pageable host side on the capturing stream"));
  if (src_pageable && !dst_pageable) {
    // Pageable source: the data is staged at the call.
    std::vector<char> snap(static_cast<const char*>(src), static_cast<const char*>(src) + n);
    Enqueue(st, [dst, snap = std::move(snap)]() { std::memcpy(dst, snap.data(), snap.size()); });
  } else if (dst_pageable && !src_pageable) {
    // Pageable destination: synchronous.
    Flush(st, UINT64_MAX);
    std::memcpy(dst, src, n);
  } else {
    return Err(Submit(st, {"cudaMemcpyAsync",
                           nullptr,
                           [dst, src, n]() { std::memcpy(dst, src, n); },
                           {{"dst", -1, dst, n, 0, 0}, {"src", -1, src, n, 0, 0}}}));
  }
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t n) {
  EMU_API;
  if (n && !Find(p, n)) {
    Warn("cudaMemset(%p, %zu): not device memory", p, n);
    return Err(cudaErrorInvalidValue);
  }
  if (cudaError_t e = LegacyConflict(&g_legacy, "cudaMemset")) return Err(e);
  FlushBlocking();
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
  EMU_API;
  if (n && !Find(p, n)) {
    Warn("cudaMemsetAsync(%p, %zu): not device memory", p, n);
    return Err(cudaErrorInvalidValue);
  }
  Stream* st = S(s);
  if (cudaError_t e = LegacyConflict(st, "cudaMemsetAsync")) return Err(e);
  return Err(Submit(st, {"cudaMemsetAsync",
                         nullptr,
                         [p, v, n]() { std::memset(p, v, n); },
                         {{"dst", -1, p, n, 0, 0}}}));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  EMU_API;
  auto* st = new Stream;
  st->flags = flags;
  st->device = t_device;
  st->eager = Rand() % 2 == 0;
  g_streams.push_back(st);
  *s = reinterpret_cast<cudaStream_t>(st);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  EMU_API;
  Stream* st = S(s);
  if (st == &g_legacy || st->destroyed) {
    Warn("cudaStreamDestroy of an invalid / destroyed stream");
    return Err(cudaErrorInvalidResourceHandle);
  }
  Flush(st, UINT64_MAX);  // pending work still completes
  st->destroyed = true;   // kept (never freed) to catch later use
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  EMU_API;
  Stream* st = S(s);
  if (st->destroyed) {
    Warn("cudaStreamSynchronize on a destroyed stream");
    return Err(cudaErrorInvalidResourceHandle);
  }
  const cudaError_t e =
      st->cap ? CaptureConflict(Conflict::kOwn, st, "cudaStreamSynchronize of the capturing stream")
      : st == &g_legacy ? LegacyConflict(st, "cudaStreamSynchronize")
                        : CaptureConflict(Conflict::kUnsafe, st, "cudaStreamSynchronize");
  if (e != cudaSuccess) return Err(e);
  if (st == &g_legacy) FlushBlocking();
  Flush(st, UINT64_MAX);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  EMU_API;
  if (cudaError_t e = CaptureConflict(Conflict::kDevice, nullptr, "cudaDeviceSynchronize"))
    return Err(e);
  FlushAll();
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  EMU_API;
  auto* ev = new Event;
  ev->flags = flags;
  ev->device = t_device;
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  EMU_API;
  auto* ev = reinterpret_cast<Event*>(e);
  if (!ev || ev->destroyed) {
    Warn("cudaEventDestroy of an invalid / destroyed event");
    return Err(cudaErrorInvalidResourceHandle);
  }
  ev->destroyed = true;  // kept (never freed) to catch later use
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  EMU_API;
  auto* ev = reinterpret_cast<Event*>(e);
  Stream* st = S(s);
  if (!ev || ev->destroyed || st->destroyed) {
    Warn("cudaEventRecord with a destroyed event or stream");
    return Err(cudaErrorInvalidResourceHandle);
  }
  if (cudaError_t err = LegacyConflict(st, "cudaEventRecord")) return Err(err);
  if (st->device >= 0 && st->device != ev->device) {
    Warn("cudaEventRecord of an event of device %d on a stream of device %d", ev->device,
         st->device);
    return Err(cudaErrorInvalidResourceHandle);
  }
  // CUDA would capture the record as an event node; the emulator refuses it: the engine's events
  // (timings, hand-offs between streams) must stay out of its graphs.
  if (st->cap)
    return Err(CaptureConflict(Conflict::kOwn, st,
                               "cudaEventRecord on the capturing stream (no events in graphs)"));
  const std::uint64_t gen = ++ev->gen;
  ev->recorded = true;
  ev->completed = false;
  ev->polls = 0;
  ev->s = st;
  ev->seq = Enqueue(st, [ev, gen]() {
    if (ev->gen != gen) return;  // re-recorded since: the later record decides
    ev->ns = NowNs();
    ev->completed = true;
  });
  return cudaSuccess;
}
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int) {
  return cudaEventRecord(e, s);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  EMU_API;
  auto* ev = reinterpret_cast<Event*>(e);
  if (!ev || ev->destroyed) {
    Warn("cudaEventSynchronize on a destroyed event");
    return Err(cudaErrorInvalidResourceHandle);
  }
  if (cudaError_t err = CaptureConflict(Conflict::kUnsafe, nullptr, "cudaEventSynchronize"))
    return Err(err);
  if (ev->recorded) Flush(ev->s, ev->seq);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  EMU_API;
  auto* ev = reinterpret_cast<Event*>(e);
  if (!ev || ev->destroyed) {
    Warn("cudaEventQuery on a destroyed event");
    return Err(cudaErrorInvalidResourceHandle);
  }
  // Lazy streams make progress when polled: the first query of a pending record says not
  // ready, the next one completes it (a polling loop ends, as on a GPU).
  if (ev->recorded && !ev->completed && ev->polls++ > 0) Flush(ev->s, ev->seq);
  return !ev->recorded || ev->completed ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  EMU_API;
  auto* ea = reinterpret_cast<Event*>(a);
  auto* eb = reinterpret_cast<Event*>(b);
  if (!ea || !eb || ea->destroyed || eb->destroyed) {
    Warn("cudaEventElapsedTime with a destroyed event");
    return Err(cudaErrorInvalidResourceHandle);
  }
  if ((ea->flags & cudaEventDisableTiming) || (eb->flags & cudaEventDisableTiming))
    return Err(cudaErrorInvalidResourceHandle);
  if (!ea->recorded || !eb->recorded) return Err(cudaErrorInvalidResourceHandle);
  if (!ea->completed || !eb->completed) return Err(cudaErrorNotReady);
  *ms = static_cast<float>(static_cast<double>(eb->ns - ea->ns) / 1e6);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  EMU_API;
  (void)flags;
  auto* ev = reinterpret_cast<Event*>(e);
  Stream* st = S(s);
  if (!ev || ev->destroyed || st->destroyed) {
    Warn("cudaStreamWaitEvent with a destroyed event or stream");
    return Err(cudaErrorInvalidResourceHandle);
  }
  if (cudaError_t err = LegacyConflict(st, "cudaStreamWaitEvent")) return Err(err);
  if (!ev->recorded) return cudaSuccess;  // never recorded: a no-op, as in CUDA
  if (st->cap) {
    // Records on capturing streams are refused (cudaEventRecord), so the event marks work outside
    // this capture: a dependency a graph cannot hold.
    st->cap->invalidated = true;
    Warn(
        "cudaStreamWaitEvent on the capturing stream for an event recorded outside the capture: "
        "cudaErrorStreamCaptureIsolation; the capture is invalidated (cudaStreamEndCapture fails)");
    return Err(cudaErrorStreamCaptureIsolation);
  }
  Stream* es = ev->s;
  const std::uint64_t seq = ev->seq;
  if (es == st) return cudaSuccess;
  Enqueue(st, [es, seq]() { Flush(es, seq); });
  return cudaSuccess;
}

// ---------------- CUDA graphs (stream capture) ----------------
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  EMU_API;
  Stream* st = S(s);
  if (st == &g_legacy) {
    Warn("cudaStreamBeginCapture on the legacy default stream");
    return Err(cudaErrorStreamCaptureUnsupported);
  }
  if (st->destroyed) {
    Warn("cudaStreamBeginCapture on a destroyed stream");
    return Err(cudaErrorInvalidResourceHandle);
  }
  if (st->cap) {
    Warn("cudaStreamBeginCapture on a stream that already captures");
    return Err(cudaErrorIllegalState);
  }
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return Err(cudaErrorInvalidValue);
  if (g_capture_fault == CaptureFault::kBegin)
    return Err(cudaErrorStreamCaptureUnsupported);  // injected
  // Work queued before stays queued (and runs before the graph's later launches); nothing runs.
  st->cap = std::make_unique<Capture>();
  st->cap->mode = mode;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  EMU_API;
  Stream* st = S(s);
  *graph = nullptr;
  if (!st->cap) {
    Warn("cudaStreamEndCapture on a stream that does not capture");
    return Err(cudaErrorIllegalState);
  }
  const std::unique_ptr<Capture> cap = std::move(st->cap);
  if (cap->invalidated) return Err(cudaErrorStreamCaptureInvalidated);  // reported at the violation
  ++g_graph_stats.captures;
  *graph = reinterpret_cast<cudaGraph_t>(
      new Graph{std::make_shared<const std::vector<Node>>(std::move(cap->nodes))});
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  EMU_API;
  Stream* st = S(s);
  if (st->destroyed) {
    Warn("cudaStreamIsCapturing on a destroyed stream");
    return Err(cudaErrorInvalidResourceHandle);
  }
  *status = !st->cap               ? cudaStreamCaptureStatusNone
            : st->cap->invalidated ? cudaStreamCaptureStatusInvalidated
                                   : cudaStreamCaptureStatusActive;
  // The legacy stream is unusable while a blocking stream captures (the query does not invalidate).
  if (st == &g_legacy)
    for (const Stream* t : g_streams)
      if (t->cap && !(t->flags & cudaStreamNonBlocking)) return Err(cudaErrorStreamCaptureImplicit);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  EMU_API;
  // The flags (upload, auto-free, node priorities) change nothing for a chain run on the host.
  (void)flags;
  auto* g = reinterpret_cast<Graph*>(graph);
  if (!g || g->destroyed) {
    Warn("cudaGraphInstantiate of a null / destroyed graph");
    return Err(cudaErrorInvalidValue);
  }
  if (g_capture_fault == CaptureFault::kInstantiate) return Err(cudaErrorNotSupported);  // injected
  *exec = reinterpret_cast<cudaGraphExec_t>(new GraphExec{g->nodes});
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                          unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  EMU_API;
  auto* ge = reinterpret_cast<GraphExec*>(exec);
  Stream* st = S(s);
  if (!ge || ge->destroyed) {
    Warn("cudaGraphLaunch of a null / destroyed graph exec");
    return Err(cudaErrorInvalidValue);
  }
  if (st->destroyed) {
    Warn("cudaGraphLaunch on a destroyed stream");
    return Err(cudaErrorInvalidResourceHandle);
  }
  if (cudaError_t e = LegacyConflict(st, "cudaGraphLaunch")) return Err(e);
  // One stream operation running every node (into a capture: one node, a child graph).
  return Err(
      Submit(st, {"cudaGraphLaunch", nullptr, [nodes = ge->nodes]() { RunGraph(*nodes); }, {}}));
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  EMU_API;
  auto* ge = reinterpret_cast<GraphExec*>(exec);
  if (!ge || ge->destroyed) {
    Warn("cudaGraphExecDestroy of a null / destroyed graph exec");
    return Err(cudaErrorInvalidValue);
  }
  ge->destroyed = true;
  ge->nodes.reset();  // launches still queued hold their own reference
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  EMU_API;
  auto* g = reinterpret_cast<Graph*>(graph);
  if (!g || g->destroyed) {
    Warn("cudaGraphDestroy of a null / destroyed graph");
    return Err(cudaErrorInvalidValue);
  }
  g->destroyed = true;
  g->nodes.reset();  // its instantiations hold their own reference
  return cudaSuccess;
}

}  // extern "C"

// ---------------- cuBLAS ----------------
struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  bool destroyed = false;
};

// f32 -> TF32 (10 mantissa bits), round to nearest, as the tensor cores take their inputs.
static float Tf32(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u += 0x1000u;
  u &= 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  EMU_API;
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  EMU_API;
  if (!h || h->destroyed) {
    Warn("cublasDestroy of an invalid / destroyed handle");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  h->destroyed = true;  // kept (never freed) to catch later use
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  EMU_API;
  if (!h || h->destroyed) {
    Warn("cublasSetStream on a destroyed handle");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void* ws, size_t bytes) {
  EMU_API;
  if (!h || h->destroyed) {
    Warn("cublasSetWorkspace on a destroyed handle");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  if (bytes > 0 && (!Find(ws, bytes) || reinterpret_cast<std::uintptr_t>(ws) % 256 != 0)) {
    Warn("cublasSetWorkspace: workspace %p (%zu bytes) is not 256-byte aligned device memory", ws,
         bytes);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  h->ws = ws;
  h->ws_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
  EMU_API;
  if (!h || h->destroyed) {
    Warn("cublasSetMathMode on a destroyed handle");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  h->math = m;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS (emulated)";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED (emulated)";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE (emulated)";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED (emulated)";
    default:
      return "CUBLAS_STATUS_? (emulated)";
  }
}
cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float* alpha, const float* A, int lda,
                              const float* B, int ldb, const float* beta, float* C, int ldc) {
  EMU_API;
  if (!h || h->destroyed) {
    Warn("cublasSgemm on a destroyed handle");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  const bool at = ta != CUBLAS_OP_N, bt = tb != CUBLAS_OP_N;
  const int a_rows = at ? k : m, a_cols = at ? m : k;  // as stored (column-major)
  const int b_rows = bt ? n : k, b_cols = bt ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
      ldc < std::max(1, m)) {
    Warn("cublasSgemm: invalid dims m=%d n=%d k=%d lda=%d ldb=%d ldc=%d (ta %d tb %d)", m, n, k,
         lda, ldb, ldc, static_cast<int>(ta), static_cast<int>(tb));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  auto span = [](int ld, int rows, int cols) {
    return (static_cast<std::size_t>(cols - 1) * static_cast<std::size_t>(ld) +
            static_cast<std::size_t>(rows)) *
           sizeof(float);
  };
  if (k > 0 && (!Find(A, span(lda, a_rows, a_cols)) || !Find(B, span(ldb, b_rows, b_cols))))
    Warn("cublasSgemm: A (%p) or B (%p) extends outside a device allocation",
         static_cast<const void*>(A), static_cast<const void*>(B));
  if (!Find(C, span(ldc, m, n)))
    Warn("cublasSgemm: C (%p) extends outside a device allocation", static_cast<void*>(C));
  const float al = *alpha, be = *beta;  // host pointer mode
  const bool tf32 = h->math == CUBLAS_TF32_TENSOR_OP_MATH;
  Stream* st = S(h->stream);
  if (LegacyConflict(st, "cublasSgemm") != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  auto run = [=]() {
    const std::int64_t t0 = NowNs();
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int l = 0; l < k; ++l) {
          float a = at ? A[static_cast<std::size_t>(i) * lda + l]
                       : A[static_cast<std::size_t>(l) * lda + i];
          float b = bt ? B[static_cast<std::size_t>(l) * ldb + j]
                       : B[static_cast<std::size_t>(j) * ldb + l];
          if (tf32) {
            a = Tf32(a);
            b = Tf32(b);
          }
          acc += a * b;
        }
        float& c = C[static_cast<std::size_t>(j) * ldc + i];
        c = be == 0.0f ? al * acc : al * acc + be * c;
      }
    AddStat("cublasSgemm", NowNs() - t0);
  };
  Node node{"cublasSgemm", nullptr, std::move(run), {{"C", -1, C, span(ldc, m, n), 0, 0}}};
  if (k > 0) {
    node.refs.push_back({"A", -1, A, span(lda, a_rows, a_cols), 0, 0});
    node.refs.push_back({"B", -1, B, span(ldb, b_rows, b_cols), 0, 0});
  }
  if (Submit(st, std::move(node)) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

// ---------------- NCCL (point-to-point between the emulated devices) ----------------
}  // extern "C"

// A communicator of ncclCommInitAll: rank `rank` of a clique of `n`, on `device`.
struct ncclComm {
  int rank = 0, n = 0, device = 0;
  std::uint64_t clique = 0;  // which ncclCommInitAll made it: ranks pair up within one
  bool destroyed = false;
};

namespace emu {
namespace {
struct P2p {
  bool send;
  void* buf;
  std::size_t count;
  ncclDataType_t type;
  int peer;
  ncclComm* comm;
  Stream* st;
};
std::vector<P2p> g_p2p;  // the sends / receives of the open group, in call order
int g_group_depth = 0;
std::uint64_t g_cliques = 0;

std::size_t NcclTypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

// One send and its receive: the receive's stream copies once the send's stream has reached the
// send, and the send's stream goes on only after that copy (so the sender may then reuse its
// buffer), as NCCL's point-to-point operations complete together.
void RunPair(const P2p& snd, const P2p& rcv) {
  const std::size_t bytes = snd.count * NcclTypeBytes(snd.type);
  Stream* a = snd.st;
  Stream* b = rcv.st;
  const std::uint64_t reached = Enqueue(a, [] {});
  void* dst = rcv.buf;
  const void* src = snd.buf;
  const std::uint64_t copied = Enqueue(b, [a, reached, dst, src, bytes] {
    Flush(a, reached);
    std::memcpy(dst, src, bytes);
  });
  Enqueue(a, [b, copied] { Flush(b, copied); });
}

ncclResult_t Queue(bool send, const void* buf, std::size_t count, ncclDataType_t type, int peer,
                   ncclComm_t comm, cudaStream_t s) {
  const char* fn = send ? "ncclSend" : "ncclRecv";
  if (comm == nullptr || comm->destroyed) {
    Warn("%s with a null / destroyed communicator", fn);
    return ncclInvalidArgument;
  }
  if (peer < 0 || peer >= comm->n || peer == comm->rank) {
    Warn("%s from rank %d to peer %d of %d", fn, comm->rank, peer, comm->n);
    return ncclInvalidArgument;
  }
  Stream* st = S(s);
  if (st->destroyed) {
    Warn("%s on a destroyed stream", fn);
    return ncclInvalidArgument;
  }
  if (st->cap) {
    Warn("%s on a capturing stream (the emulator does not capture NCCL operations)", fn);
    st->cap->invalidated = true;
    return ncclInvalidUsage;
  }
  const int sdev = st->device >= 0 ? st->device : t_device;
  if (sdev != comm->device)
    Warn("%s of rank %d (device %d) on a stream of device %d", fn, comm->rank, comm->device, sdev);
  const std::size_t bytes = count * NcclTypeBytes(type);
  if (bytes > 0) {
    const Alloc* a = Find(buf, bytes);
    if (a == nullptr)
      Warn("%s of rank %d: %zu bytes at %p are not inside one allocation", fn, comm->rank, bytes,
           buf);
    else if (a->kind == Kind::kDevice && a->device != comm->device)
      Warn("%s of rank %d (device %d): the buffer %p is device memory of device %d", fn, comm->rank,
           comm->device, buf, a->device);
  }
  g_p2p.push_back({send, const_cast<void*>(buf), count, type, peer, comm, st});
  return ncclSuccess;
}

// Pairs the group's sends with their receives (the k-th send from rank a to b with the k-th
// receive of b from a) and runs them; anything left unpaired would hang on GPUs.
ncclResult_t EndGroup() {
  std::vector<P2p> ops;
  ops.swap(g_p2p);
  std::vector<bool> used(ops.size(), false);
  ncclResult_t r = ncclSuccess;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].send) continue;
    const P2p& snd = ops[i];
    std::size_t j = 0;
    for (; j < ops.size(); ++j)
      if (!used[j] && !ops[j].send && ops[j].comm->clique == snd.comm->clique &&
          ops[j].comm->rank == snd.peer && ops[j].peer == snd.comm->rank)
        break;
    if (j == ops.size()) continue;  // reported below
    used[i] = used[j] = true;
    const P2p& rcv = ops[j];
    if (rcv.count != snd.count || rcv.type != snd.type) {
      Warn(
          "ncclSend of %zu elements (type %d) from rank %d met an ncclRecv of %zu (type %d) on "
          "rank %d",
          snd.count, static_cast<int>(snd.type), snd.comm->rank, rcv.count,
          static_cast<int>(rcv.type), rcv.comm->rank);
      r = ncclInvalidUsage;
      continue;
    }
    RunPair(snd, rcv);
  }
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (!used[i]) {
      Warn("%s of rank %d %s peer %d has no matching %s in its group (it would hang on GPUs)",
           ops[i].send ? "ncclSend" : "ncclRecv", ops[i].comm->rank, ops[i].send ? "to" : "from",
           ops[i].peer, ops[i].send ? "ncclRecv" : "ncclSend");
      r = ncclInvalidUsage;
    }
  return r;
}
}  // namespace
}  // namespace emu

extern "C" {
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error (emulated)";
    case ncclInvalidArgument:
      return "invalid argument (emulated)";
    case ncclInvalidUsage:
      return "invalid usage (emulated)";
    default:
      return "NCCL error (emulated)";
  }
}
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int n, const int* devs) {
  EMU_API;
  if (n < 1 || comms == nullptr) return ncclInvalidArgument;
  const std::uint64_t clique = ++g_cliques;
  for (int i = 0; i < n; ++i) {
    const int d = devs ? devs[i] : i;
    if (d < 0 || d >= DeviceCount()) return ncclInvalidArgument;
    for (int k = 0; k < i; ++k)
      if ((devs ? devs[k] : k) == d) return ncclInvalidUsage;  // one rank per device
  }
  for (int i = 0; i < n; ++i)
    comms[i] = new ncclComm{i, n, devs ? devs[i] : i, clique,
                            false};  // kept: use after destroy is reported
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  EMU_API;
  if (c == nullptr || c->destroyed) {
    Warn("ncclCommDestroy of a null / destroyed communicator");
    return ncclInvalidArgument;
  }
  c->destroyed = true;
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  EMU_API;
  ++g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  EMU_API;
  if (g_group_depth == 0) {
    Warn("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  return --g_group_depth == 0 ? EndGroup() : ncclSuccess;
}
// Outside a group an operation is a group of its own: a lone send or receive hangs on GPUs.
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t s) {
  EMU_API;
  const ncclResult_t r = Queue(true, buf, count, type, peer, comm, s);
  return r != ncclSuccess || g_group_depth > 0 ? r : EndGroup();
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t s) {
  EMU_API;
  const ncclResult_t r = Queue(false, buf, count, type, peer, comm, s);
  return r != ncclSuccess || g_group_depth > 0 ? r : EndGroup();
}
}  // extern "C"
