// Campaign units on a real single-node Slurm (issue 41, Must show 1-3): tests/harness/slurm_node.sh
// starts munged, slurmctld and slurmd from Debian's slurm-wlm; every test is skipped, with the
// reason, where it exits 77 (not root, Slurm not installed, the node never idle). Most tests use
// the tiny A/A of units_test.h (3 units, 2 waves, under 2 s of CPU); the issue's own check,
// campaigns/aa-demo.toml through Slurm against the same plan run locally, is one test (about
// 16 s of CPU through Slurm).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <thread>

#include "lockstep/harness/units_executor.h"
#include "units_test.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using test::AaPlan;
using test::Events;
using test::Fragment;
using test::LocalAa;
using test::ReadJson;
using test::ReadLedger;
using test::RunPlan;
using test::ScopedEnv;
using test::Slurp;

const std::string kNodeScript = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/harness/slurm_node.sh";

class Slurm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    node_ = new std::string(test::NewDir("slurm-node"));
    const std::string cmd = "bash " + kNodeScript + " start " + *node_ + " >" + *node_ +
                            "/start.out 2>" + *node_ + "/start.err";
    const int st = std::system(cmd.c_str());
    const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    why_ = new std::string(rc == 0    ? ""
                           : rc == 77 ? Slurp(*node_ + "/start.err")
                                      : "slurm_node.sh failed (exit " + std::to_string(rc) +
                                            "): " + Slurp(*node_ + "/start.err"));
    started_ = rc == 0;
    if (started_) ::setenv("SLURM_CONF", (*node_ + "/slurm.conf").c_str(), 1);
  }
  static void TearDownTestSuite() {
    if (started_)
      std::system(("bash " + kNodeScript + " stop " + *node_ + " >/dev/null 2>&1").c_str());
    ::unsetenv("SLURM_CONF");
  }
  void SetUp() override {
    // 77: Slurm cannot run here (not root, not installed, the node never idle): a skip with the
    // reason; any other failure of the script is a failure.
    if (!started_ && why_->find("slurm_node.sh failed") == 0) FAIL() << *why_;
    if (!started_) GTEST_SKIP() << "no Slurm here: " << *why_;
  }
  // The job ids of a run folder's submissions, by wave ("" for one never sent).
  static std::multimap<int, std::string> Jobs(const std::string& dir) {
    std::multimap<int, std::string> out;
    auto t = ReadFile(dir + "/slurm.json");
    if (!t.ok()) return out;
    const auto j = nlohmann::json::parse(*t, nullptr, false);
    if (!j.is_object()) return out;
    for (const auto& s : j["submissions"])
      out.emplace(s.value("wave", -1), s["job"].is_string() ? s["job"].get<std::string>() : "");
    return out;
  }
  // The jobcomp log's entries of `job` (one line per array task that ended).
  static int EndedTasks(const std::string& job) {
    const std::string log = Slurp(*node_ + "/jobcomp.log");
    int n = 0;
    for (std::size_t p = 0; (p = log.find("ArrayJobId=" + job + " ", p)) != std::string::npos; ++p)
      ++n;
    return n;
  }
  static std::string* node_;
  static std::string* why_;
  static bool started_;
};
std::string* Slurm::node_ = nullptr;
std::string* Slurm::why_ = nullptr;
bool Slurm::started_ = false;

// Must show 1: through sbatch arrays the campaign gives the local run's verdict, comparisons and
// per-item state digests; one array per wave, each task ended once.
TEST_F(Slurm, ExecutorSlurmEqualsLocal) {
  const std::string dir = RunPlan(AaPlan(), "slurm-aa", "--executor slurm", 0);
  test::ExpectSameCampaign(LocalAa(), dir, {"A1", "A2", "B"});
  const auto jobs = Jobs(dir);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(EndedTasks(jobs.find(0)->second), 2);
  EXPECT_EQ(EndedTasks(jobs.find(1)->second), 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Fragment(dir, i)["attempt"], 1) << i;
}

// Must show 1 as the issue states it: `lockstep run campaigns/aa-demo.toml --executor slurm` gives
// the local run's verdict, comparisons and per-item state digests of every state arm.
TEST_F(Slurm, AaDemoThroughSlurmEqualsLocal) {
  const std::string plan = std::string(LOCKSTEP_SOURCE_DIR) + "/campaigns/aa-demo.toml";
  const std::string local = RunPlan(plan, "aa-demo-local", "", 0);
  const std::string dir = RunPlan(plan, "aa-demo-slurm", "--executor slurm", 0);
  EXPECT_EQ(test::Verdict(dir), test::Verdict(local));
  // The timing arms' comparison holds wall times, which differ between any two runs: of those
  // entries only the event and the arm are compared; every other entry whole.
  auto decisions = [](const std::string& d) {
    std::vector<std::string> out;
    for (std::string e : test::DecisionDigest(d)) {
      if (e.starts_with("compared T")) e = e.substr(0, e.find(' ', 9));
      out.push_back(e);
    }
    return out;
  };
  EXPECT_EQ(decisions(dir), decisions(local));
  for (const char* arm : {"A1", "A2", "B-prefill-64"}) {
    const auto a = test::ItemDigests(local + "/arms/" + arm + "/export.h5");
    EXPECT_GT(a.size(), 10u) << arm;
    EXPECT_EQ(test::ItemDigests(dir + "/arms/" + arm + "/export.h5"), a) << arm;
  }
  EXPECT_GE(Jobs(dir).size(), 2u) << "one sbatch array per wave";
}

// Must show 2: a unit scancel'ed while it runs, one whose process is SIGKILLed, and one that
// Slurm reports as TIMEOUT with ExitCode 0:0 (vLLM's false green; a fake sacct on PATH says so
// of a unit that wrote good outputs) are failed arms: the stop rule fires, B is not sent, the
// report says the scheduler's state.
TEST_F(Slurm, CancelledKilledAndTimedOutUnitsAreFailedNeverPassed) {
  const std::string dir = test::NewDir("slurm-cancel") + "/run";
  {
    ScopedEnv hook(kUnitHookEnv, "1:sleep:60");
    const int pid = test::SpawnLockstep(
        {"run", AaPlan(), "--out", dir, "--no-progress", "--executor", "slurm"});
    // Wait (at most a minute) for unit 1 to sleep in its folder, then cancel its task.
    std::string job;
    for (int i = 0; i < 600 && job.empty(); ++i) {
      bool sleeping = false;
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir + "/units", ec))
        sleeping = sleeping || e.path().filename().string().rfind(".1.tmp-", 0) == 0;
      if (sleeping && Jobs(dir).count(0)) job = Jobs(dir).find(0)->second;
      if (job.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_FALSE(job.empty()) << "unit 1 never started";
    EXPECT_EQ(std::system(("scancel " + job + "_1").c_str()), 0);
    EXPECT_EQ(test::WaitChild(pid), 1);
  }
  auto a2 = test::EndOf(dir, "A2");
  EXPECT_EQ(a2.value("event", ""), "failed") << a2.dump();
  EXPECT_EQ(a2["unit"]["scheduler"]["state"], "CANCELLED") << a2.dump();
  EXPECT_EQ(test::Verdict(dir), "stopped");
  EXPECT_EQ(Events(ReadLedger(dir), "not_sent"), (std::vector<std::string>{"B"}));
  EXPECT_NE(Slurp(dir + "/report.md").find("the scheduler says CANCELLED"), std::string::npos);

  {  // unit 1's run-unit SIGKILLed (the hook) before its fragment: Slurm says FAILED 0:9
    ScopedEnv hook(kUnitHookEnv, "1:kill");
    const std::string k = RunPlan(AaPlan(), "slurm-sigkill", "--executor slurm", 1);
    auto k2 = test::EndOf(k, "A2");
    EXPECT_EQ(k2.value("event", ""), "failed") << k2.dump();
    EXPECT_EQ(k2["unit"]["scheduler"]["state"], "FAILED") << k2.dump();
    EXPECT_EQ(test::Verdict(k), "stopped");
  }

  // TIMEOUT 0:0 for unit 1, whose outputs are complete: the scheduler's State wins.
  const std::string bin = test::NewDir("fake-sacct");
  ASSERT_TRUE(WriteFileAtomic(bin + "/sacct", R"(#!/bin/sh
# sacct for a cluster without accounting: the controller's states, unit 1 TIMEOUT.
while [ $# -gt 0 ]; do [ "$1" = -j ] && job=$2; shift; done
scontrol -o show job "$job" | while read -r line; do
  t=$(echo "$line" | sed -n 's/.* ArrayTaskId=\([^ ]*\).*/\1/p')
  s=$(echo "$line" | sed -n 's/.* JobState=\([^ ]*\).*/\1/p')
  e=$(echo "$line" | sed -n 's/.* ExitCode=\([^ ]*\).*/\1/p')
  case "$t" in *-*|*,*) echo "${job}_[$t]|$s|$e"; continue ;; esac
  [ "$t" = 1 ] && [ "$s" = COMPLETED ] && s=TIMEOUT
  echo "${job}_$t|$s|$e"
done
)")
                  .ok());
  ::chmod((bin + "/sacct").c_str(), 0755);
  ScopedEnv path("PATH", bin + ":" + std::getenv("PATH"));
  const std::string to = RunPlan(AaPlan(), "slurm-timeout", "--executor slurm", 1);
  auto t2 = test::EndOf(to, "A2");
  EXPECT_EQ(t2.value("event", ""), "failed") << t2.dump();
  EXPECT_EQ(t2["unit"]["scheduler"]["state"], "TIMEOUT") << t2.dump();
  EXPECT_EQ(t2["unit"]["scheduler"]["exit_code_text"], "0:0") << t2.dump();
  EXPECT_TRUE(fs::exists(UnitDir(to, 1) + "/fragment.json"));  // it wrote good outputs
  EXPECT_EQ(test::Verdict(to), "stopped");
  EXPECT_EQ(Events(ReadLedger(to), "not_sent"), (std::vector<std::string>{"B"}));
}

// Must show 3 on Slurm: the driver SIGKILLed after recording a submission and before sbatch, and
// after sbatch while its tasks run; --resume waits for the queued job instead of sending it
// again, sends what never reached the queue, and every unit ended exactly once.
TEST_F(Slurm, KilledDriverResumesFromTheSchedulersRecords) {
  const std::string dir = test::NewDir("slurm-kill") + "/run";
  int kills = 0;
  for (int k = 0; k < 8; ++k) {
    ScopedEnv hook(kKillDriverEnv, k < 3 ? std::optional<std::string>("3") : std::nullopt);
    auto r = test::RunLockstep(k == 0 ? "run " + AaPlan() + " --out " + dir +
                                            " --no-progress --executor slurm"
                                      : "run --resume " + dir + " --no-progress");
    if (r.exit_code != 128 + SIGKILL) {
      EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
      break;
    }
    ++kills;
  }
  EXPECT_EQ(kills, 3);
  test::ExpectSameCampaign(LocalAa(), dir, {"A1", "A2", "B"});
  const auto jobs = Jobs(dir);
  int sent = 0;
  for (const auto& [wave, job] : jobs)
    if (!job.empty()) {
      ++sent;
      EXPECT_EQ(EndedTasks(job), wave == 0 ? 2 : 1) << job;
    }
  EXPECT_EQ(sent, 2) << "one sbatch per wave";
  EXPECT_GT(jobs.size(), 2u) << "a submission recorded before a kill was never sent";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Fragment(dir, i)["attempt"], 1) << i;
}

}  // namespace
}  // namespace lockstep
