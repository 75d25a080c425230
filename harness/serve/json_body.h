// The JSON body of a request, read strictly before any field is looked at: one JSON object and
// nothing else. nlohmann's parser alone is laxer than that in two ways a client can lean on:
// it skips a UTF-8 byte-order mark, and it stops at a NUL byte, so `{...}\0junk` parses as
// `{...}`. Neither is JSON (RFC 8259 forbids a BOM in a networked document, and a raw NUL is
// valid nowhere), and a proxy that reads the same bytes differently would see another request.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <variant>

#include "serve/api_error.h"

namespace lockstep {

// True when `body` nests arrays / objects deeper than `limit` outside strings (refused before
// parsing: a deep document costs memory and time for nothing a request needs).
bool NestsDeeperThan(std::string_view body, int limit);

// The checks on the bytes before parsing: a 400 (invalid_json) for a byte-order mark, a NUL byte
// or nesting deeper than 32.
std::optional<ApiError> CheckJsonBodyBytes(std::string_view body);

// `body` as a JSON object (nlohmann::json or ordered_json), or a 400 (code invalid_json) naming
// why: CheckJsonBodyBytes, not JSON or not UTF-8, trailing bytes, or not an object.
template <class Json>
std::variant<Json, ApiError> ParseJsonObjectBody(std::string_view body) {
  if (auto e = CheckJsonBodyBytes(body)) return *e;
  // Parsed as one whole document: nlohmann refuses trailing bytes other than whitespace.
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return ApiError::BadRequest("invalid JSON (or not UTF-8)", "", "invalid_json");
  if (!j.is_object())
    return ApiError::BadRequest("the body must be a JSON object", "", "invalid_json");
  return j;
}

}  // namespace lockstep
