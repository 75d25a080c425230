// Byte-level tokenizer for synthetic models, and token-file parsing.
// Text bytes map to ids 0..255; decoding renders ids >= 256 as "<id>".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

std::vector<std::int32_t> EncodeBytes(std::string_view text);
std::string DecodeTokens(const std::vector<std::int32_t>& ids);

// Parses whitespace- and/or comma-separated non-negative ids. Each id must be < n_vocab.
// Errors: kInvalidArgument naming the offending entry and its index.
Result<std::vector<std::int32_t>> ParseTokenList(std::string_view text, int n_vocab,
                                                 std::string_view label);

}  // namespace lockstep
