// `lockstep serve`: the engine behind an HTTP API (OpenAI-compatible completions, streaming,
// metrics, limits). One library call taking a plain options struct; it returns when a SIGTERM or
// SIGINT has drained the server (Status OK: exit 0), or with the error that kept it from serving.
// The endpoints, limits and lifecycle are in harness/serve/http_server.h; README.md has a tour.
#pragma once

#include <cstddef>
#include <iosfwd>
#include <string>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct ServeOptions {
  EngineConfig config;  // the engine flags (serve's default --slots is 16)
  std::string host = "127.0.0.1";
  int port = 8080;         // 0 = any free port (the bound port is printed)
  std::string api_key;     // --api-key, else LOCKSTEP_API_KEY; "" = none (loopback only)
  std::string model_name;  // the `model` of /v1/models; "" = the model folder's name
  std::string export_dir;  // request exports go here, named by request id; "" = refused
  std::string slot_dir;    // POST /slots/{id}?action=save|restore files; "" = refused
  // One request's export at most, in MiB of state (ExportQuota: projected at its first
  // checkpoint, then a hard stop); over it the request ends, 413, no file kept. 0 = no limit.
  int max_export_mib = 256;
  int max_context = 4096;                       // prompt + max_tokens at most
  std::size_t max_body = std::size_t{1} << 20;  // bytes; larger bodies get 413
  int http_threads = 32;                        // connections served at once
  int max_connections = 128;  // accepted connections waiting or served; beyond: 503
  int read_timeout_s = 10;    // header and body read timeout (slow clients)
  int write_timeout_s = 10;
  int keep_alive_s = 5;
  int keep_alive_max = 100;  // requests per connection
  double drain_s = 30;       // SIGTERM: running requests get this long, then are cancelled
  // Kept conversations ("lockstep": {"keep": true}): at most keep_max held (keeping one more
  // releases the least recently used); -1 = slots - 1 but at least 1, so with 2+ slots one is
  // always free for new work (with one slot the kept conversation is still evicted for a new
  // request). keep_idle_s: one not continued that long is released; 0 = never.
  int keep_max = -1;
  double keep_idle_s = 600;
  // A sampled request (temperature > 0) without `seed`: "random" draws one (64 bits from the
  // OS), reported as lockstep.seed and recorded in the export so the answer can be replayed;
  // "fixed" keeps seed 0 (every seedless request samples alike). Greedy requests keep 0.
  std::string seed_default = "random";
  std::string cors_origin;  // --cors ORIGIN: CORS headers and preflight answers; "" = off
  std::string version;      // GET /v1/lockstep/info: the build's version and commit (the CLI
  std::string commit;       // sets them from `lockstep --version`'s build info)
};

// Binds, prints "lockstep serve: listening on http://HOST:PORT" on `out` (one line, flushed),
// loads the model (GET /health is 503 until then), serves until SIGTERM / SIGINT, drains and
// returns OK. kInvalidArgument (exit 2): a non-loopback host without an API key, bad limits, the
// port in use; model and engine errors as `generate` reports them.
Status RunServeCommand(const ServeOptions& opts, std::ostream& out);

}  // namespace lockstep
