// POST /v1/chat/completions: the chat fields of the body (chat_prompt.h: messages,
// add_generation_prompt, chat_template_kwargs.enable_thinking) rendered with the model's chat
// template into the prompt text, `max_completion_tokens` read as max_tokens, every other field
// parsed and checked as a completion's (completion_request.h), then the completions path
// (RunCompletion): the same engine request, exports, `lockstep` object and usage, answered in
// chat shape (object "chat.completion", choices[].message; streamed as "chat.completion.chunk"
// with choices[].delta). Refusals: 400 a model without a chat template or with one outside the
// interpreter's subset (the message says which and why), bad messages, the template failing on
// them; `tools`, `tool_choice`, `response_format`, `logprobs` / `top_logprobs` and `functions`
// are 400 with the reason (no tool-call or logprob output in chat shape yet).
#pragma once

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lockstep {

struct ServeContext;

void HandleChatCompletion(ServeContext& ctx, const httplib::Request& req, httplib::Response& res);

}  // namespace lockstep
