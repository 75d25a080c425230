// A chat request's prompt: the `messages` of an OpenAI chat completion (or of `lockstep generate
// --chat FILE.json`, or a campaign request) checked and rendered with the model's chat template
// (chat_template.h) into the prompt text, which the model's tokenizer then encodes as any text
// prompt (special tokens such as <|im_start|> by their ids).
//
// Accepted: `messages`, a non-empty array of objects with `role` one of system, user,
// assistant, tool and `content` a string, null (an assistant turn with tool_calls) or an array of
// text parts ({"type": "text", "text": ...}, joined with "\n" as vLLM does; other part types are
// refused); every other key of a message (name, tool_calls, tool_call_id, reasoning_content) is
// passed to the template as it is. Options: `add_generation_prompt` (default true),
// `chat_template_kwargs` {`enable_thinking`: bool} (vLLM's field) or `enable_thinking` at the top
// level (llama-server's).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/engine/status.h"
#include "lockstep/harness/chat_template.h"

namespace lockstep {

struct ChatPrompt {
  nlohmann::ordered_json messages;
  ChatRenderOptions options;
};

// Takes the chat fields (messages, add_generation_prompt, chat_template_kwargs, enable_thinking)
// out of `body` (an object), leaving the rest for the completion parser. kInvalidArgument names
// the field: "messages[2].role must be one of system, user, assistant, tool".
Result<ChatPrompt> TakeChatPrompt(nlohmann::ordered_json& body);

// Renders `p` with `t` (ChatTemplate::Render's errors).
Result<std::string> RenderChatPrompt(const ChatTemplate& t, const ChatPrompt& p);

// `generate --chat FILE`: FILE holds a JSON object with `messages` and the options above, or the
// messages array alone. Returns the prompt text. Errors: the file, its JSON, TakeChatPrompt's,
// a model without a chat template, the template's own.
Result<std::string> RenderChatFile(const std::string& model_path, const std::string& file);

}  // namespace lockstep
