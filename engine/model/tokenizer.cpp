#include "lockstep/engine/tokenizer.h"

#include <sys/stat.h>

#include <charconv>

#include "lockstep/engine/bpe_tokenizer.h"
#include "lockstep/engine/gguf.h"
#include "model/utf8.h"

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

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer() { info_ = {"byte", 256, 255, "", ""}; }
  Result<std::vector<std::int32_t>> Encode(std::string_view text) const override {
    return EncodeBytes(text);
  }
  void AppendBytes(std::int32_t id, std::string& out) const override {
    if (Has(id)) out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  bool Has(std::int32_t id) const override { return id >= 0 && id < 256; }
  std::string Decode(std::span<const std::int32_t> ids) const override {
    return DecodeTokens(std::vector<std::int32_t>(ids.begin(), ids.end()));
  }
  const TokenizerInfo& info() const override { return info_; }

 private:
  TokenizerInfo info_;
};

}  // namespace

TokenizerPtr MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

Result<TokenizerPtr> LoadModelTokenizer(const std::string& model_dir) {
  if (model_dir.size() > 5 && model_dir.compare(model_dir.size() - 5, 5, ".gguf") == 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(GgufFilePtr f, GgufFile::Open(model_dir));
    LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tok, LoadGgufTokenizer(*f));
    return tok ? std::move(tok) : MakeByteTokenizer();
  }
  // A path that is no model must not fall back to bytes silently (`tokenize --model nope`): a
  // folder with config.json (a checkpoint) or tokenizer.json (a tokenizer alone), or a .gguf.
  struct stat st {};
  const std::string path = model_dir + "/tokenizer.json";
  const bool has_tokenizer = ::stat(path.c_str(), &st) == 0;
  if (::stat(model_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      (!has_tokenizer && ::stat((model_dir + "/config.json").c_str(), &st) != 0))
    return Status::InvalidArgument("--model '" + model_dir + "'",
                                   "is not a model (expected a checkpoint folder with config.json "
                                   "or tokenizer.json, or a .gguf file)");
  if (!has_tokenizer) return MakeByteTokenizer();
  return LoadBpeTokenizer(path);
}

std::string StreamDecoder::Push(std::int32_t id) {
  tok_.AppendBytes(id, pending_);
  // Emit every complete sequence (and every ill-formed subpart, as U+FFFD); keep a trailing
  // prefix that a later token may complete.
  std::string out;
  std::size_t i = 0;
  while (i < pending_.size()) {
    const utf8::Step s = utf8::Next(pending_, i);
    if (s.kind == utf8::Kind::kIncomplete) break;
    if (s.kind == utf8::Kind::kValid) {
      out.append(pending_, i, s.n);
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += s.n;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::Finish() {
  std::string out;
  utf8::AppendLossy(pending_, out);
  pending_.clear();
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
