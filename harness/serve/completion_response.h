// The JSON of `POST /v1/completions` answers: the whole response, one Server-Sent-Events chunk
// (`data: {...}\n\n`, object "text_completion" as OpenAI streams it) and the `lockstep` object
// (output ids, window summary, config and request digests, prefix reuse, export file name and
// digest, the server's engine instance).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/engine/scheduler.h"
#include "lockstep/engine/tokenizer.h"
#include "serve/serve_job.h"

namespace lockstep {

struct ResponseContext {
  std::string model_name;
  std::int64_t created = 0;   // unix seconds
  std::string config_sha256;  // of the request's effective EngineConfig
  std::string export_file;    // "" = none
  std::string export_sha256;  // the finished export's SHA-256 ("" = none)
  std::string engine_instance;
  const Tokenizer* tokenizer = nullptr;  // the model's (logprobs' token texts)
};

// OpenAI's logprobs object for `lps` (tokens as `tok` decodes them).
nlohmann::json LogprobsJson(const std::vector<TokenLogprob>& lps, const Tokenizer& tok);

// The `lockstep` object of a finished request.
nlohmann::json LockstepJson(const ServeJob& job, const RequestResult& r, const ResponseContext& c);

nlohmann::json UsageJson(const ServeJob& job, const RequestResult& r);

// The non-streamed response.
nlohmann::json CompletionJson(const ServeJob& job, const RequestResult& r, const std::string& text,
                              const std::vector<TokenLogprob>& lps, const ResponseContext& c);

// One SSE event: `data: <chunk>\n\n` where chunk carries `text` (and logprobs when asked); with
// `last`, also finish_reason, usage and the lockstep object.
std::string SseChunk(const ServeJob& job, const std::string& text,
                     const std::vector<TokenLogprob>& lps, const std::string* finish_reason,
                     const RequestResult* last, const ResponseContext& c);

// The JSON text of `j` for the wire (invalid UTF-8 replaced, never thrown).
std::string Dump(const nlohmann::json& j);

}  // namespace lockstep
