#include "serve/completion_response.h"

#include <map>

#include "lockstep/engine/tokenizer.h"
#include "lockstep/instrument/fingerprint.h"
#include "serve/chat_response.h"
#include "serve/text_stream.h"

namespace lockstep {

namespace {

nlohmann::json WindowSummary(const RequestResult& r) {
  std::map<std::string, std::pair<long, long>> by_source;  // drafted, accepted
  for (const auto& w : r.result.windows) {
    auto& e = by_source[DraftSourceName(w.source)];
    e.first += w.T - 1;
    e.second += w.accepted;
  }
  nlohmann::json s;
  s["n"] = r.result.n_windows;
  s["tokens_per_window"] =
      r.result.n_windows ? static_cast<double>(r.result.output.size()) / r.result.n_windows : 0.0;
  s["sources"] = nlohmann::json::object();
  for (const auto& [k, v] : by_source)
    s["sources"][k] = {{"drafted", v.first}, {"accepted", v.second}};
  return s;
}

nlohmann::json Choice(const std::string& text, const ServeJob& job,
                      const std::vector<TokenLogprob>& lps, const std::string* finish_reason,
                      const ResponseContext& rc) {
  nlohmann::json c;
  c["text"] = text;
  c["index"] = 0;
  c["logprobs"] = job.req.logprobs >= 0 && rc.tokenizer ? LogprobsJson(lps, *rc.tokenizer)
                                                        : nlohmann::json(nullptr);
  c["finish_reason"] = finish_reason ? nlohmann::json(*finish_reason) : nlohmann::json(nullptr);
  return c;
}

}  // namespace

std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json LogprobsJson(const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  nlohmann::json tokens = nlohmann::json::array(), token_lps = nlohmann::json::array(),
                 top = nlohmann::json::array(), ids = nlohmann::json::array();
  for (const TokenLogprob& lp : lps) {
    tokens.push_back(SanitizeUtf8(TokenBytes(tok, {lp.token})));
    ids.push_back(lp.token);
    token_lps.push_back(lp.logprob);
    nlohmann::json t = nlohmann::json::object();
    for (const auto& [id, v] : lp.top) t[SanitizeUtf8(TokenBytes(tok, {id}))] = v;
    top.push_back(t);
  }
  return {
      {"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", top}, {"token_ids", ids}};
}

nlohmann::json LockstepJson(const ServeJob& job, const RequestResult& r, const ResponseContext& c) {
  nlohmann::json l;
  l["request_id"] = job.id;
  l["output_ids"] = r.result.output;
  l["stop_reason"] = r.result.stop_reason;
  l["end"] = RequestEndName(r.end);
  l["windows"] = WindowSummary(r);
  l["config_sha256"] = c.config_sha256;
  l["request_sha256"] = Sha256Tokens(job.prompt);
  l["prompt_tokens_reused"] = r.prefix.reused_tokens;
  l["snapshot_position"] = r.prefix.snapshot_position;
  l["slot_tokens_reused"] = job.slot_reused;
  l["prefix_reuse"] = ReuseReasonText(r.prefix);
  l["slot"] = r.slot;
  if (!r.preemptions.empty())  // issue 40: each preemption (scheduler.h PreemptionRecord)
    l["preemptions"] = nlohmann::json::parse(PreemptionsJson(r.preemptions));
  l["steps"] = {{"first", r.first_step}, {"last", r.last_step}};
  l["export"] = c.export_file.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.export_file);
  l["export_sha256"] =
      c.export_sha256.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.export_sha256);
  l["engine_instance"] = c.engine_instance;
  l["cache"] = job.req.cache_bypass ? "bypass" : "use";
  l["seed"] = job.req.seed;
  l["seed_drawn"] = job.req.seed_drawn;
  if (job.req.trace) {
    nlohmann::json t = nlohmann::json::array();
    for (const auto& w : r.result.windows)
      t.push_back(nlohmann::json::parse(w.ToJsonLine(), nullptr, false));
    l["trace"] = t;
  }
  return l;
}

nlohmann::json UsageJson(const ServeJob& job, const RequestResult& r) {
  const auto n_prompt = static_cast<std::int64_t>(job.prompt.size());
  const auto n_out = static_cast<std::int64_t>(r.result.output.size());
  return {{"prompt_tokens", n_prompt},
          {"completion_tokens", n_out},
          {"total_tokens", n_prompt + n_out},
          {"prompt_tokens_details", {{"cached_tokens", r.prefix.reused_tokens + job.slot_reused}}}};
}

nlohmann::json CompletionJson(const ServeJob& job, const RequestResult& r, const std::string& text,
                              const std::vector<TokenLogprob>& lps, const ResponseContext& c) {
  // "stop" whenever a stop string ended the text, also on the last allowed token.
  const std::string reason =
      r.result.stop_reason == "length" && !job.text.stopped() ? "length" : "stop";
  nlohmann::json j;
  j["id"] = job.id;
  j["object"] = "text_completion";
  j["created"] = c.created;
  j["model"] = c.model_name;
  j["choices"] = nlohmann::json::array({Choice(text, job, lps, &reason, c)});
  j["usage"] = UsageJson(job, r);
  j["lockstep"] = LockstepJson(job, r, c);
  return job.req.chat ? ToChatJson(std::move(j), false) : j;
}

std::string SseChunk(const ServeJob& job, const std::string& text,
                     const std::vector<TokenLogprob>& lps, const std::string* finish_reason,
                     const RequestResult* last, const ResponseContext& c) {
  nlohmann::json j;
  j["id"] = job.id;
  j["object"] = "text_completion";
  j["created"] = c.created;
  j["model"] = c.model_name;
  j["choices"] = nlohmann::json::array({Choice(text, job, lps, finish_reason, c)});
  if (last) {
    j["usage"] = UsageJson(job, *last);
    j["lockstep"] = LockstepJson(job, *last, c);
  }
  if (job.req.chat) j = ToChatJson(std::move(j), true);
  if (!last || !job.req.include_usage) return "data: " + Dump(j) + "\n\n";
  // stream_options.include_usage: as OpenAI streams it, usage comes in a chunk of its own with
  // no choices after the one with finish_reason.
  nlohmann::json usage = {{"id", j["id"]},
                          {"object", j["object"]},
                          {"created", j["created"]},
                          {"model", j["model"]},
                          {"choices", nlohmann::json::array()},
                          {"usage", j["usage"]}};
  j["usage"] = nullptr;
  return "data: " + Dump(j) + "\n\ndata: " + Dump(usage) + "\n\n";
}

}  // namespace lockstep
