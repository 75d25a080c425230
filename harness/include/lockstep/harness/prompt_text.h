// A text prompt as the model's token ids, and the tokenizer's record (`generate --json`,
// `tokenize --json`, a served export): what `lockstep generate`, the campaign runner, `lockstep
// serve` and `lockstep preflight` share, apart from the tokenize commands themselves.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/engine/tokenizer.h"

namespace lockstep {

// The ids of a text prompt (generate --prompt / --prompt-file) for a model of `n_vocab` ids.
// kInvalidArgument naming "prompt": text that is not valid UTF-8 (BPE), an id the model's
// vocabulary lacks, or (byte level) a vocabulary under 256.
Result<std::vector<std::int32_t>> EncodePromptText(const Tokenizer& tok, std::string_view text,
                                                   int n_vocab);

// {"type", "vocab_size", "sha256"}: sha256 of tokenizer.json, null for byte level.
// kIOError when the file cannot be read again.
Result<nlohmann::json> TokenizerJson(const Tokenizer& tok);

}  // namespace lockstep
