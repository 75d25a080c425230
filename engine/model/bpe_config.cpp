// Loading tokenizer.json into the BPE tokenizer's tables: every field Qwen's file sets is checked
// against what bpe_tokenizer.cpp implements, and anything else is refused by name.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/bpe_tokenizer.h"
#include "model/bpe_model.h"
#include "model/utf8.h"

namespace lockstep {

const char* const kQwenSplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace bpe {

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes for
// U+0100 + k in byte order.
const std::array<char32_t, 256>& ByteChars() {
  static const std::array<char32_t, 256> kCpOf = [] {
    std::array<char32_t, 256> cp_of{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      cp_of[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return cp_of;
  }();
  return kCpOf;
}

std::string Utf8Of(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The bytes a vocabulary token decodes to (Hugging Face's ByteLevel decoder): each character's
// byte, or the token's own UTF-8 when a character is outside the alphabet.
std::string TokenBytes(const std::string& token) {
  static const std::unordered_map<char32_t, char> byte_of = [] {
    std::unordered_map<char32_t, char> m;
    for (int b = 0; b < 256; ++b) m[ByteChars()[b]] = static_cast<char>(b);
    return m;
  }();
  std::string out;
  std::size_t i = 0;
  while (i < token.size()) {
    const utf8::Step st = utf8::Next(token, i);
    auto it = st.kind == utf8::Kind::kValid ? byte_of.find(st.cp) : byte_of.end();
    if (it == byte_of.end()) return token;
    out += it->second;
    i += st.n;
  }
  return out;
}

constexpr std::int64_t kMaxId = (std::int64_t{1} << 24) - 1;

Status SetToken(const std::string& label, BpeTokenizer& t, std::int64_t id, std::string bytes,
                const std::string& what) {
  if (id < 0 || id > kMaxId)
    return Status::Corruption(label, what + ": id " + std::to_string(id) + " is out of range");
  const auto u = static_cast<std::size_t>(id);
  if (u >= t.has_.size()) {
    t.has_.resize(u + 1, 0);
    t.bytes_.resize(u + 1);
  }
  if (t.has_[u]) return Status::Corruption(label, what + ": id " + std::to_string(id) + " twice");
  t.has_[u] = 1;
  t.bytes_[u] = std::move(bytes);
  return Status::Ok();
}

Status SetByteIds(const std::string& label, BpeTokenizer& t,
                  const std::unordered_map<std::string, std::int32_t>& ids) {
  for (int b = 0; b < 256; ++b) {
    auto it = ids.find(Utf8Of(ByteChars()[b]));
    if (it == ids.end())
      return Status::NotSupported(
          label,
          "byte " + std::to_string(b) + " has no token (a byte-level vocabulary needs all 256)");
    t.byte_id_[b] = it->second;
  }
  return Status::Ok();
}

Status AddMerge(const std::string& label, BpeTokenizer& t,
                const std::unordered_map<std::string, std::int32_t>& ids, const std::string& a,
                const std::string& b, std::int32_t rank) {
  auto ia = ids.find(a), ib = ids.find(b), iab = ids.find(a + b);
  if (ia == ids.end() || ib == ids.end() || iab == ids.end())
    return Status::Corruption(label, "merge " + std::to_string(rank) + " ('" + a + "', '" + b +
                                         "'): a token is not in the vocabulary");
  const std::uint64_t key =
      (static_cast<std::uint64_t>(ia->second) << 32) | static_cast<std::uint32_t>(ib->second);
  t.merges_.emplace(key, BpeMerge{rank, iab->second});  // a repeated pair keeps its first rank
  return Status::Ok();
}

void Finish(BpeTokenizer& t, const std::string& label) {
  std::stable_sort(t.added_.begin(), t.added_.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  t.info_.type = "bpe";
  t.info_.vocab_size = static_cast<int>(std::count(t.has_.begin(), t.has_.end(), std::uint8_t{1}));
  t.info_.max_id = static_cast<int>(t.has_.size()) - 1;
  t.info_.path = label;
}

}  // namespace bpe

namespace {

using Json = nlohmann::json;

Status Unsupported(const std::string& label, const std::string& field, const Json& value) {
  return Status::NotSupported(
      label, field + " " + value.dump() + " is not supported (bpe_tokenizer.h lists what is)");
}

// `j[key]` must be absent, null, or one of `allowed`.
Status Expect(const std::string& label, const Json& j, const std::string& where,
              const std::string& key, std::initializer_list<Json> allowed) {
  if (!j.contains(key) || j[key].is_null()) return Status::Ok();
  for (const Json& a : allowed)
    if (j[key] == a) return Status::Ok();
  return Unsupported(label, where + "." + key, j[key]);
}

Status CheckPipeline(const std::string& label, const Json& j, BpeTokenizer& t) {
  for (const char* key : {"truncation", "padding"})
    if (j.contains(key) && !j[key].is_null()) return Unsupported(label, key, j[key]);
  const Json& norm = j.value("normalizer", Json());
  if (!norm.is_null() && norm != Json{{"type", "NFC"}})
    return Unsupported(label, "normalizer", norm);
  t.nfc_ = !norm.is_null();
  const Json& pre = j.value("pre_tokenizer", Json());
  const bool qwen = pre.is_object() && pre.value("type", "") == "Sequence" &&
                    pre.value("pretokenizers", Json()).is_array() &&
                    pre["pretokenizers"].size() == 2;
  if (!qwen) return Unsupported(label, "pre_tokenizer", pre);
  const Json& split = pre["pretokenizers"][0];
  const Json& bytes = pre["pretokenizers"][1];
  if (split.value("type", "") != "Split" || split.value("behavior", "") != "Isolated" ||
      split.value("invert", true) != false ||
      split.value("pattern", Json()) != Json{{"Regex", kQwenSplitPattern}})
    return Unsupported(label, "pre_tokenizer Split", split);
  if (bytes.value("type", "") != "ByteLevel" || bytes.value("add_prefix_space", true) != false ||
      bytes.value("use_regex", true) != false)
    return Unsupported(label, "pre_tokenizer ByteLevel", bytes);
  const Json& dec = j.value("decoder", Json());
  if (!dec.is_object() || dec.value("type", "") != "ByteLevel")
    return Unsupported(label, "decoder", dec);
  const Json& post = j.value("post_processor", Json());
  if (!post.is_null() && (!post.is_object() || post.value("type", "") != "ByteLevel"))
    return Unsupported(label, "post_processor", post);
  return Status::Ok();
}

Status CheckModel(const std::string& label, const Json& m) {
  if (!m.is_object() || m.value("type", "") != "BPE")
    return Unsupported(label, "model.type", m.is_object() ? m.value("type", Json()) : m);
  LOCKSTEP_RETURN_IF_ERROR(Expect(label, m, "model", "dropout", {}));
  LOCKSTEP_RETURN_IF_ERROR(Expect(label, m, "model", "unk_token", {}));
  LOCKSTEP_RETURN_IF_ERROR(Expect(label, m, "model", "continuing_subword_prefix", {""}));
  LOCKSTEP_RETURN_IF_ERROR(Expect(label, m, "model", "end_of_word_suffix", {""}));
  for (const char* key : {"fuse_unk", "byte_fallback", "ignore_merges"})
    LOCKSTEP_RETURN_IF_ERROR(Expect(label, m, "model", key, {false}));
  if (!m.contains("vocab") || !m["vocab"].is_object())
    return Status::Corruption(label, "model.vocab is not an object of token -> id");
  if (!m.contains("merges") || !m["merges"].is_array())
    return Status::Corruption(label, "model.merges is not an array");
  return Status::Ok();
}

Status LoadVocab(const std::string& label, const Json& vocab, BpeTokenizer& t,
                 std::unordered_map<std::string, std::int32_t>& ids) {
  ids.reserve(vocab.size());
  for (const auto& [token, v] : vocab.items()) {
    if (!v.is_number_integer()) return Status::Corruption(label, "vocab '" + token + "': id");
    const auto id = v.get<std::int64_t>();
    LOCKSTEP_RETURN_IF_ERROR(
        bpe::SetToken(label, t, id, bpe::TokenBytes(token), "vocab '" + token + "'"));
    ids.emplace(token, static_cast<std::int32_t>(id));
  }
  return bpe::SetByteIds(label, t, ids);
}

Status LoadMerges(const std::string& label, const Json& merges, BpeTokenizer& t,
                  const std::unordered_map<std::string, std::int32_t>& ids) {
  t.merges_.reserve(merges.size());
  std::int32_t rank = 0;
  for (const Json& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const std::size_t sp = s.find(' ', 1);
      if (sp == std::string::npos)
        return Status::Corruption(label, "merge '" + s + "' is not 'a b'");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      return Status::Corruption(label, "merge " + std::to_string(rank) + " is not a pair");
    }
    LOCKSTEP_RETURN_IF_ERROR(bpe::AddMerge(label, t, ids, a, b, rank));
    ++rank;
  }
  return Status::Ok();
}

// Hugging Face ignores an added token's id in the file: it takes the vocabulary's id of the same
// content, else the next id after the vocabulary and the added tokens so far. A file whose ids
// differ from those is refused rather than given other ids than the file says.
std::int64_t HfAddedId(const std::string& content, std::int64_t vocab_size, std::int64_t max_added,
                       const std::unordered_map<std::string, std::int32_t>& ids) {
  if (auto it = ids.find(content); it != ids.end()) return it->second;
  if (max_added < 0) return vocab_size;
  return max_added >= vocab_size ? max_added + 1 : vocab_size;
}

Status LoadAdded(const std::string& label, const Json& added, BpeTokenizer& t,
                 std::unordered_map<std::string, std::int32_t>& ids, std::int64_t vocab_size) {
  if (added.is_null()) return Status::Ok();
  if (!added.is_array()) return Status::Corruption(label, "added_tokens is not an array");
  std::int64_t max_added = -1;
  for (const Json& a : added) {
    if (!a.is_object() || !a.value("content", Json()).is_string() ||
        !a.value("id", Json()).is_number_integer())
      return Status::Corruption(label, "added token " + a.dump() + ": needs id and content");
    const std::string content = a["content"].get<std::string>();
    if (content.empty() || utf8::FirstInvalid(content) != std::string::npos)
      return Status::Corruption(label, "added token " + a.dump() + ": content empty or not UTF-8");
    for (const char* key : {"single_word", "lstrip", "rstrip", "normalized"})
      if (a.value(key, false) != false)
        return Unsupported(label, "added token '" + content + "' " + key, a[key]);
    const auto id = a["id"].get<std::int64_t>();
    const std::int64_t hf = HfAddedId(content, vocab_size, max_added, ids);
    if (id != hf)
      return Status::NotSupported(
          label, "added token '" + content + "' has id " + std::to_string(id) +
                     " but Hugging Face's tokenizers "
                     "give it " +
                     std::to_string(hf) + " (added ids must follow the vocabulary)");
    max_added = std::max(max_added, id);
    if (ids.count(content)) {
      t.has_[static_cast<std::size_t>(id)] = 0;  // a vocabulary token: the added token takes it
    } else {
      ids.emplace(content, static_cast<std::int32_t>(id));
    }
    LOCKSTEP_RETURN_IF_ERROR(bpe::SetToken(label, t, id, content, "added token '" + content + "'"));
    t.added_.push_back({content, static_cast<std::int32_t>(id), a.value("special", false)});
    t.added_first_[static_cast<unsigned char>(content[0])] = true;
  }
  return Status::Ok();
}

}  // namespace

Result<TokenizerPtr> ParseBpeTokenizer(std::string_view json, const std::string& label) {
  Json j;
  try {
    j = Json::parse(json.begin(), json.end());
  } catch (const std::exception& e) {
    return Status::Corruption(label, std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) return Status::Corruption(label, "not a JSON object");
  auto t = std::make_unique<BpeTokenizer>();
  try {
    LOCKSTEP_RETURN_IF_ERROR(CheckPipeline(label, j, *t));
    static const Json kNull;
    const Json& model = j.contains("model") ? j["model"] : kNull;  // by reference: it is large
    LOCKSTEP_RETURN_IF_ERROR(CheckModel(label, model));
    std::unordered_map<std::string, std::int32_t> ids;
    LOCKSTEP_RETURN_IF_ERROR(LoadVocab(label, model["vocab"], *t, ids));
    LOCKSTEP_RETURN_IF_ERROR(LoadMerges(label, model["merges"], *t, ids));
    LOCKSTEP_RETURN_IF_ERROR(LoadAdded(label,
                                       j.contains("added_tokens") ? j["added_tokens"] : kNull, *t,
                                       ids, static_cast<std::int64_t>(ids.size())));
  } catch (const std::exception& e) {  // a field of the wrong JSON type
    return Status::Corruption(label, e.what());
  }
  bpe::Finish(*t, label);
  t->info_.source = "tokenizer.json";
  return TokenizerPtr(std::move(t));
}

Result<TokenizerPtr> LoadBpeTokenizer(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{256} << 20));
  return ParseBpeTokenizer(text, path);
}

}  // namespace lockstep
