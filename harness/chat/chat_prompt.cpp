#include "lockstep/harness/chat_prompt.h"

#include <fstream>
#include <sstream>

namespace lockstep {

namespace {

using J = nlohmann::ordered_json;

Status Bad(const std::string& field, const std::string& what) {
  return Status::InvalidArgument(field + " " + what);
}

Status CheckMessage(J& m, std::size_t k) {
  const std::string at = "messages[" + std::to_string(k) + "]";
  if (!m.is_object()) return Bad(at, "must be an object with role and content");
  if (!m.contains("role") || !m["role"].is_string())
    return Bad(at + ".role", "is required (a string)");
  const std::string role = m["role"].get<std::string>();
  if (role != "system" && role != "user" && role != "assistant" && role != "tool")
    return Bad(at + ".role",
               "must be one of system, user, assistant, tool (not '" + role.substr(0, 32) + "')");
  if (!m.contains("content")) {
    if (role == "assistant" && m.contains("tool_calls")) return Status::Ok();
    return Bad(at + ".content", "is required");
  }
  J& c = m["content"];
  if (c.is_string() || (c.is_null() && role == "assistant")) return Status::Ok();
  if (!c.is_array()) return Bad(at + ".content", "must be a string or an array of text parts");
  std::string joined;
  for (std::size_t p = 0; p < c.size(); ++p) {
    const J& part = c[p];
    const std::string pat = at + ".content[" + std::to_string(p) + "]";
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      return Bad(pat,
                 "must be {\"type\": \"text\", \"text\": ...} (only text parts are supported)");
    if (p) joined += "\n";
    joined += part["text"].get<std::string>();
  }
  c = joined;
  return Status::Ok();
}

}  // namespace

Result<ChatPrompt> TakeChatPrompt(J& body) {
  if (!body.is_object()) return Status::InvalidArgument("the chat request must be a JSON object");
  ChatPrompt p;
  if (!body.contains("messages")) return Bad("'messages'", "is required");
  p.messages = std::move(body["messages"]);
  body.erase("messages");
  if (!p.messages.is_array() || p.messages.empty())
    return Bad("'messages'", "must be a non-empty array");
  for (std::size_t k = 0; k < p.messages.size(); ++k)
    LOCKSTEP_RETURN_IF_ERROR(CheckMessage(p.messages[k], k));
  if (body.contains("add_generation_prompt")) {
    if (!body["add_generation_prompt"].is_boolean())
      return Bad("'add_generation_prompt'", "must be true or false");
    p.options.add_generation_prompt = body["add_generation_prompt"].get<bool>();
    body.erase("add_generation_prompt");
  }
  auto take_thinking = [&](J& v, const std::string& field) -> Status {
    if (!v.is_boolean()) return Bad("'" + field + "'", "must be true or false");
    p.options.enable_thinking = v.get<bool>();
    return Status::Ok();
  };
  if (body.contains("enable_thinking")) {
    LOCKSTEP_RETURN_IF_ERROR(take_thinking(body["enable_thinking"], "enable_thinking"));
    body.erase("enable_thinking");
  }
  if (body.contains("chat_template_kwargs")) {
    J& kw = body["chat_template_kwargs"];
    if (!kw.is_object()) return Bad("'chat_template_kwargs'", "must be an object");
    for (auto it = kw.begin(); it != kw.end(); ++it) {
      if (it.key() != "enable_thinking")
        return Bad("'chat_template_kwargs." + it.key() + "'",
                   "is not supported (only enable_thinking)");
      LOCKSTEP_RETURN_IF_ERROR(take_thinking(*it, "chat_template_kwargs.enable_thinking"));
    }
    body.erase("chat_template_kwargs");
  }
  return p;
}

Result<std::string> RenderChatPrompt(const ChatTemplate& t, const ChatPrompt& p) {
  return t.Render(p.messages, p.options);
}

Result<std::string> RenderChatFile(const std::string& model_path, const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::InvalidArgument("--chat", "cannot read " + file);
  std::ostringstream ss;
  ss << in.rdbuf();
  J j = J::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return Status::InvalidArgument("--chat", file + " is not JSON");
  if (j.is_array()) j = J{{"messages", std::move(j)}};
  auto p = TakeChatPrompt(j);
  if (!p.ok()) return p.status().WithContext("--chat " + file);
  if (j.is_object() && !j.empty())
    return Status::InvalidArgument("--chat", file + ": unknown field '" + j.begin().key() + "'");
  LOCKSTEP_ASSIGN_OR_RETURN(std::optional<ChatTemplate> t, LoadChatTemplate(model_path));
  if (!t)
    return Status::InvalidArgument(
        "--chat",
        "the model has no chat template (chat_template.jinja, tokenizer_config.json's "
        "chat_template, or a GGUF's tokenizer.chat_template)");
  return RenderChatPrompt(*t, *p);
}

}  // namespace lockstep
