// The BPE tokenizer's tables, private to engine/model: built from tokenizer.json by
// bpe_config.cpp or from a GGUF file's tokenizer.ggml.* metadata by bpe_gguf.cpp (with the
// builders in bpe:: below), used by bpe_tokenizer.cpp (encode, decode).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "lockstep/engine/gguf.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/tokenizer.h"

namespace lockstep {

struct BpeMerge {
  std::int32_t rank;  // the merge's line in the file: lower merges first
  std::int32_t id;    // the merged token
};

struct AddedToken {
  std::string content;
  std::int32_t id;
  bool special;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer() = default;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  Result<std::vector<std::int32_t>> Encode(std::string_view text) const override;
  void AppendBytes(std::int32_t id, std::string& out) const override;
  bool Has(std::int32_t id) const override {
    return id >= 0 && static_cast<std::size_t>(id) < has_.size() && has_[id];
  }
  std::string Decode(std::span<const std::int32_t> ids) const override;
  const TokenizerInfo& info() const override { return info_; }

  // Filled by the loader (bpe_config.cpp).
  TokenizerInfo info_;
  bool nfc_ = false;
  std::array<std::int32_t, 256> byte_id_{};             // the token of each single byte
  std::unordered_map<std::uint64_t, BpeMerge> merges_;  // (left << 32 | right) -> merge
  std::vector<std::string> bytes_;                      // id -> the bytes it decodes to
  std::vector<std::uint8_t> has_;                       // id -> whether it has a token
  std::vector<AddedToken> added_;                       // longest first
  std::array<bool, 256> added_first_{};                 // bytes an added token starts with

 private:
  // Appends the ids of one pre-tokenized piece (ranked merges over its bytes).
  void EncodePiece(std::string_view piece, std::vector<std::int32_t>& out) const;
  void MergePiece(std::string_view piece, std::vector<std::int32_t>& out) const;
  // Appends the ids of text between added tokens: NFC, pre-tokenizer, BPE.
  Status EncodeSegment(std::string_view text, std::vector<std::int32_t>& out) const;

  // Pieces already merged (as Hugging Face's BPE keeps a cache): same ids, less work.
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
};

// Building the tables (bpe_config.cpp); `label` names the source in messages.
namespace bpe {

// GPT-2's byte-level alphabet: the character that stands for each byte.
const std::array<char32_t, 256>& ByteChars();
std::string Utf8Of(char32_t cp);
// The bytes a byte-level vocabulary token decodes to (Hugging Face's ByteLevel decoder): each
// character's byte, or the token's own UTF-8 when a character is outside the alphabet.
std::string TokenBytes(const std::string& token);
// Gives id (< 2^24, not yet taken: kCorruption naming `what`) the bytes `bytes`.
Status SetToken(const std::string& label, BpeTokenizer& t, std::int64_t id, std::string bytes,
                const std::string& what);
// byte_id_ from `ids` (vocabulary token -> id); kNotSupported when a byte has no token.
Status SetByteIds(const std::string& label, BpeTokenizer& t,
                  const std::unordered_map<std::string, std::int32_t>& ids);
// The merge of rank `rank`: a + b -> the token a + b; kCorruption when one of the three is not in
// `ids`. A repeated pair keeps its first rank.
Status AddMerge(const std::string& label, BpeTokenizer& t,
                const std::unordered_map<std::string, std::int32_t>& ids, const std::string& a,
                const std::string& b, std::int32_t rank);
// After the last token: added tokens longest first, info_ (type "bpe", sizes, path = label).
void Finish(BpeTokenizer& t, const std::string& label);

}  // namespace bpe

// The tokenizer.ggml.* metadata of a tokenizer.json (its text; `label` names it) for a model of
// `n_vocab` ids, added to *kv as llama.cpp's converter writes it (bpe_gguf.cpp has the table; ids
// without a token become "[PAD<id>]"). Errors: those of ParseBpeTokenizer; kNotSupported without
// the NFC normalizer; kInvalidArgument for an id >= n_vocab.
Status GgufVocabulary(std::string_view tokenizer_json, const std::string& label, int n_vocab,
                      std::map<std::string, GgufValue>* kv);

}  // namespace lockstep
