#include "serve/text_stream.h"

#include <algorithm>
#include <utility>

namespace lockstep {

namespace {

// Length of the valid UTF-8 sequence at bytes[i] (1..4); 0 if invalid, with `*bad` the length
// of its maximal ill-formed subpart (the lead and the continuation bytes that still fit, at least
// 1); -1 if the bytes end before it is complete but everything seen so far is valid (`*bad` the
// bytes present).
int SequenceAt(std::string_view bytes, std::size_t i, std::size_t* bad = nullptr) {
  std::size_t unused = 0;
  if (bad == nullptr) bad = &unused;
  *bad = 1;
  const auto b = static_cast<unsigned char>(bytes[i]);
  if (b < 0x80) return 1;
  const int n = b >= 0xf5 ? 0 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc2 ? 2 : 0;
  if (n == 0) return 0;
  std::uint32_t cp = n == 4 ? b & 0x07u : n == 3 ? b & 0x0fu : b & 0x1fu;
  for (int k = 1; k < n; ++k) {
    *bad = static_cast<std::size_t>(k);
    if (i + static_cast<std::size_t>(k) >= bytes.size()) return -1;
    const auto c = static_cast<unsigned char>(bytes[i + static_cast<std::size_t>(k)]);
    if ((c & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3fu);
    // Overlong, surrogate and too-large forms are refused as soon as the second byte tells.
    if (k == 1 && ((n == 3 && cp < 0x20) || (n == 3 && cp >= 0x360 && cp < 0x380) ||
                   (n == 4 && (cp < 0x10 || cp > 0x10f))))
      return 0;
  }
  return n;
}

}  // namespace

std::string SanitizeUtf8(std::string_view bytes) {
  // One U+FFFD per maximal ill-formed subpart (Unicode 15 section 3.9), as the tokenizers'
  // decode does (and Rust's from_utf8_lossy): the text equals `lockstep generate`'s.
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t bad = 1;
    const int n = SequenceAt(bytes, i, &bad);
    if (n <= 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
      continue;
    }
    out.append(bytes.substr(i, static_cast<std::size_t>(n)));
    i += static_cast<std::size_t>(n);
  }
  return out;
}

std::size_t StableUtf8Prefix(std::string_view bytes) {
  const std::size_t from = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (std::size_t i = from; i < bytes.size(); ++i)
    if (SequenceAt(bytes, i) == -1) {
      // Held back only if the decoder would actually reach i: no sequence starting before it
      // and crossing it (i is a lead byte, and the bytes before are decided on their own).
      return i;
    }
  return bytes.size();
}

std::string TokenBytes(const Tokenizer& tok, const std::vector<std::int32_t>& ids) {
  if (tok.info().type == "byte") return DecodeTokens(ids);
  std::string out;
  for (std::int32_t id : ids) tok.AppendBytes(id, out);
  return out;
}

TextStream::TextStream(std::vector<std::string> stop) : stop_(std::move(stop)) {
  for (const auto& s : stop_) max_stop_ = std::max(max_stop_, s.size());
}

bool TextStream::AppendTokens(const Tokenizer& tok, const std::vector<std::int32_t>& ids) {
  const bool byte_level = tok.info().type == "byte";
  for (std::int32_t id : ids)
    if (Append(TokenBytes(tok, {id}), byte_level && id >= 256)) return true;
  return false;
}

bool TextStream::Append(std::string_view bytes, bool opaque) {
  if (stopped_) return true;
  const std::size_t old = raw_.size();
  raw_.append(bytes);
  if (opaque) {
    opaque_.emplace_back(old, raw_.size());
    return false;  // a placeholder can neither hold nor complete a stop string
  }
  auto crosses_placeholder = [&](std::size_t at, std::size_t n) {
    for (auto it = opaque_.rbegin(); it != opaque_.rend() && it->second > at; ++it)
      if (it->first < at + n) return true;
    return false;
  };
  // A stop string found in the new bytes or straddling the old tail.
  const std::size_t from = old > max_stop_ ? old - max_stop_ : 0;
  std::size_t cut = std::string::npos;
  for (const auto& s : stop_) {
    for (std::size_t at = raw_.find(s, from); at != std::string::npos; at = raw_.find(s, at + 1))
      if (!crosses_placeholder(at, s.size())) {
        cut = std::min(cut, at);
        break;
      }
  }
  if (cut == std::string::npos) return false;
  raw_.resize(std::max(cut, sent_));
  stopped_ = true;
  return true;
}

std::string TextStream::Take(bool final) {
  std::size_t end = raw_.size();
  if (!final && !stopped_) {
    end = end > sent_ + (max_stop_ ? max_stop_ - 1 : 0) ? end - (max_stop_ ? max_stop_ - 1 : 0)
                                                        : sent_;
    end = sent_ + StableUtf8Prefix(std::string_view(raw_).substr(sent_, end - sent_));
  }
  if (end <= sent_) return {};
  std::string out = SanitizeUtf8(std::string_view(raw_).substr(sent_, end - sent_));
  sent_ = end;
  return out;
}

}  // namespace lockstep
