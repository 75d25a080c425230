// Hot-path trace events: a timestamp and a small record stored into a fixed ring buffer, no I/O,
// no allocation, no lock. The engine marks layer boundaries with LOCKSTEP_TRACE; exports read the
// ring after the request (/trace/events).
//
// Cost (tests/bench/trace_bench.cpp): an enabled event is one CLOCK_MONOTONIC read (vDSO) plus a
// 16-byte store (goal <= 50 ns); a disabled site is one relaxed atomic load and a branch (goal
// <= 1 ns). Tracing is off unless a consumer enables it (TraceRing::Global().Enable()).
//
// Thread safety: one producer at a time (the engine's driver thread records; kernels running on
// pool workers do not). Snapshot() may run on any thread after the producer is done; it reads the
// last `capacity` events (older ones are overwritten, counted by dropped()).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/engine/clock.h"

namespace lockstep {

enum class TraceEventId : std::uint16_t {
  kLayerBegin = 1,  // a = global layer index, b = stage
  kLayerEnd = 2,
  kStageBegin = 3,  // a = stage, b = rows (T)
  kStageEnd = 4,
};

struct TraceEvent {
  std::int64_t t_ns;  // CLOCK_MONOTONIC
  std::uint16_t id;   // TraceEventId
  std::uint16_t b;
  std::int32_t a;
};
static_assert(sizeof(TraceEvent) == 16);

class TraceRing {
 public:
  explicit TraceRing(std::size_t capacity_pow2 = std::size_t{1} << 16);
  TraceRing(const TraceRing&) = delete;
  TraceRing& operator=(const TraceRing&) = delete;

  static TraceRing& Global();

  void Enable() { enabled_.store(true, std::memory_order_relaxed); }
  void Disable() { enabled_.store(false, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Records one event when enabled.
  inline void Record(TraceEventId id, std::int32_t a, std::uint16_t b) {
    if (!enabled_.load(std::memory_order_relaxed)) return;
    const std::int64_t t_ns = MonotonicNs();
    const std::uint64_t h = head_.load(std::memory_order_relaxed);
    buf_[h & mask_] = TraceEvent{t_ns, static_cast<std::uint16_t>(id), b, a};
    head_.store(h + 1, std::memory_order_release);
  }

  // Events recorded since the last Clear(), oldest first (at most capacity()).
  std::vector<TraceEvent> Snapshot() const;
  void Clear();
  std::size_t capacity() const { return mask_ + 1; }
  std::uint64_t recorded() const { return head_.load(std::memory_order_acquire) - start_; }
  std::uint64_t dropped() const;

 private:
  std::unique_ptr<TraceEvent[]> buf_;
  std::size_t mask_;
  std::atomic<std::uint64_t> head_{0};
  std::uint64_t start_ = 0;  // head at the last Clear()
  std::atomic<bool> enabled_{false};
};

}  // namespace lockstep

#define LOCKSTEP_TRACE(id, a, b) ::lockstep::TraceRing::Global().Record((id), (a), (b))
