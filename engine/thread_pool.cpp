#include "lockstep/engine/thread_pool.h"

#include <algorithm>

namespace lockstep {

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
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
// Range i of n items split into k contiguous parts (earlier parts get the remainder).
inline void RangeOf(std::size_t n, std::size_t k, std::size_t i, std::size_t* b, std::size_t* e) {
  std::size_t base = n / k, rem = n % k;
  *b = i * base + std::min(i, rem);
  *e = *b + base + (i < rem ? 1 : 0);
}
}  // namespace

void ThreadPool::ParallelFor(std::size_t n, const RangeFn& fn, std::size_t min_per_thread) {
  if (n == 0) return;
  std::size_t k = std::min<std::size_t>(static_cast<std::size_t>(n_threads_),
                                        std::max<std::size_t>(1, n / std::max<std::size_t>(1, min_per_thread)));
  if (k <= 1 || in_parallel_.load(std::memory_order_relaxed)) {
    fn(0, n);
    return;
  }
  in_parallel_.store(true, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    n_active_ = k;
    pending_ = static_cast<int>(k) - 1;
    ++generation_;
  }
  cv_work_.notify_all();
  std::size_t b, e;
  RangeOf(n, k, 0, &b, &e);
  fn(b, e);
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }
  in_parallel_.store(false, std::memory_order_relaxed);
}

void ThreadPool::WorkerLoop(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    const RangeFn* fn;
    std::size_t n, k;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
      k = n_active_;
    }
    if (static_cast<std::size_t>(index) < k) {
      std::size_t b, e;
      RangeOf(n, k, static_cast<std::size_t>(index), &b, &e);
      (*fn)(b, e);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

}  // namespace lockstep
