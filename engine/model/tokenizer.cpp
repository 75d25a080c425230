#include "lockstep/engine/tokenizer.h"

#include <charconv>

namespace lockstep {

std::vector<std::int32_t> EncodeBytes(std::string_view text) {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char ch : text) ids.push_back(static_cast<std::int32_t>(ch));
  return ids;
}

std::string DecodeTokens(const std::vector<std::int32_t>& ids) {
  std::string out;
  for (auto id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else {
      out += "<" + std::to_string(id) + ">";
    }
  }
  return out;
}

Result<std::vector<std::int32_t>> ParseTokenList(std::string_view text, int n_vocab,
                                                 std::string_view label) {
  std::vector<std::int32_t> ids;
  std::size_t i = 0;
  auto is_sep = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (i < text.size()) {
    while (i < text.size() && is_sep(text[i])) ++i;
    if (i >= text.size()) break;
    std::size_t j = i;
    while (j < text.size() && !is_sep(text[j])) ++j;
    std::string_view tok = text.substr(i, j - i);
    long long v = 0;
    auto [ptr, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (ec != std::errc() || ptr != tok.data() + tok.size() || v < 0)
      return Status::InvalidArgument(label, "entry " + std::to_string(ids.size()) + " '" +
                                                std::string(tok) +
                                                "' is not a non-negative integer token id");
    if (v >= n_vocab)
      return Status::InvalidArgument(
          label, "entry " + std::to_string(ids.size()) + ": token id " + std::to_string(v) +
                     " is outside the vocabulary (size " + std::to_string(n_vocab) + ")");
    ids.push_back(static_cast<std::int32_t>(v));
    i = j;
  }
  return ids;
}

}  // namespace lockstep
