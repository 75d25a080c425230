// The units driver (units_executor.h): local run-unit children or Slurm job arrays, a merge
// after each wave.
#include "lockstep/harness/units_executor.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <ostream>
#include <sstream>
#include <thread>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/process.h"
#include "lockstep/harness/run_record.h"
#include "lockstep/harness/units.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

// The file's text, or "" when it cannot be read (logs the driver only shows).
std::string TextOrEmpty(const std::string& path, std::size_t max_bytes) {
  auto t = ReadFile(path, max_bytes);
  return t.ok() ? *t : std::string();
}

// The test hook's countdown (kKillDriverEnv): SIGKILL at the N-th step.
void DriverStep() {
  static int steps = 0;
  const char* v = std::getenv(kKillDriverEnv);
  if (v == nullptr || *v == '\0') return;
  if (++steps >= std::atoi(v)) ::kill(::getpid(), SIGKILL);
}

// `name` found on $PATH (RunChild does no PATH search); "" when it is not there.
std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string d;
  while (std::getline(ss, d, ':'))
    if (!d.empty() && ::access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  return "";
}

struct Captured {
  int exit_code = -1;
  std::string out, err;
};

// Runs a scheduler command, its stdout and stderr captured (files in `scratch`).
Result<Captured> Capture(std::vector<std::string> argv, const std::string& scratch) {
  const std::string exe = FindInPath(argv[0]);
  if (exe.empty())
    return Status::Runtime("'" + argv[0] + "'", "not found on PATH (is Slurm installed here?)");
  argv[0] = exe;
  ChildSpec cs;
  cs.argv = std::move(argv);
  cs.stdout_path = fmt::format("{}/.cmd-{}.out", scratch, ::getpid());
  cs.stderr_path = fmt::format("{}/.cmd-{}.err", scratch, ::getpid());
  cs.timeout_s = 120;
  LOCKSTEP_ASSIGN_OR_RETURN(ChildResult r, RunChild(cs));
  Captured c;
  c.exit_code = r.exit_code;
  c.out = TextOrEmpty(cs.stdout_path, std::size_t{16} << 20);
  c.err = TextOrEmpty(cs.stderr_path, std::size_t{1} << 20);
  std::error_code ec;
  fs::remove(cs.stdout_path, ec), fs::remove(cs.stderr_path, ec);
  return c;
}

// The value of `key=` in a `scontrol -o` line ("" none).
std::string ScontrolField(const std::string& line, const std::string& key) {
  const std::string k = " " + key + "=";
  auto p = (" " + line).find(k);
  if (p == std::string::npos) return "";
  p += k.size() - 1;
  return line.substr(p, line.find(' ', p) - p);
}

Status WriteSchedulerRecord(const std::string& dir, int index, const SlurmTaskState& t,
                            const std::string& job) {
  const auto colon = t.exit_code.find(':');
  const int code = std::atoi(t.exit_code.c_str());
  const int sig = colon == std::string::npos ? 0 : std::atoi(t.exit_code.c_str() + colon + 1);
  const nlohmann::json rec = {{"state", t.state},
                              {"exit_code_text", t.exit_code},
                              {"exit_code", code != 0 ? code : 3},
                              {"signal", sig},
                              {"job", job}};
  std::error_code ec;
  fs::create_directories(dir + "/units", ec);
  return WriteFileAtomic(SchedulerRecordPath(dir, index), rec.dump() + "\n");
}

bool HasVerifiedUnit(const std::string& dir, int index) {
  // The mode only decides whether export.h5 must be there; a state unit lists it in its
  // fragment either way, and every listed file is checked.
  return VerifyUnit(UnitDir(dir, index), false).ok();
}

// ---- local: run-unit children ----

Status RunWaveLocally(const std::string& dir, const std::vector<int>& indices, std::ostream& out) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string self, SelfExecutable());
  std::error_code ec;
  fs::create_directories(dir + "/units", ec);
  for (int i : indices) {
    DriverStep();
    ChildSpec cs;
    cs.argv = {self, "run-unit", dir, "--index", std::to_string(i)};
    cs.stdout_path = fmt::format("{}/units/{}.run-unit.log", dir, i);
    cs.stderr_path = fmt::format("{}/units/{}.run-unit.err", dir, i);
    LOCKSTEP_ASSIGN_OR_RETURN(ChildResult r, RunChild(cs));
    out << TextOrEmpty(cs.stdout_path, std::size_t{1} << 20);
    if (!HasVerifiedUnit(dir, i))  // it died before its fragment: a failed unit, not a pending
      LOCKSTEP_RETURN_IF_ERROR(WriteSchedulerRecord(
          dir, i,
          SlurmTaskState{i, r.signal ? "KILLED" : "FAILED",
                         fmt::format("{}:{}", r.exit_code < 0 ? 0 : r.exit_code, r.signal)},
          "local"));
  }
  return Status::Ok();
}

// ---- slurm ----

struct Submissions {
  nlohmann::json j = {{"submissions", nlohmann::json::array()}};
  std::string path;
  Status Save() const { return WriteFileAtomic(path, j.dump(2) + "\n"); }
};

Result<Submissions> LoadSubmissions(const std::string& dir) {
  Submissions s;
  s.path = dir + "/slurm.json";
  if (!fs::exists(s.path)) return s;
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(s.path, std::size_t{16} << 20));
  s.j = nlohmann::json::parse(text, nullptr, false);
  if (!s.j.is_object() || !s.j.contains("submissions"))
    return Status::Corruption("'" + s.path + "'", "not the driver's submissions file");
  return s;
}

Result<std::vector<SlurmTaskState>> QueryJob(const std::string& job, const std::string& scratch) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      Captured sa,
      Capture({"sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State,ExitCode"}, scratch));
  if (sa.exit_code == 0) {
    auto tasks = ParseSacct(sa.out, job);
    if (!tasks.empty()) return tasks;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Captured sc, Capture({"scontrol", "-o", "show", "job", job}, scratch));
  if (sc.exit_code != 0) return std::vector<SlurmTaskState>{};  // gone from the controller too
  return ParseScontrol(sc.out);
}

Status RunWaveOnSlurm(const std::string& dir, const std::string& campaign, int wave,
                      const std::vector<int>& indices, const ExecutorOptions& eo,
                      std::ostream& out) {
  const std::string scratch = dir + "/units";
  std::error_code ec;
  fs::create_directories(scratch, ec);
  LOCKSTEP_ASSIGN_OR_RETURN(Submissions subs, LoadSubmissions(dir));
  // The latest submission of this wave that holds every index still to run: a killed driver's
  // job is waited for, not sent again.
  nlohmann::json* sub = nullptr;
  for (auto& s : subs.j["submissions"]) {
    if (s.value("wave", -1) != wave) continue;
    const auto held = s.value("indices", std::vector<int>{});
    bool all = true;
    for (int i : indices) all = all && std::find(held.begin(), held.end(), i) != held.end();
    if (all) sub = &s;
  }
  if (sub != nullptr && (*sub)["job"].is_null()) {
    // Killed between the intent and sbatch's answer: find the job by its name, if it exists.
    LOCKSTEP_ASSIGN_OR_RETURN(Captured q, Capture({"squeue", "-h", "--name",
                                                   (*sub)["name"].get<std::string>(), "-o", "%F"},
                                                  scratch));
    std::string id = q.out.substr(0, q.out.find('\n'));
    if (q.exit_code == 0 && !id.empty()) {
      (*sub)["job"] = id;
      LOCKSTEP_RETURN_IF_ERROR(subs.Save());
    } else {
      sub = nullptr;  // never queued, or gone: send the units still to run
    }
  }
  if (sub != nullptr) {
    // A finished job whose tasks all have a final state already had its records written: a
    // unit still to run from it was damaged since, so it is sent again.
    LOCKSTEP_ASSIGN_OR_RETURN(auto tasks, QueryJob((*sub)["job"].get<std::string>(), scratch));
    bool active = false;
    for (const auto& t : tasks) active = active || !SlurmStateFinal(t.state);
    if (!active && !tasks.empty() && (*sub).value("recorded", false)) sub = nullptr;
  }
  if (sub == nullptr) {
    // The name finds the job again after a kill between this intent and sbatch's answer: the
    // run folder's digest keeps two campaigns of one name apart.
    const std::string name =
        fmt::format("lockstep-{}-{}-w{}-{}", campaign,
                    Sha256Hex(fs::absolute(dir).lexically_normal().string()).substr(0, 8), wave,
                    subs.j["submissions"].size());
    subs.j["submissions"].push_back(
        {{"wave", wave}, {"name", name}, {"job", nullptr}, {"indices", indices}});
    LOCKSTEP_RETURN_IF_ERROR(subs.Save());
    DriverStep();
    LOCKSTEP_ASSIGN_OR_RETURN(std::string self, SelfExecutable());
    std::vector<std::string> argv = {"sbatch", "--parsable", "--array=" + IndexRanges(indices),
                                     "--job-name=" + name,
                                     "--output=" + scratch + "/slurm-%A_%a.out"};
    for (const auto& a : eo.slurm_args) argv.push_back(a);
    argv.push_back(fmt::format("--wrap=exec '{}' run-unit '{}' --index-env SLURM_ARRAY_TASK_ID",
                               self, fs::absolute(dir).string()));
    LOCKSTEP_ASSIGN_OR_RETURN(Captured sb, Capture(argv, scratch));
    const std::string id = sb.out.substr(0, sb.out.find_first_of(";\n"));
    if (sb.exit_code != 0 || id.empty())
      return Status::Runtime("sbatch", fmt::format("exit {}: {}", sb.exit_code, sb.err));
    subs.j["submissions"].back()["job"] = id;
    LOCKSTEP_RETURN_IF_ERROR(subs.Save());
    sub = &subs.j["submissions"].back();
    out << fmt::format("  wave {}: sbatch --array={} (job {})\n", wave, IndexRanges(indices), id);
    DriverStep();
  }
  const std::string job = (*sub)["job"].get<std::string>();
  std::map<int, SlurmTaskState> final_states;
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto tasks, QueryJob(job, scratch));
    bool active = false;
    for (const auto& t : tasks) {
      if (SlurmStateFinal(t.state))
        final_states[t.index] = t;
      else
        active = true;
    }
    if (!active) break;
    std::this_thread::sleep_for(std::chrono::duration<double>(eo.poll_s));
  }
  for (int i : indices) {
    auto it = final_states.find(i);
    if (it == final_states.end()) {  // the controller forgot it: only its outputs can speak
      if (!HasVerifiedUnit(dir, i))
        LOCKSTEP_RETURN_IF_ERROR(
            WriteSchedulerRecord(dir, i, SlurmTaskState{i, "UNKNOWN", "0:0"}, job));
      continue;
    }
    if (!SlurmTaskSucceeded(it->second) || !HasVerifiedUnit(dir, i)) {
      LOCKSTEP_RETURN_IF_ERROR(
          WriteSchedulerRecord(dir, i, it->second, fmt::format("{}_{}", job, i)));
      out << fmt::format("  unit {}: Slurm says {} (ExitCode {}): a failed unit\n", i,
                         it->second.state, it->second.exit_code);
    }
  }
  (*sub)["recorded"] = true;
  return subs.Save();
}

}  // namespace

std::vector<SlurmTaskState> ParseSacct(const std::string& text, const std::string& job) {
  std::vector<SlurmTaskState> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    const auto p1 = line.find('|');
    const auto p2 = line.find('|', p1 == std::string::npos ? p1 : p1 + 1);
    if (p1 == std::string::npos || p2 == std::string::npos) continue;
    const std::string id = line.substr(0, p1);
    if (id.rfind(job + "_", 0) != 0) continue;  // the array's rows: JOB_N ([N-M] pending)
    const std::string idx = id.substr(job.size() + 1);
    if (idx.empty() || idx[0] == '[') continue;
    SlurmTaskState t;
    t.index = std::atoi(idx.c_str());
    std::string state = line.substr(p1 + 1, p2 - p1 - 1);
    t.state = state.substr(0, state.find(' '));  // "CANCELLED by 0"
    t.exit_code = line.substr(p2 + 1);
    while (!t.exit_code.empty() && (t.exit_code.back() == '\r' || t.exit_code.back() == ' '))
      t.exit_code.pop_back();
    out.push_back(t);
  }
  return out;
}

std::vector<SlurmTaskState> ParseScontrol(const std::string& text) {
  std::vector<SlurmTaskState> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    const std::string task = ScontrolField(line, "ArrayTaskId");
    const std::string state = ScontrolField(line, "JobState");
    if (task.empty() || state.empty()) continue;
    const std::string exit_code = ScontrolField(line, "ExitCode");
    // A pending part of an array: "2-5,7" or "2-9%4"; every index in it is pending.
    std::stringstream ts(task.substr(0, task.find('%')));
    std::string part;
    while (std::getline(ts, part, ',')) {
      const auto dash = part.find('-');
      const int lo = std::atoi(part.c_str());
      const int hi = dash == std::string::npos ? lo : std::atoi(part.c_str() + dash + 1);
      for (int i = lo; i <= hi; ++i) out.push_back({i, state, exit_code});
    }
  }
  return out;
}

bool SlurmStateFinal(const std::string& s) {
  for (const char* active : {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED",
                             "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "STOPPED",
                             "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"})
    if (s == active) return false;
  return true;
}

bool SlurmTaskSucceeded(const SlurmTaskState& t) {
  return t.state == "COMPLETED" && t.exit_code == "0:0";
}

bool IsUnitsRunFolder(const std::string& dir) { return fs::exists(dir + "/units.json"); }

Status RunUnitsCampaign(const RunOptions& ro, const ExecutorOptions& eo_in, std::ostream& out) {
  ExecutorOptions eo = eo_in;
  const std::string& dir = ro.out_dir;
  const std::string exec_path = dir + "/executor.json";
  if (!ro.resume) {
    if (eo.executor != "units" && eo.executor != "slurm")
      return Status::InvalidArgument("--executor",
                                     "'" + eo.executor + "': one of local, units, slurm");
    ExpandOptions x;
    x.plan = ro.plan, x.out_dir = dir, x.builds = ro.builds, x.exe = ro.exe;
    LOCKSTEP_RETURN_IF_ERROR(ExpandPlan(x, out));
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(
        exec_path,
        nlohmann::json{{"executor", eo.executor}, {"slurm_args", eo.slurm_args}}.dump() + "\n"));
  } else {
    if (!eo.slurm_args.empty())
      return Status::InvalidArgument("--slurm-arg",
                                     "a resumed run uses the arguments it "
                                     "recorded in executor.json");
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(exec_path, std::size_t{1} << 20));
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object()) return Status::Corruption("'" + exec_path + "'", "not JSON");
    eo.executor = j.value("executor", "units");
    eo.slurm_args = j.value("slurm_args", std::vector<std::string>{});
  }
  RunRecord rec;
  LOCKSTEP_ASSIGN_OR_RETURN(Campaign c, LoadRunFolderPlan(dir, &rec));
  std::vector<int> last;
  for (;;) {
    DriverStep();
    MergeResult mr;
    const Status s = MergeUnits(dir, out, &mr);
    if (!mr.pending) return s;
    if (mr.indices == last)
      return Status::Runtime("wave " + std::to_string(mr.wave),
                             "units " + IndexRanges(mr.indices) +
                                 " were sent and are still not run: giving up (see units/)");
    last = mr.indices;
    if (eo.executor == "slurm")
      LOCKSTEP_RETURN_IF_ERROR(RunWaveOnSlurm(dir, c.name, mr.wave, mr.indices, eo, out));
    else
      LOCKSTEP_RETURN_IF_ERROR(RunWaveLocally(dir, mr.indices, out));
  }
}

}  // namespace lockstep
