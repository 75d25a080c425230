// CompletionRequest: the body of `POST /v1/completions` (OpenAI legacy completions) parsed and
// validated, before anything touches the engine. Pure: JSON text in, a request or an ApiError
// (400, naming the field) out; the libFuzzer target tests/fuzz/serve_request_fuzz.cpp runs it.
//
// Accepted fields (any other is refused by name): model, prompt (a non-empty string or a
// non-empty array of token ids), max_tokens (default 16), temperature [0, 2], top_p (0, 1],
// top_k >= 0, seed (unsigned 64-bit), stop (a string or up to 4 non-empty strings), stream, n
// (1 only), logprobs (null or 0..5), ignore_eos, presence_penalty / frequency_penalty [-2, 2],
// repeat_penalty (0, 10], repeat_last_n >= -1, id_slot (-1, or a slot holding a kept
// conversation that the prompt continues), and `lockstep` {arm, export, trace, cache, keep,
// priority}:
// export is true or {windows, points} (the file is named by the server, never by the client);
// cache is "use" (default) or "bypass" (the request neither reads nor writes the prefix cache);
// keep = true holds the finished conversation in its slot (POST /slots/{id}, id_slot); priority
// (-1000..1000, default 0): a waiting request preempts running ones of lower priority
// (lockstep/engine/scheduler.h, "Preemption").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "serve/api_error.h"

namespace lockstep {

struct CompletionLimits {
  int n_vocab = 0;         // token ids must be below
  int max_context = 4096;  // prompt + max_tokens at most (checked again after encoding)
  std::size_t max_prompt_bytes = 1 << 20;
  std::string model_name;  // `model` must be this when given ("" = any)
};

struct ExportRequest {
  std::string windows = "0-2";  // WindowSelection text
  std::string points = "pre_verify,post_verify,commit";
};

struct CompletionRequest {
  std::string model;
  std::optional<std::string> prompt_text;  // exactly one of text and ids
  std::vector<std::int32_t> prompt_ids;
  int max_tokens = 16;
  double temperature = 1.0;  // OpenAI's default; 0 = greedy
  double top_p = 1.0;
  int top_k = 0;
  double presence_penalty = 0.0;   // OpenAI's; SamplingParams says how each penalty acts
  double frequency_penalty = 0.0;  // OpenAI's
  double repeat_penalty = 1.0;     // llama.cpp's (llama-server spells it so)
  int repeat_last_n = 64;          // llama.cpp's; -1 = the whole context
  std::uint64_t seed = 0;
  bool seed_given = false;  // the body had a seed (else the server's --seed-default decides)
  bool seed_drawn = false;  // the server drew `seed` (reported as lockstep.seed_drawn)
  int n = 1;                // choices: choice k runs with seed + k (choices.h)
  std::vector<std::string> stop;
  bool stream = false;
  int logprobs = -1;  // -1 = none
  bool ignore_eos = false;
  // lockstep diagnostics
  std::string arm;
  std::optional<ExportRequest> export_request;
  bool trace = false;
  bool cache_bypass = false;   // lockstep.cache = "bypass"
  bool keep = false;           // lockstep.keep: the slot holds the conversation afterwards
  int priority = 0;            // lockstep.priority (RequestSpec::priority)
  int id_slot = -1;            // continue the conversation kept in this slot
  bool chat = false;           // POST /v1/chat/completions: the answer in chat shape
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage alone
  bool user_given = false;     // `user` was sent (accepted, not used; the log says so)
};

// Parses `body`. Errors (all ApiError 400 unless noted): not JSON or not an object ("invalid
// JSON"), nesting deeper than 32, an unknown field (code unknown_field, param = its name), a wrong
// type, a value out of range, ids outside the vocabulary, prompt + max_tokens over max_context;
// a `model` other than the served one is 404 (model_not_found).
std::variant<CompletionRequest, ApiError> ParseCompletionRequest(std::string_view body,
                                                                 const CompletionLimits& limits);

// The context check, also run after a text prompt is encoded: 400 when n_prompt + max_tokens
// exceeds limits.max_context (the message gives both numbers).
// A seed for a request that gave none: 53 bits from std::random_device (the OS's entropy), so
// a JavaScript client reads the reported seed exactly.
std::uint64_t DrawSeed();

std::optional<ApiError> CheckContext(std::size_t n_prompt, int max_tokens,
                                     const CompletionLimits& limits);

}  // namespace lockstep
