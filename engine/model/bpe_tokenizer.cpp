// Encode and decode of the BPE tokenizer (tables: bpe_model.h, loaded by bpe_config.cpp).
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <cstring>
#include <queue>

#include "model/bpe_model.h"
#include "model/pretokenize.h"
#include "model/utf8.h"

namespace lockstep {

namespace {

// NFC through ICU. ASCII is always NFC: it skips ICU.
Status Nfc(std::string_view text, std::string& out) {
  out.clear();
  bool ascii = true;
  for (char ch : text) ascii &= static_cast<unsigned char>(ch) < 0x80;
  if (ascii) {
    out.assign(text);
    return Status::Ok();
  }
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) return Status::Runtime("ICU NFC normaliser", u_errorName(err));
  const icu::StringPiece in(text.data(), static_cast<std::int32_t>(text.size()));
  if (nfc->isNormalizedUTF8(in, err) && U_SUCCESS(err)) {
    out.assign(text);
    return Status::Ok();
  }
  err = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(&out, static_cast<std::int32_t>(text.size()));
  nfc->normalizeUTF8(0, in, sink, nullptr, err);
  if (U_FAILURE(err)) return Status::Runtime("ICU NFC normaliser", u_errorName(err));
  return Status::Ok();
}

struct Sym {
  std::int32_t id;
  std::int32_t prev, next;  // neighbours in the word (-1: none)
  bool gone;                // merged into its left neighbour
};

struct Candidate {
  std::int32_t rank, pos, id;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

// Hugging Face's BPE word merge: the pair of lowest rank first, the leftmost of equal ranks, each
// merge re-examining its two new neighbour pairs; a stale candidate (a symbol merged away since)
// is skipped when popped.
void BpeTokenizer::MergePiece(std::string_view piece, std::vector<std::int32_t>& out) const {
  const auto n = static_cast<std::int32_t>(piece.size());
  thread_local std::vector<Sym> syms;
  syms.resize(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i)
    syms[i] = {byte_id_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1,
               false};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](std::int32_t pos) {
    const std::int32_t nx = syms[pos].next;
    if (nx < 0) return;
    const std::uint64_t key =
        (static_cast<std::uint64_t>(syms[pos].id) << 32) | static_cast<std::uint32_t>(syms[nx].id);
    auto it = merges_.find(key);
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    Sym& s = syms[top.pos];
    if (s.gone || s.next < 0) continue;
    const std::uint64_t key =
        (static_cast<std::uint64_t>(s.id) << 32) | static_cast<std::uint32_t>(syms[s.next].id);
    auto it = merges_.find(key);
    if (it == merges_.end() || it->second.id != top.id) continue;  // stale
    Sym& right = syms[s.next];
    right.gone = true;
    s.id = top.id;
    s.next = right.next;
    if (s.next >= 0) syms[s.next].prev = top.pos;
    if (s.prev >= 0) consider(s.prev);
    consider(top.pos);
  }
  for (std::int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

void BpeTokenizer::EncodePiece(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  constexpr std::size_t kCacheMaxPiece = 64, kCacheMaxEntries = 1 << 16;
  const bool cacheable = piece.size() <= kCacheMaxPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(std::string(piece));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t start = out.size();
  MergePiece(piece, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(
        std::string(piece),
        std::vector<std::int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
  }
}

Status BpeTokenizer::EncodeSegment(std::string_view text, std::vector<std::int32_t>& out) const {
  if (text.empty()) return Status::Ok();
  thread_local std::string normalized;
  std::string_view src = text;
  if (nfc_) {
    LOCKSTEP_RETURN_IF_ERROR(Nfc(text, normalized));
    src = normalized;
  }
  thread_local std::vector<std::uint32_t> ends;
  ends.clear();
  QwenSplit(src, ends);
  std::uint32_t begin = 0;
  for (std::uint32_t end : ends) {
    EncodePiece(src.substr(begin, end - begin), out);
    begin = end;
  }
  return Status::Ok();
}

Result<std::vector<std::int32_t>> BpeTokenizer::Encode(std::string_view text) const {
  if (std::size_t bad = utf8::FirstInvalid(text); bad != std::string_view::npos)
    return Status::InvalidArgument("text", "is not valid UTF-8 (byte " + std::to_string(bad) +
                                               " of " + std::to_string(text.size()) +
                                               "); give the text as UTF-8 or token ids");
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // Added tokens, leftmost-longest on the raw text (as Hugging Face's added vocabulary splits it
  // before the normaliser), then the text between them.
  std::size_t seg = 0, i = 0;
  while (i < text.size()) {
    if (!added_first_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : added_)
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;  // longest first: the first that matches is the longest here
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    LOCKSTEP_RETURN_IF_ERROR(EncodeSegment(text.substr(seg, i - seg), ids));
    ids.push_back(hit->id);
    i += hit->content.size();
    seg = i;
  }
  LOCKSTEP_RETURN_IF_ERROR(EncodeSegment(text.substr(seg), ids));
  return ids;
}

void BpeTokenizer::AppendBytes(std::int32_t id, std::string& out) const {
  if (Has(id)) out += bytes_[static_cast<std::size_t>(id)];
}

std::string BpeTokenizer::Decode(std::span<const std::int32_t> ids) const {
  StreamDecoder dec(*this);
  std::string out;
  for (std::int32_t id : ids) out += dec.Push(id);
  out += dec.Finish();
  return out;
}

}  // namespace lockstep
