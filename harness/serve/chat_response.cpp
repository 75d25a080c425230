#include "serve/chat_response.h"

#include <string>
#include <utility>

namespace lockstep {

nlohmann::json ToChatJson(nlohmann::json j, bool chunk) {
  j["object"] = chunk ? "chat.completion.chunk" : "chat.completion";
  if (!j.contains("choices")) return j;
  for (auto& c : j["choices"]) {
    std::string text =
        c.contains("text") && c["text"].is_string() ? c["text"].get<std::string>() : std::string();
    c.erase("text");
    if (!chunk) {
      c["message"] = {{"role", "assistant"}, {"content", std::move(text)}};
    } else if (!text.empty() || c["finish_reason"].is_null()) {
      c["delta"] = {{"role", "assistant"}, {"content", std::move(text)}};
    } else {
      c["delta"] = nlohmann::json::object();
    }
  }
  return j;
}

}  // namespace lockstep
