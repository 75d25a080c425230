#include "lockstep/engine/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOCKSTEP_PAUSE() _mm_pause()
#else
#define LOCKSTEP_PAUSE() ((void)0)
#endif

namespace lockstep {

namespace {
// Spin iterations (a few microseconds) before a worker sleeps or the caller yields. Long spins
// win on an idle machine and lose badly when the cores are shared (CI runs tests in parallel),
// so the spin covers only the gap between back-to-back loops of one decode step.
constexpr int kSpinIters = 2000;
// After the spin a worker yields the core in a loop for this long before it sleeps: the serial
// work between two loops of a decode step (norms, x's rounding, routing) often outlasts the spin,
// and a sleeping worker's futex wake-up then cost more than the loop (quantised decode of `wide
// --layers 8` on 2 threads spent ~10% of a step waking its worker). Yielding gives the core to
// any other runnable thread, so a shared machine loses little.
constexpr auto kYieldFor = std::chrono::microseconds(1000);

// Range i of n items split into k contiguous parts (earlier parts get the remainder).
inline void RangeOf(std::size_t n, std::size_t k, std::size_t i, std::size_t* b, std::size_t* e) {
  std::size_t base = n / k, rem = n % k;
  *b = i * base + std::min(i, rem);
  *e = *b + base + (i < rem ? 1 : 0);
}
}  // namespace

int ThreadPool::HardwareThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads <= 0 ? HardwareThreads() : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(std::size_t n, const RangeFn& fn, std::size_t min_per_thread) {
  if (n == 0) return;
  std::size_t k =
      std::min<std::size_t>(static_cast<std::size_t>(n_threads_),
                            std::max<std::size_t>(1, n / std::max<std::size_t>(1, min_per_thread)));
  if (k <= 1 || in_parallel_.load(std::memory_order_relaxed)) {
    fn(0, n);
    return;
  }
  in_parallel_.store(true, std::memory_order_relaxed);
  fn_ = &fn;
  n_ = n;
  n_active_ = k;
  pending_.store(static_cast<int>(k) - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);  // pairs with the sleepers' predicate check
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_work_.notify_all();
  std::size_t b, e;
  RangeOf(n, k, 0, &b, &e);
  fn(b, e);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIters) {
      LOCKSTEP_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
  in_parallel_.store(false, std::memory_order_relaxed);
}

void ThreadPool::WorkerLoop(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    std::uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIters; ++spin) {
      LOCKSTEP_PAUSE();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      const auto until = std::chrono::steady_clock::now() + kYieldFor;
      do {
        std::this_thread::yield();
        g = generation_.load(std::memory_order_acquire);
      } while (g == seen && std::chrono::steady_clock::now() < until);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    if (static_cast<std::size_t>(index) < n_active_) {
      std::size_t b, e;
      RangeOf(n_, n_active_, static_cast<std::size_t>(index), &b, &e);
      (*fn_)(b, e);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

}  // namespace lockstep
