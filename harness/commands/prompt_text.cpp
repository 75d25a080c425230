#include "lockstep/harness/prompt_text.h"

#include <cstring>
#include <variant>

#include "lockstep/engine/gguf.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace {

// A GGUF value in a fixed binary form: its type id (u32), then the value (integers and doubles
// as 8 little-endian bytes, a bool as one byte, a string or array as its u64 count, then the
// bytes or the elements).
void AppendValue(const GgufValue& v, std::string& out) {
  auto raw = [&out](const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); };
  auto u64 = [&raw](std::uint64_t x) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(x >> (8 * i));
    raw(b, 8);
  };
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v.type >> (8 * i)));
  if (const auto* x = std::get_if<std::uint64_t>(&v.v)) return u64(*x);
  if (const auto* x = std::get_if<std::int64_t>(&v.v)) return u64(static_cast<std::uint64_t>(*x));
  if (const auto* x = std::get_if<double>(&v.v)) {
    std::uint64_t bits;
    std::memcpy(&bits, x, sizeof(bits));
    return u64(bits);
  }
  if (const auto* x = std::get_if<bool>(&v.v)) return out.push_back(*x ? '\1' : '\0');
  if (const auto* x = std::get_if<std::string>(&v.v)) {
    u64(x->size());
    return raw(x->data(), x->size());
  }
  const auto& a = std::get<std::vector<GgufValue>>(v.v);
  u64(a.size());
  for (const GgufValue& e : a) AppendValue(e, out);
}

// The digest of a GGUF's vocabulary: SHA-256 over its tokenizer.ggml.* metadata, each key (in
// order) then its value in AppendValue's form. A digest of the whole file would read every
// weight byte on each `generate --json` (seconds on a multi-GB checkpoint), and change with them.
Result<std::string> GgufVocabularySha256(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto f, GgufFile::Open(path));
  std::string canon;
  for (const auto& [key, value] : f->kv()) {
    if (key.rfind("tokenizer.ggml.", 0) != 0) continue;
    canon.append(key).push_back('\0');
    AppendValue(value, canon);
  }
  return Sha256Hex(canon);
}

}  // namespace

Result<std::vector<std::int32_t>> EncodePromptText(const Tokenizer& tok, std::string_view text,
                                                   int n_vocab) {
  if (tok.info().type == "byte" && n_vocab < 256)
    return Status::InvalidArgument("prompt", "text prompts need a vocabulary of at least 256 ids");
  auto ids = tok.Encode(text);
  if (!ids.ok()) return ids.status().WithContext("prompt");
  for (std::int32_t id : *ids)
    if (id >= n_vocab)
      return Status::InvalidArgument("prompt", "the tokenizer gives id " + std::to_string(id) +
                                                   " but the model's vocabulary has " +
                                                   std::to_string(n_vocab) + " ids");
  return ids;
}

Result<nlohmann::json> TokenizerJson(const Tokenizer& tok) {
  const TokenizerInfo& info = tok.info();
  nlohmann::json j = {{"type", info.type}, {"vocab_size", info.vocab_size}, {"sha256", nullptr}};
  if (info.source == "gguf") {
    LOCKSTEP_ASSIGN_OR_RETURN(j["sha256"], GgufVocabularySha256(info.path));
  } else if (!info.path.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(j["sha256"], Sha256File(info.path));
  }
  return j;
}

}  // namespace lockstep
