// Chat templates: a model's own Jinja template (Hugging Face's `chat_template`) turned into the
// prompt text, by lockstep's own interpreter of the Jinja subset the Qwen-family templates use
// (harness/chat/jinja_*.h list what is covered; anything else is refused by name, never
// approximated). Where it comes from (LoadChatTemplate):
//   * a model folder: `chat_template.jinja` beside the weights when present (transformers prefers
//     it), else `tokenizer_config.json`'s "chat_template" (a string, or a list of {name,
//     template}: the one named "default");
//   * a GGUF file: its `tokenizer.chat_template` metadata string.
// The special tokens of tokenizer_config.json (bos_token, eos_token, pad_token, unk_token: a
// string or {"content": ...}) are variables of the template, as transformers passes them.
// Rendering is bounded (steps, output size, nesting), so a hostile template fails with an error
// instead of hanging. Parity: tests/chat/ renders >= 200 generated conversations with Hugging
// Face's own @huggingface/jinja and compares byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/engine/status.h"

namespace lockstep {

namespace jinja {
struct Stmt;
}

struct ChatTemplateLimits {
  std::size_t max_output_bytes = 4u << 20;
  std::int64_t max_steps = 4'000'000;
  int max_depth = 64;  // nesting of blocks and expressions
};

// What a conversation is rendered with.
struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // unset: the variable is undefined (the template's default)
  nlohmann::ordered_json tools;         // null: no `tools` variable
};

class ChatTemplate {
 public:
  // Parses `source`. kInvalidArgument: a syntax error (message names the line); kNotSupported:
  // a construct outside the subset ("unsupported tag 'macro' at line 3").
  static Result<ChatTemplate> Parse(std::string source, ChatTemplateLimits limits = {});

  // Renders `messages` (a JSON array of objects with role and content, passed as they are) with
  // `options` and the special tokens. kInvalidArgument: the template failed on this input (an
  // undefined value used, a type error, raise_exception, a limit), naming the line.
  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const ChatRenderOptions& options) const;

  const std::string& source() const { return source_; }
  const std::string& sha256() const { return sha256_; }  // of the source text
  const std::string& origin() const { return origin_; }  // file it came from ("" = given)
  void set_origin(std::string o) { origin_ = std::move(o); }
  // tokenizer_config.json's special tokens, as template variables.
  nlohmann::ordered_json& special_tokens() { return special_tokens_; }

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Stmt>>> body_;
  std::string source_, sha256_, origin_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  ChatTemplateLimits limits_;
};

// The template of the model at `model_path` (folder or .gguf file), nullopt when it has none.
// Errors: a template present but unreadable, malformed (tokenizer_config.json not JSON) or
// outside the subset (kNotSupported), with the file named.
Result<std::optional<ChatTemplate>> LoadChatTemplate(const std::string& model_path);

}  // namespace lockstep
