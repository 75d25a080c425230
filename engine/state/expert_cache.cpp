#include "lockstep/engine/expert_cache.h"

#include <numeric>

#include "lockstep/engine/splitmix.h"

namespace lockstep {

namespace {}  // namespace

ExpertCache::ExpertCache(std::vector<int> layers, int n_experts, int n_resident,
                         std::uint64_t expert_bytes)
    : layers_(std::move(layers)),
      n_experts_(n_experts),
      n_resident_(n_resident),
      expert_bytes_(expert_bytes) {
  map_.assign(layers_.size() * static_cast<std::size_t>(n_experts_), 0);
  std::vector<int> perm(static_cast<std::size_t>(n_experts_));
  for (std::size_t il = 0; il < layers_.size(); ++il) {
    std::iota(perm.begin(), perm.end(), 0);
    std::uint64_t s =
        SplitMix64(static_cast<std::uint64_t>(layers_[il]) + 0x6c6f636b73746570ull);  // "lockstep"
    for (int i = n_experts_ - 1; i > 0; --i) {  // Fisher-Yates
      s = SplitMix64(s);
      int j = static_cast<int>(s % static_cast<std::uint64_t>(i + 1));
      std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
    }
    for (int i = 0; i < n_resident_; ++i)
      map_[il * static_cast<std::size_t>(n_experts_) +
           static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = 1;
  }
}

void ExpertCache::Record(int il, int expert, int n_tokens) {
  if (resident(il, expert)) {
    counters_.hits += static_cast<std::uint64_t>(n_tokens);
  } else {
    counters_.misses += static_cast<std::uint64_t>(n_tokens);
    counters_.bytes_fetched += expert_bytes_;  // fetched once per call, shared by its rows
    counters_.host_tokens += static_cast<std::uint64_t>(n_tokens);
  }
}

}  // namespace lockstep
