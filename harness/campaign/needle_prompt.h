// Needle-in-a-haystack prompt sizes, shared by the plan parser (which refuses a spec that cannot
// hold its needles) and the generator (needle_prompt.cpp). Private to harness/.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep {

// Needle prompts: "The code of vault KK is NNNNN. " (31 bytes) and "What is the code of vault KK?"
// (29 bytes); vault numbers have two digits and codes five, so the sizes do not depend on the seed.
constexpr std::size_t kNeedleBytes = 31;
constexpr std::size_t kQuestionBytes = 29;
constexpr int kMinNeedleTokens = 64;
constexpr int kMaxNeedleTokens = 1 << 20;
constexpr int kMaxNeedles = 64;

inline std::int64_t NeedleMinTokens(std::int64_t needles) {
  return static_cast<std::int64_t>(kQuestionBytes) +
         needles * static_cast<std::int64_t>(kNeedleBytes);
}

}  // namespace lockstep
