#include "serve/json_body.h"

#include <string>

namespace lockstep {

// Nesting depth of `body` outside strings: nlohmann's parser is iterative, but a deep document
// costs memory and time for nothing a request needs; refused before parsing.
bool NestsDeeperThan(std::string_view body, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

std::optional<ApiError> CheckJsonBodyBytes(std::string_view body) {
  auto refuse = [](const std::string& why) {
    return ApiError::BadRequest("invalid JSON: " + why, "", "invalid_json");
  };
  if (body.starts_with("\xEF\xBB\xBF")) return refuse("the body starts with a byte-order mark");
  if (const auto nul = body.find('\0'); nul != std::string_view::npos)
    return refuse("a NUL byte at offset " + std::to_string(nul));
  if (NestsDeeperThan(body, 32)) return refuse("nested deeper than 32 levels");
  return std::nullopt;
}

}  // namespace lockstep
