// The BPE tokenizer's tables, private to engine/model: built from tokenizer.json by
// bpe_config.cpp, used by bpe_tokenizer.cpp (encode, decode).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

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

}  // namespace lockstep
