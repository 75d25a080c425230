// POST /v1/completions: parse and validate the body (completion_request.h), encode the prompt,
// open the request's export when asked, hand the job to the engine driver and answer: one JSON
// response, or Server-Sent Events (`data: {...}` per window's text, a last chunk with
// finish_reason, usage and the lockstep object, then `data: [DONE]`). A streaming client that
// goes away (a failed write; an idle stream writes an SSE comment every second to notice)
// cancels its request, which frees its slot. A finished export is registered for download
// (export_registry.h) with its SHA-256 in the answer. Refusals: 400 (body; an id_slot prompt that
// does not continue the slot's conversation), 404 (model), 409 (id_slot names a slot without a
// kept conversation), 429 + Retry-After (queue full), 503 + Retry-After (loading, draining).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/engine/weights.h"
#include "serve/api_error.h"
#include "serve/completion_request.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lockstep {

struct ServeContext;

void HandleCompletion(ServeContext& ctx, const httplib::Request& req, httplib::Response& res);

// Everything after the body is parsed: encode, export, submit, answer (JSON or SSE). The chat
// endpoint (chat_handler.h) comes in here with its rendered prompt (`r.chat` shapes the answer).
void RunCompletion(ServeContext& ctx, CompletionRequest r, httplib::Response& res);

// Sets `res` to `e` (status, JSON body, Retry-After for 429 and 503).
void SendError(httplib::Response& res, const ApiError& e);

// The prompt text as token ids with the model's tokenizer (`tok`: the model folder's
// tokenizer.json, else byte level; serve_command.cpp loads it as `lockstep generate` does), so a
// text prompt gets generate's ids. kInvalidArgument (a 400 naming "prompt"): text that is not
// valid UTF-8 for a BPE tokenizer, an id outside the model's `n_vocab`, or byte level on a
// vocabulary under 256 ids.
Result<std::vector<std::int32_t>> EncodePrompt(const Tokenizer& tok, int n_vocab,
                                               std::string_view text);

}  // namespace lockstep
