// The change gate (issue 27, Must-show 1, 2 and 4): arms on named builds. No second build is made:
// the `lockstep` executable is copied to a "baseline" path (with a few bytes appended, so the two
// files have different SHA-256 digests and the ledger can tell them apart), and a code change is
// stood in for by a perturbation injected into every candidate arm's engine config.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "campaign_files.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/builds.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/ledger.h"
#include "lockstep/instrument/fingerprint.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::Events;
using test::ReadJson;
using test::ReadLedger;
using test::RunLockstep;
using test::Slurp;

const std::string kPlan = std::string(LOCKSTEP_SOURCE_DIR) + "/campaigns/gate-change.toml";
const std::string kCandidateArms[] = {"cand-A1", "cand-A2", "change"};

// The "baseline build": a copy of this build's executable with bytes appended after the ELF
// image (it runs the same; its SHA-256 differs).
const std::string& BaselineCopy() {
  static const std::string path = [] {
    const std::string p = test::NewDir("change-builds") + "/baseline-lockstep";
    fs::copy_file(LOCKSTEP_BIN_PATH, p);
    std::ofstream(p, std::ios::app | std::ios::binary) << "\nbaseline copy\n";
    ::chmod(p.c_str(), 0755);
    return p;
  }();
  return path;
}

// gate-change.toml with `edit` applied: engine lines added to the named arms (after their
// `name = ...` line, as an [arm.engine] table) and `extra` lines into [gates] / [engine].
struct PlanEdit {
  std::vector<std::string> arms;  // which arms get `arm_engine`
  std::string arm_engine;         // e.g. inject = ["perturb:..."]
  std::string gates;              // appended to [gates]
  std::string engine;             // appended to [engine]
};

std::string EditedPlan(const PlanEdit& e) {
  std::string s = Slurp(kPlan);
  EXPECT_FALSE(s.empty());
  for (const std::string& arm : e.arms) {
    const auto at = s.find("name = \"" + arm + "\"");
    EXPECT_NE(at, std::string::npos) << arm;
    const auto next = s.find("\n[[", at);
    s.insert(next == std::string::npos ? s.size() : next, "\n[arm.engine]\n" + e.arm_engine + "\n");
  }
  auto append_to = [&s](const std::string& table, const std::string& lines) {
    if (lines.empty()) return;
    const auto at = s.find("\n" + table + "\n");
    ASSERT_NE(at, std::string::npos) << table;
    s.insert(at + table.size() + 2, lines + "\n");
  };
  append_to("[gates]", e.gates);
  append_to("[engine]", e.engine);
  // The plan lives in the test's folder: its [builds] defaults do not exist there, so every run
  // names both builds on the command line.
  const std::string path = test::NewDir("change-plan") + "/gate-change.toml";
  EXPECT_TRUE(WriteFileAtomic(path, s).ok());
  return path;
}

std::string BuildFlags() {
  return " --build baseline=" + BaselineCopy() + " --build candidate=" + LOCKSTEP_BIN_PATH;
}

std::string RunGate(const std::string& plan, int expect_exit, const std::string& extra = "") {
  const std::string dir = test::NewDir("change-run") + "/run";
  auto r = RunLockstep("gate " + plan + " --out " + dir + " --no-progress" + BuildFlags() + extra);
  EXPECT_EQ(r.exit_code, expect_exit) << r.out << r.err;
  return dir;
}

std::string ExportExecutable(const std::string& dir, const std::string& arm) {
  auto r = ExportReader::Open(dir + "/arms/" + arm + "/export.h5");
  EXPECT_TRUE(r.ok()) << arm << ": " << r.status().message();
  return r.ok() ? (*r)->meta().executable_sha256 : std::string();
}

// Must-show 1: no change passes; both digests are in the ledger, and each arm's export was
// written by the build the ledger says it ran on.
TEST(ChangeGate, IdenticalBehaviourPassesAndRecordsBothDigests) {
  const std::string dir = RunGate(kPlan, 0, " --json " + test::NewDir("change-json") + "/s.json");
  auto base_sha = Sha256File(BaselineCopy());
  auto cand_sha = Sha256File(LOCKSTEP_BIN_PATH);
  ASSERT_TRUE(base_sha.ok() && cand_sha.ok());
  ASSERT_NE(*base_sha, *cand_sha);
  const auto es = ReadLedger(dir);
  ASSERT_FALSE(es.empty());
  const json& builds = es.front().data["builds"];
  EXPECT_EQ(builds["baseline"]["sha256"], *base_sha) << builds.dump();
  EXPECT_EQ(builds["candidate"]["sha256"], *cand_sha) << builds.dump();
  EXPECT_EQ(builds["baseline"]["export_schema"], ThisExportSchema());
  EXPECT_EQ(builds["baseline"]["version"].get<std::string>().rfind("lockstep ", 0), 0u);
  EXPECT_EQ(es.front().data["arm_builds"]["change"], "candidate");
  EXPECT_EQ(es.front().data["arm_builds"]["control"], "baseline");
  int sent = 0;
  for (const auto& e : es) {
    if (e.event != "sent") continue;
    ++sent;
    const bool cand = std::find(std::begin(kCandidateArms), std::end(kCandidateArms), e.arm) !=
                      std::end(kCandidateArms);
    EXPECT_EQ(e.data["build"], cand ? "candidate" : "baseline") << e.arm;
    EXPECT_EQ(e.data["executable_sha256"], cand ? *cand_sha : *base_sha) << e.arm;
    // The export's own fingerprint: the arm really ran on that file.
    EXPECT_EQ(ExportExecutable(dir, e.arm), cand ? *cand_sha : *base_sha) << e.arm;
  }
  EXPECT_EQ(sent, 6);  // two A/As, the change, the positive control
  const std::string md = Slurp(dir + "/report.md");
  for (const std::string& line :
       {std::string("> **PASS**"),
        std::string("> - Change (change vs base-A1, build candidate against baseline): no compared "
                    "item differs in any bit"),
        std::string("## Change against the baseline"),
        "- Builds: `baseline` = " + builds["baseline"]["version"].get<std::string>(),
        "SHA-256 " + base_sha->substr(0, 12) + " (arms base-A1, base-A2, control)",
        "SHA-256 " + cand_sha->substr(0, 12) + " (arms cand-A1, cand-A2, change)"})
    EXPECT_NE(md.find(line), std::string::npos) << "missing: " << line << "\n" << md;
  EXPECT_EQ(md.find(BaselineCopy()), std::string::npos) << "the report publishes no paths";
  const json rec = ReadJson(dir + "/compare/change.json");
  EXPECT_EQ(rec["builds"]["a"]["sha256"], *base_sha);
  EXPECT_EQ(rec["builds"]["b"]["sha256"], *cand_sha);
}

// Must-show 1: a perturbed candidate fails, and the report names the perturbed item first.
TEST(ChangeGate, PerturbedCandidateFailsNamingThePerturbedItemFirst) {
  PlanEdit e;
  e.arms = {std::begin(kCandidateArms), std::end(kCandidateArms)};
  e.arm_engine = "inject = [\"perturb:layer=5:item=ssm_state:eps=1e-2:window=1\"]";
  const std::string dir = RunGate(EditedPlan(e), 1);
  const auto es = ReadLedger(dir);
  EXPECT_TRUE(Events(es, "stopped").empty()) << "the change's own failure is the answer";
  const json rec = ReadJson(dir + "/compare/change.json");
  EXPECT_FALSE(rec["comparison"]["passed"].get<bool>());
  const json& ff = rec["report"]["state"]["first_failure"];
  EXPECT_EQ(ff["checkpoint"], "00001_commit") << ff.dump();
  EXPECT_EQ(ff["layer"], 5);
  EXPECT_EQ(ff["kind"], "ssm_state");
  for (const char* aa : {"base-A2", "cand-A2"})
    EXPECT_TRUE(ReadJson(dir + "/compare/" + aa + ".json")["comparison"]["passed"].get<bool>())
        << aa;
  const std::string md = Slurp(dir + "/report.md");
  for (const std::string& line :
       {std::string("> **FAIL**: Change vs base-A1 failed its gates."),
        std::string("> - Change (change vs base-A1, build candidate against baseline): first "
                    "changed item: window 1, checkpoint 00001_commit, stage 2, layer 5, item "
                    "ssm_state: NRMSE 1.0e-02, KL n/a (not logits; the first changed logits, at "),
        std::string("- Changed item kinds (items): ssm_state ("), std::string("logits (")})
    EXPECT_NE(md.find(line), std::string::npos) << "missing: " << line << "\n" << md;
}

// Must-show 1: `exact = true` passes bitwise without a change, and fails a change the default
// thresholds let through.
TEST(ChangeGate, ExactAsksForBitwiseEquality) {
  PlanEdit exact;
  exact.gates = "exact = true";
  const std::string dir = RunGate(EditedPlan(exact), 0);
  const json rec = ReadJson(dir + "/compare/change.json");
  bool seen = false;
  for (const auto& g : rec["comparison"]["gates"])
    if (g["name"] == "state bitwise equal") {
      seen = true;
      EXPECT_TRUE(g["passed"].get<bool>());
    }
  EXPECT_TRUE(seen) << rec["comparison"].dump();

  PlanEdit tiny = exact;
  tiny.arms = {std::begin(kCandidateArms), std::end(kCandidateArms)};
  tiny.arm_engine = "inject = [\"perturb:layer=5:item=ssm_state:eps=1e-6:window=1\"]";
  const std::string failed = RunGate(EditedPlan(tiny), 1);
  const json change = ReadJson(failed + "/compare/change.json");
  EXPECT_FALSE(change["comparison"]["passed"].get<bool>());
  EXPECT_TRUE(change["report"]["state"]["first_failure"].is_null())
      << "within the thresholds: only the exact gate sees it";
  tiny.gates.clear();
  RunGate(EditedPlan(tiny), 0);  // the same change under the default thresholds passes
}

// Must-show 2: an unstable A/A on either build stops the gate before the cross-build comparison,
// and the report says which rule stopped it and that no attribution was made.
TEST(ChangeGate, UnstableAaOnEitherBuildStopsBeforeTheComparison) {
  for (const std::string unstable : {"base-A2", "cand-A2"}) {
    SCOPED_TRACE(unstable);
    PlanEdit e;
    e.engine = "max_new = 48";  // room for the latency policy to pause and the path to differ
    e.arms = {unstable};
    e.arm_engine = "inject = [\"delay:stage=2:window=4:ms=120\"]";
    std::string plan = Slurp(EditedPlan(e));
    plan.replace(plan.find("draft_policy = \"adaptive\""), 25, "draft_policy = \"latency\" ");
    plan.erase(plan.find("max_new = 16\n"), 13);
    const std::string path = test::NewDir("change-plan") + "/gate-change.toml";
    ASSERT_TRUE(WriteFileAtomic(path, plan).ok());
    const std::string dir = RunGate(path, 1);
    const auto es = ReadLedger(dir);
    const auto sent = Events(es, "sent");
    EXPECT_EQ(std::find(sent.begin(), sent.end(), "change"), sent.end());
    const auto not_sent = Events(es, "not_sent");
    EXPECT_NE(std::find(not_sent.begin(), not_sent.end(), "change"), not_sent.end());
    ASSERT_EQ(Events(es, "stopped").size(), 1u);
    for (const auto& s : es)
      if (s.event == "stopped") {
        EXPECT_EQ(s.data["rule"], "unstable_aa");
      }
    EXPECT_FALSE(fs::exists(dir + "/compare/change.json"));
    const std::string md = Slurp(dir + "/report.md");
    for (const std::string& line :
         {std::string("> **STOPPED**"),
          std::string("> - No attribution (change vs base-A1, build candidate against baseline): "
                      "the comparison was not made (the campaign stopped first)."),
          std::string("> - Stopped by rule 'unstable_aa'"),
          std::string("\"unstable A/A => no attribution: the gate cannot say what the change "
                      "did\"")})
      EXPECT_NE(md.find(line), std::string::npos) << "missing: " << line << "\n" << md;
  }
}

// Issue 35: a candidate whose injection never fires makes both candidate arms exit 2 after they
// wrote their outputs. They are failed arms (ledger `failed`, predicate arm_failed), so the stop
// rule fires: STOPPED, never a FAIL attributed to the change.
TEST(ChangeGate, CandidateArmsThatExitTwoStopTheGate) {
  PlanEdit e;
  e.arms = {"cand-A1", "cand-A2"};
  e.arm_engine = "inject = [\"delay:stage=1:window=15:ms=1\"]";
  const std::string dir = RunGate(EditedPlan(e), 1);
  const auto es = ReadLedger(dir);
  EXPECT_EQ(Events(es, "failed"), (std::vector<std::string>{"cand-A1", "cand-A2"}));
  bool arm_failed = false;
  for (const auto& s : es)
    if (s.event == "compared" && s.arm == "cand-A2")
      arm_failed = s.data["predicates"]["arm_failed"].get<bool>();
  EXPECT_TRUE(arm_failed);
  ASSERT_FALSE(es.empty());
  EXPECT_EQ(es.back().data["verdict"], "stopped");
  const auto not_sent = Events(es, "not_sent");
  EXPECT_NE(std::find(not_sent.begin(), not_sent.end(), "change"), not_sent.end());
}

void WriteScript(const std::string& path, const std::string& body) {
  ASSERT_TRUE(WriteFileAtomic(path, "#!/bin/sh\n" + body).ok());
  ::chmod(path.c_str(), 0755);
}

// Must-show 4: a build that cannot run this plan is exit 2 with the reason, before anything runs
// (no run folder appears).
TEST(ChangeGate, RefusesBadBuildsBeforeAnyArmRuns) {
  const std::string d = test::NewDir("change-bad");
  const std::string noexec = d + "/noexec";
  fs::copy_file(LOCKSTEP_BIN_PATH, noexec);
  ::chmod(noexec.c_str(), 0644);
  WriteScript(d + "/schema2", "echo 'lockstep 9.0.0'\necho 'export schema: lockstep.export v2'\n");
  WriteScript(d + "/noschema", "echo 'lockstep 0.0.1'\necho 'commit: 123'\n");
  WriteScript(d + "/other", "echo 'python 3.11'\n");
  WriteScript(d + "/fails", "exit 4\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {d + "/missing", "does not exist"},
      {noexec, "is not executable"},
      {d, "is a folder, not an executable"},
      {d + "/schema2",
       "export schema 'lockstep.export v2' differs from this build's 'lockstep.export v1'"},
      {d + "/noschema", "prints no 'export schema:' line"},
      {d + "/other", "not a lockstep build"},
      {d + "/fails", "'--version' exited 4"}};
  for (const auto& [path, reason] : cases) {
    for (const char* which : {"baseline", "candidate"}) {
      const std::string out = d + "/run-" + fs::path(path).filename().string() + "-" + which;
      const bool base = std::string(which) == "baseline";
      auto r = RunLockstep("gate " + kPlan + " --out " + out +
                           " --no-progress --build baseline=" + (base ? path : BaselineCopy()) +
                           " --build candidate=" + (base ? LOCKSTEP_BIN_PATH : path));
      EXPECT_EQ(r.exit_code, 2) << path << "\n" << r.out << r.err;
      EXPECT_NE(r.err.find("build '" + std::string(which) + "'"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(reason), std::string::npos) << r.err;
      EXPECT_FALSE(fs::exists(out)) << "nothing may run for a refused build: " << out;
    }
  }
  // `lockstep run` takes --build too; an undeclared name, or a plan whose default path is
  // missing (no --build given), is refused the same way.
  auto r = RunLockstep("run " + kPlan + " --out " + d +
                       "/run-undeclared --build base=" + BaselineCopy());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("the plan declares no build 'base' ([builds]: baseline, candidate)"),
            std::string::npos)
      << r.err;
  const std::string plan = EditedPlan({});  // its [builds] paths do not exist in its folder
  r = RunLockstep("run " + plan + " --out " + d +
                  "/run-default --build candidate=" + std::string(LOCKSTEP_BIN_PATH));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("build 'baseline' ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d + "/run-default"));
}

// The probe's deadline: a build that never answers --version is refused, not waited for.
TEST(ChangeGate, ProbeIsBoundedInTime) {
  const std::string hang = test::NewDir("change-hang") + "/hang";
  WriteScript(hang, "exec sleep 30\n");
  const auto t0 = std::chrono::steady_clock::now();
  auto b = ProbeBuild("baseline", hang, 0.5);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().exit_code(), 2);
  EXPECT_NE(b.status().message().find("did not answer within 0.5 s"), std::string::npos)
      << b.status().message();
  EXPECT_LT(s, 5.0);
}

// A resumed change gate keeps its recorded builds: --build is refused, and so is a build file
// replaced since the campaign started.
TEST(ChangeGate, ResumeKeepsTheRecordedBuilds) {
  const std::string dir = RunGate(kPlan, 0);
  auto r = RunLockstep("run --resume " + dir + BuildFlags());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--build applies to a new run only"), std::string::npos) << r.err;
  r = RunLockstep("run --resume " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;  // complete: the report is rendered again
}

// Plan errors of the keys this issue adds are exit 2 at parse time, with the line.
TEST(ChangeGate, PlanKeysAreChecked) {
  const std::string text = Slurp(kPlan);
  const std::string campaigns = std::string(LOCKSTEP_SOURCE_DIR) + "/campaigns";
  auto parse = [&](const std::string& t) { return ParseCampaign(t, "p.toml", campaigns); };
  ASSERT_TRUE(parse(text).ok()) << parse(text).status().message();
  auto c = parse(text);
  EXPECT_EQ(c->builds.at("baseline"),
            (fs::path(LOCKSTEP_SOURCE_DIR) / "build-main/harness/lockstep").lexically_normal());
  EXPECT_EQ(c->builds.at("candidate"),
            (fs::path(LOCKSTEP_SOURCE_DIR) / "build/harness/lockstep").lexically_normal());
  EXPECT_EQ(c->arms.back().name, "control");
  EXPECT_EQ(c->arms.back().build, "baseline");
  auto expect_error = [&](std::string t, const std::string& from, const std::string& to,
                          const std::string& msg) {
    t.replace(t.find(from), from.size(), to);
    auto r = parse(t);
    ASSERT_FALSE(r.ok()) << to;
    EXPECT_EQ(r.status().exit_code(), 2);
    EXPECT_NE(r.status().message().find(msg), std::string::npos) << r.status().message();
  };
  expect_error(text, "build = \"candidate\"\nbaseline = \"cand-A1\"",
               "build = \"pr\"\nbaseline = \"cand-A1\"",
               "arm 'cand-A2': build 'pr' is not declared in [builds] (baseline, candidate)");
  expect_error(text, "arms = [\"base-A2\", \"cand-A2\"]", "arms = [\"base-A1\"]",
               "'arms' names 'base-A1', which is not an arm with a baseline");
  expect_error(text, "state = true", "state = false\nexact = true", "set state = true");
  expect_error(text, "[builds] ", "[builds]\nself = \"x\"\n#", "build name 'self' is taken");
}

}  // namespace
}  // namespace lockstep
