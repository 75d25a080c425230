// Service arms: runner-managed `lockstep serve` children and the HTTP requests of an arm
// (service_arm.h has the contract; campaigns/README.md "Service arms" the plan keys and records).
#include "campaign/service_arm.h"

#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/digest.h"
#include "lockstep/harness/process.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string RandomHex128() {
  unsigned char b[16] = {};
  std::ifstream f("/dev/urandom", std::ios::binary);
  f.read(reinterpret_cast<char*>(b), sizeof(b));
  if (!f) {  // no /dev/urandom: time and pid still tell two servers apart
    const auto t = Clock::now().time_since_epoch().count();
    return Sha256Hex(std::to_string(t) + "/" + std::to_string(::getpid())).substr(0, 32);
  }
  return HexOf(b, sizeof(b));
}

// Reaps `pid` within `timeout_s`: its exit code / 128 + signal, or -1 when still running.
int ReapWithin(pid_t pid, double timeout_s) {
  const auto t0 = Clock::now();
  do {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0 && errno != EINTR) return 255;  // not our child any more
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (Since(t0) < timeout_s);
  return -1;
}

// The port of the "lockstep serve: listening on http://HOST:PORT" line in `path`, 0 until that
// line is there whole (ends with a newline).
int PortFromFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const auto at = text.find("listening on");
  const auto end = at == std::string::npos ? at : text.find('\n', at);
  if (end == std::string::npos) return 0;
  const auto colon = text.rfind(':', end);
  return colon == std::string::npos || colon < at ? 0 : std::atoi(text.c_str() + colon + 1);
}

}  // namespace

Result<ServiceUrl> ParseServiceUrl(std::string_view url) {
  const auto bad = [&] {
    return Status::InvalidArgument(
        "'url'",
        "must be http://HOST:PORT (e.g. http://127.0.0.1:8080), got '" + std::string(url) + "'");
  };
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) return bad();
  std::string_view rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad();
  ServiceUrl u;
  u.host = std::string(rest.substr(0, colon));
  const std::string_view port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 || u.host.find_first_of("/?#@ ") != std::string::npos)
    return bad();
  for (char ch : port)
    if (ch < '0' || ch > '9') return bad();
  u.port = std::atoi(std::string(port).c_str());
  if (u.port < 1 || u.port > 65535) return bad();
  return u;
}

std::string StringOr(const nlohmann::json& j, const char* key, const std::string& def) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return def;
  return j[key].get<std::string>();
}

std::int64_t IntOr(const nlohmann::json& j, const char* key, std::int64_t def) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return def;
  return j[key].get<std::int64_t>();
}

bool ValidEnvName(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char ch : s)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '_'))
      return false;
  return true;
}

namespace {

// The server log's lines other than its access lines for GET /health (the start polls), last
// 600 bytes.
std::string LogNews(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string line, out;
  while (std::getline(f, line))
    if (line.find("GET /health") == std::string::npos) out += line + " | ";
  if (out.size() > 600) out = "..." + out.substr(out.size() - 600);
  return out.empty() ? "(empty)" : out.substr(0, out.size() >= 3 ? out.size() - 3 : 0);
}

}  // namespace

// ---- ServerChild ----

Result<std::unique_ptr<ServerChild>> ServerChild::Start(const ServerChildSpec& spec) {
  std::error_code ec;
  fs::create_directories(spec.dir + "/exports", ec);
  if (ec) return Status::IOError("server folder '" + spec.dir + "'", ec.message());
  std::unique_ptr<ServerChild> s(new ServerChild());
  s->export_dir_ = spec.dir + "/exports";
  s->log_path_ = spec.dir + "/server.log";
  s->instance_ = RandomHex128();
  const std::string out_path = spec.dir + "/server.stdout";
  std::vector<std::string> args = {spec.exe,        "serve",
                                   "--config",      spec.config_path,
                                   "--host",        "127.0.0.1",
                                   "--port",        "0",
                                   "--slots",       std::to_string(spec.slots),
                                   "--export-dir",  s->export_dir_,
                                   "--max-context", std::to_string(spec.max_context),
                                   "--max-body",    std::to_string(spec.max_body),
                                   "--drain-s",     "5"};
  ChildSpec cs;
  cs.argv = std::move(args);
  cs.stdout_path = out_path;
  cs.stderr_path = s->log_path_;
  const auto t0 = Clock::now();
  LOCKSTEP_ASSIGN_OR_RETURN(const pid_t pid, SpawnChild(cs));
  s->pid_ = pid;
  const auto fail = [&](const std::string& why) -> Status {
    s->Stop(0);
    return Status::Runtime("lockstep serve (" + spec.dir + ")",
                           why + "; its log: " + LogNews(s->log_path_));
  };
  while (s->port_ <= 0) {
    if (const int code = ReapWithin(pid, 0); code >= 0) {
      s->pid_ = -1;
      return Status::Runtime("lockstep serve (" + spec.dir + ")",
                             "exited with " + std::to_string(code) +
                                 " before listening; its log: " + LogNews(s->log_path_));
    }
    if (Since(t0) > spec.start_timeout_s) return fail("no port line within the start timeout");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s->port_ = PortFromFile(out_path);
  }
  httplib::Client cli("127.0.0.1", s->port_);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(5, 0);
  for (;;) {
    auto r = cli.Get("/health");
    if (r && r->status == 200) break;
    // A refused configuration is a "lockstep: error:" line; the server may not exit promptly
    // after it (its HTTP thread was already listening), so the line alone ends the wait.
    if (const std::string log = LogNews(s->log_path_);
        log.find("lockstep: error:") != std::string::npos)
      return fail("refused to start");
    if (ReapWithin(pid, 0) >= 0) {
      s->pid_ = -1;
      return Status::Runtime("lockstep serve (" + spec.dir + ")",
                             "exited while loading; its log: " + LogNews(s->log_path_));
    }
    if (Since(t0) > spec.start_timeout_s) return fail("not ready (GET /health) in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // The server's own engine instance (GET /v1/lockstep/info), else the random one drawn above.
  if (auto r = cli.Get("/v1/lockstep/info"); r && r->status == 200) {
    auto j = nlohmann::json::parse(r->body, nullptr, false);
    if (j.is_object() && j.contains("engine_instance") && j["engine_instance"].is_string())
      s->instance_ = j["engine_instance"].get<std::string>();
  }
  s->start_seconds_ = Since(t0);
  return s;
}

ServerChild::~ServerChild() { Stop(5); }

int ServerChild::Stop(double grace_s) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int code = ReapWithin(pid_, grace_s);
  if (code < 0) {
    ::kill(pid_, SIGKILL);
    code = ReapWithin(pid_, 30);
  }
  pid_ = -1;
  return code;
}

// ---- request bodies and the remote server's config ----

nlohmann::json ArmRequestBody(const Campaign& c, const ArmSpec& arm, const EngineConfig& cfg,
                              const std::vector<std::int32_t>& prompt, bool with_export, bool trace,
                              const std::string& cache) {
  nlohmann::json lk = {{"arm", arm.name}};
  if (with_export) {
    std::string points;
    for (const auto& p : c.export_plan.points) points += (points.empty() ? "" : ",") + p;
    lk["export"] = {{"windows", c.export_plan.windows}, {"points", points}};
  }
  if (trace) lk["trace"] = true;
  if (cache != "use") lk["cache"] = cache;
  return {{"prompt", prompt},
          {"max_tokens", cfg.max_new},
          {"temperature", cfg.temperature},
          {"top_p", cfg.top_p},
          {"top_k", cfg.top_k},
          {"seed", cfg.seed},
          {"ignore_eos", cfg.ignore_eos},
          {"lockstep", lk}};
}

std::vector<std::string> ServerConfigMismatches(const nlohmann::json& server,
                                                const EngineConfig& arm) {
  static const std::vector<std::string> kSkip = {"model", "replay_path", "seed",    "temperature",
                                                 "top_k", "top_p",       "max_new", "ignore_eos"};
  const nlohmann::json mine = nlohmann::json::parse(arm.ToJson());
  std::vector<std::string> out;
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(kSkip.begin(), kSkip.end(), k) != kSkip.end()) continue;
    if (k == "threads" && arm.threads == 0) continue;  // auto: any resolved count
    const nlohmann::json theirs = server.is_object() && server.contains(k) ? server[k] : nullptr;
    if (theirs != it.value())
      out.push_back(k + " (server " + theirs.dump() + ", arm " + it.value().dump() + ")");
  }
  return out;
}

// ---- what the runner records ----

Result<nlohmann::json> PlannedService(const std::string& url_flag, const std::string& env_flag,
                                      const ServiceSpec& plan) {
  std::string url = url_flag.empty() ? plan.url : url_flag;
  std::string env = env_flag.empty() ? plan.api_key_env : env_flag;
  if (url.empty()) {
    if (!env_flag.empty())
      return Status::InvalidArgument("--service-key-env",
                                     "needs a server (--service-url or the "
                                     "plan's [service] url)");
    return nlohmann::json();
  }
  auto parsed = ParseServiceUrl(url);
  if (!parsed.ok()) return parsed.status().WithContext("--service-url");
  if (!env.empty() && !ValidEnvName(env))
    return Status::InvalidArgument("--service-key-env", "'" + env + "' is not a variable name");
  if (!env.empty() && std::getenv(env.c_str()) == nullptr)
    return Status::InvalidArgument(
        "api_key_env", "the variable '" + env + "' (the remote server's key) is not set");
  return nlohmann::json{{"url", url}, {"api_key_env", env}};
}

nlohmann::json ServiceDigest(nlohmann::json s) {
  s.erase("instance");
  if (s.contains("export") && s["export"].is_object())
    s["export"] = {{"verified",
                    s["export"].contains("verified") ? s["export"]["verified"] : nlohmann::json()}};
  if (StringOr(s, "engine_state", "") == "lost: re-primed") s["engine_state"] = "carried";
  if (s.contains("requests_before") && s["requests_before"].is_number())
    s["requests_before"] = s["requests_before"].get<std::int64_t>() > 0;
  if (s.contains("load") && s["load"].is_object()) s["load"].erase("seconds");
  s.erase("load_in_flight");
  return s;
}

}  // namespace lockstep
