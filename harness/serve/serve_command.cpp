#include "lockstep/harness/serve_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <ostream>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/instrument/fingerprint.h"
#include "serve/engine_driver.h"
#include "serve/http_server.h"
#include "serve/lifecycle.h"
#include "serve/lockstep_endpoints.h"
#include "serve/stale_files.h"

namespace lockstep {

namespace {

constexpr double kMaxKeepIdleS = 365.0 * 24 * 3600;  // a year: far from clock overflow

bool LoopbackHost(const std::string& h) {
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

Status CheckOptions(ServeOptions& o) {
  if (o.api_key.empty())
    if (const char* k = std::getenv("LOCKSTEP_API_KEY")) o.api_key = k;
  if (!LoopbackHost(o.host) && o.api_key.empty())
    return Status::InvalidArgument(
        "--host " + o.host,
        "serving beyond loopback needs an API key (--api-key or LOCKSTEP_API_KEY)");
  if (o.port < 0 || o.port > 65535) return Status::InvalidArgument("--port", "must be 0..65535");
  if (o.max_body < 1024) return Status::InvalidArgument("--max-body", "must be at least 1024");
  if (o.max_context < 2) return Status::InvalidArgument("--max-context", "must be at least 2");
  if (o.http_threads < 1 || o.max_connections < o.http_threads)
    return Status::InvalidArgument("--http-threads",
                                   "needs 1 <= --http-threads <= --max-connections");
  if (o.keep_max < -1 || o.keep_max > o.config.slots)
    return Status::InvalidArgument("--keep-max",
                                   "must be 0..--slots (" + std::to_string(o.config.slots) + ")");
  if (!(o.keep_idle_s >= 0 && o.keep_idle_s <= kMaxKeepIdleS))
    return Status::InvalidArgument("--keep-idle", "must be 0 (never) .. 31536000 seconds");
  if (o.read_timeout_s < 1 || o.write_timeout_s < 1 || o.drain_s < 0)
    return Status::InvalidArgument("--read-timeout/--write-timeout/--drain-s",
                                   "timeouts are at least 1 s, the drain at least 0");
  for (const std::string* d : {&o.export_dir, &o.slot_dir})
    if (!d->empty() && !std::filesystem::is_directory(*d))
      return Status::InvalidArgument(d == &o.export_dir ? "--export-dir" : "--slot-dir",
                                     "is not an existing folder");
  if (o.config.model.empty())
    return Status::InvalidArgument("--model", "is required (a folder with config.json)");
  return Status::Ok();
}

std::string ModelName(const ServeOptions& o) {
  if (!o.model_name.empty()) return o.model_name;
  std::filesystem::path p(o.config.model);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

std::string IdPrefix() {
  const auto t = std::chrono::system_clock::now().time_since_epoch().count();
  return "cmpl-" + Sha256Hex(std::to_string(::getpid()) + "/" + std::to_string(t)).substr(0, 8) +
         "-";
}

}  // namespace

Status RunServeCommand(const ServeOptions& opts_in, std::ostream& out) {
  ServeOptions opts = opts_in;
  LOCKSTEP_RETURN_IF_ERROR(CheckOptions(opts));
  EngineConfig cfg = opts.config;
  LOCKSTEP_RETURN_IF_ERROR(cfg.Validate());
  if (cfg.threads == 0) cfg.threads = ThreadPool::HardwareThreads();

  ShutdownSignals signals;  // before any thread starts: every thread inherits the mask
  ServeContext ctx;
  ctx.opts = opts;
  ctx.id_prefix = IdPrefix();
  LOCKSTEP_ASSIGN_OR_RETURN(ctx.engine_instance, NewEngineInstance());
  ctx.started_unix = static_cast<std::int64_t>(std::time(nullptr));
  // Leftovers of earlier processes (unfinished exports, slot temp files) in the two folders:
  // those unchanged for a minute before this start (a live process's file is recent).
  for (const std::string* d : {&opts.export_dir, &opts.slot_dir}) {
    if (d->empty()) continue;
    const StaleSweep sw = RemoveStaleFiles(*d, static_cast<std::time_t>(ctx.started_unix - 60));
    ctx.metrics.CountStaleRemoved(sw.files, sw.bytes);
    if (sw.files > 0)
      std::fprintf(stderr, "serve: removed %llu stale files (%llu bytes) left in %s\n",
                   static_cast<unsigned long long>(sw.files),
                   static_cast<unsigned long long>(sw.bytes),
                   d == &opts.export_dir ? "--export-dir" : "--slot-dir");
  }
  ctx.limits.model_name = ModelName(opts);
  ctx.limits.max_context = opts.max_context;
  ctx.limits.max_prompt_bytes = opts.max_body;
  HttpServer server(ctx);
  LOCKSTEP_ASSIGN_OR_RETURN(int port, server.Bind());
  out << "lockstep serve: listening on http://" << opts.host << ":" << port << std::endl;
  server.Start();  // /health answers 503 while the model loads

  LOCKSTEP_ASSIGN_OR_RETURN(ModelWeightsPtr weights, ModelWeights::Load(cfg.model));
  LOCKSTEP_ASSIGN_OR_RETURN(TokenizerPtr tokenizer, LoadModelTokenizer(cfg.model));
  LOCKSTEP_ASSIGN_OR_RETURN(EnginePtr engine, Engine::Create(cfg, *weights));
  ctx.weights = weights.get();
  ctx.tokenizer = tokenizer.get();
  auto chat = LoadChatTemplate(cfg.model);
  if (!chat.ok())
    ctx.chat_template_error =
        "the model's chat template cannot be used: " + chat.status().message();
  else if (!*chat)
    ctx.chat_template_error =
        "the model has no chat template (chat_template.jinja, tokenizer_config.json's "
        "chat_template, or a GGUF's tokenizer.chat_template): use /v1/completions";
  else
    ctx.chat_template = std::move(**chat);
  if (!ctx.chat_template_error.empty())
    std::fprintf(stderr, "serve: chat completions answer 400: %s\n",
                 ctx.chat_template_error.c_str());
  ctx.engine_config = engine->config();
  ctx.limits.n_vocab = weights->config.n_vocab;
  if (auto exe = Sha256SelfExe(); exe.ok()) ctx.executable_sha256 = *exe;
  if (auto mh = Sha256Files(weights->files); mh.ok()) ctx.model_sha256 = *mh;
  KeepPolicy keep;
  keep.max = opts.keep_max >= 0 ? opts.keep_max : std::max(1, engine->max_slots() - 1);
  keep.idle_s = opts.keep_idle_s;
  EngineDriver driver(*engine, ctx.metrics, *tokenizer, keep);
  ctx.driver = &driver;
  ctx.ready = true;
  std::fprintf(stderr, "serve: ready: model %s, %d slots, engine instance %s\n",
               ctx.limits.model_name.c_str(), engine->max_slots(), ctx.engine_instance.c_str());

  const int sig = signals.Wait();
  const auto drain_end = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(opts.drain_s));
  ctx.draining = true;
  std::fprintf(stderr, "serve: %s: draining %d requests (up to %.0f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", driver.in_flight(), opts.drain_s);
  const int cancelled = Drain(driver, opts.drain_s);
  // Answers of the requests that finished (or were cancelled) still reach their clients: the
  // rest of the drain, and at least half a second.
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      drain_end - std::chrono::steady_clock::now());
  server.Stop(std::max(left, std::chrono::milliseconds(500)));
  driver.Shutdown();
  std::fprintf(stderr, "serve: stopped (%d requests cancelled at the drain limit)\n", cancelled);
  return Status::Ok();
}

}  // namespace lockstep
