// Logical expert residency of one pipeline stage: which routed experts of each of its MoE layers
// count as "device resident", and hit / miss / byte counters for every routing decision.
//
// The map is logical (a host-side record, as in the seed issue), fixed at start: for each layer
// the resident set is the first `n_resident` experts of a permutation seeded by the global layer
// index, so every run of the same config gets the same map. A routed expert that is not resident
// counts as a miss and its weight bytes as fetched over PCIe.
//
// Thread safety: Record() is called from the stage's driver thread only; counters are plain.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep {

struct ExpertCounters {
  std::uint64_t hits = 0;           // routed (token, expert) pairs served by a resident expert
  std::uint64_t misses = 0;         // ... by a non-resident expert
  std::uint64_t bytes_fetched = 0;  // weight bytes of the misses
  std::uint64_t host_tokens = 0;    // token rows computed by non-resident experts
};

class ExpertCache {
 public:
  // `layers`: global indices of this stage's MoE layers; `expert_bytes`: bytes of one expert.
  ExpertCache(std::vector<int> layers, int n_experts, int n_resident, std::uint64_t expert_bytes);

  int n_layers() const { return static_cast<int>(layers_.size()); }
  int n_experts() const { return n_experts_; }
  int n_resident() const { return n_resident_; }
  const std::vector<int>& layers() const { return layers_; }
  // Residency map row for local layer index il: uint8 [n_experts], 1 = resident.
  const std::uint8_t* map(int il) const {
    return map_.data() + static_cast<std::size_t>(il) * static_cast<std::size_t>(n_experts_);
  }
  bool resident(int il, int expert) const { return map(il)[expert] != 0; }

  // Records that `n_tokens` rows were routed to `expert` in local layer `il`.
  void Record(int il, int expert, int n_tokens);
  const ExpertCounters& counters() const { return counters_; }

 private:
  std::vector<int> layers_;
  int n_experts_, n_resident_;
  std::uint64_t expert_bytes_;
  std::vector<std::uint8_t> map_;  // uint8 [n_layers, n_experts]
  ExpertCounters counters_;
};

}  // namespace lockstep
