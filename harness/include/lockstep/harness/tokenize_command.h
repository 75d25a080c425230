// `lockstep tokenize` and `lockstep detokenize`: the model's tokenizer (tokenizer.json beside
// the weights, else byte level: engine/include/lockstep/engine/tokenizer.h) for users checking
// their prompts. The prompt's encoding and the tokenizer's record are prompt_text.h.
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

}  // namespace lockstep
