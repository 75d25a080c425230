// SplitMix64 finaliser: the one bit mixer every seeded structure in lockstep uses (the sampler's
// counter RNG, synthetic weights, expert residency permutations, the tests' random data). Its
// outputs are part of every golden export: changing a constant changes the synthetic models.
#pragma once

#include <cstdint>

namespace lockstep {

// The golden-ratio increment SplitMix64 adds to its state (2^64 / phi, odd).
inline constexpr std::uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;

// Steele, Lea and Flood's SplitMix64 step on state x: adds kSplitMix64Gamma, then mixes. A pure
// function, so a stream is SplitMix64(key ^ counter) or s = SplitMix64(s), as callers need.
inline std::uint64_t SplitMix64(std::uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace lockstep
