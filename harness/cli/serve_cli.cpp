// The `serve` subcommand's flags.
#include <iostream>
#include <memory>

#include "commands.h"
#include "engine_flags.h"
#include "lockstep/harness/compare_commands.h"
#include "lockstep/harness/serve_command.h"
#include "version.h"

namespace lockstep::cli {

// ---- serve ----
void AddServe(CLI::App& app, std::vector<Command>& commands) {
  auto* serve = app.add_subcommand(
      "serve", "Serve the engine over HTTP (OpenAI-compatible completions, streaming, metrics)");
  struct State {
    lockstep::ServeOptions opts;
    lockstep::EngineFlags flags;
    std::string max_body = "1M";
  };
  auto st = std::make_shared<State>();
  lockstep::ServeOptions& o = st->opts;
  st->flags.Register(*serve);  // the engine options (serve's --slots default is 16)
  serve->get_option("--slots")->default_str("16");
  // The server's own flags, each with its default shown.
  auto server = [serve](const char* flag, auto& field, const char* doc) {
    return serve->add_option(flag, field, doc)->capture_default_str()->group(kGroupServer);
  };
  server("--host", o.host, "Address to listen on (beyond loopback: an API key)");
  server("--port", o.port, "TCP port (0: any free port, printed on stdout)");
  server("--api-key", o.api_key,
         "Key every endpoint but /health requires as 'Authorization: Bearer KEY'")
      ->default_str("LOCKSTEP_API_KEY or none");
  server("--model-name", o.model_name, "Model id of /v1/models and responses")
      ->default_str("the model folder's name");
  server("--max-context", o.max_context, "Prompt + max_tokens at most");
  server("--max-body", st->max_body, "Request bodies at most (larger: 413)");
  server("--max-export-mib", o.max_export_mib,
         "One request's export at most, MiB of state (over it: the request ends, 413, nothing "
         "kept; 0: no limit)")
      ->check(CLI::NonNegativeNumber);
  server("--http-threads", o.http_threads, "Connections served at once");
  server("--max-connections", o.max_connections,
         "Connections waiting or served at most (beyond: 503)");
  server("--read-timeout", o.read_timeout_s, "Seconds to read a request's headers and body");
  server("--seed-default", o.seed_default,
         "Seedless sampled requests: random (a drawn seed, reported as lockstep.seed) or fixed "
         "(seed 0)")
      ->check(CLI::IsMember({"random", "fixed"}));
  server("--cors", o.cors_origin,
         "Allow browser pages from ORIGIN (or *): CORS headers and OPTIONS preflight answers")
      ->default_str("off");
  server("--write-timeout", o.write_timeout_s, "Seconds a response write may block");
  server("--keep-alive", o.keep_alive_s, "Seconds an idle connection stays open");
  server("--drain-s", o.drain_s,
         "SIGTERM / SIGINT: seconds running requests may finish before they are cancelled");
  server("--keep-max", o.keep_max,
         "Kept conversations at most (keeping one more releases the least recently used)")
      ->default_str("--slots - 1, at least 1");
  server("--keep-idle", o.keep_idle_s,
         "Seconds a kept conversation waits for its continuation before it is released (0: "
         "never)");
  serve
      ->add_option("--export-dir", o.export_dir,
                   "Folder for request exports (lockstep.export v1, named by request id)")
      ->group(kGroupExport);
  serve->add_option("--slot-dir", o.slot_dir, "Folder for POST /slots/{id} files")
      ->group(kGroupExport);
  serve->footer(
      "Examples:\n"
      "  lockstep serve --model m --port 8080\n"
      "  lockstep serve --model m --slots 4 --export-dir exports --drain-s 10\n"
      "  lockstep serve --model m --host 0.0.0.0 --api-key \"$KEY\" --max-body 4M");
  commands.push_back({serve, [st, serve]() -> Status {
                        LOCKSTEP_ASSIGN_OR_RETURN(st->opts.config, st->flags.Build());
                        if (serve->get_option("--slots")->count() == 0) st->opts.config.slots = 16;
                        if (serve->get_option("--keep-max")->count() > 0 && st->opts.keep_max < 0)
                          return lockstep::Status::InvalidArgument("--keep-max",
                                                                   "must be 0..--slots");
                        LOCKSTEP_ASSIGN_OR_RETURN(
                            std::int64_t body, lockstep::ParseByteSize(st->max_body, "--max-body"));
                        st->opts.max_body = static_cast<std::size_t>(body);
                        st->opts.version = lockstep::GetBuildInfo().version;
                        st->opts.commit = lockstep::GetBuildInfo().commit;
                        return lockstep::RunServeCommand(st->opts, std::cout);
                      }});
}

}  // namespace lockstep::cli
