// Campaign units without a scheduler (issue 41, Must show 2-6): `--executor units` equals the
// local runner; run-unit again is a no-op and damaged outputs run again; failed and killed units
// are failed arms the stop rules act on; the driver killed at many points resumes without running
// a unit twice; two hosts are flagged and same_host_as is checked; abba and seeded random order;
// the Slurm state parsers.
#include "units_test.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "lockstep/harness/campaign.h"
#include "lockstep/harness/units_executor.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using test::AaPlan;
using test::AbbaPlan;
using test::Events;
using test::Fragment;
using test::LocalAa;
using test::LocalAbba;
using test::ReadJson;
using test::ReadLedger;
using test::RunLockstep;
using test::RunPlan;
using test::ScopedEnv;
using test::Slurp;

// The (arm#repeat) of the timing arms' sends, in ledger order.
std::vector<std::string> TimingSends(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : ReadLedger(dir))
    if (e.event == "sent" && (e.arm == "T1" || e.arm == "T2"))
      out.push_back(e.arm + "#" + std::to_string(e.data.value("repeat", 0)));
  return out;
}

// Must show 1 without a scheduler: the units executor gives the local run's verdict, decisions,
// comparisons and per-item state digests; every unit ran once, on this host.
TEST(Units, ExecutorUnitsEqualsLocal) {
  const std::string units = RunPlan(AaPlan(), "aa-units", "--executor units", 0);
  test::ExpectSameCampaign(LocalAa(), units, {"A1", "A2", "B"});
  const auto uj = ReadJson(units + "/units.json");
  ASSERT_EQ(uj["units"].size(), 3u);
  EXPECT_EQ(uj["waves"], 2);
  EXPECT_EQ(uj["units"][2]["arm"], "B");
  EXPECT_EQ(uj["units"][2]["wave"], 1);
  EXPECT_EQ(uj["units"][2]["depends_on"], (nlohmann::json{0, 1}));
  for (int i = 0; i < 3; ++i) {
    const auto f = Fragment(units, i);
    EXPECT_EQ(f["attempt"], 1) << i;
    EXPECT_NE(f["host"]["cpu_model"], "") << i;
    EXPECT_EQ(test::EndOf(units, f["arm"])["unit"]["index"], i);
  }
  for (const auto& e : ReadLedger(units))
    if (e.event == "compared") {
      EXPECT_EQ(e.data["hosts"]["same"], true) << e.arm;
      EXPECT_EQ(e.data["hosts"]["note"], "") << e.arm;
    }
}

// Must show 4: a finished unit run again changes nothing; damaged outputs are not trusted by merge
// and run again as attempt 2; a retry after a failed attempt says whether its result differs.
TEST(Units, RunUnitAgainIsANoOpAndDamagedOutputsRunAgain) {
  const std::string dir = test::NewDir("requeue") + "/run";
  ASSERT_EQ(RunLockstep("plan expand " + AaPlan() + " --out " + dir).exit_code, 0);
  EXPECT_EQ(RunLockstep("plan expand " + AaPlan() + " --wave 0 --count").out, "2\n");
  EXPECT_EQ(RunLockstep("plan expand " + AaPlan() + " --wave 1 --count").out, "1\n");
  auto r0 = RunLockstep("run-unit " + dir + " --index 0");
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  const std::string frag = UnitDir(dir, 0) + "/fragment.json";
  const std::string before = Slurp(frag);
  const auto mtime = fs::last_write_time(frag);
  auto again = RunLockstep("run-unit " + dir + " --index 0");
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("already finished (attempt 1"), std::string::npos) << again.out;
  EXPECT_EQ(Slurp(frag), before);
  EXPECT_EQ(fs::last_write_time(frag), mtime);
  EXPECT_FALSE(fs::exists(UnitDir(dir, 0) + ".attempt-1"));

  {  // unit 1 fails (the hook's unknown flag), then runs again from $VAR: its result differs
    ScopedEnv hook(kUnitHookEnv, "1:fail");
    EXPECT_EQ(RunLockstep("run-unit " + dir + " --index 1").exit_code, 3);
  }
  ScopedEnv idx("LOCKSTEP_TEST_UNIT_INDEX", "1");
  auto r1 = RunLockstep("run-unit " + dir + " --index-env LOCKSTEP_TEST_UNIT_INDEX");
  EXPECT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  EXPECT_NE(r1.out.find("differs from attempt 1's"), std::string::npos) << r1.out;
  const auto f1 = Fragment(dir, 1);
  EXPECT_EQ(f1["attempt"], 2);
  EXPECT_EQ(f1["retry_differs"]["differs"], true);
  EXPECT_EQ(f1["previous"][0]["exit_code"], 2);

  // Damage unit 0's export after it finished: merge refuses it and names it to run again.
  const std::string h5 = UnitDir(dir, 0) + "/export.h5";
  {
    std::fstream f(h5, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(h5) / 2));
    f.put('\x5a');
  }
  auto m = RunLockstep("merge " + dir);
  EXPECT_EQ(m.exit_code, kMergePending) << m.out << m.err;
  EXPECT_NE(m.out.find("export.h5 changed since the unit finished"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("next: wave 0, units 0 "), std::string::npos) << m.out;
  auto redo = RunLockstep("run-unit " + dir + " --index 0");
  EXPECT_EQ(redo.exit_code, 0) << redo.out << redo.err;
  const auto f0 = Fragment(dir, 0);
  EXPECT_EQ(f0["attempt"], 2);
  EXPECT_TRUE(fs::exists(UnitDir(dir, 0) + ".attempt-1"));
  auto m2 = RunLockstep("merge " + dir);
  EXPECT_EQ(m2.exit_code, kMergePending) << m2.out << m2.err;
  EXPECT_NE(m2.out.find("next: wave 1, units 2 "), std::string::npos) << m2.out;
}

// Must show 2 without a scheduler: a unit whose process failed, and one whose run-unit was
// SIGKILLed before its fragment, are failed arms (never a pass), and the stop rule acts on them as
// on a failed local arm (A2's injection that never fires: exit 2 after its outputs).
TEST(Units, FailedAndKilledUnitsStopTheCampaignAsAFailedLocalArm) {
  const std::string plan = test::WriteUnitsPlan(
      "a2-fails", test::UnitsPlan("[arm.engine]\ninject = [\"delay:stage=1:window=7:ms=1\"]\n"));
  const std::string local = RunPlan(plan, "fail-local", "", 1);
  ASSERT_EQ(test::EndOf(local, "A2").value("event", ""), "failed");
  for (const char* hook : {"1:fail", "1:kill"}) {
    ScopedEnv env(kUnitHookEnv, hook);
    const std::string units =
        RunPlan(AaPlan(), std::string("fail-units-") + (hook + 2), "--executor units", 1);
    EXPECT_EQ(test::Verdict(units), test::Verdict(local)) << hook;
    EXPECT_EQ(test::Verdict(units), "stopped") << hook;
    const auto a2 = test::EndOf(units, "A2");
    EXPECT_EQ(a2.value("event", ""), "failed") << hook << a2.dump();
    const auto lu = ReadLedger(units), ll = ReadLedger(local);
    EXPECT_EQ(Events(lu, "not_sent"), Events(ll, "not_sent")) << hook;
    EXPECT_EQ(Events(lu, "stopped"), Events(ll, "stopped")) << hook;
    EXPECT_EQ(Events(lu, "failed"), (std::vector<std::string>{"A2"})) << hook;
    EXPECT_NE(Slurp(units + "/report.md").find("**STOPPED**"), std::string::npos) << hook;
  }
}

// Must show 3: the units driver SIGKILLed at each of its steps in turn (after a merge, after a
// unit) resumes to the local run's verdict and decisions, and no unit ever ran twice.
TEST(Units, KilledDriverResumesWithoutRunningAUnitTwice) {
  const std::string dir = test::NewDir("kill-driver") + "/run";
  int kills = 0, resumes = 0;
  for (int k = 0; k < 40; ++k) {
    // 2: killed after its first merge; 3: after the merge and one unit.
    ScopedEnv hook(kKillDriverEnv, std::to_string(2 + k % 2));
    const bool fresh = !fs::exists(dir + "/units.json");
    auto r = RunLockstep(fresh ? "run " + AbbaPlan() + " --out " + dir +
                                     " --no-progress --executor units"
                               : "run --resume " + dir + " --no-progress");
    resumes += fresh ? 0 : 1;
    if (r.exit_code != 128 + SIGKILL) {
      EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
      break;
    }
    ++kills;
  }
  EXPECT_GE(kills, 10);
  EXPECT_GT(resumes, kills - 1);
  auto last = RunLockstep("run --resume " + dir + " --no-progress");
  EXPECT_EQ(last.exit_code, 0) << last.out << last.err;
  EXPECT_EQ(test::Verdict(dir), test::Verdict(LocalAbba()));
  auto strip_timing = [](std::vector<std::string> d) {
    for (std::string& line : d)
      if (line.rfind("compared T2 ", 0) == 0) {
        auto j = nlohmann::json::parse(line.substr(12));
        j.erase("timing");
        line = "compared T2 " + j.dump();
      }
    return d;
  };
  EXPECT_EQ(strip_timing(test::DecisionDigest(dir)),
            strip_timing(test::DecisionDigest(LocalAbba())));
  const auto units = ReadJson(dir + "/units.json")["units"];
  ASSERT_EQ(units.size(), 7u);
  for (std::size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(Fragment(dir, static_cast<int>(i))["attempt"], 1) << "unit " << i << " ran twice";
    EXPECT_FALSE(fs::exists(UnitDir(dir, static_cast<int>(i)) + ".attempt-1")) << i;
  }
  std::set<std::pair<std::string, int>> finished;
  for (const auto& e : ReadLedger(dir)) {
    const auto key = std::make_pair(e.arm, e.data.value("repeat", 0));
    if (e.event == "sent") {
      EXPECT_FALSE(finished.count(key)) << e.arm << " sent after it finished";
    }
    if (e.event == "finished" || e.event == "failed") finished.insert(key);
  }
  EXPECT_EQ(TimingSends(dir), (std::vector<std::string>{"T1#0", "T2#0", "T2#1", "T1#1"}));
}

// Must show 5: A2's unit on a second (faked) host is flagged in the A/A comparison, and its
// same_host_as = "A1" is checked, not trusted: a failed placement gate. No hostname in reports.
TEST(Units, SecondHostIsFlaggedAndSameHostAsIsChecked) {
  const std::string plan =
      test::WriteUnitsPlan("same-host", test::UnitsPlan("same_host_as = \"A1\"\n"));
  const std::string dir = test::NewDir("hosts") + "/run";
  ASSERT_EQ(RunLockstep("plan expand " + plan + " --out " + dir).exit_code, 0);
  EXPECT_EQ(ReadJson(dir + "/units.json")["units"][1]["same_host_as"], "A1");
  ASSERT_EQ(RunLockstep("run-unit " + dir + " --index 0").exit_code, 0);
  {
    ScopedEnv fake(kFakeHostEnv, "lockstep-second-node");
    ASSERT_EQ(RunLockstep("run-unit " + dir + " --index 1").exit_code, 0);
  }
  EXPECT_NE(Fragment(dir, 0)["host_sha256"], Fragment(dir, 1)["host_sha256"]);
  // Each unit's export carries the host it ran on (root attribute `host`), as its fragment does.
  for (int i = 0; i < 2; ++i) {
    auto r = ExportReader::Open(UnitDir(dir, i) + "/export.h5");
    ASSERT_TRUE(r.ok()) << r.status().message();
    const auto host = nlohmann::json::parse((*r)->meta().host, nullptr, false);
    EXPECT_EQ(host, Fragment(dir, i)["host"]) << "unit " << i;
  }
  auto m = RunLockstep("merge " + dir);
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;  // A2's comparison failed: B is not sent
  nlohmann::json a2;
  for (const auto& e : ReadLedger(dir))
    if (e.event == "compared" && e.arm == "A2") a2 = e.data;
  ASSERT_TRUE(a2.is_object());
  EXPECT_EQ(a2["hosts"]["same"], false);
  const std::string note = a2["hosts"]["note"];
  EXPECT_NE(note.find("A1 on host "), std::string::npos) << note;
  EXPECT_NE(note.find("this A/A also measures host differences"), std::string::npos) << note;
  bool placement = false;
  for (const auto& g : a2["gates"])
    if (g["name"] == "placement") {
      placement = true;
      EXPECT_EQ(g["passed"], false);
      EXPECT_NE(g["message"].get<std::string>().find("A2 asked for the host of A1"),
                std::string::npos)
          << g.dump();
    }
  EXPECT_TRUE(placement) << a2.dump();
  const std::string md = Slurp(dir + "/report.md");
  EXPECT_NE(md.find("**hosts differ**"), std::string::npos) << md;
  EXPECT_NE(md.find("**placement violated**"), std::string::npos) << md;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  for (const std::string& doc : {md, Slurp(dir + "/report.html")}) {
    EXPECT_EQ(doc.find("lockstep-second-node"), std::string::npos);
    if (std::string(host).size() > 3) {
      EXPECT_EQ(doc.find(host), std::string::npos) << host;
    }
  }
}

// Must show 6: abba sends the timing arms' repeats T1 T2 T2 T1, recorded in the ledger and stated
// in the report; random is the same for a seed and differs between seeds.
TEST(Units, AbbaOrderInTheLedgerAndSeededRandomOrder) {
  const std::string& dir = LocalAbba();
  EXPECT_EQ(TimingSends(dir), (std::vector<std::string>{"T1#0", "T2#0", "T2#1", "T1#1"}));
  const auto es = ReadLedger(dir);
  ASSERT_FALSE(es.empty());
  EXPECT_EQ(es.front().data.value("order", ""), "abba");
  EXPECT_NE(Slurp(dir + "/report.md").find("ran in `abba` order: T1#0 T2#0 T2#1 T1#1"),
            std::string::npos);

  auto order = [](std::uint64_t seed) {
    const std::string text = test::UnitsPlan(
        "",
        "[[arm]]\nname = \"T1\"\nmode = \"timing\"\nrepeat = 4\nrequire = [\"aa_stable\"]\n"
        "[[arm]]\nname = \"T2\"\nmode = \"timing\"\nrepeat = 4\nbaseline = \"T1\"\n"
        "require = [\"aa_stable\"]\n",
        "order = \"random\"\norder_seed = " + std::to_string(seed) + "\n");
    auto c = ParseCampaign(text, "random.toml", ".");
    EXPECT_TRUE(c.ok()) << c.status().message();
    std::vector<std::string> seq;
    if (!c.ok()) return seq;
    for (const Unit& u : ExpandUnits(*c))
      if (u.wave == 1 && u.arm != "B") seq.push_back(u.arm + "#" + std::to_string(u.repeat));
    return seq;
  };
  const auto s1 = order(11);
  ASSERT_EQ(s1.size(), 8u);
  EXPECT_EQ(order(11), s1);
  std::set<std::vector<std::string>> seen{s1};
  for (std::uint64_t seed = 12; seed < 16; ++seed) seen.insert(order(seed));
  EXPECT_GT(seen.size(), 2u) << "the seed does not change the order";
  // Each arm's repeats are numbered in the order they are sent.
  std::map<std::string, int> next;
  for (const std::string& s : s1) {
    const std::string arm = s.substr(0, 2);
    EXPECT_EQ(s, arm + "#" + std::to_string(next[arm]++));
  }
}

// Must show 2's parsers: only COMPLETED with ExitCode 0:0 is a success; CANCELLED, TIMEOUT,
// NODE_FAIL, OUT_OF_MEMORY, PREEMPTED with 0:0 (vLLM's false green) and a non-zero exit are not.
TEST(Units, SlurmStatesAndExitCodesNeverGiveAFalseGreen) {
  const auto sa = ParseSacct(
      "77_0|COMPLETED|0:0\n77_1|CANCELLED by 0|0:0\n77_2|TIMEOUT|0:0\n77_3|NODE_FAIL|0:0\n"
      "77_4|OUT_OF_MEMORY|0:125\n77_5|PREEMPTED|0:0\n77_6|COMPLETED|1:0\n77_7|FAILED|2:0\n"
      "77_[8-9]|PENDING|0:0\n78_0|COMPLETED|0:0\n77_10|RUNNING|0:0\r\n",
      "77");
  ASSERT_EQ(sa.size(), 9u);
  for (const auto& t : sa) EXPECT_EQ(SlurmTaskSucceeded(t), t.index == 0) << t.index << t.state;
  EXPECT_EQ(sa[1].state, "CANCELLED");
  EXPECT_EQ(sa[8].index, 10);
  EXPECT_EQ(sa[8].exit_code, "0:0");
  EXPECT_FALSE(SlurmStateFinal(sa[8].state));
  for (const auto& t : sa)
    if (t.index < 8) {
      EXPECT_TRUE(SlurmStateFinal(t.state)) << t.state;
    }

  const auto sc = ParseScontrol(
      "JobId=80 ArrayJobId=79 ArrayTaskId=1 JobName=x JobState=TIMEOUT Reason=TimeLimit "
      "ExitCode=0:0 RunTime=00:01:00\n"
      "JobId=79 ArrayJobId=79 ArrayTaskId=2-3,5%2 JobState=PENDING ExitCode=0:0\n"
      "JobId=81 ArrayJobId=79 ArrayTaskId=0 JobState=COMPLETED ExitCode=0:0\n"
      "JobId=82 ArrayJobId=79 ArrayTaskId=4 JobState=PREEMPTED ExitCode=0:0\n");
  std::map<int, std::string> states;
  for (const auto& t : sc) states[t.index] = t.state;
  EXPECT_EQ(states, (std::map<int, std::string>{{0, "COMPLETED"},
                                                {1, "TIMEOUT"},
                                                {2, "PENDING"},
                                                {3, "PENDING"},
                                                {4, "PREEMPTED"},
                                                {5, "PENDING"}}));
  for (const auto& t : sc) EXPECT_EQ(SlurmTaskSucceeded(t), t.index == 0) << t.index;
  EXPECT_EQ(IndexRanges({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

}  // namespace
}  // namespace lockstep
