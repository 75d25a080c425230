// Campaign arms on `lockstep serve` (issue 25): fresh and shared-warm arms end to end with their
// ledger and service.json records (Must show 1's records), the strict service keys, SIGKILL of
// the runner at random points and while a server starts or load runs (Must show 3: same
// decision, no server outlives the runner, "lost: re-primed"), and a separately started server
// with an API key (Must show 4: same verdicts, bitwise the same exports item by item; a
// tampered download refused by digest). Tiny model, 8 tokens: the file runs in about a minute.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "campaign_files.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/golden.h"
#include "lockstep/harness/ledger.h"
#include "lockstep/harness/runner.h"
#include "serve_http/serve_process.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using test::ReadJson;
using test::ReadLedger;
using test::RunLockstep;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

const char* kHead = R"(name = "svc"
question = "Do requests on fresh and shared servers compute the same state?"
[model]
preset = "tiny"
seed = 7
[request]
prompt = "abcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabc"
[engine]
threads = 1
max_new = 8
spec = 2
slots = 2
prefix_cache = true
prefill_chunk = 16
[gates]
output = true
state = true
exact = true
)";

// A1, A2 fresh; A3 shared and primed (warm); A4 shared after A3 (warm from A3's requests); L
// shared under background load; P a process arm.
const char* kArms = R"(
[[arm]]
name = "A1"
server = "fresh"
[[arm]]
name = "A2"
server = "fresh"
baseline = "A1"
decision = "aa_stable"
[[arm]]
name = "A3"
server = "shared"
prime = true
baseline = "A1"
[[arm]]
name = "A4"
server = "shared"
baseline = "A1"
[[arm]]
name = "L"
server = "shared"
baseline = "A1"
load = { requests = 4, concurrency = 2, prompt_tokens = [20, 60], max_new = 8, seed = 1 }
[[arm]]
name = "P"
baseline = "A1"
)";

std::string WritePlan(const std::string& name, const std::string& text) {
  const std::string dir = test::NewDir("svcplan-" + name);
  EXPECT_TRUE(WriteFileAtomic(dir + "/" + name + ".toml", text).ok());
  return dir + "/" + name + ".toml";
}

const std::string& Plan() {
  static const std::string p =
      WritePlan("svc", "control = \"perturb:layer=3:item=k:eps=1e-2:window=1\"\n" +
                           std::string(kHead) + kArms);
  return p;
}

// The bytes of a /proc file, or "" when the process has gone: reading a file of a process that
// just exited fails with ESRCH, which libstdc++'s filebuf turns into an exception (the flake of
// issue 43: "basic_filebuf::underflow error reading the file: No such process").
std::string ReadProcFile(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string s;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;  // end, or the process went away mid-read: what was read is all there is
    s.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return s;
}

// pids of processes (not zombies) whose command line holds `needle` (a run folder). Processes
// may exit at any point of the scan: the listing and every read tolerate it.
std::vector<int> ProcessesHolding(const std::string& needle) {
  std::vector<int> out;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (ReadProcFile(it->path() / "cmdline").find(needle) == std::string::npos) continue;
    const std::string st = ReadProcFile(it->path() / "stat");
    const auto rp = st.rfind(')');
    if (rp == std::string::npos) continue;  // gone between the two reads
    if (rp + 2 < st.size() && st[rp + 2] == 'Z') continue;
    out.push_back(std::stoi(name));
  }
  return out;
}

// Waits (up to 10 s) until no process holds `dir` in its command line; true when none is left.
bool NoneHolding(const std::string& dir) {
  const auto t0 = Clock::now();
  while (!ProcessesHolding(dir).empty()) {
    if (Since(t0) > 10) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

json Service(const std::vector<LedgerEntry>& es, const std::string& arm) {
  for (const auto& e : es)
    if (e.event == "finished" && e.arm == arm) return e.data.value("service", json());
  return json();
}

// The reference run (uninterrupted, runner-managed servers), shared by the tests that read it.
const std::string& LocalRun() {
  static const std::string dir = [] {
    const std::string d = test::NewDir("svc-local") + "/run";
    auto r = RunLockstep("run " + Plan() + " --out " + d + " --no-progress");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return d;
  }();
  return dir;
}

TEST(ServiceRunner, FreshAndSharedWarmArmsRecordTheirEngine) {
  const std::string& dir = LocalRun();
  const auto es = ReadLedger(dir);
  ASSERT_FALSE(es.empty());
  EXPECT_EQ(es.back().data.value("verdict", ""), "pass");
  for (const std::string arm : {"A2", "A3", "A4", "L", "P"}) {
    const json cmp = ReadJson(dir + "/compare/" + arm + ".json")["comparison"];
    EXPECT_TRUE(cmp["passed"].get<bool>()) << arm << ": " << cmp.dump();
  }
  // The positive control ran on its own fresh server, its injection read from its export.
  const json ctl = ReadJson(dir + "/compare/control.json")["comparison"];
  EXPECT_FALSE(ctl["passed"].get<bool>());
  EXPECT_TRUE(ctl["control_applied"].get<bool>()) << ctl.dump();
  EXPECT_EQ(Service(es, "control")["server"], "fresh");
  // service.json is the ledger's `service` object.
  for (const std::string arm : {"A1", "A2", "A3", "A4", "L"})
    EXPECT_EQ(ReadJson(dir + "/arms/" + arm + "/service.json"), Service(es, arm)) << arm;
  EXPECT_TRUE(Service(es, "P").is_null()) << "a process arm has no service object";
  const json a1 = Service(es, "A1"), a2 = Service(es, "A2"), a3 = Service(es, "A3"),
             a4 = Service(es, "A4"), l = Service(es, "L");
  for (const json* s : {&a1, &a2}) {
    EXPECT_EQ((*s)["server"], "fresh");
    EXPECT_EQ((*s)["engine_state"], "fresh");
    EXPECT_EQ((*s)["cold"], true);
    EXPECT_EQ((*s)["prompt_tokens_reused"], 0);
    EXPECT_EQ((*s)["requests_before"], 0);
    EXPECT_EQ((*s)["primed"], false);
  }
  EXPECT_NE(a1["instance"], a2["instance"]) << "each fresh arm has its own server";
  EXPECT_EQ(a3["server"], "shared");
  EXPECT_EQ(a3["engine_state"], "carried");
  EXPECT_EQ(a3["primed"], true);
  EXPECT_EQ(a3["cold"], false);
  EXPECT_GT(a3["prompt_tokens_reused"].get<int>(), 0);
  EXPECT_GE(a3["snapshot_position"].get<int>(), 0);
  EXPECT_EQ(a3["requests_before"], 1);  // its prime
  EXPECT_EQ(a4["cold"], false) << "A4 is warm from A3's requests on the shared server";
  EXPECT_EQ(a4["requests_before"], 2);
  EXPECT_EQ(a4["instance"], a3["instance"]);
  EXPECT_EQ(a1["engine_config_sha256"], a3["engine_config_sha256"]);
  ASSERT_TRUE(l["load"].is_object()) << l.dump();
  EXPECT_EQ(l["load"]["requests"], 4);
  EXPECT_EQ(l["load"]["completed"], 4);
  EXPECT_EQ(l["load"]["digests"].size(), 4u);
  EXPECT_EQ(l["requests_before"], 3);
  EXPECT_TRUE(a1["load"].is_null());
  for (const json* s : {&a1, &a3, &l}) EXPECT_EQ((*s)["export"]["verified"], true) << s->dump();
  // One server per fresh arm and one shared, each started and stopped; none is left.
  int started = 0, stopped = 0;
  for (const auto& e : es)
    started += e.event == "server_started", stopped += e.event == "server_stopped";
  EXPECT_EQ(started, 4);  // A1, A2, the shared one, the control
  EXPECT_EQ(stopped, 4);
  EXPECT_TRUE(ProcessesHolding(dir).empty());
  // A process arm's output and a service arm's are the same files.
  EXPECT_EQ(ReadJson(dir + "/arms/A3/stdout.json")["output_ids"],
            ReadJson(dir + "/arms/P/stdout.json")["output_ids"]);
}

// Timing arms on servers: one fresh server per repeat, or repeats on the shared one, each repeat
// with its own record.
TEST(ServiceRunner, TimingArmsRepeatOnServers) {
  const std::string plan =
      WritePlan("timing", std::string(kHead) +
                              "[[arm]]\nname = \"T1\"\nmode = \"timing\"\nrepeat = 2\nserver = "
                              "\"fresh\"\n[[arm]]\nname = \"T2\"\nmode = \"timing\"\nrepeat = "
                              "2\nserver = \"shared\"\nbaseline = \"T1\"\n");
  const std::string dir = test::NewDir("svc-timing") + "/run";
  auto r = RunLockstep("run " + plan + " --out " + dir + " --no-progress");
  EXPECT_NE(r.exit_code, 2) << r.out << r.err;
  const auto es = ReadLedger(dir);
  std::vector<std::string> records;
  for (const auto& e : es)
    if (e.event == "finished")
      records.push_back(e.arm + "#" + std::to_string(e.data.value("repeat", -1)) + " " +
                        e.data["service"].value("server", "") + " " +
                        e.data["service"].value("engine_state", ""));
  EXPECT_EQ(records, (std::vector<std::string>{"T1#0 fresh fresh", "T1#1 fresh fresh",
                                               "T2#0 shared carried", "T2#1 shared carried"}));
  for (const char* rep : {"r0", "r1"}) {
    EXPECT_GT(test::Slurp(dir + "/arms/T1/" + std::string(rep) + "/trace.jsonl").size(), 10u);
    EXPECT_EQ(ReadJson(dir + "/arms/T2/" + std::string(rep) + "/service.json")["server"], "shared");
  }
  EXPECT_NE(ReadJson(dir + "/arms/T1/r0/service.json")["instance"],
            ReadJson(dir + "/arms/T1/r1/service.json")["instance"]);
  EXPECT_EQ(ReadJson(dir + "/arms/T2/r1/service.json")["cold"], false) << "r1 is warm from r0";
  EXPECT_FALSE(fs::exists(dir + "/arms/T1/r0/export.h5")) << "timing arms export nothing";
}

// Each bad service key is exit 2 with file:line:col, before anything runs.
TEST(ServiceRunner, BadServiceKeysAreRefusedWithTheirPlace) {
  const std::string arm = "[[arm]]\nname = \"A1\"\n";  // line 19 of the plan
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {"server", arm + "server = \"warm\"\n", ":21:10: arm 'A1': 'server' must be process"},
      {"prime-process", arm + "prime = true\n", ":21:9: arm 'A1': 'prime' applies to a service"},
      {"load-key", arm + "server = \"fresh\"\nload = { requests = 2, burst = 3 }\n",
       ":22:24: unknown key 'burst'"},
      {"shared-override", arm + "server = \"shared\"\n[arm.engine]\nspec = 3\n",
       ":23:8: arm 'A1': a shared arm runs on the campaign's server"},
      {"load-slots", arm + "server = \"fresh\"\nload = { requests = 2 }\n[arm.engine]\nslots = 1\n",
       ":22:8: arm 'A1': 'load' shares the arm's engine steps"},
      {"prompt-range", arm + "server = \"fresh\"\nload = { prompt_tokens = [9, 3] }\n",
       ":22:30: 'prompt_tokens' must be"},
      {"url", "[service]\nurl = \"https://example.com\"\n" + arm,
       ":20:7: 'url': must be http://HOST:PORT"},
      {"key-env", "[service]\nurl = \"http://127.0.0.1:9\"\napi_key_env = \"1X\"\n" + arm,
       ":21:15: 'api_key_env' must name an environment variable"},
  };
  for (const auto& [name, tail, want] : cases) {
    auto c = ParseCampaign(std::string(kHead) + tail, "p.toml", test::NewDir("badsvc"));
    ASSERT_FALSE(c.ok()) << name;
    EXPECT_EQ(c.status().code(), Status::Code::kInvalidArgument) << name;
    EXPECT_NE(c.status().message().find(want), std::string::npos)
        << name << ": " << c.status().message();
  }
  // The same through the CLI: exit 2, no run folder.
  const std::string out = test::NewDir("badsvc-cli") + "/run";
  auto r = RunLockstep("run " + WritePlan("bad", std::string(kHead) + arm + "prime = true\n") +
                       " --out " + out + " --no-progress");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // A shared arm may set request keys; the control of a service first arm runs on a fresh server.
  auto ok = ParseCampaign("control = \"perturb:layer=3:item=k:eps=1e-2:window=1\"\n" +
                              std::string(kHead) + arm +
                              "server = \"shared\"\n[arm.engine]\nseed = 3\nmax_new = 6\n",
                          "p.toml", test::NewDir("oksvc"));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->arms.back().name, "control");
  EXPECT_EQ(ok->arms.back().server, "fresh");
}

// A server that refuses its configuration fails its arm at once, with the server's own error
// line (its health polls are not quoted), and leaves no process behind.
TEST(ServiceRunner, AServerThatRefusesItsConfigFailsTheArm) {
  const std::string plan =
      WritePlan("refused", std::string(kHead) +
                               "[[arm]]\nname = \"A1\"\nserver = \"fresh\"\n[arm.engine]\ninject = "
                               "[\"perturb:stage=1:layer=1:item=k:eps=1e-2:window=1\"]\n"
                               "[[arm]]\nname = \"A2\"\nserver = \"fresh\"\nbaseline = \"A1\"\n");
  const std::string dir = test::NewDir("svc-refused") + "/run";
  const auto t0 = Clock::now();
  auto r = RunLockstep("run " + plan + " --out " + dir + " --no-progress");
  EXPECT_LT(Since(t0), 30) << "the server's refusal was waited out, not seen";
  // A lone arm is refused as a plan (issue 35: nothing paired); A2 against the failed A1 fails.
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("A1: FAILED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer 1 belongs to stage 0"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("GET /health"), std::string::npos) << r.out;
  const auto es = ReadLedger(dir);
  EXPECT_EQ(test::Events(es, "failed"), std::vector<std::string>{"A1"});
  EXPECT_EQ(test::Events(es, "server_failed"), std::vector<std::string>{"A1"});
  EXPECT_TRUE(NoneHolding(dir));
}

// LedgerDigest's reading of service records: volatile fields and the server events dropped,
// "lost: re-primed" as "carried", requests_before as whether it is above 0; what decides stays.
TEST(ServiceRunner, LedgerDigestKeepsTheServiceDecisionContent) {
  auto finished = [](json svc) {
    return LedgerEntry{0, "finished", "A3", {{"repeat", 0}, {"seconds", 1.0}, {"service", svc}}};
  };
  const json base = {{"server", "shared"},
                     {"instance", "aa"},
                     {"engine_state", "carried"},
                     {"cold", false},
                     {"prompt_tokens_reused", 32},
                     {"requests_before", 3},
                     {"export", {{"file", "x.h5"}, {"received_sha256", "1"}, {"verified", true}}},
                     {"load", {{"digest", "d"}, {"seconds", 0.5}}}};
  json other = base;
  other["instance"] = "bb";
  other["engine_state"] = "lost: re-primed";
  other["requests_before"] = 7;
  other["export"] = {{"file", "y.h5"}, {"received_sha256", "2"}, {"verified", true}};
  other["load"]["seconds"] = 0.9;
  const LedgerEntry started{0, "server_started", "A3", {{"port", 1}}};
  EXPECT_EQ(LedgerDigest({finished(base)}), LedgerDigest({started, finished(other)}));
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, json>>{{"cold", true},
                                                 {"prompt_tokens_reused", 0},
                                                 {"requests_before", 0},
                                                 {"load", nullptr},
                                                 {"server", "fresh"}}) {
    json changed = base;
    changed[key] = value;
    EXPECT_NE(LedgerDigest({finished(base)}), LedgerDigest({finished(changed)})) << key;
  }
  json refused = base;
  refused["export"]["verified"] = false;
  EXPECT_NE(LedgerDigest({finished(base)}), LedgerDigest({finished(refused)}));
  // A failed arm's record holds nulls: read, never thrown on.
  const json failed = {{"server", "remote"},
                       {"engine_state", nullptr},
                       {"requests_before", nullptr},
                       {"export", {{"verified", nullptr}}}};
  EXPECT_EQ(LedgerDigest({finished(failed)}).size(), 1u);
  // The comparison's two sides are read the same way.
  const LedgerEntry cmp_a{0, "compared", "A3", {{"service", {{"b", {{"requests_before", 3}}}}}}};
  const LedgerEntry cmp_b{0, "compared", "A3", {{"service", {{"b", {{"requests_before", 9}}}}}}};
  EXPECT_EQ(LedgerDigest({cmp_a}), LedgerDigest({cmp_b}));
}

// The ledger's lines so far (a torn last line is fine: it is only read here).
std::string LedgerText(const std::string& dir) { return test::Slurp(dir + "/ledger.jsonl"); }

// Where a kill lands: at a random time, or when the ledger shows a phase.
enum class KillAt { kRandom, kServerStarting, kLoadRunning, kSharedUp };

// Kills the runner `pid` at `at`; true when it was killed (not already finished).
bool KillWhen(pid_t pid, const std::string& dir, KillAt at, double delay_ms) {
  const auto t0 = Clock::now();
  if (at == KillAt::kRandom) {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(delay_ms * 1000)));
  } else {
    // The line that opens the phase: a fresh arm sent (its server starts next), the load arm
    // sent (its load starts after it), the shared server's first arm finished.
    const std::string needle = at == KillAt::kServerStarting ? "\"server\":\"fresh\""
                               : at == KillAt::kLoadRunning  ? "\"arm\":\"L\""
                                                             : "\"arm\":\"A3\"";
    const std::string event =
        at == KillAt::kSharedUp ? "\"event\":\"finished\"" : "\"event\":\"sent\"";
    for (;;) {
      bool seen = false;
      std::istringstream in(LedgerText(dir));
      for (std::string line; std::getline(in, line);)
        seen = seen ||
               (line.find(needle) != std::string::npos && line.find(event) != std::string::npos);
      if (seen) break;
      if (Since(t0) > 60 || ::waitpid(pid, nullptr, WNOHANG) == pid) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(delay_ms * 1000)));
  }
  const bool killed = ::kill(pid, SIGKILL) == 0;
  test::WaitChild(pid);
  return killed;
}

// Where a kill landed, from the ledger it left: the last line is a fresh arm's `sent` (its server
// was starting) or the load arm's `sent` / `server_*` line (its load was running).
struct Landing {
  bool server_starting = false, load_running = false;
};
Landing LandedIn(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  Landing l;
  for (std::size_t i = lines.size(); i-- > 0;) {
    if (lines[i].find("\"event\":\"sent\"") == std::string::npos) continue;
    const bool last = i + 1 == lines.size();
    l.server_starting = last && lines[i].find("\"server\":\"fresh\"") != std::string::npos;
    l.load_running = lines[i].find("\"arm\":\"L\"") != std::string::npos && last;
    break;
  }
  return l;
}

// Must show 3: SIGKILL at >= 20 points (random ones, and while a server starts, while the load
// runs, while the shared server is up); each resume ends in the same decision (LedgerDigest)
// and no `lockstep serve` (or any child) survives its runner.
TEST(ServiceRunner, SigkillAtRandomPointsResumesToTheSameDecision) {
  const auto reference = LedgerDigest(ReadLedger(LocalRun()));
  ASSERT_FALSE(reference.empty());
  const auto t0 = Clock::now();
  ASSERT_EQ(test::WaitChild(test::SpawnLockstep(
                {"run", Plan(), "--out", test::NewDir("svc-time") + "/run", "--no-progress"})),
            0);
  const double total_ms = Since(t0) * 1000;
  std::mt19937 rng(25);
  int kills = 0, survivors = 0, reprimed = 0, in_server_start = 0, in_load = 0;
  const KillAt plan[] = {KillAt::kServerStarting, KillAt::kLoadRunning, KillAt::kSharedUp};
  for (int iter = 0; iter < 16 && Since(t0) < 150; ++iter) {
    const std::string dir = test::NewDir("svc-kill" + std::to_string(iter)) + "/run";
    const int n_kills = 1 + static_cast<int>(rng() % 2);
    for (int k = 0; k <= n_kills; ++k) {
      const bool fresh = !fs::exists(dir + "/ledger.jsonl");
      const pid_t pid = test::SpawnLockstep(
          fresh ? std::vector<std::string>{"run", Plan(), "--out", dir, "--no-progress"}
                : std::vector<std::string>{"run", "--resume", dir, "--no-progress"});
      if (k == n_kills) {
        ASSERT_EQ(test::WaitChild(pid), 0) << "final attempt of iteration " << iter;
        break;
      }
      // The first kill of the first iterations lands in a chosen phase; the others at random.
      const KillAt at = iter < 6 && k == 0 ? plan[iter % 3] : KillAt::kRandom;
      const double delay = at == KillAt::kRandom
                               ? std::uniform_real_distribution<double>(0.0, total_ms * 1.1)(rng)
                               : std::uniform_real_distribution<double>(0.0, 8.0)(rng);
      if (!KillWhen(pid, dir, at, delay)) continue;
      ++kills;
      const Landing where = LandedIn(LedgerText(dir));
      in_server_start += where.server_starting;
      in_load += where.load_running;
      if (!NoneHolding(dir)) ++survivors;
    }
    const auto es = ReadLedger(dir);
    EXPECT_EQ(LedgerDigest(es), reference) << "iteration " << iter;
    ASSERT_FALSE(es.empty());
    EXPECT_EQ(es.back().data.value("verdict", ""), "pass") << "iteration " << iter;
    EXPECT_TRUE(NoneHolding(dir)) << "iteration " << iter << ": a process outlived the run";
    // A shared arm run on a shared server that replaced a killed runner's is re-primed, and
    // recorded so: never silently warm.
    for (const auto& e : es)
      if (e.event == "finished" && e.data.contains("service") &&
          e.data["service"].value("engine_state", "") == "lost: re-primed")
        ++reprimed;
  }
  std::printf(
      "service kills: %d (while a fresh server started: %d, while the load ran: %d), "
      "re-primed shared arms: %d, in %.0f s\n",
      kills, in_server_start, in_load, reprimed, Since(t0));
  EXPECT_GE(kills, 20);
  EXPECT_EQ(survivors, 0) << "a server (or another child) outlived a killed runner";
  EXPECT_GE(in_server_start, 1) << "no kill landed while a fresh server started";
  EXPECT_GE(in_load, 1) << "no kill landed while the load arm ran";
  EXPECT_GE(reprimed, 1) << "no shared arm ran on a replacement shared server";
}

// After the shared server's first arm finished, a kill and a resume: the next shared arms run on
// a new server that got the history again, are recorded "lost: re-primed" and are still warm.
TEST(ServiceRunner, SharedArmAfterAResumeIsReprimed) {
  const std::string dir = test::NewDir("svc-reprime") + "/run";
  const pid_t pid = test::SpawnLockstep({"run", Plan(), "--out", dir, "--no-progress"});
  ASSERT_TRUE(KillWhen(pid, dir, KillAt::kSharedUp, 0));
  ASSERT_TRUE(NoneHolding(dir));
  auto r = RunLockstep("run --resume " + dir + " --no-progress");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto es = ReadLedger(dir);
  const json a3 = Service(es, "A3"), a4 = Service(es, "A4");
  EXPECT_EQ(a3["engine_state"], "carried");
  EXPECT_EQ(a4["engine_state"], "lost: re-primed");
  EXPECT_EQ(a4["cold"], false);
  EXPECT_EQ(a4["prompt_tokens_reused"],
            Service(ReadLedger(LocalRun()), "A4")["prompt_tokens_reused"]);
  EXPECT_NE(a4["instance"], a3["instance"]);
  bool reprimed = false;
  for (const auto& e : es)
    if (e.event == "reprimed")
      reprimed = e.data["arms"] == json::array({"A3"}) && e.data["requests"] == 2;
  EXPECT_TRUE(reprimed);
  EXPECT_EQ(LedgerDigest(es), LedgerDigest(ReadLedger(LocalRun())));
}

// Item-by-item SHA-256 of an export (path -> digest).
std::map<std::string, std::string> Items(const std::string& path) {
  std::map<std::string, std::string> out;
  auto r = ExportReader::Open(path, ReaderLimits{});
  EXPECT_TRUE(r.ok()) << path << ": " << r.status().message();
  if (!r.ok()) return out;
  auto d = ExportItemDigests(**r);
  EXPECT_TRUE(d.ok());
  if (d.ok())
    for (const auto& it : *d) out[it.key] = DigestText(it);
  return out;
}

// A separately started `lockstep serve` (loopback, API key) with the campaign's engine.
std::unique_ptr<test::ServeProcess> RemoteServer(const std::string& key) {
  const std::string exports = test::NewDir("svc-remote-exports");
  return std::make_unique<test::ServeProcess>(
      std::vector<std::string>{"--config", LocalRun() + "/shared/config.json", "--slots", "2",
                               "--port", "0", "--api-key", key, "--export-dir", exports});
}

// Must show 4: the same plan against a server someone started gives the same verdicts and
// bitwise the same exports as on runner-managed servers.
TEST(ServiceRunner, RemoteServerGivesTheSameVerdictsAndExports) {
  const std::string key = "k-" + std::to_string(::getpid());
  ::setenv("LOCKSTEP_TEST_REMOTE_KEY", key.c_str(), 1);
  auto srv = RemoteServer(key);
  ASSERT_TRUE(srv->started()) << srv->Log();
  const std::string dir = test::NewDir("svc-remote") + "/run";
  auto r =
      RunLockstep("run " + Plan() + " --out " + dir +
                  " --no-progress --service-url http://127.0.0.1:" + std::to_string(srv->port()) +
                  " --service-key-env LOCKSTEP_TEST_REMOTE_KEY");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto remote = ReadLedger(dir), local = ReadLedger(LocalRun());
  EXPECT_EQ(remote.back().data["verdict"], local.back().data["verdict"]);
  std::map<std::string, bool> rv, lv;
  for (const auto& e : remote)
    if (e.event == "compared") rv[e.arm] = e.data["passed"].get<bool>();
  for (const auto& e : local)
    if (e.event == "compared") lv[e.arm] = e.data["passed"].get<bool>();
  EXPECT_EQ(rv, lv);
  for (const std::string arm : {"A1", "A2", "A3", "A4", "L", "P"}) {
    const auto a = Items(LocalRun() + "/arms/" + arm + "/export.h5"),
               b = Items(dir + "/arms/" + arm + "/export.h5");
    EXPECT_GT(a.size(), 50u) << arm;
    EXPECT_EQ(a, b) << arm << ": the remote export differs from the runner-managed one";
  }
  const json a1 = Service(remote, "A1"), a3 = Service(remote, "A3");
  EXPECT_EQ(a1["server"], "remote");
  EXPECT_EQ(a1["cache"], "bypass");
  EXPECT_EQ(a1["cold"], true);
  const json a2 = Service(remote, "A2");
  EXPECT_EQ(a2["cold"], true) << "A2 bypassed the cache A1 left on the remote server";
  EXPECT_EQ(a2["cache"], "bypass");
  EXPECT_EQ(a3["cold"], false);
  EXPECT_EQ(a3["export"]["verified"], true);
  // The server's own count: nothing before A1; A1, A2 and A3's prime before A3.
  EXPECT_EQ(a1["requests_before"], 0);
  EXPECT_EQ(a3["requests_before"], 3);
  EXPECT_EQ(a1["instance"], a3["instance"]);
  EXPECT_EQ(Service(remote, "control")["server"], "fresh") << "the control runs on its own server";
  bool recorded = false;
  for (const auto& e : remote)
    if (e.event == "planned")
      recorded = e.data["service"]["api_key_env"] == "LOCKSTEP_TEST_REMOTE_KEY" &&
                 e.data.dump().find(key) == std::string::npos;
  EXPECT_TRUE(recorded) << "the planned entry names the key's variable, never the key";
  // Without the key the server refuses every arm; a server with another engine config is named.
  const std::string nokey = test::NewDir("svc-remote-nokey") + "/run";
  ::setenv("LOCKSTEP_TEST_WRONG_KEY", "wrong", 1);
  auto n =
      RunLockstep("run " + Plan() + " --out " + nokey +
                  " --no-progress --service-url http://127.0.0.1:" + std::to_string(srv->port()) +
                  " --service-key-env LOCKSTEP_TEST_WRONG_KEY");
  // Refused before any arm is sent: the server's fingerprints cannot be checked (issue 35).
  EXPECT_EQ(n.exit_code, 2) << n.out << n.err;
  EXPECT_NE(n.err.find("401"), std::string::npos) << n.err;
  EXPECT_TRUE(test::Events(ReadLedger(nokey), "sent").empty());
}

TEST(ServiceRunner, RemoteConfigMismatchNamesTheKey) {
  const std::string key = "k2";
  const std::string cfg_dir = test::NewDir("svc-mismatch");
  json cfg = ReadJson(LocalRun() + "/shared/config.json");
  cfg["spec"] = 3;
  ASSERT_TRUE(WriteFileAtomic(cfg_dir + "/config.json", cfg.dump()).ok());
  test::ServeProcess srv({"--config", cfg_dir + "/config.json", "--slots", "2", "--port", "0",
                          "--export-dir", cfg_dir});
  ASSERT_TRUE(srv.started()) << srv.Log();
  const std::string dir = cfg_dir + "/run";
  auto r =
      RunLockstep("run " + Plan() + " --out " + dir +
                  " --no-progress --service-url http://127.0.0.1:" + std::to_string(srv.port()));
  // Refused before any arm is sent, exit 2, naming the key (issue 35).
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("engine config spec (server 3, arm 2)"), std::string::npos) << r.err;
  EXPECT_TRUE(test::Events(ReadLedger(dir), "sent").empty());
}

// A proxy in front of the real server that flips one byte of every export it passes on, keeping
// the server's X-Lockstep-Sha256.
class TamperingProxy {
 public:
  explicit TamperingProxy(int upstream) : upstream_(upstream) {
    auto forward = [this](const httplib::Request& req, httplib::Response& res) {
      httplib::Client cli("127.0.0.1", upstream_);
      cli.set_read_timeout(60, 0);
      httplib::Headers h;
      if (req.has_header("Authorization"))
        h.emplace("Authorization", req.get_header_value("Authorization"));
      auto r = req.method == "POST" ? cli.Post(req.path, h, req.body, "application/json")
                                    : cli.Get(req.path, h);
      if (!r) {
        res.status = 502;
        return;
      }
      res.status = r->status;
      std::string body = r->body;
      if (req.path.rfind("/v1/exports/", 0) == 0 && r->status == 200 && !body.empty()) {
        body[body.size() / 2] = static_cast<char>(body[body.size() / 2] ^ 0x01);
        res.set_header("X-Lockstep-Sha256", r->get_header_value("X-Lockstep-Sha256"));
      }
      res.set_content(body, r->get_header_value("Content-Type"));
    };
    server_.Get(".*", forward);
    server_.Post(".*", forward);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~TamperingProxy() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int upstream_;
  int port_ = 0;
  httplib::Server server_;
  std::thread thread_;
};

// Must show 4: a download whose bytes are not the ones the server digested is refused, and the
// comparison fails with "export digest mismatch".
TEST(ServiceRunner, TamperedExportDownloadIsRefused) {
  const std::string dir0 = test::NewDir("svc-tamper");
  test::ServeProcess srv({"--config", LocalRun() + "/shared/config.json", "--slots", "2", "--port",
                          "0", "--export-dir", dir0});
  ASSERT_TRUE(srv.started()) << srv.Log();
  TamperingProxy proxy(srv.port());
  ASSERT_GT(proxy.port(), 0);
  const std::string plan =
      WritePlan("tamper", std::string(kHead) +
                              "[[arm]]\nname = \"A1\"\nserver = \"fresh\"\n[[arm]]\nname = "
                              "\"A2\"\nserver = \"fresh\"\nbaseline = \"A1\"\n");
  const std::string dir = dir0 + "/run";
  auto r =
      RunLockstep("run " + plan + " --out " + dir +
                  " --no-progress --service-url http://127.0.0.1:" + std::to_string(proxy.port()));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const json cmp = ReadJson(dir + "/compare/A2.json")["comparison"];
  EXPECT_FALSE(cmp["passed"].get<bool>());
  bool gate = false;
  for (const auto& g : cmp["gates"])
    if (g["name"] == "export digest")
      gate = !g["passed"].get<bool>() &&
             g["message"].get<std::string>().find("export digest mismatch") != std::string::npos;
  EXPECT_TRUE(gate) << cmp.dump();
  EXPECT_FALSE(fs::exists(dir + "/arms/A1/export.h5")) << "a refused export is never compared";
  EXPECT_TRUE(fs::exists(dir + "/arms/A1/export.h5.refused"));
  const json s = ReadJson(dir + "/arms/A1/service.json");
  EXPECT_EQ(s["export"]["verified"], false);
  EXPECT_NE(s["export"]["sha256"], s["export"]["received_sha256"]);
}

}  // namespace
}  // namespace lockstep
