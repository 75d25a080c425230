// POST /v1/completions: parse and validate the body (completion_request.h), encode the prompt,
// open the request's export when asked, hand the job to the engine driver and answer: one JSON
// response, or Server-Sent Events (`data: {...}` per window's text, a last chunk with
// finish_reason, usage and the lockstep object, then `data: [DONE]`). A streaming client that
// goes away (a failed write; an idle stream writes an SSE comment every second to notice)
// cancels its request, which frees its slot. Refusals: 400 (body), 404 (model), 429 + Retry-After
// (queue full), 503 + Retry-After (loading, draining).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/engine/weights.h"
#include "serve/api_error.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lockstep {

struct ServeContext;

void HandleCompletion(ServeContext& ctx, const httplib::Request& req, httplib::Response& res);

// Sets `res` to `e` (status, JSON body, Retry-After for 429 and 503).
void SendError(httplib::Response& res, const ApiError& e);

// The prompt text as token ids with the model's tokenizer: byte-level for the synthetic models
// (a vocabulary of at least 256 ids). The one place a tokenizer is chosen. kInvalidArgument when
// the model has no tokenizer lockstep supports.
Result<std::vector<std::int32_t>> EncodePrompt(const ModelWeights& model, std::string_view text);

}  // namespace lockstep
