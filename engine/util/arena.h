// Arena: scratch memory for kernels, reused across calls so the hot path does not allocate.
//
// Alloc() hands out 64-byte-aligned float buffers from large blocks; Scope releases everything
// allocated since it was opened. Blocks are kept for reuse, so after the first window of a given
// size no further allocation happens. Not thread-safe: one arena per driver thread; kernels
// allocate before they fan out to the pool.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace lockstep {

class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Uninitialised buffer of n floats, valid until the enclosing Scope closes.
  float* Alloc(std::size_t n);
  template <typename T>
  T* AllocAs(std::size_t n) {
    static_assert(sizeof(T) <= sizeof(float) * 16 && alignof(T) <= 64);
    return reinterpret_cast<T*>(Alloc((n * sizeof(T) + sizeof(float) - 1) / sizeof(float)));
  }
  std::size_t bytes_reserved() const;

  class Scope {
   public:
    explicit Scope(Arena& a) : a_(a), block_(a.block_), offset_(a.offset_) {}
    ~Scope() {
      a_.block_ = block_;
      a_.offset_ = offset_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Arena& a_;
    std::size_t block_;
    std::size_t offset_;
  };

 private:
  struct Block {
    std::unique_ptr<float[]> storage;
    float* base = nullptr;  // 64-byte aligned start inside storage
    std::size_t size = 0;   // usable floats from base
  };
  std::vector<Block> blocks_;
  std::size_t block_ = 0;   // current block index
  std::size_t offset_ = 0;  // floats used in the current block
};

}  // namespace lockstep
