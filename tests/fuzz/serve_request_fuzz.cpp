// libFuzzer target: arbitrary bytes -> ParseCompletionRequest, the body parser of
// `POST /v1/completions` (harness/serve/completion_request.h).
//
// The contract under test: every body either parses into a request whose fields are inside the
// documented ranges (prompt ids inside the vocabulary, prompt + max_tokens within the context,
// at most 4 stop strings, logprobs <= 5), or yields an ApiError with status 400 or 404, a message
// and a body that is valid JSON. Never a crash, a hang, undefined behaviour or an exception.
// Built only with clang (see CMakeLists.txt here and the Makefile's test-fuzz); run e.g.
// `./serve_request_fuzz -max_total_time=60 -max_len=4096 corpus/serve_request/`.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>
#include <variant>

#include "serve/completion_request.h"

namespace {

void Require(bool cond) {
  if (!cond) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  lockstep::CompletionLimits lim;
  lim.n_vocab = 512;
  lim.max_context = 256;
  lim.max_prompt_bytes = 1024;
  lim.model_name = "tiny";
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto r = lockstep::ParseCompletionRequest(body, lim);
  if (auto* e = std::get_if<lockstep::ApiError>(&r)) {
    Require(e->status == 400 || e->status == 404);
    Require(!e->message.empty());
    Require(!nlohmann::json::parse(e->Body(), nullptr, false).is_discarded());
    return 0;
  }
  const auto& q = std::get<lockstep::CompletionRequest>(r);
  Require(q.prompt_text.has_value() != !q.prompt_ids.empty());
  for (std::int32_t id : q.prompt_ids) Require(id >= 0 && id < lim.n_vocab);
  if (!q.prompt_text) Require(q.prompt_ids.size() + std::size_t(q.max_tokens) <= 256u);
  Require(q.max_tokens >= 1 && q.max_tokens <= lim.max_context);
  Require(q.stop.size() <= 4);
  Require(q.logprobs >= -1 && q.logprobs <= 5);
  Require(q.temperature >= 0 && q.temperature <= 2 && q.top_p > 0 && q.top_p <= 1);
  Require(q.top_k >= 0 && q.top_k <= lim.n_vocab);
  return 0;
}
