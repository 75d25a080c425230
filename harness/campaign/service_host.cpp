// ServiceHost: the servers of one runner process and the HTTP requests of service arms (prime,
// background load, the arm's request, its export fetched and checked). The contract is in
// service_arm.h; the plan keys and records in campaigns/README.md "Service arms".
#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "campaign/service_arm.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/background_load.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

namespace {

struct Endpoint {
  std::string host;
  int port = 0;
  std::string api_key;
};

std::unique_ptr<httplib::Client> Client(const Endpoint& ep, double read_timeout_s) {
  auto cli = std::make_unique<httplib::Client>(ep.host, ep.port);
  cli->set_connection_timeout(10, 0);
  const auto secs = static_cast<time_t>(read_timeout_s);
  cli->set_read_timeout(secs > 0 ? secs : 1, 0);
  cli->set_write_timeout(60, 0);
  if (!ep.api_key.empty()) cli->set_bearer_token_auth(ep.api_key);
  return cli;
}

std::string Where(const Endpoint& ep, const std::string& path) {
  return "http://" + ep.host + ":" + std::to_string(ep.port) + path;
}

// The error message of a non-200 answer (the OpenAI error body's message when there is one).
std::string AnswerError(const httplib::Result& r) {
  if (!r) return "no answer (" + httplib::to_string(r.error()) + ")";
  std::string msg = "HTTP " + std::to_string(r->status);
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object())
    msg += ": " + StringOr(j["error"], "message", "");
  return msg;
}

Result<nlohmann::json> PostCompletion(const Endpoint& ep, const nlohmann::json& body,
                                      double timeout_s) {
  auto cli = Client(ep, timeout_s);
  auto r = cli->Post("/v1/completions", body.dump(), "application/json");
  if (!r || r->status != 200)
    return Status::Runtime("POST " + Where(ep, "/v1/completions"), AnswerError(r));
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("lockstep") || !j["lockstep"].is_object())
    return Status::Runtime("POST " + Where(ep, "/v1/completions"),
                           "the answer has no lockstep object");
  return j;
}

Result<nlohmann::json> GetJson(const Endpoint& ep, const std::string& path) {
  auto cli = Client(ep, 30);
  auto r = cli->Get(path);
  // A 4xx is the server refusing what we sent (a missing or wrong key, an unknown path): bad
  // input on our side (exit 2); no answer or a 5xx is a runtime failure.
  if (r && r->status >= 400 && r->status < 500)
    return Status::InvalidArgument("GET " + Where(ep, path), AnswerError(r));
  if (!r || r->status != 200) return Status::Runtime("GET " + Where(ep, path), AnswerError(r));
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object()) return Status::Runtime("GET " + Where(ep, path), "not a JSON object");
  return j;
}

// Requests the server has run so far: GET /v1/lockstep/info `completions_run`, else the sum of
// /metrics lockstep_requests_total; null when neither answers.
nlohmann::json RemoteRequestCount(const Endpoint& ep) {
  auto cli = Client(ep, 30);
  if (auto info = cli->Get("/v1/lockstep/info"); info && info->status == 200) {
    auto j = nlohmann::json::parse(info->body, nullptr, false);
    if (j.is_object() && j.contains("completions_run") && j["completions_run"].is_number())
      return j["completions_run"];
  }
  auto r = cli->Get("/metrics");
  if (!r || r->status != 200) return nullptr;
  std::istringstream in(r->body);
  std::string line;
  double total = 0;
  while (std::getline(in, line)) {
    if (line.rfind("lockstep_requests_total", 0) != 0) continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    total += std::atof(line.c_str() + sp + 1);
  }
  // No line yet: the counter has no sample, the server has answered none.
  return nlohmann::json(static_cast<std::int64_t>(total));
}

// Streams GET /v1/exports/{file} into `dest`; the X-Lockstep-Sha256 header in `header_sha`.
Status DownloadExport(const Endpoint& ep, const std::string& file, const std::string& dest,
                      double timeout_s, std::string* header_sha) {
  std::ofstream out(dest, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IOError("'" + dest + "'", "cannot be created");
  auto cli = Client(ep, timeout_s);
  int status = 0;
  auto r = cli->Get(
      "/v1/exports/" + file,
      [&](const httplib::Response& res) {
        status = res.status;
        *header_sha = res.get_header_value("X-Lockstep-Sha256");
        return true;
      },
      [&](const char* data, std::size_t n) {
        if (status != 200) return true;  // an error body: read, not written
        out.write(data, static_cast<std::streamsize>(n));
        return static_cast<bool>(out);
      });
  out.close();
  if (!r || status != 200)
    return Status::Runtime(
        "GET " + Where(ep, "/v1/exports/" + file),
        r ? "HTTP " + std::to_string(status) : "no answer (" + httplib::to_string(r.error()) + ")");
  if (!out) return Status::IOError("'" + dest + "'", "write failed");
  return Status::Ok();
}

// The --inject records of an export (/injections), for a response that does not carry them.
nlohmann::json ExportInjections(const std::string& path) {
  nlohmann::json out = nlohmann::json::array();
  auto r = ExportReader::Open(path, ReaderLimits{});
  if (!r.ok()) return out;
  for (const std::string& s : (*r)->meta().injections) {
    auto j = nlohmann::json::parse(s, nullptr, false);
    if (j.is_object()) out.push_back(j);
  }
  return out;
}

}  // namespace

struct ServiceHost::Impl {
  const Campaign& c;
  ServiceOptions opts;
  std::vector<std::int32_t> prompt;
  int vocab = 0;
  std::string run_dir;
  bool shared_lost = false;
  Append append;
  std::optional<Endpoint> remote;
  nlohmann::json remote_info;  // GET /v1/lockstep/info, once
  std::unique_ptr<ServerChild> shared;
  std::string shared_exe;
  std::int64_t shared_requests = 0;  // requests sent to the shared server so far
  bool shared_replaced = false;      // the shared server of this process replaced a lost one

  Impl(const Campaign& cc) : c(cc) {}

  int MaxContext() const {
    int need = static_cast<int>(prompt.size()) + 64;
    for (const auto& a : c.arms) {
      auto cfg = EffectiveConfig(c, a, "preset");
      if (cfg.ok()) need = std::max(need, static_cast<int>(prompt.size()) + cfg->max_new + 1);
      if (a.load) need = std::max(need, a.load->prompt_hi + a.load->max_new + 1);
    }
    return std::max(need, 4096);
  }

  ServerChildSpec ChildSpec(const std::string& exe, const std::string& config_path,
                            const std::string& dir, int slots) const {
    ServerChildSpec s;
    s.exe = exe;
    s.config_path = config_path;
    s.dir = dir;
    s.slots = slots;
    s.max_context = MaxContext();
    s.max_body = std::max<std::int64_t>(std::int64_t{1} << 20,
                                        static_cast<std::int64_t>(prompt.size()) * 16 + 65536);
    s.start_timeout_s = opts.server_start_timeout_s;
    return s;
  }

  Result<std::unique_ptr<ServerChild>> StartServer(const std::string& role, const std::string& arm,
                                                   const ServerChildSpec& spec) {
    auto s = ServerChild::Start(spec);
    if (!s.ok()) {
      LOCKSTEP_RETURN_IF_ERROR(
          Record("server_failed", arm, {{"role", role}, {"error", s.status().message()}}));
      return s.status();
    }
    LOCKSTEP_RETURN_IF_ERROR(Record("server_started", arm,
                                    {{"role", role},
                                     {"instance", (*s)->instance()},
                                     {"port", (*s)->port()},
                                     {"pid", (*s)->pid()},
                                     {"seconds", (*s)->start_seconds()}}));
    return s;
  }

  Status ledger_status;  // the first failed ledger write of the current Run()

  // Ledger writes from inside a Run(): a failure is kept (Run() returns it), never taken for an
  // arm failure.
  Status Record(const std::string& event, const std::string& arm, nlohmann::json data) {
    Status s = append(event, arm, std::move(data));
    if (!s.ok() && ledger_status.ok()) ledger_status = s;
    return s;
  }

  Status StopServer(std::unique_ptr<ServerChild>& s, const std::string& role,
                    const std::string& arm) {
    if (!s) return Status::Ok();
    const auto t0 = Clock::now();
    const std::string instance = s->instance();
    const int code = s->Stop(10);
    s.reset();
    return Record(
        "server_stopped", arm,
        {{"role", role}, {"instance", instance}, {"exit", code}, {"seconds", SecondsSince(t0)}});
  }

  // The shared server, started (and after a resume re-primed) at its first use.
  Status EnsureShared(const std::string& exe, const std::string& arm,
                      const std::vector<SharedHistoryItem>& history) {
    if (shared) {
      if (exe != shared_exe)
        return Status::InvalidArgument("arm '" + arm + "'",
                                       "shared arms run on one build (the shared server's)");
      return Status::Ok();
    }
    const std::string dir = run_dir + "/shared";
    std::error_code ec;
    fs::remove_all(dir, ec);  // a lost server's files: its exports are of no arm
    fs::create_directories(dir, ec);
    ArmSpec none;
    none.name = "shared";
    LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, none, ModelDir()));
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(dir + "/config.json", cfg.ToJson() + "\n"));
    LOCKSTEP_ASSIGN_OR_RETURN(
        shared, StartServer("shared", arm, ChildSpec(exe, dir + "/config.json", dir, cfg.slots)));
    shared_exe = exe;
    shared_requests = 0;
    if (!shared_lost) return Status::Ok();
    // A previous runner's shared server died with it: the history the remaining shared arms
    // depend on (primes and requests of the earlier shared arms, without exports) is sent again.
    shared_replaced = true;
    const Endpoint ep{"127.0.0.1", shared->port(), ""};
    std::vector<std::string> arms;
    for (const SharedHistoryItem& h : history) {
      for (int r = 0; r < h.repeats; ++r) {
        const nlohmann::json body =
            ArmRequestBody(c, *h.arm, h.config, prompt, false, false, "use");
        for (int k = 0; k < (h.arm->prime ? 2 : 1); ++k) {
          auto ans = PostCompletion(ep, body, opts.request_timeout_s);
          if (!ans.ok()) return ans.status().WithContext("re-priming the shared server");
          ++shared_requests;
        }
      }
      arms.push_back(h.arm->name);
    }
    return Record("reprimed", arm, {{"arms", arms}, {"requests", shared_requests}});
  }

  std::string ModelDir() const {
    // The effective config's model: the run folder's synthetic model or the plan's folder.
    return c.model.path.empty() ? run_dir + "/model" : c.model.path;
  }

  Status CheckRemote(const std::string& arm, const EngineConfig& cfg) {
    if (remote_info.is_null()) {
      auto info = GetJson(*remote, "/v1/lockstep/info");
      if (!info.ok())
        return Status::Runtime(
            "arm '" + arm + "'",
            info.status().message() +
                " (the remote server must be a lockstep serve with GET /v1/lockstep/info)");
      remote_info = *info;
    }
    const auto diff = ServerConfigMismatches(
        remote_info.contains("config") ? remote_info["config"] : nlohmann::json(), cfg);
    if (diff.empty()) return Status::Ok();
    std::string keys;
    for (const auto& d : diff) keys += (keys.empty() ? "" : "; ") + d;
    return Status::InvalidArgument(
        "arm '" + arm + "'",
        "the remote server's engine config differs from the arm's in server-level key(s): " + keys);
  }
};

namespace {

// SHA-256 of an effective config without the model path (as the runner's `sent` entries).
std::string ConfigDigest(EngineConfig cfg) {
  cfg.model.clear();
  return Sha256Hex(cfg.ToJson());
}

// Moves (or downloads) the arm's export to `dest` and checks it against the digests the server
// gave; the `export` object of service.json. A mismatch leaves the file as dest.refused.
Result<nlohmann::json> FetchExport(const std::optional<Endpoint>& remote, const Endpoint& ep,
                                   const std::string& export_dir, const nlohmann::json& lk,
                                   const std::string& dest, double timeout_s) {
  if (!lk.contains("export") || !lk["export"].is_string())
    return Status::Runtime("the arm's request", "the server wrote no export");
  const std::string file = lk["export"].get<std::string>();
  std::string header_sha;
  if (remote) {
    LOCKSTEP_RETURN_IF_ERROR(DownloadExport(ep, file, dest, timeout_s, &header_sha));
  } else {
    std::error_code ec;
    fs::rename(export_dir + "/" + file, dest, ec);
    if (ec) fs::copy_file(export_dir + "/" + file, dest, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::IOError("export '" + file + "'", ec.message());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::string got, Sha256File(dest));
  const std::string said = StringOr(lk, "export_sha256", "");
  nlohmann::json e = {{"file", file},
                      {"sha256", said.empty() ? nlohmann::json(nullptr) : nlohmann::json(said)},
                      {"received_sha256", got}};
  if (remote) e["header_sha256"] = header_sha;
  bool verified = true, checked = !said.empty() || !header_sha.empty();
  if (!said.empty() && said != got) verified = false;
  if (!header_sha.empty() && header_sha != got) verified = false;
  if (remote && !checked) verified = false;  // a download is never compared unchecked
  e["verified"] = checked || remote ? nlohmann::json(verified) : nlohmann::json(nullptr);
  if (!verified) {
    e["reason"] = checked ? "export digest mismatch" : "export digest missing";
    std::error_code ec;
    fs::rename(dest, dest + ".refused", ec);
  }
  return e;
}

// stdout.json and trace.jsonl of a service arm, from the completion answer.
Status WriteArmFiles(const nlohmann::json& answer, const nlohmann::json& injections,
                     const std::string& arm_dir) {
  const nlohmann::json& lk = answer["lockstep"];
  std::string trace;
  if (lk.contains("trace") && lk["trace"].is_array())
    for (const auto& w : lk["trace"]) trace += w.dump() + "\n";
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(arm_dir + "/trace.jsonl", trace));
  nlohmann::json l = lk;
  l.erase("trace");
  nlohmann::json out = {
      {"output_ids", lk.contains("output_ids") ? lk["output_ids"] : nlohmann::json::array()},
      {"stop_reason", StringOr(lk, "stop_reason", "")},
      {"resources", nlohmann::json::object()},
      {"injections", injections},
      {"usage", answer.contains("usage") ? answer["usage"] : nlohmann::json()},
      {"lockstep", l}};
  return WriteFileAtomic(arm_dir + "/stdout.json", out.dump(2) + "\n");
}

}  // namespace

struct ServiceHost::Call {
  Endpoint ep;
  std::string export_dir;  // runner-managed servers: where their exports are written
  std::unique_ptr<ServerChild> fresh;
  bool remote = false;
};

ServiceHost::ServiceHost(const Campaign& c, ServiceOptions opts, std::vector<std::int32_t> prompt,
                         int vocab, std::string run_dir, bool shared_lost, Append append)
    : impl_(std::make_unique<Impl>(c)) {
  impl_->opts = std::move(opts);
  impl_->prompt = std::move(prompt);
  impl_->vocab = vocab;
  impl_->run_dir = std::move(run_dir);
  impl_->shared_lost = shared_lost;
  impl_->append = std::move(append);
  if (!impl_->opts.url.empty())
    if (auto u = ParseServiceUrl(impl_->opts.url); u.ok())
      impl_->remote = Endpoint{u->host, u->port, impl_->opts.api_key};
}

ServiceHost::~ServiceHost() {
  if (impl_ && impl_->shared) impl_->shared->Stop(5);
}

Status ServiceHost::StopAll() { return impl_->StopServer(impl_->shared, "shared", ""); }

Result<nlohmann::json> ServiceHost::CheckRemoteServes(const std::string& arm,
                                                      const std::string& model_sha256,
                                                      const ArmBuild& build,
                                                      const EngineConfig& cfg) {
  Impl& m = *impl_;
  if (!m.remote) return Status::InvalidArgument("arm '" + arm + "'", "no remote server to check");
  if (m.remote_info.is_null()) {
    auto info = GetJson(*m.remote, "/v1/lockstep/info");
    // Its code stays: a 4xx (a wrong key) is exit 2, no answer exit 3.
    if (!info.ok())
      return info.status().WithContext(
          "remote server " + m.opts.url +
          " (it must be a lockstep serve answering GET /v1/lockstep/info before any arm is sent)");
    m.remote_info = *info;
  }
  const nlohmann::json& info = m.remote_info;
  const nlohmann::json model = info.contains("model") ? info["model"] : nlohmann::json();
  const std::string served_model = StringOr(model, "sha256", "");
  const std::string served_exe = StringOr(info, "executable_sha256", "");
  std::vector<std::string> diff;
  auto field = [&diff](const std::string& name, const std::string& served,
                       const std::string& plan) {
    if (served != plan)
      diff.push_back(fmt::format("{}: the server's {}, the plan's {}", name,
                                 served.empty() ? "unknown" : served.substr(0, 12),
                                 plan.substr(0, 12)));
  };
  field("model SHA-256", served_model, model_sha256);
  field("executable SHA-256", served_exe, build.sha256);
  for (const std::string& d :
       ServerConfigMismatches(info.contains("config") ? info["config"] : nlohmann::json(), cfg))
    diff.push_back("engine config " + d);
  if (!diff.empty())
    return Status::InvalidArgument(
        "arm '" + arm + "'",
        fmt::format("the remote server {} does not serve what the plan names (refused before "
                    "any arm was sent): {}",
                    m.opts.url, fmt::join(diff, "; ")));
  return nlohmann::json{{"url", m.opts.url},
                        {"model_sha256", served_model},
                        {"executable_sha256", served_exe},
                        {"config_sha256", StringOr(info, "config_sha256", "")},
                        {"version", StringOr(info, "version", "")}};
}

// The server the arm's request goes to: the remote one, a fresh child, or the shared one.
Status ServiceHost::Connect(const ArmSpec& arm, const EngineConfig& cfg, const std::string& exe,
                            const std::string& arm_dir,
                            const std::vector<SharedHistoryItem>& history, Call& call,
                            nlohmann::json& svc) {
  Impl& m = *impl_;
  if (call.remote) {
    LOCKSTEP_RETURN_IF_ERROR(m.CheckRemote(arm.name, cfg));
    call.ep = *m.remote;
    svc["instance"] = m.remote_info.contains("engine_instance") ? m.remote_info["engine_instance"]
                                                                : nlohmann::json();
    svc["engine_state"] = "carried";
    return Status::Ok();
  }
  if (arm.server == "fresh") {
    LOCKSTEP_ASSIGN_OR_RETURN(
        call.fresh,
        m.StartServer("fresh", arm.name,
                      m.ChildSpec(exe, arm_dir + "/config.json", arm_dir + "/server", cfg.slots)));
    call.ep = Endpoint{"127.0.0.1", call.fresh->port(), ""};
    call.export_dir = call.fresh->export_dir();
    svc["instance"] = call.fresh->instance();
    svc["engine_state"] = "fresh";
    return Status::Ok();
  }
  LOCKSTEP_RETURN_IF_ERROR(m.EnsureShared(exe, arm.name, history));
  call.ep = Endpoint{"127.0.0.1", m.shared->port(), ""};
  call.export_dir = m.shared->export_dir();
  svc["instance"] = m.shared->instance();
  svc["engine_state"] = m.shared_replaced ? "lost: re-primed" : "carried";
  return Status::Ok();
}

// Prime, load, the arm's request and its files.
Status ServiceHost::Send(const ArmSpec& arm, const EngineConfig& cfg, const std::string& arm_dir,
                         Call& call, nlohmann::json& svc) {
  Impl& m = *impl_;
  const bool count_shared = !call.remote && arm.server == "shared";
  // A fresh arm on a remote server bypasses its conversation cache, unless it is primed (its
  // prime must warm it).
  const std::string cache = call.remote && arm.server == "fresh" && !arm.prime ? "bypass" : "use";
  svc["cache"] = cache;
  if (arm.prime) {
    auto ans = PostCompletion(call.ep, ArmRequestBody(m.c, arm, cfg, m.prompt, false, false, cache),
                              m.opts.request_timeout_s);
    if (!ans.ok()) return ans.status().WithContext("prime");
    if (count_shared) ++m.shared_requests;
  }
  // What the engine had served before the arm's request (its prime included; its own load runs
  // beside it and is recorded as `load`).
  svc["requests_before"] = call.remote             ? RemoteRequestCount(call.ep)
                           : arm.server == "fresh" ? nlohmann::json(arm.prime ? 1 : 0)
                                                   : nlohmann::json(m.shared_requests);
  std::unique_ptr<BackgroundLoad> load;
  if (arm.load) {
    load = std::make_unique<BackgroundLoad>(
        ServiceEndpoint{call.ep.host, call.ep.port, call.ep.api_key}, *arm.load, m.vocab);
    load->Start();
    svc["load_in_flight"] = load->WaitUntilInFlight(30);
  }
  const bool state = arm.mode == "state";
  auto answer = PostCompletion(call.ep, ArmRequestBody(m.c, arm, cfg, m.prompt, state, true, cache),
                               m.opts.request_timeout_s);
  if (load) {
    const LoadOutcome lo = load->Finish();
    svc["load"] = lo.ToJson();
    if (count_shared) m.shared_requests += lo.completed;
  }
  if (!answer.ok()) return answer.status();
  if (count_shared) ++m.shared_requests;
  const nlohmann::json& lk = (*answer)["lockstep"];
  if (lk.contains("engine_instance") && lk["engine_instance"].is_string())
    svc["instance"] = lk["engine_instance"];
  const std::int64_t reused = IntOr(lk, "prompt_tokens_reused", 0);
  svc["cold"] = reused == 0;
  svc["prompt_tokens_reused"] = reused;
  svc["snapshot_position"] = IntOr(lk, "snapshot_position", -1);
  nlohmann::json injections = lk.contains("injections") ? lk["injections"] : nlohmann::json();
  if (state) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        svc["export"], FetchExport(call.remote ? m.remote : std::nullopt, call.ep, call.export_dir,
                                   lk, arm_dir + "/export.h5", m.opts.request_timeout_s));
    if (!injections.is_array() && !cfg.inject.empty() && svc["export"]["verified"] != false)
      injections = ExportInjections(arm_dir + "/export.h5");
  }
  if (!injections.is_array()) injections = nlohmann::json::array();
  return WriteArmFiles(*answer, injections, arm_dir);
}

Result<ServiceArmRun> ServiceHost::Run(const ArmSpec& arm, const EngineConfig& cfg,
                                       const std::string& exe, const std::string& arm_dir,
                                       int repeat, const std::vector<SharedHistoryItem>& history) {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  Call call;
  call.remote = m.remote.has_value() && !arm.control;
  nlohmann::json svc = {{"server", call.remote ? std::string("remote") : arm.server},
                        {"arm_server", arm.server},
                        {"repeat", repeat},
                        {"instance", nullptr},
                        {"engine_config_sha256", ConfigDigest(cfg)},
                        {"cold", nullptr},
                        {"prompt_tokens_reused", nullptr},
                        {"snapshot_position", nullptr},
                        {"engine_state", nullptr},
                        {"primed", arm.prime},
                        {"requests_before", nullptr},
                        {"load", nullptr}};
  m.ledger_status = Status::Ok();
  Status st = Connect(arm, cfg, exe, arm_dir, history, call, svc);
  if (st.ok()) st = Send(arm, cfg, arm_dir, call, svc);
  if (call.fresh) {
    const Status stop = m.StopServer(call.fresh, "fresh", arm.name);
    if (st.ok() && !stop.ok()) st = stop;
  }
  LOCKSTEP_RETURN_IF_ERROR(m.ledger_status);
  ServiceArmRun run;
  run.ok = st.ok();
  if (!st.ok()) run.error = st.message();
  run.seconds = SecondsSince(t0);
  run.service = svc;
  const Status w = WriteFileAtomic(arm_dir + "/service.json", svc.dump(2) + "\n");
  if (run.ok && !w.ok()) run.ok = false, run.error = w.message();
  return run;
}

}  // namespace lockstep
