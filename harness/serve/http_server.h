// HttpServer: the routes of `lockstep serve` on cpp-httplib (Debian's libcpp-httplib, 0.11.4).
//
//   GET  /health            200 {"status":"ok","engine_instance":"<hex>"}; 503 while loading or
//                           draining (no key needed)
//   GET  /v1/models         the served model (OpenAI list shape)
//   POST /v1/completions    completions_handler.h
//   POST /v1/chat/completions   chat_handler.h
//   GET  /slots             each slot's state, the waiting requests
//   POST /slots/{id}?action=save|restore|erase   slot files (slot_actions.h)
//   GET  /metrics           Prometheus text (metrics.h)
//   GET  /v1/exports/{file}, GET /v1/lockstep/info   lockstep_endpoints.h
//
// Every other path is 404, every error an ApiError body. With an API key every endpoint but
// /health needs `Authorization: Bearer KEY` (constant-time compare). The sockets are the HTTP
// front's (http_front.h): it reads every request under bounds (head size and count, deadlines for
// the head and the body, --max-body counted as a body arrives, --max-connections) and relays
// complete requests to the routes below, which cpp-httplib serves on an internal loopback port
// that answers only requests carrying the front's per-process token. Nothing is submitted before
// the whole body is in. The log line of a request names its method, path, status and request id:
// never a body, a key or an export path.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/engine/weights.h"
#include "lockstep/harness/chat_template.h"
#include "lockstep/harness/serve_command.h"
#include "serve/completion_request.h"
#include "serve/engine_driver.h"
#include "serve/export_registry.h"
#include "serve/http_front.h"
#include "serve/metrics.h"

namespace httplib {
class Server;
}

namespace lockstep {

// What the handlers share. The engine-side pointers are set once, before `ready` turns true.
struct ServeContext {
  ServeOptions opts;
  ServeMetrics metrics;
  std::atomic<bool> ready{false};     // model loaded, driver running
  std::atomic<bool> draining{false};  // SIGTERM seen: completions refused with 503
  const ModelWeights* weights = nullptr;
  const Tokenizer* tokenizer = nullptr;  // the model's (LoadModelTokenizer), as generate uses
  EngineDriver* driver = nullptr;
  EngineConfig engine_config;  // the engine's effective config (threads resolved)
  CompletionLimits limits;
  std::string model_sha256, executable_sha256;
  std::string id_prefix;  // "cmpl-<8 hex>-" per process
  std::atomic<std::uint64_t> next_id{1};
  std::string engine_instance;    // 128 random bits, hex: this process (set before Bind)
  std::int64_t started_unix = 0;  // when it started (unix seconds)
  ExportRegistry exports;         // the exports this server wrote (GET /v1/exports/{file})
  // The model's chat template (chat_template.h), loaded with the model; without one (none, or
  // outside the interpreter's subset) chat completions answer 400 with chat_template_error.
  std::optional<ChatTemplate> chat_template;
  std::string chat_template_error;
};

class HttpServer {
 public:
  explicit HttpServer(ServeContext& ctx);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (0: any free port) for the front and a free loopback port for the routes;
  // returns the front's port. kInvalidArgument when it cannot.
  Result<int> Bind();
  // Serves on a thread of its own until Stop().
  void Start();
  // Closes the front (every client connection; answers being relayed get up to `grace`) and the
  // routes' server, joins.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

 private:
  void Routes();
  ServeContext& ctx_;
  std::string token_;  // X-Lockstep-Front: 128 random bits, hex
  std::unique_ptr<httplib::Server> svr_;
  std::unique_ptr<HttpFront> front_;
  std::thread listen_;
};

}  // namespace lockstep
