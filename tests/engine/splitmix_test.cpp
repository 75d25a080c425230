// SplitMix64 (splitmix.h) is the reference generator's output function: its values are part of
// every synthetic model and every seeded draw, so a changed constant must fail here first.
#include "lockstep/engine/splitmix.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace lockstep {
namespace {

TEST(SplitMix64, MatchesTheReferenceStream) {
  // Vigna's splitmix64.c from state 0: next() adds the increment, then mixes.
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(0x9e3779b97f4a7c15ull), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(SplitMix64(1), 0x910a2dec89025cc1ull);
  EXPECT_EQ(SplitMix64(~std::uint64_t{0}), 0xe4d971771b652c20ull);
}

}  // namespace
}  // namespace lockstep
