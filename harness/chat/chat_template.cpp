#include "lockstep/harness/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/jinja_parser.h"
#include "chat/jinja_render.h"
#include "lockstep/engine/gguf.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

Result<ChatTemplate> ChatTemplate::Parse(std::string source, ChatTemplateLimits limits) {
  LOCKSTEP_ASSIGN_OR_RETURN(jinja::Body body, jinja::ParseTemplate(source, limits.max_depth));
  ChatTemplate t;
  t.body_ = std::make_shared<const jinja::Body>(std::move(body));
  t.sha256_ = Sha256Hex(source);
  t.source_ = std::move(source);
  t.limits_ = limits;
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options) const {
  if (!messages.is_array())
    return Status::InvalidArgument("chat template: messages must be an array");
  std::vector<std::pair<std::string, jinja::Value>> vars;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it)
    vars.emplace_back(it.key(), jinja::FromJson(*it));
  vars.emplace_back("messages", jinja::FromJson(messages));
  vars.emplace_back("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
  if (options.enable_thinking)
    vars.emplace_back("enable_thinking", jinja::Value::Bool(*options.enable_thinking));
  if (!options.tools.is_null()) vars.emplace_back("tools", jinja::FromJson(options.tools));
  jinja::RenderLimits limits;
  limits.max_output_bytes = limits_.max_output_bytes;
  limits.max_steps = limits_.max_steps;
  return jinja::Render(*body_, vars, limits);
}

namespace {

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<ChatTemplate> ParseFrom(std::string source, const std::string& origin) {
  auto t = ChatTemplate::Parse(std::move(source));
  if (!t.ok()) return t.status().WithContext(origin);
  t->set_origin(origin);
  return t;
}

// tokenizer_config.json's special tokens: a string, or an AddedToken object with "content".
void AddSpecialTokens(const nlohmann::ordered_json& cfg, ChatTemplate& t) {
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    if (!cfg.contains(key)) continue;
    const auto& v = cfg[key];
    if (v.is_string()) t.special_tokens()[key] = v;
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      t.special_tokens()[key] = v["content"];
  }
}

}  // namespace

Result<std::optional<ChatTemplate>> LoadChatTemplate(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (model_path.size() > 5 && model_path.ends_with(".gguf") && !fs::is_directory(model_path, ec)) {
    LOCKSTEP_ASSIGN_OR_RETURN(GgufFilePtr g, GgufFile::Open(model_path));
    auto src = g->String("tokenizer.chat_template");
    if (!src) return std::optional<ChatTemplate>();
    LOCKSTEP_ASSIGN_OR_RETURN(ChatTemplate t,
                              ParseFrom(*src, model_path + " (tokenizer.chat_template)"));
    // The special tokens' texts, from their ids in the vocabulary (llama.cpp's keys).
    auto tokens = g->kv().find("tokenizer.ggml.tokens");
    const auto* vocab =
        tokens == g->kv().end() ? nullptr : std::get_if<std::vector<GgufValue>>(&tokens->second.v);
    const std::pair<const char*, const char*> keys[] = {{"bos", "bos_token"},
                                                        {"eos", "eos_token"},
                                                        {"padding", "pad_token"},
                                                        {"unknown", "unk_token"}};
    for (const auto& [gguf_key, var] : keys) {
      auto id = g->Int(std::string("tokenizer.ggml.") + gguf_key + "_token_id");
      if (!vocab || !id || *id < 0 || static_cast<std::size_t>(*id) >= vocab->size()) continue;
      if (const auto* text = std::get_if<std::string>(&(*vocab)[static_cast<std::size_t>(*id)].v))
        t.special_tokens()[var] = *text;
    }
    return std::optional<ChatTemplate>(std::move(t));
  }
  const std::string cfg_path = model_path + "/tokenizer_config.json";
  nlohmann::ordered_json cfg;
  if (fs::exists(cfg_path, ec)) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadText(cfg_path));
    cfg = nlohmann::ordered_json::parse(text, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object())
      return Status::InvalidArgument(cfg_path + ": not a JSON object");
  }
  const std::string jinja_path = model_path + "/chat_template.jinja";
  std::optional<ChatTemplate> out;
  if (fs::exists(jinja_path, ec)) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string src, ReadText(jinja_path));
    LOCKSTEP_ASSIGN_OR_RETURN(ChatTemplate t, ParseFrom(std::move(src), jinja_path));
    out = std::move(t);
  } else if (cfg.contains("chat_template")) {
    const auto& ct = cfg["chat_template"];
    std::optional<std::string> src;
    if (ct.is_string()) src = ct.get<std::string>();
    if (ct.is_array())
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          src = e["template"].get<std::string>();
    if (!src)
      return Status::InvalidArgument(cfg_path +
                                     ": chat_template is neither a string nor a list with a "
                                     "\"default\" template");
    LOCKSTEP_ASSIGN_OR_RETURN(ChatTemplate t, ParseFrom(std::move(*src), cfg_path));
    out = std::move(t);
  }
  if (out) AddSpecialTokens(cfg, *out);
  return out;
}

}  // namespace lockstep
