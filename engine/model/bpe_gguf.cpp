// The BPE tokenizer and a GGUF file's tokenizer.ggml.* metadata, both ways: LoadGgufTokenizer
// (bpe_tokenizer.h) reads it, GgufVocabulary (bpe_model.h; ConvertToGguf) writes a tokenizer.json
// in the form llama.cpp's convert_hf_to_gguf.py writes a Qwen tokenizer.json:
//   tokenizer.ggml.model       "gpt2" (byte-level BPE)
//   tokenizer.ggml.pre         "qwen2": Qwen's pipeline (NFC, Qwen's split pattern, byte level)
//   tokenizer.ggml.tokens      [n] strings: id i's token, in the byte-level alphabet for a
//                              vocabulary token, the raw content for an added one
//   tokenizer.ggml.token_type  [n] ints: 1 normal (vocabulary), 3 control (added, special),
//                              4 user-defined (added, not special), 5 unused (no token)
//   tokenizer.ggml.merges      "a b" strings, rank = index
//   tokenizer.ggml.bos_token_id / eos_token_id / padding_token_id   ids < n
//   tokenizer.ggml.add_bos_token / add_eos_token                    false or absent
// The converter pads the ids a tokenizer.json lacks (up to the model's vocabulary) with
// user-defined "[PAD<id>]" tokens; those are read back as ids without a token, as in the
// tokenizer.json, so that the ids of every text are the same (and "[PAD5]" in a text is not one
// token). Everything else is refused by name: a bad value is kCorruption naming the key (and the
// id), a type or option this tokenizer does not implement kNotSupported naming it.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "lockstep/engine/bpe_tokenizer.h"
#include "lockstep/engine/gguf.h"
#include "model/bpe_model.h"
#include "model/utf8.h"

namespace lockstep {

namespace {

constexpr std::string_view kPrefix = "tokenizer.ggml.";

enum TokenType : std::int64_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

class Reader {
 public:
  explicit Reader(const GgufFile& f) : f_(f), label_(fmt::format("GGUF '{}'", f.path())) {}

  Result<TokenizerPtr> Read();

 private:
  static std::string Key(std::string_view k) { return std::string(kPrefix) + std::string(k); }
  Status Bad(std::string_view key, const std::string& why) const {
    return Status::Corruption(label_, Key(key) + " " + why);
  }
  // The array under `key` (nullptr when absent); kCorruption when it is another kind of value.
  Result<const std::vector<GgufValue>*> Array(std::string_view key) const {
    const auto it = f_.kv().find(Key(key));
    if (it == f_.kv().end()) return nullptr;
    const auto* a = std::get_if<std::vector<GgufValue>>(&it->second.v);
    if (a == nullptr) return Bad(key, "is not an array");
    return a;
  }
  Status CheckOptions() const;
  Status ReadTokens(std::unordered_map<std::string, std::int32_t>& ids);
  Status ReadMerges(const std::unordered_map<std::string, std::int32_t>& ids);
  Status CheckSpecialIds(std::size_t n) const;

  const GgufFile& f_;
  const std::string label_;
  std::unique_ptr<BpeTokenizer> t_ = std::make_unique<BpeTokenizer>();
};

Status Reader::CheckOptions() const {
  const auto pre = f_.kv().find(Key("pre"));
  if (pre == f_.kv().end())
    return Status::NotSupported(label_, Key("pre") +
                                            " is missing: only 'qwen2' (Qwen's "
                                            "pre-tokenizer) is supported");
  const auto* p = std::get_if<std::string>(&pre->second.v);
  if (p == nullptr) return Bad("pre", "is not a string");
  if (*p != "qwen2")
    return Status::NotSupported(label_, fmt::format("{} '{}' is not supported (only 'qwen2', "
                                                    "Qwen's pre-tokenizer)",
                                                    Key("pre"), *p));
  for (const char* key : {"add_bos_token", "add_eos_token"}) {
    const auto it = f_.kv().find(Key(key));
    if (it == f_.kv().end()) continue;
    const auto* b = std::get_if<bool>(&it->second.v);
    if (b == nullptr) return Bad(key, "is not a bool");
    if (*b)
      return Status::NotSupported(label_, Key(key) +
                                              " true is not supported (the tokenizer adds "
                                              "no tokens to a text)");
  }
  return Status::Ok();
}

Status Reader::ReadTokens(std::unordered_map<std::string, std::int32_t>& ids) {
  LOCKSTEP_ASSIGN_OR_RETURN(const std::vector<GgufValue>* tokens, Array("tokens"));
  if (tokens == nullptr) return Bad("tokens", "is missing (the file declares a gpt2 vocabulary)");
  if (tokens->empty()) return Bad("tokens", "is empty");
  LOCKSTEP_ASSIGN_OR_RETURN(const std::vector<GgufValue>* types, Array("token_type"));
  if (types != nullptr && types->size() != tokens->size())
    return Bad("token_type", fmt::format("has {} entries, {} has {}", types->size(), Key("tokens"),
                                         tokens->size()));
  ids.reserve(tokens->size());
  for (std::size_t i = 0; i < tokens->size(); ++i) {
    const auto* s = std::get_if<std::string>(&(*tokens)[i].v);
    if (s == nullptr) return Bad("tokens", fmt::format("entry {} is not a string", i));
    std::int64_t type = kNormal;
    if (types != nullptr) {
      const GgufValue& v = (*types)[i];
      if (const auto* u = std::get_if<std::uint64_t>(&v.v)) {
        type = static_cast<std::int64_t>(std::min<std::uint64_t>(*u, 1u << 30));
      } else if (const auto* x = std::get_if<std::int64_t>(&v.v)) {
        type = *x;
      } else {
        return Bad("token_type", fmt::format("entry {} is not an integer", i));
      }
    }
    const auto id = static_cast<std::int64_t>(i);
    const std::string what = fmt::format("{} entry {}", Key("tokens"), i);
    if (type == kUnused || (type == kUserDefined && *s == fmt::format("[PAD{}]", i))) continue;
    if (type != kNormal && type != kControl && type != kUserDefined)
      return Status::NotSupported(
          label_, fmt::format("{} {} of token {} ('{}') is not supported (1 normal, 3 control, 4 "
                              "user-defined, 5 unused)",
                              Key("token_type"), type, i, *s));
    if (s->empty() || utf8::FirstInvalid(*s) != std::string::npos)
      return Bad("tokens", fmt::format("entry {} is empty or not UTF-8", i));
    if (!ids.emplace(*s, static_cast<std::int32_t>(id)).second)
      return Bad("tokens", fmt::format("entry {} ('{}') repeats entry {}", i, *s, ids.at(*s)));
    if (type == kNormal) {
      LOCKSTEP_RETURN_IF_ERROR(bpe::SetToken(label_, *t_, id, bpe::TokenBytes(*s), what));
    } else {
      LOCKSTEP_RETURN_IF_ERROR(bpe::SetToken(label_, *t_, id, *s, what));
      t_->added_.push_back({*s, static_cast<std::int32_t>(id), type == kControl});
      t_->added_first_[static_cast<unsigned char>((*s)[0])] = true;
    }
  }
  // Merges and bytes refer to vocabulary tokens only (as tokenizer.json's model.vocab).
  for (const AddedToken& a : t_->added_) ids.erase(a.content);
  return bpe::SetByteIds(label_ + ": " + Key("tokens"), *t_, ids);
}

Status Reader::ReadMerges(const std::unordered_map<std::string, std::int32_t>& ids) {
  LOCKSTEP_ASSIGN_OR_RETURN(const std::vector<GgufValue>* merges, Array("merges"));
  if (merges == nullptr) return Bad("merges", "is missing (a gpt2 vocabulary needs its merges)");
  t_->merges_.reserve(merges->size());
  for (std::size_t i = 0; i < merges->size(); ++i) {
    const auto* s = std::get_if<std::string>(&(*merges)[i].v);
    const std::size_t sp = s == nullptr ? std::string::npos : s->find(' ', 1);
    if (sp == std::string::npos)
      return Bad("merges", fmt::format("entry {} is not a string 'a b'", i));
    const Status st = bpe::AddMerge(label_, *t_, ids, s->substr(0, sp), s->substr(sp + 1),
                                    static_cast<std::int32_t>(i));
    if (!st.ok())
      return Bad("merges",
                 fmt::format("entry {} ('{}'): a token is not in {}", i, *s, Key("tokens")));
  }
  return Status::Ok();
}

Status Reader::CheckSpecialIds(std::size_t n) const {
  for (const char* key : {"bos_token_id", "eos_token_id", "padding_token_id"}) {
    const auto it = f_.kv().find(Key(key));
    if (it == f_.kv().end()) continue;
    const auto v = f_.Int(Key(key));
    if (!v || *v < 0 || static_cast<std::uint64_t>(*v) >= n)
      return Bad(key, fmt::format("is not an id below the {} tokens", n));
  }
  return Status::Ok();
}

Result<TokenizerPtr> Reader::Read() {
  LOCKSTEP_RETURN_IF_ERROR(CheckOptions());
  t_->nfc_ = true;  // qwen2: Qwen's tokenizer.json normalises to NFC
  std::unordered_map<std::string, std::int32_t> ids;
  LOCKSTEP_RETURN_IF_ERROR(ReadTokens(ids));
  LOCKSTEP_RETURN_IF_ERROR(ReadMerges(ids));
  LOCKSTEP_RETURN_IF_ERROR(CheckSpecialIds((*Array("tokens"))->size()));
  bpe::Finish(*t_, f_.path());
  t_->info_.source = "gguf";
  return TokenizerPtr(std::move(t_));
}

}  // namespace

Result<TokenizerPtr> LoadGgufTokenizer(const GgufFile& file) {
  const auto it = file.kv().find(std::string(kPrefix) + "model");
  if (it == file.kv().end()) return TokenizerPtr();
  const auto* model = std::get_if<std::string>(&it->second.v);
  if (model == nullptr)
    return Status::Corruption(fmt::format("GGUF '{}'", file.path()),
                              "tokenizer.ggml.model is not a string");
  if (*model == "none") return TokenizerPtr();
  if (*model != "gpt2")
    return Status::NotSupported(fmt::format("GGUF '{}'", file.path()),
                                fmt::format("tokenizer.ggml.model '{}' is not supported (only "
                                            "'gpt2', byte-level BPE as Qwen's)",
                                            *model));
  return Reader(file).Read();
}

namespace {

// llama.cpp's does_token_look_special for Qwen's added tokens: "<|...|>" is control even when the
// tokenizer.json does not mark it special.
bool LooksSpecial(const std::string& s) {
  return s.size() >= 4 && s.compare(0, 2, "<|") == 0 && s.compare(s.size() - 2, 2, "|>") == 0;
}

GgufValue StrValue(std::string s) { return {std::move(s), 8}; }

}  // namespace

Status GgufVocabulary(std::string_view tokenizer_json, const std::string& label, int n_vocab,
                      std::map<std::string, GgufValue>* kv) {
  LOCKSTEP_RETURN_IF_ERROR(ParseBpeTokenizer(tokenizer_json, label).status());
  using Json = nlohmann::json;
  const Json j = Json::parse(tokenizer_json.begin(), tokenizer_json.end());  // parsed above
  if (j.value("normalizer", Json()) != Json{{"type", "NFC"}})
    return Status::NotSupported(label,
                                "a tokenizer.json without the NFC normalizer has no GGUF "
                                "form here (tokenizer.ggml.pre 'qwen2' normalises to NFC)");
  std::vector<std::string> tokens(static_cast<std::size_t>(n_vocab));
  std::vector<std::int64_t> types(tokens.size(), 0);
  auto put = [&](std::int64_t id, std::string s, std::int64_t type) {
    if (id < 0 || id >= n_vocab)
      return Status::InvalidArgument(label, fmt::format("token id {} is outside the model's "
                                                        "vocabulary of {}",
                                                        id, n_vocab));
    tokens[static_cast<std::size_t>(id)] = std::move(s);
    types[static_cast<std::size_t>(id)] = type;
    return Status::Ok();
  };
  for (const auto& [token, id] : j["model"]["vocab"].items())
    LOCKSTEP_RETURN_IF_ERROR(put(id.get<std::int64_t>(), token, kNormal));
  for (const Json& a : j.value("added_tokens", Json::array())) {
    const std::string content = a["content"].get<std::string>();
    const bool control = a.value("special", false) || LooksSpecial(content);
    LOCKSTEP_RETURN_IF_ERROR(
        put(a["id"].get<std::int64_t>(), content, control ? kControl : kUserDefined));
  }
  std::vector<GgufValue> tok_values, type_values, merge_values;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == 0) tokens[i] = fmt::format("[PAD{}]", i), types[i] = kUserDefined;
    tok_values.push_back(StrValue(std::move(tokens[i])));
    type_values.push_back({types[i], 5});  // int32, as llama.cpp writes it
  }
  for (const Json& m : j["model"]["merges"])
    merge_values.push_back(StrValue(m.is_string()
                                        ? m.get<std::string>()
                                        : m[0].get<std::string>() + " " + m[1].get<std::string>()));
  const std::string k(kPrefix);
  (*kv)[k + "model"] = StrValue("gpt2");
  (*kv)[k + "pre"] = StrValue("qwen2");
  (*kv)[k + "tokens"] = {std::move(tok_values), 9};
  (*kv)[k + "token_type"] = {std::move(type_values), 9};
  (*kv)[k + "merges"] = {std::move(merge_values), 9};
  return Status::Ok();
}

}  // namespace lockstep
