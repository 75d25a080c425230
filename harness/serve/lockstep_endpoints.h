// The endpoints of `lockstep serve` beyond OpenAI's shape, for the campaign runner
// (issue 25) and anyone checking what ran:
//
//   GET /v1/exports/{file}  a finished export the server wrote (export_registry.h), streamed
//                           from the file in 256 KiB blocks (never whole in memory), with
//                           `X-Lockstep-Sha256` (its SHA-256, also the completion's
//                           lockstep.export_sha256) and Content-Length. 404 for any name the
//                           server did not produce (a path, `..`, a file put into --export-dir
//                           by someone else), 409 while the request's export is still being
//                           written (never a partial file).
//   GET /v1/lockstep/info   {"engine_instance", "config" (the effective engine config),
//                           "config_sha256", "model" {name, sha256, n_vocab},
//                           "executable_sha256", "slots", "completions_run" (completions that
//                           ran on this instance so far: a campaign's requests_before),
//                           "version", "commit", "started_unix"}; 503 while loading.
//
// Both need the API key like every endpoint but /health (http_server.cpp checks it first).
#pragma once

#include <string>

#include "lockstep/engine/status.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lockstep {

struct ServeContext;

void HandleExportDownload(const ServeContext& ctx, const httplib::Request& req,
                          httplib::Response& res);
void HandleInfo(const ServeContext& ctx, httplib::Response& res);

// 128 random bits from /dev/urandom as 32 lower-case hex digits: this server process's
// `engine_instance` (a restarted server is another instance). kIOError when it cannot be read.
Result<std::string> NewEngineInstance();

}  // namespace lockstep
