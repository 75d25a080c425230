#include "serve/chat_handler.h"

#include <httplib.h>

#include <utility>
#include <variant>

#include "lockstep/harness/chat_prompt.h"
#include "serve/choices.h"
#include "serve/completions_handler.h"
#include "serve/http_server.h"
#include "serve/json_body.h"

namespace lockstep {

namespace {

using J = nlohmann::ordered_json;

// Chat fields lockstep does not answer in chat shape: refused with why, never ignored.
std::optional<ApiError> RefuseUnsupported(const J& body) {
  static const std::pair<const char*, const char*> kRefused[] = {
      {"tools", "tool calls are not parsed from the output yet: send the tool text in messages"},
      {"tool_choice", "tool calls are not parsed from the output yet"},
      {"functions", "function calls are not parsed from the output yet"},
      {"function_call", "function calls are not parsed from the output yet"},
      {"response_format", "constrained output (JSON mode) is not implemented"},
      {"logprobs", "chat logprobs are not implemented: use /v1/completions with logprobs"},
      {"top_logprobs", "chat logprobs are not implemented: use /v1/completions with logprobs"},
  };
  for (const auto& [field, why] : kRefused)
    if (body.contains(field) && !body[field].is_null() &&
        !(body[field].is_boolean() && !body[field].get<bool>()))
      return ApiError::BadRequest(std::string("'") + field + "' is not supported: " + why, field,
                                  "unsupported_field");
  return std::nullopt;
}

}  // namespace

void HandleChatCompletion(ServeContext& ctx, const httplib::Request& req, httplib::Response& res) {
  if (!ctx.ready) return SendError(res, ApiError::Unavailable("loading the model", "loading"));
  if (ctx.draining)
    return SendError(res, ApiError::Unavailable("the server is shutting down", "draining"));
  if (!ctx.chat_template)
    return SendError(res, ApiError::BadRequest(ctx.chat_template_error, "messages",
                                               "chat_template_unavailable"));
  auto parsed_body = ParseJsonObjectBody<J>(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return SendError(res, *e);
  J body = std::move(std::get<J>(parsed_body));
  if (auto e = RefuseUnsupported(body)) return SendError(res, *e);
  if (body.contains("prompt"))
    return SendError(res, ApiError::BadRequest("unknown field 'prompt' (a chat request has "
                                               "messages; /v1/completions takes a prompt)",
                                               "prompt", "unknown_field"));
  auto prompt = TakeChatPrompt(body);
  if (!prompt.ok())
    return SendError(res, ApiError::BadRequest(prompt.status().message(), "messages"));
  auto text = RenderChatPrompt(*ctx.chat_template, *prompt);
  if (!text.ok())
    return SendError(
        res, ApiError::BadRequest(text.status().message(), "messages", "chat_template_failed"));
  if (text->empty())
    return SendError(res, ApiError::BadRequest("the chat template rendered an empty prompt",
                                               "messages", "chat_template_failed"));
  if (body.contains("max_completion_tokens")) {
    if (body.contains("max_tokens"))
      return SendError(res, ApiError::BadRequest("give max_tokens or max_completion_tokens, not "
                                                 "both",
                                                 "max_completion_tokens"));
    body["max_tokens"] = std::move(body["max_completion_tokens"]);
    body.erase("max_completion_tokens");
  }
  body["prompt"] = std::move(*text);
  auto parsed =
      ParseCompletionRequest(body.dump(-1, ' ', false, J::error_handler_t::replace), ctx.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
  CompletionRequest r = std::move(std::get<CompletionRequest>(parsed));
  if (r.logprobs >= 0)
    return SendError(res, ApiError::BadRequest("chat logprobs are not implemented", "logprobs"));
  r.chat = true;
  RunChoices(ctx, std::move(r), res);
}

}  // namespace lockstep
