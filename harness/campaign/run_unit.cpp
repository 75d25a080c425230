// `lockstep run-unit` and the unit fragment (units.h): one unit as a fresh process, its folder
// written aside and renamed, its record CRC'd and its files digested so merge can refuse
// anything damaged.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <ostream>
#include <thread>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/weights.h"
#include "lockstep/harness/builds.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/ledger.h"
#include "lockstep/harness/llama_arm.h"
#include "lockstep/harness/process.h"
#include "lockstep/harness/run_record.h"
#include "lockstep/harness/runner.h"
#include "lockstep/harness/units.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFragment = "fragment.json";

std::string FragmentCrc(nlohmann::json j) {
  j.erase("crc");
  return fmt::format("{:08x}", Crc32(j.dump()));
}

}  // namespace

nlohmann::json UnitFragment::ToJson() const {
  nlohmann::json j = {{"schema", "lockstep.unit_fragment"},
                      {"version", 1},
                      {"index", index},
                      {"arm", arm},
                      {"repeat", repeat},
                      {"attempt", attempt},
                      {"plan_sha256", plan_sha256},
                      {"exit_code", exit_code},
                      {"signal", signal},
                      {"seconds", seconds},
                      {"executable_sha256", executable_sha256},
                      {"engine_config_sha256", engine_config_sha256},
                      {"model_sha256", model_sha256},
                      {"request_sha256", request_sha256},
                      {"build", build},
                      {"host", host.ToJson()},
                      {"host_sha256", host.Digest()},
                      {"files", files},
                      {"previous", previous},
                      {"retry_differs", retry_differs},
                      {"outputs_sha256", outputs_sha256}};
  j["crc"] = FragmentCrc(j);
  return j;
}

Result<UnitFragment> UnitFragment::FromJson(const nlohmann::json& j) {
  UnitFragment f;
  try {
    if (j.value("schema", "") != "lockstep.unit_fragment")
      return Status::Corruption("fragment", "not a lockstep.unit_fragment");
    if (j.value("crc", "") != FragmentCrc(j))
      return Status::Corruption("fragment", "CRC mismatch (edited or torn)");
    f.index = j.at("index").get<int>();
    f.arm = j.at("arm").get<std::string>();
    f.repeat = j.at("repeat").get<int>();
    f.attempt = j.at("attempt").get<int>();
    f.plan_sha256 = j.at("plan_sha256").get<std::string>();
    f.exit_code = j.at("exit_code").get<int>();
    f.signal = j.at("signal").get<int>();
    f.seconds = j.at("seconds").get<double>();
    f.executable_sha256 = j.at("executable_sha256").get<std::string>();
    f.engine_config_sha256 = j.at("engine_config_sha256").get<std::string>();
    f.model_sha256 = j.at("model_sha256").get<std::string>();
    f.request_sha256 = j.at("request_sha256").get<std::string>();
    f.build = j.at("build").get<std::string>();
    f.host = HostFingerprint::FromJson(j.at("host"));
    f.files = j.at("files").get<std::map<std::string, std::string>>();
    f.previous = j.at("previous");
    f.retry_differs = j.at("retry_differs");
    f.outputs_sha256 = j.at("outputs_sha256").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption("fragment", e.what());
  }
  return f;
}

Result<UnitFragment> VerifyUnit(const std::string& unit_dir, bool state) {
  const std::string path = unit_dir + "/" + kFragment;
  if (!fs::exists(path)) return Status::NotFound("unit '" + unit_dir + "'", "no fragment.json");
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{16} << 20));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::Corruption("'" + path + "'", "not JSON");
  auto f = UnitFragment::FromJson(j);
  if (!f.ok()) return Status::Corruption("'" + path + "'", f.status().message());
  for (const auto& [name, sha] : f->files) {
    auto got = Sha256File(unit_dir + "/" + name);
    if (!got.ok())
      return Status::Corruption("unit '" + unit_dir + "'", name + " is missing or unreadable");
    if (*got != sha)
      return Status::Corruption("unit '" + unit_dir + "'",
                                fmt::format("{} changed since the unit finished (SHA-256 {} now, "
                                            "{} recorded)",
                                            name, got->substr(0, 12), sha.substr(0, 12)));
  }
  if (f->ran())
    for (const char* need : {"stdout.json", "trace.jsonl", state ? "export.h5" : nullptr})
      if (need != nullptr && !f->files.count(need))
        return Status::Corruption("unit '" + unit_dir + "'",
                                  std::string("finished without ") + need);
  return f;
}

namespace {

// The global index the options name: --index N, or $VAR; within --wave W when given.
Result<int> ResolveIndex(const RunUnitOptions& o, const std::vector<Unit>& units) {
  long long idx = o.index;
  if (!o.index_env.empty()) {
    const char* v = std::getenv(o.index_env.c_str());
    if (v == nullptr || *v == '\0')
      return Status::InvalidArgument("--index-env " + o.index_env, "the variable is not set");
    char* end = nullptr;
    idx = std::strtoll(v, &end, 10);
    if (*end != '\0' || idx < 0)
      return Status::InvalidArgument("--index-env " + o.index_env,
                                     std::string("not an index: '") + v + "'");
  }
  if (idx < 0) return Status::InvalidArgument("run-unit", "give --index N or --index-env VAR");
  if (o.wave >= 0) {
    const std::vector<int> wave = UnitsOfWave(units, o.wave);
    if (idx >= static_cast<long long>(wave.size()))
      return Status::InvalidArgument(
          "--wave " + std::to_string(o.wave),
          fmt::format("index {} within the wave, which has {} units", idx, wave.size()));
    return wave[static_cast<std::size_t>(idx)];
  }
  if (idx >= static_cast<long long>(units.size()))
    return Status::InvalidArgument("--index",
                                   fmt::format("{}: the campaign has {} units", idx, units.size()));
  return static_cast<int>(idx);
}

// The earlier attempts set aside (DIR/units/N.attempt-K), by attempt; unreadable ones as
// {"attempt": K, "unreadable": true}.
nlohmann::json PreviousAttempts(const std::string& dir, int index) {
  std::map<int, nlohmann::json> found;
  const std::string prefix = std::to_string(index) + ".attempt-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir + "/units", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const int k = std::atoi(name.c_str() + prefix.size());
    nlohmann::json rec = {{"attempt", k}, {"unreadable", true}};
    if (auto text = ReadFile(e.path().string() + "/" + kFragment, std::size_t{16} << 20);
        text.ok()) {
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (auto f = UnitFragment::FromJson(j); f.ok())
        rec = {{"attempt", k},
               {"exit_code", f->exit_code},
               {"signal", f->signal},
               {"outputs_sha256", f->outputs_sha256}};
    }
    found[k] = rec;
  }
  nlohmann::json out = nlohmann::json::array();
  for (auto& [k, rec] : found) out.push_back(rec);
  return out;
}

// SHA-256 of what the unit produced: its exit, and its output tokens when stdout.json has them.
std::string OutputsDigest(const std::string& d, int exit_code, int signal) {
  std::string ids = "none";
  if (auto text = ReadFile(d + "/stdout.json", std::size_t{64} << 20); text.ok()) {
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_object() && j.contains("output_ids")) ids = j["output_ids"].dump();
  }
  return Sha256Hex(fmt::format("exit {} signal {} output_ids {}", exit_code, signal, ids));
}

// The test hook's action for unit `index` (kUnitHookEnv): "sleep:S", "kill", "fail" or "".
std::string UnitHook(int index) {
  const char* v = std::getenv(kUnitHookEnv);
  if (v == nullptr) return "";
  const std::string s = v, prefix = std::to_string(index) + ":";
  return s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : "";
}

Status SyncDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IOError("folder '" + path + "'", "cannot be opened to sync");
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? Status::Ok() : Status::IOError("folder '" + path + "'", "fsync failed");
}

}  // namespace

Status RunUnit(const RunUnitOptions& o, std::ostream& out) {
  const std::string& dir = o.dir;
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Unit> units, ReadUnits(dir));
  LOCKSTEP_ASSIGN_OR_RETURN(const int idx, ResolveIndex(o, units));
  const Unit& u = units[static_cast<std::size_t>(idx)];
  RunRecord rec;
  LOCKSTEP_ASSIGN_OR_RETURN(Campaign c, LoadRunFolderPlan(dir, &rec));
  const ArmSpec* arm = nullptr;
  for (const ArmSpec& a : c.arms)
    if (a.name == u.arm) arm = &a;
  if (arm == nullptr) return Status::Corruption("units.json", "unit names arm '" + u.arm + "'");
  const std::string label = fmt::format("unit {} ({} #{})", idx, u.arm, u.repeat);
  const std::string final_dir = UnitDir(dir, idx);

  std::error_code ec;
  if (fs::exists(final_dir)) {
    auto v = VerifyUnit(final_dir, arm->mode == "state");
    if (v.ok() && v->ran()) {
      out << fmt::format(
          "{}: already finished (attempt {}, exit {}, outputs verified): nothing "
          "to do\n",
          label, v->attempt, v->exit_code);
      return Status::Ok();
    }
    const nlohmann::json prev = PreviousAttempts(dir, idx);
    int k = prev.empty() ? 1 : prev.back().value("attempt", 0) + 1;
    if (v.ok()) k = std::max(k, v->attempt);
    const std::string aside = fmt::format("{}.attempt-{}", final_dir, k);
    fs::remove_all(aside, ec);
    fs::rename(final_dir, aside, ec);
    if (ec) return Status::IOError("unit folder '" + final_dir + "'", ec.message());
    out << fmt::format("{}: attempt {} {}: running it again\n", label, k,
                       v.ok() ? fmt::format("failed (exit {}, signal {})", v->exit_code, v->signal)
                              : "is damaged (" + v.status().message() + ")");
  }
  const nlohmann::json previous = PreviousAttempts(dir, idx);
  UnitFragment f;
  f.index = idx;
  f.arm = u.arm;
  f.repeat = u.repeat;
  f.attempt = previous.empty() ? 1 : previous.back().value("attempt", 0) + 1;
  f.plan_sha256 = rec.plan_sha256;
  f.previous = previous;

  const std::string build_name = ArmBuildName(*arm);
  if (!rec.builds.is_object() || !rec.builds.contains(build_name))
    return Status::Corruption(
        "ledger", "arm '" + u.arm + "' runs on build '" + build_name + "', which the ledger lacks");
  const ArmBuild build = BuildFromJson(build_name, rec.builds[build_name]);
  LOCKSTEP_ASSIGN_OR_RETURN(f.executable_sha256, Sha256File(build.path));
  f.build = build.name;
  const std::string model_dir = PlanModelPath(c, dir);
  const std::string tokens = RunPaths(dir).RequestTokens();
  LOCKSTEP_ASSIGN_OR_RETURN(f.request_sha256, Sha256File(tokens));
  {
    LOCKSTEP_ASSIGN_OR_RETURN(ModelWeightsPtr w, ModelWeights::Load(model_dir));
    LOCKSTEP_ASSIGN_OR_RETURN(f.model_sha256, Sha256Files(w->files));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, *arm, model_dir));
  f.engine_config_sha256 = ArmConfigSha256(c, *arm, cfg);
  f.host = ProbeHost(cfg.threads);

  const std::string tmp = fmt::format("{}/units/.{}.tmp-{}", dir, idx, ::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return Status::IOError("unit folder '" + tmp + "'", ec.message());
  fs::remove(SchedulerRecordPath(dir, idx), ec);  // this attempt is the unit's news now
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/config.json", cfg.ToJson() + "\n"));
  ChildSpec cs;
  cs.argv = ArmGenerateArgv(c, *arm, build.path, tmp, tokens);
  cs.stdout_path = tmp + "/stdout.json";
  cs.stderr_path = tmp + "/stderr.log";
  const std::string hook = UnitHook(idx);
  if (hook.rfind("sleep:", 0) == 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(hook.c_str() + 6)));
  if (hook == "fail") cs.argv.push_back("--lockstep-test-hook-unknown-flag");
  LOCKSTEP_ASSIGN_OR_RETURN(ChildResult cr, RunChild(cs));
  if (hook == "kill") ::kill(::getpid(), SIGKILL);
  f.exit_code = cr.exit_code;
  f.signal = cr.signal;
  f.seconds = cr.seconds;
  f.outputs_sha256 = OutputsDigest(tmp, cr.exit_code, cr.signal);
  if (!previous.empty()) {
    const nlohmann::json& last = previous.back();
    const bool differs = last.value("outputs_sha256", "") != f.outputs_sha256;
    f.retry_differs = {{"attempt", last.value("attempt", 0)},
                       {"differs", differs},
                       {"was", fmt::format("exit {}, signal {}", last.value("exit_code", -1),
                                           last.value("signal", 0))},
                       {"now", fmt::format("exit {}, signal {}", cr.exit_code, cr.signal)}};
  }
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    if (!e.is_regular_file()) continue;
    LOCKSTEP_ASSIGN_OR_RETURN(f.files[e.path().filename().string()], Sha256File(e.path().string()));
  }
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + kFragment, f.ToJson().dump(2) + "\n"));
  LOCKSTEP_RETURN_IF_ERROR(SyncDir(tmp));
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    return Status::Runtime(label, "another attempt of this unit finished first");
  }
  LOCKSTEP_RETURN_IF_ERROR(SyncDir(dir + "/units"));
  out << fmt::format("{}: {} (attempt {}, exit {}{}) in {:.2f} s\n", label,
                     f.ran() ? "finished" : "FAILED", f.attempt, cr.exit_code,
                     cr.signal ? fmt::format(", signal {}", cr.signal) : "", cr.seconds);
  if (f.retry_differs.is_object() && f.retry_differs.value("differs", false))
    out << fmt::format("{}: this attempt's result differs from attempt {}'s ({} then, {} now)\n",
                       label, f.retry_differs.value("attempt", 0), f.retry_differs.value("was", ""),
                       f.retry_differs.value("now", ""));
  if (!f.ran())
    return Status::Runtime(label, fmt::format("its process failed (exit {}, signal {}); see {}/"
                                              "stderr.log (merge records it as failed)",
                                              cr.exit_code, cr.signal, final_dir));
  return Status::Ok();
}

}  // namespace lockstep
