// `lockstep tokenize` and `lockstep detokenize`: the model's tokenizer (tokenizer.json beside
// the weights, else byte level: engine/include/lockstep/engine/tokenizer.h) for users checking
// their prompts, and the tokenizer's record in `generate --json`.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/engine/tokenizer.h"

namespace lockstep {

struct TokenizeOptions {
  std::string model;  // the model folder (its tokenizer.json, or byte level without one)
  std::string text;   // TEXT, or
  std::string file;   // --file F: the file's bytes
  std::string json;   // --json PATH|-: a lockstep.tokenize object instead of the ids line
};

// Prints the ids of the text, space-separated on one line (what --prompt-tokens reads), or the
// JSON object {schema, schema_version, tokenizer, ids}. kInvalidArgument for text that is not
// valid UTF-8 (BPE) or both / neither of text and file; the tokenizer's errors otherwise.
Status RunTokenize(const TokenizeOptions& opts, std::ostream& out);

struct DetokenizeOptions {
  std::string model;
  std::string ids;   // IDS: whitespace- or comma-separated ids, or
  std::string file;  // --file F: a file of them (generate --prompt-tokens' format)
  std::string json;  // --json PATH|-: {schema, schema_version, tokenizer, text, skipped_ids}
};

// Prints the text of the ids and a newline. Ids without a token (a model's vocabulary is often
// larger than its tokenizer's) are skipped as Hugging Face's decode skips them, and counted on
// stderr; byte level renders them "<id>". kInvalidArgument for an entry that is not an id
// (negative, not a number, 2^24 or more).
Status RunDetokenize(const DetokenizeOptions& opts, std::ostream& out);

// The ids of a text prompt (generate --prompt / --prompt-file) for a model of `n_vocab` ids.
// kInvalidArgument naming "prompt": text that is not valid UTF-8 (BPE), an id the model's
// vocabulary lacks, or (byte level) a vocabulary under 256.
Result<std::vector<std::int32_t>> EncodePromptText(const Tokenizer& tok, std::string_view text,
                                                   int n_vocab);

// {"type", "vocab_size", "sha256"}: sha256 of tokenizer.json, null for byte level.
// kIOError when the file cannot be read again.
Result<nlohmann::json> TokenizerJson(const Tokenizer& tok);

}  // namespace lockstep
