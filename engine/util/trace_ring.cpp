#include "lockstep/engine/trace_ring.h"

#include "util/check.h"

namespace lockstep {

TraceRing::TraceRing(std::size_t capacity_pow2)
    : buf_(new TraceEvent[capacity_pow2]), mask_(capacity_pow2 - 1) {
  LOCKSTEP_CHECK(capacity_pow2 >= 2 && (capacity_pow2 & mask_) == 0)
      << "capacity must be a power of two";
}

TraceRing& TraceRing::Global() {
  static TraceRing ring;
  return ring;
}

std::vector<TraceEvent> TraceRing::Snapshot() const {
  const std::uint64_t h = head_.load(std::memory_order_acquire);
  const std::uint64_t n = h - start_;
  const std::uint64_t keep = n < capacity() ? n : capacity();
  std::vector<TraceEvent> out;
  out.reserve(static_cast<std::size_t>(keep));
  for (std::uint64_t i = h - keep; i < h; ++i) out.push_back(buf_[i & mask_]);
  return out;
}

void TraceRing::Clear() { start_ = head_.load(std::memory_order_acquire); }

std::uint64_t TraceRing::dropped() const {
  const std::uint64_t n = recorded();
  return n > capacity() ? n - capacity() : 0;
}

}  // namespace lockstep
