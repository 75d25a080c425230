// A fixed-size pool of worker threads for data-parallel loops.
//
// ParallelFor(n, fn) splits [0, n) into `size()` contiguous ranges, in order, and runs
// fn(begin, end) for each: range 0 on the calling thread, the others on workers; it returns when
// all are done. The partition depends only on (n, size()), so a kernel whose items are computed
// independently of each other (the engine's rule: each output element is owned by one range and
// reduced in a fixed order) gives bitwise-identical results for any thread count.
//
// Thread safety: ParallelFor may be called from one thread at a time (the engine's driver);
// nested calls from inside fn run serially on the calling worker.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace lockstep {

class ThreadPool {
 public:
  // n_threads >= 1 (counting the calling thread); 0 means one per hardware thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  using RangeFn = std::function<void(std::size_t begin, std::size_t end)>;
  // Runs fn over [0, n) split into size() contiguous ranges; small n runs inline.
  // `min_per_thread` keeps tiny loops on one thread (dispatch costs ~microseconds).
  void ParallelFor(std::size_t n, const RangeFn& fn, std::size_t min_per_thread = 1);

  static int HardwareThreads();

 private:
  void WorkerLoop(int index);

  // Decode dispatches hundreds of small loops per token, so workers spin briefly on the
  // generation counter before sleeping on the condition variable (a futex round trip per loop
  // costs more than the loop on small models).
  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_;
  const RangeFn* fn_ = nullptr;               // published before generation_ is bumped
  std::size_t n_ = 0;                         // idem
  std::size_t n_active_ = 0;                  // ranges this round (<= n_threads_)
  std::atomic<std::uint64_t> generation_{0};  // bumped (under mu_) to start a round
  std::atomic<int> pending_{0};               // worker ranges not finished this round
  std::atomic<bool> stop_{false};
  std::atomic<bool> in_parallel_{false};
};

}  // namespace lockstep
