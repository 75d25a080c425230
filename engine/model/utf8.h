// UTF-8 helpers private to the tokenizers: validation, one code point at a time, and the
// replacement of invalid bytes by U+FFFD the way Rust's String::from_utf8_lossy does (one U+FFFD
// per maximal subpart of an ill-formed sequence, Unicode 15 section 3.9).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::utf8 {

// What starts at s[i]: a valid sequence (kValid, n its length), the prefix of one that the end of
// `s` cut (kIncomplete, n the bytes present) or a maximal ill-formed subpart (kInvalid, n >= 1).
enum class Kind { kValid, kIncomplete, kInvalid };
struct Step {
  Kind kind;
  std::size_t n;
  char32_t cp;  // the code point (kValid only)
};
Step Next(std::string_view s, std::size_t i);

// The offset of the first byte that does not start a valid sequence, or npos for valid UTF-8.
std::size_t FirstInvalid(std::string_view s);

// Appends `s` with every ill-formed (or, at the end, incomplete) subpart as U+FFFD.
void AppendLossy(std::string_view s, std::string& out);

}  // namespace lockstep::utf8
