#include "serve/auth.h"

#include <cctype>
#include <cstddef>

namespace lockstep {

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  // Every byte of `a` against b[i % |b|] (b's length leaks through neither the loop count nor an
  // early exit); the length difference is folded in at the end.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  if (b.empty()) return a.empty();
  for (std::size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i % b.size()]);
  // A volatile read keeps the compiler from short-circuiting the accumulated result.
  volatile unsigned char result = diff;
  return result == 0;
}

bool BearerAllowed(std::string_view header, const std::string& key) {
  if (key.empty()) return true;
  // The scheme is case-insensitive (RFC 9110 11.1: "bearer", "BEARER"), then one or more spaces.
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size()) return false;
  for (std::size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return false;
  std::size_t at = kScheme.size();
  if (header[at] != ' ') return false;
  while (at < header.size() && header[at] == ' ') ++at;
  return ConstantTimeEqual(header.substr(at), key);
}

}  // namespace lockstep
