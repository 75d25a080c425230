#include "serve/completions_handler.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>
#include <utility>
#include <variant>

#include "lockstep/engine/clock.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/harness/prompt_text.h"
#include "lockstep/instrument/fingerprint.h"
#include "serve/choices.h"
#include "serve/completion_response.h"
#include "serve/http_server.h"
#include "serve/request_export.h"

namespace lockstep {

namespace {

// The server's config with the request's own fields: what `lockstep generate` would run with
// the same engine flags and --max-new / --temperature / --top-p / --top-k / --seed.
EngineConfig RequestConfig(const EngineConfig& base, const CompletionRequest& r) {
  EngineConfig c = base;
  c.max_new = r.max_tokens;
  c.temperature = r.temperature;
  c.top_p = r.top_p;
  c.top_k = r.top_k;
  c.presence_penalty = r.presence_penalty;
  c.frequency_penalty = r.frequency_penalty;
  c.repeat_penalty = r.repeat_penalty;
  c.repeat_last_n = r.repeat_last_n;
  c.seed = r.seed;
  c.ignore_eos = r.ignore_eos;
  return c;
}

// Everything a finished request's answer needs, taken from its channel.
struct Outcome {
  std::optional<ApiError> error;
  std::optional<RequestResult> result;
  std::string finish_reason, delta;
  std::vector<TokenLogprob> logprobs;
  bool done = false;
};

Outcome TakeOutcome(ServeJob& job) {
  Outcome o;
  o.error = job.error;
  o.done = job.done;
  o.delta.swap(job.delta);
  o.logprobs.swap(job.delta_logprobs);
  if (job.done) {
    o.result = job.result;
    o.finish_reason = job.finish_reason;
  }
  return o;
}

// The response context every chunk shares (no digests: those are the last chunk's).
ResponseContext BaseContext(const ServeContext& ctx) {
  ResponseContext rc;
  rc.model_name = ctx.limits.model_name;
  rc.created = std::time(nullptr);
  rc.engine_instance = ctx.engine_instance;
  rc.tokenizer = ctx.tokenizer;
  return rc;
}

// Finishes the export of a completed request and registers it for download (its digest computed
// once, here); a request that did not finish has its name forgotten (404, its `.partial` stays).
// The answer's context: file name and digest ("" when there is no export). An export that passed
// its byte budget (--max-export-mib) sets `*refused` (413: the request is answered with it; the
// exporter has removed the file).
ResponseContext Answer(ServeContext& ctx, ServeJob& job, const RequestResult& r,
                       const EngineConfig& cfg, std::optional<ApiError>* refused) {
  ResponseContext rc = BaseContext(ctx);
  rc.config_sha256 = Sha256Hex(cfg.ToJson());
  if (!job.exporter) return rc;
  if (r.end != RequestEnd::kFinished) {
    job.served.Forget();
    return rc;
  }
  const bool over_budget = job.exporter->over_budget();
  Status s = FinishRequestExport(ctx, job, r, cfg);
  if (!s.ok()) {
    job.served.Forget();
    if (over_budget) {
      std::fprintf(stderr, "serve: %s: export over --max-export-mib, removed\n", job.id.c_str());
      *refused = ApiError::TooLarge(s.message());
      refused->value().param = "lockstep.export";
      refused->value().code = "export_too_large";
      return rc;
    }
    std::fprintf(stderr, "serve: %s: export not written (%s)\n", job.id.c_str(),
                 std::string(Status::CodeName(s.code())).c_str());
    return rc;
  }
  rc.export_file = job.served.name();
  auto entry = job.served.Finish();
  if (entry.ok())
    rc.export_sha256 = entry->sha256;
  else
    std::fprintf(stderr, "serve: %s: export written, not hashed (%s)\n", job.id.c_str(),
                 std::string(Status::CodeName(entry.status().code())).c_str());
  return rc;
}

void Respond(ServeContext& ctx, ServeJob& job, const EngineConfig& cfg, httplib::Response& res) {
  Outcome o;
  {
    std::unique_lock lk(job.mu);
    job.cv.wait(lk, [&] { return job.done; });
    o = TakeOutcome(job);
  }
  if (o.error || o.finish_reason == "cancelled") job.served.Forget();
  if (o.error) return SendError(res, *o.error);
  if (o.finish_reason == "cancelled")
    return SendError(
        res, ApiError::Unavailable("the request was cancelled (server shutdown)", "cancelled"));
  std::optional<ApiError> refused;
  const ResponseContext rc = Answer(ctx, job, *o.result, cfg, &refused);
  if (refused) return SendError(res, *refused);
  res.set_content(Dump(CompletionJson(job, *o.result, job.text.Text(), o.logprobs, rc)),
                  "application/json");
}

void Stream(ServeContext& ctx, const ServeJobPtr& job, const EngineConfig& cfg,
            httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  auto last_write = std::make_shared<std::int64_t>(MonotonicNs());
  EngineDriver* driver = ctx.driver;
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, job, cfg, last_write, driver](std::size_t, httplib::DataSink& sink) {
        Outcome o;
        {
          std::unique_lock lk(job->mu);
          job->cv.wait_for(lk, std::chrono::milliseconds(200), [&] {
            return job->done || !job->delta.empty() || !job->delta_logprobs.empty();
          });
          o = TakeOutcome(*job);
        }
        auto write = [&](const std::string& s) {
          *last_write = MonotonicNs();
          return sink.write(s.data(), s.size());
        };
        bool ok = true;
        if (!o.delta.empty() || !o.logprobs.empty()) {
          const ResponseContext rc = BaseContext(ctx);
          ok = write(SseChunk(*job, o.delta, o.logprobs, nullptr, nullptr, rc));
        } else if (!o.done && MonotonicNs() - *last_write > 1'000'000'000) {
          ok = write(": keep-alive\n\n");  // a gone client fails this write
        }
        if (ok && o.done) {
          if (o.error) {
            job->served.Forget();
            ok = write("data: " + o.error->Body() + "\n\n");
          } else {
            std::optional<ApiError> refused;
            const ResponseContext rc = Answer(ctx, *job, *o.result, cfg, &refused);
            ok = refused ? write("data: " + refused->Body() + "\n\n")
                         : write(SseChunk(*job, "", {}, &o.finish_reason, &*o.result, rc));
          }
          ok = ok && write("data: [DONE]\n\n");
          if (ok) sink.done();
        }
        if (!ok) driver->Cancel(job);
        return ok;
      },
      [&ctx, job, driver](bool success) {
        if (success) return;
        driver->Cancel(job);
        // Gone before its end: its export never finishes (a name still finishing stays).
        job->served.ForgetIfWriting();
      });
}

}  // namespace

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(e.Body(), "application/json");
}

Result<std::vector<std::int32_t>> EncodePrompt(const Tokenizer& tok, int n_vocab,
                                               std::string_view text) {
  return EncodePromptText(tok, text, n_vocab);
}

void HandleCompletion(ServeContext& ctx, const httplib::Request& req, httplib::Response& res) {
  if (!ctx.ready) return SendError(res, ApiError::Unavailable("loading the model", "loading"));
  if (ctx.draining)
    return SendError(res, ApiError::Unavailable("the server is shutting down", "draining"));
  auto parsed = ParseCompletionRequest(req.body, ctx.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
  RunChoices(ctx, std::move(std::get<CompletionRequest>(parsed)), res);
}

void RunCompletion(ServeContext& ctx, CompletionRequest r, httplib::Response& res) {
  if (!r.seed_given && !r.seed_drawn && r.temperature > 0 && ctx.opts.seed_default == "random") {
    r.seed = DrawSeed();
    r.seed_drawn = true;
  }
  std::vector<std::int32_t> prompt = r.prompt_ids;
  if (r.prompt_text) {
    auto enc = EncodePrompt(*ctx.tokenizer, ctx.limits.n_vocab, *r.prompt_text);
    if (!enc.ok()) return SendError(res, ApiError::BadRequest(enc.status().message(), "prompt"));
    prompt = std::move(*enc);
    if (auto e = CheckContext(prompt.size(), r.max_tokens, ctx.limits)) return SendError(res, *e);
  }
  if (r.export_request && ctx.opts.export_dir.empty())
    return SendError(res, ApiError::BadRequest("exports need a server started with --export-dir",
                                               "lockstep.export", "export_disabled"));
  char num[24];
  std::snprintf(num, sizeof(num), "%06llu", static_cast<unsigned long long>(ctx.next_id++));
  const std::string id = ctx.id_prefix + num;
  if (r.user_given)
    std::fprintf(stderr, "serve: %s: 'user' given (accepted, not used)\n", id.c_str());
  auto job = std::make_shared<ServeJob>(id, std::move(r), std::move(prompt));
  const EngineConfig cfg = RequestConfig(ctx.engine_config, job->req);
  job->options = RequestOptions::FromConfig(cfg);
  if (job->req.export_request) {
    auto ex = OpenRequestExport(ctx.opts.export_dir, id, *job->req.export_request,
                                ctx.opts.max_export_mib, job->req.max_tokens);
    if (!ex.ok()) {
      if (ex.status().code() == Status::Code::kInvalidArgument)
        return SendError(res, ApiError::BadRequest(ex.status().message(), "lockstep.export"));
      std::fprintf(stderr, "serve: %s: export not opened\n", id.c_str());
      return SendError(res, ApiError::Internal("the export could not be created"));
    }
    job->exporter = std::move(*ex);
    job->served = ServedExport(ctx.exports, ExportFileName(id),
                               ctx.opts.export_dir + "/" + ExportFileName(id));
  }
  job->arrive_ns = MonotonicNs();
  res.set_header("X-Request-Id", id);
  ctx.driver->Submit(job);
  {
    std::unique_lock lk(job->mu);
    job->cv.wait(lk, [&] { return job->accepted || job->done; });
    if (job->done && job->error) {
      const ApiError e = *job->error;
      lk.unlock();
      job->served.Forget();
      return SendError(res, e);
    }
  }
  if (!job->req.stream) return Respond(ctx, *job, cfg, res);
  Stream(ctx, job, cfg, res);
}

}  // namespace lockstep
