// TextStream: a completion's text as it grows window by window, cut for streaming. It applies
// the request's stop strings (the text ends before the first one found, which ends the request)
// and hands out only text that can no longer change: a tail that could still become a stop string
// or that ends inside a UTF-8 sequence is held back until more tokens come or the request ends.
// Bytes that are not valid UTF-8 become U+FFFD, one per maximal ill-formed subpart (as the
// tokenizers' Decode replaces them), the same way whatever the chunking, so the streamed chunks
// concatenate to the text of the non-streamed response and to `lockstep generate`'s text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/engine/tokenizer.h"

namespace lockstep {

// `bytes` as valid UTF-8: each maximal ill-formed subpart (Unicode 15 section 3.9; an incomplete
// sequence at the end is one) is one U+FFFD.
std::string SanitizeUtf8(std::string_view bytes);
// The length of the longest prefix of `bytes` that does not end inside a sequence that more bytes
// could still complete (at most 3 bytes are held back).
std::size_t StableUtf8Prefix(std::string_view bytes);

// The bytes `ids` stand for in `tok`, undecoded (TextStream cuts and sanitizes them): a BPE
// token's bytes (nothing for an id without a token); byte level renders ids >= 256 as "<id>", as
// its Decode does. So SanitizeUtf8(TokenBytes(tok, ids)) == tok.Decode(ids).
std::string TokenBytes(const Tokenizer& tok, const std::vector<std::int32_t>& ids);

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop);
  // Appends the decoded bytes of new tokens. Returns true when a stop string was found (the text
  // is cut before it; later Append calls are ignored). `opaque`: the bytes are a placeholder
  // (byte level's "<id>" for an id >= 256), not text: no stop string matches across them.
  bool Append(std::string_view bytes, bool opaque = false);
  // Append of each token's bytes (TokenBytes), byte level's placeholders opaque.
  bool AppendTokens(const Tokenizer& tok, const std::vector<std::int32_t>& ids);
  // Text ready to send since the last call (valid UTF-8); `final`: everything left.
  std::string Take(bool final);
  bool stopped() const { return stopped_; }
  // The whole text so far (valid UTF-8), stop string excluded.
  std::string Text() const { return SanitizeUtf8(raw_); }

 private:
  std::vector<std::string> stop_;
  std::size_t max_stop_ = 0;
  std::string raw_;                                          // decoded bytes, cut at a stop string
  std::size_t sent_ = 0;                                     // raw bytes handed out
  std::vector<std::pair<std::size_t, std::size_t>> opaque_;  // [begin, end) placeholders in raw_
  bool stopped_ = false;
};

}  // namespace lockstep
