// Service arms (issue 25; campaigns/README.md "Service arms"): a campaign arm whose request runs
// on a `lockstep serve` instead of a fresh `lockstep generate`. Private to harness/campaign; the
// runner (runner.cpp) owns one ServiceHost per runner process.
//
//   ServerChild   a runner-managed `lockstep serve` child: the arm's build with an effective
//                 config (--config FILE --host 127.0.0.1 --port 0 --slots N --export-dir D),
//                 the bound port read from its stdout line, ready when GET /health answers 200;
//                 PR_SET_PDEATHSIG(SIGKILL) so it dies with the runner (forked from the calling
//                 thread: call it from the runner's main thread); Stop() sends SIGTERM, then
//                 SIGKILL after a bound, and reaps it.
//   ServiceHost   (service_host.cpp) the servers of one runner process (a fresh one per fresh arm
//   repeat, the
//                 campaign's shared one, or the remote [service] server) and the HTTP requests
//                 of the arms: prime, background load (BackgroundLoad), the arm's request with
//                 its export and trace. Run() leaves in the arm's folder what a process arm
//                 leaves (stdout.json, trace.jsonl, export.h5 for state arms) plus service.json,
//                 so the comparison code reads both the same way.
//
// Every wait is bounded: server start (port line, then /health) by
// ServerChildSpec::start_timeout_s, requests by ServiceOptions::request_timeout_s, a stop by its
// grace period.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/status.h"
#include "lockstep/harness/builds.h"
#include "lockstep/harness/campaign.h"

namespace lockstep {

// "http://HOST:PORT" (a trailing "/" allowed); kInvalidArgument naming the form otherwise.
struct ServiceUrl {
  std::string host;
  int port = 0;
};
Result<ServiceUrl> ParseServiceUrl(std::string_view url);
// An environment variable name: [A-Za-z_][A-Za-z0-9_]*.
bool ValidEnvName(std::string_view s);

// A member of JSON object `j` when it has the type asked for, else `def` (missing, null, another
// type, or `j` not an object: never an exception; answers and records may hold nulls).
std::string StringOr(const nlohmann::json& j, const char* key, const std::string& def);
std::int64_t IntOr(const nlohmann::json& j, const char* key, std::int64_t def);

struct ServerChildSpec {
  std::string exe;          // the lockstep executable (the arm's build)
  std::string config_path;  // the engine config (--config)
  std::string dir;          // server.stdout, server.log and exports/ are created here
  int slots = 1;
  int max_context = 4096;
  std::int64_t max_body = std::int64_t{1} << 20;
  double start_timeout_s = 120;
};

class ServerChild {
 public:
  // Forks and execs the server, waits for its port line and GET /health 200. kRuntime with the
  // tail of its log when it exits or does not get ready in time (it is killed then).
  static Result<std::unique_ptr<ServerChild>> Start(const ServerChildSpec& spec);
  ~ServerChild();  // Stop(5) unless stopped
  ServerChild(const ServerChild&) = delete;
  ServerChild& operator=(const ServerChild&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& export_dir() const { return export_dir_; }
  const std::string& instance() const { return instance_; }  // random 128-bit hex
  double start_seconds() const { return start_seconds_; }
  // SIGTERM, waits up to grace_s, then SIGKILL; reaps. The exit code, 128 + signal, or -1 when
  // it was already stopped.
  int Stop(double grace_s);

 private:
  ServerChild() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string export_dir_, instance_, log_path_;
  double start_seconds_ = 0;
};

struct ServiceOptions {
  std::string url;      // the remote server ("" none: runner-managed servers)
  std::string api_key;  // its key ("" none)
  double request_timeout_s = 600;
  double server_start_timeout_s = 120;
};

// One earlier shared arm whose requests a replacement shared server gets again.
struct SharedHistoryItem {
  const ArmSpec* arm = nullptr;
  EngineConfig config;  // the arm's effective config (its request keys)
  int repeats = 1;
};

struct ServiceArmRun {
  bool ok = false;
  std::string error;       // why it failed (one line), when !ok
  nlohmann::json service;  // the ledger's `service` object (null when nothing ran)
  double seconds = 0;
};

class ServiceHost {
 public:
  using Append =
      std::function<Status(const std::string& event, const std::string& arm, nlohmann::json data)>;
  // `prompt`: the request's ids; `vocab`: the model's (load prompts); `shared_config_path`: the
  // campaign's [engine] config for the shared server (written by the caller); `shared_lost`: a
  // previous runner process had a shared server (its ledger says so), so the one started here
  // replaces it and gets the earlier shared arms' requests again ("lost: re-primed").
  ServiceHost(const Campaign& c, ServiceOptions opts, std::vector<std::int32_t> prompt, int vocab,
              std::string run_dir, bool shared_lost, Append append);
  ~ServiceHost();  // StopAll()
  ServiceHost(const ServiceHost&) = delete;
  ServiceHost& operator=(const ServiceHost&) = delete;

  // Runs one repeat of service arm `arm` (its effective config `cfg`, build `exe`) in `arm_dir`
  // (exists, holds config.json). `history`: the earlier shared arms that finished, in plan order
  // (used when the shared server is (re)started by this process). A failure is in the result
  // (the arm failed); a Status error only for a ledger write that failed.
  Result<ServiceArmRun> Run(const ArmSpec& arm, const EngineConfig& cfg, const std::string& exe,
                            const std::string& arm_dir, int repeat,
                            const std::vector<SharedHistoryItem>& history);
  // Stops the shared server (SIGTERM, bounded) and records it.
  Status StopAll();

  // The remote server (ServiceOptions::url) must serve what arm `arm` names: the plan's model
  // (`model_sha256`, as exports fingerprint it), the arm's build (its executable's SHA-256) and
  // its engine config (the server-level keys, ServerConfigMismatches). Reads GET
  // /v1/lockstep/info once. Returns what was checked ({url, model_sha256, executable_sha256,
  // config_sha256, version}); kInvalidArgument naming every field that differs, with the
  // server's value and the plan's; kRuntime when the server cannot be asked.
  Result<nlohmann::json> CheckRemoteServes(const std::string& arm, const std::string& model_sha256,
                                           const ArmBuild& build, const EngineConfig& cfg);

 private:
  struct Impl;
  struct Call;  // one Run(): the server it talks to
  Status Connect(const ArmSpec& arm, const EngineConfig& cfg, const std::string& exe,
                 const std::string& arm_dir, const std::vector<SharedHistoryItem>& history,
                 Call& call, nlohmann::json& svc);
  Status Send(const ArmSpec& arm, const EngineConfig& cfg, const std::string& arm_dir, Call& call,
              nlohmann::json& svc);
  std::unique_ptr<Impl> impl_;
};

// The completion body of an arm's request: the prompt as ids, the config's request keys and the
// `lockstep` object (arm name, export windows/points when `with_export`, trace, cache).
nlohmann::json ArmRequestBody(const Campaign& c, const ArmSpec& arm, const EngineConfig& cfg,
                              const std::vector<std::int32_t>& prompt, bool with_export, bool trace,
                              const std::string& cache);

// Server-level keys where the remote server's config (GET /v1/lockstep/info `config`) differs
// from the arm's effective config: request keys, `model` and an arm's `threads` = 0 (auto) are
// not compared. Each entry: "key (server X, arm Y)".
std::vector<std::string> ServerConfigMismatches(const nlohmann::json& server,
                                                const EngineConfig& arm);

// The remote server a new run uses: the command line's --service-url / --service-key-env
// (`url_flag`, `env_flag`) over the plan's [service]; null when the runner manages its own
// servers; else {"url", "api_key_env"}, recorded in the ledger's planned entry. kInvalidArgument:
// a bad url or variable name, a key variable that is not set, a key variable without a server.
Result<nlohmann::json> PlannedService(const std::string& url_flag, const std::string& env_flag,
                                      const ServiceSpec& plan);

// A `service` object's decision content for LedgerDigest (runner.h): the instance, export names
// and digests (exports carry their run id and time) and load seconds are volatile; an
// engine_state "lost: re-primed" reads as "carried" and requests_before as whether the engine had
// served any (a re-primed server got the history again, without the earlier arms' load).
nlohmann::json ServiceDigest(nlohmann::json service);

}  // namespace lockstep
