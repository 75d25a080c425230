#include "util/arena.h"

#include <algorithm>
#include <cstdint>

namespace lockstep {

namespace {
constexpr std::size_t kAlignFloats = 16;                       // 64 bytes
constexpr std::size_t kMinBlockFloats = std::size_t{1} << 20;  // 4 MiB
}  // namespace

float* Arena::Alloc(std::size_t n) {
  n = (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  if (n == 0) n = kAlignFloats;
  while (block_ < blocks_.size()) {
    Block& b = blocks_[block_];
    if (offset_ + n <= b.size) {
      float* p = b.base + offset_;
      offset_ += n;
      return p;
    }
    ++block_;
    offset_ = 0;
  }
  Block b;
  b.size = std::max(kMinBlockFloats, n);
  // new float[] is only 16-byte aligned; over-allocate so the base can be 64-byte aligned.
  b.storage.reset(new float[b.size + kAlignFloats]);
  auto addr = reinterpret_cast<std::uintptr_t>(b.storage.get());
  b.base = b.storage.get() + ((64 - addr % 64) % 64) / sizeof(float);
  blocks_.push_back(std::move(b));
  block_ = blocks_.size() - 1;
  offset_ = n;
  return blocks_.back().base;
}

std::size_t Arena::bytes_reserved() const {
  std::size_t s = 0;
  for (const auto& b : blocks_) s += b.size * sizeof(float);
  return s;
}

}  // namespace lockstep
