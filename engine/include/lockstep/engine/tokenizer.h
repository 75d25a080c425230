// Tokenizers: the byte-level tokenizer of synthetic models, the model's own tokenizer (a
// tokenizer.json beside the weights: bpe_tokenizer.h), streaming decode, and token-file parsing.
//
// Byte level: text bytes map to ids 0..255; decoding renders ids >= 256 as "<id>".
// LoadModelTokenizer picks the tokenizer a model implies: for a folder `DIR/tokenizer.json` when it
// exists, for a GGUF file the vocabulary its metadata declares (an unsupported one is an error,
// never a fallback to bytes), else byte level.
// Threading: a Tokenizer is immutable after loading; Encode and Decode may be called from several
// threads at once (the BPE tokenizer's word cache is locked).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

std::vector<std::int32_t> EncodeBytes(std::string_view text);
std::string DecodeTokens(const std::vector<std::int32_t>& ids);

struct TokenizerInfo {
  std::string type;    // "byte" | "bpe" (the model type of tokenizer.json or GGUF "gpt2")
  int vocab_size = 0;  // ids with a token: 256 for byte level; vocab + added tokens for BPE
  int max_id = 0;      // the largest id with a token
  std::string path;    // the tokenizer.json or GGUF file it was loaded from ("" for byte level)
  std::string source;  // "tokenizer.json", "gguf" (its tokenizer.ggml.* metadata), "" byte level
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids. kInvalidArgument when `text` is not valid UTF-8 (BPE; byte level takes any bytes),
  // naming the byte offset.
  virtual Result<std::vector<std::int32_t>> Encode(std::string_view text) const = 0;
  // Appends the bytes token `id` stands for (nothing for an id without a token).
  virtual void AppendBytes(std::int32_t id, std::string& out) const = 0;
  // Whether `id` has a token.
  virtual bool Has(std::int32_t id) const = 0;
  // Ids to text. BPE: the bytes of every id, invalid UTF-8 replaced by U+FFFD per maximal
  // subpart, ids without a token skipped (as Hugging Face's tokenizers decode).
  virtual std::string Decode(std::span<const std::int32_t> ids) const = 0;
  virtual const TokenizerInfo& info() const = 0;
};
using TokenizerPtr = std::unique_ptr<Tokenizer>;

// The byte-level tokenizer (EncodeBytes / DecodeTokens behind the interface).
TokenizerPtr MakeByteTokenizer();

// `model_dir`/tokenizer.json when it exists (LoadBpeTokenizer); for a path ending in .gguf (a file,
// or the first of a split set) the vocabulary of its tokenizer.ggml.* metadata
// (LoadGgufTokenizer); else the byte-level tokenizer. Errors: kInvalidArgument when `model_dir`
// is neither a .gguf path nor a folder holding config.json or tokenizer.json (no silent fallback
// to bytes for a mistyped path); those of the two loaders and of GgufFile::Open (kNotSupported
// names the unsupported type or option).
Result<TokenizerPtr> LoadModelTokenizer(const std::string& model_dir);

// Streaming decode: Push(id) returns the text that became complete with that token (bytes of an
// incomplete UTF-8 sequence are held back until a later token completes or breaks it); Finish()
// returns what is held back, invalid sequences as U+FFFD. The concatenation of every Push and
// Finish equals Decode of the same ids. Borrows `tok`, which must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string Push(std::int32_t id);
  std::string Finish();

 private:
  const Tokenizer& tok_;
  std::string pending_;  // bytes not yet emitted: a prefix of one UTF-8 sequence at most
};

// Parses whitespace- and/or comma-separated non-negative ids. Each id must be < n_vocab.
// Errors: kInvalidArgument naming the offending entry and its index.
Result<std::vector<std::int32_t>> ParseTokenList(std::string_view text, int n_vocab,
                                                 std::string_view label);

}  // namespace lockstep
