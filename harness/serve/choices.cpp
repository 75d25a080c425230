#include "serve/choices.h"

#include <httplib.h>

#include <thread>
#include <utility>
#include <vector>

#include "serve/completion_response.h"
#include "serve/completions_handler.h"
#include "serve/http_server.h"

namespace lockstep {

void RunChoices(ServeContext& ctx, CompletionRequest r, httplib::Response& res) {
  if (r.n == 1) return RunCompletion(ctx, std::move(r), res);
  if (r.stream)
    return SendError(res, ApiError::BadRequest("n > 1 cannot be streamed (send n requests, or "
                                               "stream: false)",
                                               "n", "unsupported_field"));
  if (r.keep || r.id_slot >= 0)
    return SendError(res, ApiError::BadRequest("n > 1 cannot keep or continue a slot's "
                                               "conversation",
                                               "n"));
  if (!r.seed_given && r.temperature > 0 && ctx.opts.seed_default == "random") {
    r.seed = DrawSeed();
    r.seed_drawn = true;
  }
  const int n = r.n;
  std::vector<httplib::Response> answers(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k) {
    CompletionRequest rk = r;
    rk.n = 1;
    rk.seed = r.seed + static_cast<std::uint64_t>(k);
    threads.emplace_back([&ctx, &answers, k, rk = std::move(rk)]() mutable {
      RunCompletion(ctx, std::move(rk), answers[static_cast<std::size_t>(k)]);
    });
  }
  for (auto& t : threads) t.join();
  nlohmann::json merged, locksteps = nlohmann::json::array();
  std::int64_t completion_tokens = 0;
  for (int k = 0; k < n; ++k) {
    httplib::Response& a = answers[static_cast<std::size_t>(k)];
    if (a.status != -1 && a.status != 200) {  // the first refusal is the answer
      res = std::move(a);
      return;
    }
    nlohmann::json j = nlohmann::json::parse(a.body, nullptr, false);
    if (!j.is_object() || !j.contains("choices") || j["choices"].empty())
      return SendError(res, ApiError::Internal("a choice's answer could not be read"));
    nlohmann::json choice = j["choices"][0];
    choice["index"] = k;
    completion_tokens += j["usage"]["completion_tokens"].get<std::int64_t>();
    locksteps.push_back(j["lockstep"]);
    if (k == 0) {
      merged = std::move(j);
      merged["choices"] = nlohmann::json::array();
      res.set_header("X-Request-Id", a.get_header_value("X-Request-Id"));
    }
    merged["choices"].push_back(std::move(choice));
  }
  const std::int64_t prompt_tokens = merged["usage"]["prompt_tokens"].get<std::int64_t>();
  merged["usage"]["completion_tokens"] = completion_tokens;
  merged["usage"]["total_tokens"] = prompt_tokens + completion_tokens;
  merged["lockstep"]["choices"] = std::move(locksteps);
  res.set_content(Dump(merged), "application/json");
}

}  // namespace lockstep
