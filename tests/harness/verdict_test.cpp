// A campaign cannot pass on what it did not check (issue 35): the one verdict rule
// (lockstep/harness/verdict.h) at load time, at run time, and for the commands around it.
// Must show 1: each reported case as a test; Must show 2: a table of plan mutations, none of
// which gives exit 0 with PASS unless the rule holds, each saying why.
#include "lockstep/harness/verdict.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "campaign_files.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/ledger.h"
#include "serve_http/serve_process.h"
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

// ---- the runtime rule, on comparison records ----

ComparisonResult Pair(const std::string& arm, bool passed, CheckedCounts checked) {
  ComparisonResult r;
  r.arm = arm;
  r.baseline = "A1";
  r.passed = passed;
  r.checked = checked;
  return r;
}

Campaign TwoArms(bool control) {
  Campaign c;
  ArmSpec a1, a2;
  a1.name = "A1";
  a2.name = "A2";
  a2.baseline = "A1";
  c.arms = {a1, a2};
  if (control) {
    ArmSpec ctl;
    ctl.name = "control";
    ctl.baseline = "A1";
    ctl.control = true;
    c.arms.push_back(ctl);
    c.control = "perturb:layer=3:item=k:eps=1e-2:window=1";
  }
  return c;
}

TEST(CampaignVerdict, PassNeedsAComparisonThatComparedSomething) {
  const Campaign c = TwoArms(false);
  std::map<std::string, ComparisonResult> m;
  EXPECT_STREQ(CampaignOutcomeName(DecideCampaignVerdict(c, m, false).outcome), "not_checked")
      << "nothing compared";
  m["A2"] = Pair("A2", true, {});
  const CampaignDecision zero = DecideCampaignVerdict(c, m, false);
  EXPECT_STREQ(CampaignOutcomeName(zero.outcome), "not_checked");
  EXPECT_NE(zero.reason.find("A2 vs A1 compared nothing"), std::string::npos) << zero.reason;
  for (const CheckedCounts n :
       {CheckedCounts{1, 0, 0}, CheckedCounts{0, 1, 0}, CheckedCounts{0, 0, 1}}) {
    m["A2"] = Pair("A2", true, n);
    EXPECT_STREQ(CampaignOutcomeName(DecideCampaignVerdict(c, m, false).outcome), "pass");
  }
  m["A2"] = Pair("A2", false, {0, 186, 0});
  EXPECT_STREQ(CampaignOutcomeName(DecideCampaignVerdict(c, m, false).outcome), "fail");
  EXPECT_STREQ(CampaignOutcomeName(DecideCampaignVerdict(c, m, true).outcome), "stopped");
}

TEST(CampaignVerdict, AControlCountsAsCaughtOnlyOnACompardQuantity) {
  const Campaign c = TwoArms(true);
  std::map<std::string, ComparisonResult> m;
  m["A2"] = Pair("A2", true, {16, 186, 6});
  EXPECT_STREQ(CampaignOutcomeName(DecideCampaignVerdict(c, m, false).outcome), "fail")
      << "the control did not run";
  ComparisonResult ctl = Pair("control", false, {16, 0, 6});
  ctl.control = true;
  ctl.gates.push_back(GateOutcome{"state within thresholds", false, "nothing compared"});
  m["control"] = ctl;
  const CampaignDecision nothing = DecideCampaignVerdict(c, m, false);
  EXPECT_STREQ(CampaignOutcomeName(nothing.outcome), "not_checked");
  EXPECT_NE(nothing.reason.find("state within thresholds"), std::string::npos) << nothing.reason;
  m["control"].caught_by = {"state within thresholds"};
  EXPECT_STREQ(CampaignOutcomeName(DecideCampaignVerdict(c, m, false).outcome), "pass");
  m["control"].passed = true;
  EXPECT_STREQ(CampaignOutcomeName(DecideCampaignVerdict(c, m, false).outcome), "insensitive");
  m["control"].control_applied = false;
  EXPECT_STREQ(CampaignOutcomeName(DecideCampaignVerdict(c, m, false).outcome),
               "control_not_applied");
}

TEST(CampaignVerdict, RelaxedThresholdsAreNamedWithTheirDefaults) {
  Thresholds t;
  EXPECT_TRUE(RelaxedThresholds(t).empty());
  t.nrmse_max = 1e-5;  // tighter: not a relaxation
  EXPECT_TRUE(RelaxedThresholds(t).empty());
  t.nrmse_max = 1e-2;
  t.kl_max = 1e-3;
  t.nrmse_by_kind["ssm_state"] = 1e-3;
  const auto r = RelaxedThresholds(t);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], "NRMSE relaxed to 0.01, default 0.0002");
  EXPECT_EQ(r[1], "logits KL relaxed to 0.001, default 1e-05");
  EXPECT_EQ(r[2], "ssm_state NRMSE relaxed to 0.001, default 0.0002");
}

// ---- plans, end to end ----

// The aa-smoke plan in parts, so that a mutation replaces one part.
struct Plan {
  std::string head = R"(name = "honest"
question = "Does the tiny A/A hold?"
hypothesis = "pass"
)";
  std::string control = "control = \"perturb:layer=3:item=k:eps=1e-2:window=1\"\n";
  std::string body = R"([model]
preset = "tiny"
seed = 7
induction = true
[request]
prompt = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
[engine]
threads = 1
stages = 4
spec = 3
max_new = 16
draft_policy = "adaptive"
)";
  std::string exports = "[export]\nwindows = \"0-2\"\n";
  std::string thresholds;
  std::string gates = "[gates]\noutput = true\nstate = true\npath = { within = 0 }\n";
  std::string arms = "[[arm]]\nname = \"A1\"\n[[arm]]\nname = \"A2\"\nbaseline = \"A1\"\n";
  std::string Text() const { return head + control + body + exports + thresholds + gates + arms; }
};

std::string WritePlan(const std::string& name, const std::string& text) {
  const std::string path = test::NewDir("verdict-plan-" + name) + "/plan.toml";
  EXPECT_TRUE(WriteFileAtomic(path, text).ok());
  return path;
}

// Whether a finished run folder satisfies the rule: every non-control comparison compared
// something, and the control (if any) was caught on a compared quantity.
void ExpectRuleHolds(const std::string& dir, const std::string& what) {
  int pairs = 0;
  for (const auto& e : ReadLedger(dir)) {
    if (e.event != "compared") continue;
    const json& checked = e.data["checked"];
    if (e.data["control"].get<bool>()) {
      EXPECT_FALSE(e.data["caught_by"].empty()) << what << ": " << e.data.dump();
      continue;
    }
    ++pairs;
    EXPECT_GT(
        checked["tokens"].get<int>() + checked["items"].get<int>() + checked["windows"].get<int>(),
        0)
        << what << ": " << e.data.dump();
  }
  EXPECT_GT(pairs, 0) << what;
}

struct Mutation {
  std::string name;
  std::function<void(Plan&)> apply;
  int exit_code;       // of `lockstep run`
  std::string reason;  // in its output (stderr for a refusal)
};

// Must show 2: no mutation gives exit 0 with PASS unless the rule holds, and each says why.
TEST(CampaignVerdict, PlanMutationsNeverPassVacuously) {
  const std::vector<Mutation> cases = {
      {"every-gate-off", [](Plan& p) { p.gates = "[gates]\noutput = false\nstate = false\n"; }, 2,
       "nothing is gated"},
      {"no-gates-table", [](Plan& p) { p.gates.clear(); }, 2, "nothing is gated"},
      {"only-resources", [](Plan& p) { p.gates = "[gates]\nresources = { no_swap = false }\n"; }, 2,
       "nothing is gated"},
      {"one-arm", [](Plan& p) { p.arms = "[[arm]]\nname = \"A1\"\n"; }, 2, "nothing is paired"},
      {"one-arm-no-control",
       [](Plan& p) {
         p.arms = "[[arm]]\nname = \"A1\"\n";
         p.control.clear();
       },
       2, "nothing is paired"},
      {"windows-none", [](Plan& p) { p.exports = "[export]\nwindows = \"none\"\n"; }, 2,
       "windows = \"none\" exports no state"},
      {"windows-never-run", [](Plan& p) { p.exports = "[export]\nwindows = \"500-600\"\n"; }, 2,
       "selects no window that runs"},
      {"timing-pair-state-gate",
       [](Plan& p) {
         p.gates = "[gates]\nstate = true\n";
         p.control.clear();
         p.arms =
             "[[arm]]\nname = \"T1\"\nmode = \"timing\"\nrepeat = 6\n[[arm]]\nname = \"T2\"\n"
             "mode = \"timing\"\nrepeat = 6\nbaseline = \"T1\"\n";
       },
       2, "no gate that is on applies to this pair"},
      {"control-nothing-to-fail-on",
       [](Plan& p) { p.gates = "[gates]\naggregate_timing = { rel_max = 0.5 }\n"; }, 2,
       "the positive control can be caught only by"},
      {"control-window-not-exported",
       [](Plan& p) {
         p.gates = "[gates]\nstate = true\n";
         p.exports = "[export]\nwindows = \"0\"\n";
       },
       2, "it would be caught on nothing"},
      {"thresholds-relaxed", [](Plan& p) { p.thresholds = "[thresholds]\nnrmse_max = 1e-3\n"; }, 0,
       "NRMSE relaxed to 0.001, default 0.0002"},
      {"as-planned", [](Plan&) {}, 0, "verdict: PASS"},
  };
  for (const Mutation& m : cases) {
    Plan p;
    m.apply(p);
    const std::string plan = WritePlan(m.name, p.Text());
    const std::string dir = test::NewDir("verdict-run-" + m.name) + "/run";
    auto check = RunLockstep("run --check-plan " + plan);
    EXPECT_EQ(check.exit_code, m.exit_code == 2 ? 2 : 0) << m.name << ": " << check.err;
    EXPECT_FALSE(fs::exists(dir)) << "--check-plan runs nothing";
    auto r = RunLockstep("run " + plan + " --out " + dir + " --no-progress");
    EXPECT_EQ(r.exit_code, m.exit_code) << m.name << ": " << r.out << r.err;
    EXPECT_NE((r.out + r.err).find(m.reason), std::string::npos)
        << m.name << ": " << r.out << r.err;
    if (m.exit_code == 2) {
      EXPECT_NE(check.err.find(m.reason), std::string::npos) << m.name << ": " << check.err;
      EXPECT_FALSE(fs::exists(dir)) << m.name << ": a refused plan created its run folder";
      continue;
    }
    EXPECT_NE(r.out.find("verdict: PASS"), std::string::npos) << m.name << ": " << r.out;
    ExpectRuleHolds(dir, m.name);
    if (m.name == "thresholds-relaxed") {
      const std::string md = Slurp(dir + "/report.md");
      // Named in the verdict box, before the first section, and never "no tolerance was relaxed".
      EXPECT_LT(md.find("NRMSE relaxed to 0.001, default 0.0002"), md.find("\n#")) << md;
      EXPECT_EQ(md.find("no tolerance was relaxed"), std::string::npos);
      EXPECT_NE(check.out.find("NRMSE relaxed to 0.001, default 0.0002"), std::string::npos);
    }
  }
}

// The report's sentences say what was checked: a pass within thresholds is not "held" as if no
// bit changed; unknowns read "unknown", not -1; a CPU run gets no device-backend sentence; a
// whole-stage item has no "layer -1"; the control's row names the gate that caught it.
TEST(CampaignVerdict, ReportSentencesSayWhatWasChecked) {
  Plan p;
  p.head =
      "name = \"chunk\"\nquestion = \"q\"\nhypothesis = \"The change does not alter what the "
      "engine computes: every gate should pass.\"\n";
  p.arms =
      "[[arm]]\nname = \"A1\"\n[[arm]]\nname = \"A2\"\nbaseline = \"A1\"\n[arm.engine]\n"
      "prefill_chunk = 7\n";
  const std::string dir = test::NewDir("verdict-words") + "/run";
  auto r = RunLockstep("run " + WritePlan("words", p.Text()) + " --out " + dir + " --no-progress");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string md = Slurp(dir + "/report.md");
  EXPECT_NE(md.find("the hypothesis held within the thresholds only: "), std::string::npos) << md;
  EXPECT_NE(md.find("compared items differ bitwise, each within its threshold"), std::string::npos);
  EXPECT_EQ(md.find("-1.0 ms"), std::string::npos) << md;
  EXPECT_EQ(md.find("layer -1"), std::string::npos) << md;
  EXPECT_EQ(md.find("On a device backend"), std::string::npos) << md;
  EXPECT_NE(md.find("failed as expected: caught by the failed gate"), std::string::npos) << md;
  EXPECT_NE(md.find("Fingerprints checked: the plan's model (SHA-256 "), std::string::npos) << md;
}

// "A failed arm that does not count as failed": an arm whose injection never fires exits 2 after
// writing its outputs; the ledger must count it as failed, so the stop rule fires (STOPPED, not
// FAIL) and no later arm is sent.
TEST(CampaignVerdict, AnArmThatExitsTwoIsAFailedArm) {
  Plan p;
  p.control.clear();
  p.arms =
      "[[arm]]\nname = \"A1\"\n[[arm]]\nname = \"A2\"\nbaseline = \"A1\"\ndecision = "
      "\"aa_stable\"\n[arm.engine]\ninject = [\"delay:stage=1:window=15:ms=1\"]\n"
      "[[arm]]\nname = \"B\"\nbaseline = \"A1\"\nrequire = [\"aa_stable\"]\n"
      "[[stop]]\nname = \"unstable_aa\"\narms = [\"A2\"]\npredicates = [\"arm_failed\", "
      "\"output_differs\"]\nmessage = \"unstable\"\n";
  const std::string dir = test::NewDir("verdict-exit2") + "/run";
  auto r = RunLockstep("run " + WritePlan("exit2", p.Text()) + " --out " + dir + " --no-progress");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto es = ReadLedger(dir);
  EXPECT_EQ(Events(es, "failed"), std::vector<std::string>{"A2"});
  bool arm_failed = false;
  for (const auto& e : es)
    if (e.event == "compared" && e.arm == "A2") arm_failed = e.data["predicates"]["arm_failed"];
  EXPECT_TRUE(arm_failed) << "the A2 comparison must see its arm as failed";
  ASSERT_FALSE(es.empty());
  EXPECT_EQ(es.back().data["verdict"], "stopped") << r.out;
  EXPECT_EQ(Events(es, "not_sent"), std::vector<std::string>{"B"});
  EXPECT_NE(r.out.find("A2: FAILED"), std::string::npos) << r.out;
}

// "Wrong model (or executable, or engine config) behind --service-url": refused before the first
// arm, exit 2, naming each field.
TEST(CampaignVerdict, ARemoteServerMustServeWhatThePlanNames) {
  Plan p;
  p.arms =
      "[[arm]]\nname = \"A1\"\nserver = \"fresh\"\n[[arm]]\nname = \"A2\"\nserver = "
      "\"fresh\"\nbaseline = \"A1\"\n";
  const std::string plan = WritePlan("remote", p.Text());
  const std::string local = test::NewDir("verdict-remote-local") + "/run";
  auto l = RunLockstep("run " + plan + " --out " + local + " --no-progress");
  ASSERT_EQ(l.exit_code, 0) << l.out << l.err;
  ExpectRuleHolds(local, "local");
  const json cfg = ReadJson(local + "/arms/A1/config.json");
  const std::string slots = std::to_string(cfg["slots"].get<int>());  // a server-level key
  const std::string base = test::NewDir("verdict-remote");
  // Another model: the same preset with another weight seed.
  auto init = RunLockstep("model init --preset tiny --seed 8 --induction --out " + base + "/m8");
  ASSERT_EQ(init.exit_code, 0) << init.err;
  json other_model = cfg, other_config = cfg;
  other_model["model"] = base + "/m8";
  other_config["spec"] = 2;
  ASSERT_TRUE(WriteFileAtomic(base + "/model.json", other_model.dump()).ok());
  ASSERT_TRUE(WriteFileAtomic(base + "/config.json", other_config.dump()).ok());
  ASSERT_TRUE(WriteFileAtomic(base + "/same.json", cfg.dump()).ok());
  // Another executable: the built one with a byte appended (it still runs; its SHA-256 differs).
  const std::string exe = base + "/lockstep-other";
  fs::copy_file(LOCKSTEP_BIN_PATH, exe);
  { std::ofstream(exe, std::ios::app) << '\n'; }
  fs::permissions(exe, fs::perms::owner_all);
  struct Case {
    std::string name, config, exe, field;
  };
  const std::vector<Case> cases = {{"model", base + "/model.json", "", "model SHA-256"},
                                   {"executable", base + "/same.json", exe, "executable SHA-256"},
                                   {"config", base + "/config.json", "", "engine config spec"}};
  for (const Case& c : cases) {
    fs::create_directories(base + "/exports-" + c.name);
    test::ServeProcess srv({"--config", c.config, "--slots", slots, "--port", "0", "--export-dir",
                            base + "/exports-" + c.name},
                           true, c.exe);
    ASSERT_TRUE(srv.started()) << c.name << ": " << srv.Log();
    const std::string dir = base + "/run-" + c.name;
    auto r = RunLockstep("run " + plan + " --out " + dir + " --no-progress --service-url " +
                         "http://127.0.0.1:" + std::to_string(srv.port()));
    EXPECT_EQ(r.exit_code, 2) << c.name << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(c.field), std::string::npos) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find("does not serve what the plan names"), std::string::npos) << r.err;
    EXPECT_TRUE(Events(ReadLedger(dir), "sent").empty()) << c.name << ": an arm was sent";
  }
  // The server that does serve the plan: the checked fingerprints are in the report.
  fs::create_directories(base + "/exports-same");
  test::ServeProcess same({"--config", base + "/same.json", "--slots", slots, "--port", "0",
                           "--export-dir", base + "/exports-same"});
  ASSERT_TRUE(same.started()) << same.Log();
  const std::string ok = base + "/run-same";
  auto r = RunLockstep("run " + plan + " --out " + ok + " --no-progress --service-url " +
                       "http://127.0.0.1:" + std::to_string(same.port()));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string md = Slurp(ok + "/report.md");
  EXPECT_NE(md.find("Fingerprints checked:"), std::string::npos) << md;
  EXPECT_NE(md.find("the remote server's model (SHA-256"), std::string::npos) << md;
}

// `golden check` with an injection that never fires: a verdict line, exit 2, and the stderr.log
// it points at still exists.
TEST(CampaignVerdict, AFailedGoldenCheckSaysSoAndKeepsItsFiles) {
  const std::string ref = test::NewDir("verdict-golden") + "/ref";
  auto rec = RunLockstep("golden record --plan " + std::string(LOCKSTEP_SOURCE_DIR) +
                         "/campaigns/aa-smoke.toml --out " + ref);
  ASSERT_EQ(rec.exit_code, 0) << rec.out << rec.err;
  auto r =
      RunLockstep("golden check " + ref + " --engine-override inject=delay:stage=1:window=15:ms=1");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("verdict: FAIL (error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("never fired"), std::string::npos) << r.out;
  const auto at = r.out.find("see ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string log = r.out.substr(at + 4, r.out.find("stderr.log", at) + 10 - at - 4);
  EXPECT_TRUE(fs::exists(log)) << "the check deleted the file it points at: " << log;
}

// `align` of two different models' runs, and `tokenize` with a path that is no model: exit 2.
TEST(CampaignVerdict, CommandsRefuseWhatTheyCannotCompare) {
  const std::string d = test::NewDir("verdict-cmds");
  for (const std::string seed : {"7", "8"}) {
    auto init =
        RunLockstep("model init --preset tiny --seed " + seed + " --out " + d + "/m" + seed);
    ASSERT_EQ(init.exit_code, 0) << init.err;
    auto g = RunLockstep("generate --model " + d + "/m" + seed +
                         " --prompt 'abcabcabc' --max-new 6 --spec 2 --threads 1 --trace-jsonl " +
                         d + "/" + seed + ".jsonl --export " + d + "/" + seed + ".h5");
    ASSERT_EQ(g.exit_code, 0) << g.err;
  }
  for (const std::string ext : {".h5", ".jsonl"}) {
    auto a = RunLockstep("align " + d + "/7" + ext + " " + d + "/8" + ext);
    if (ext == ".jsonl" && a.out.find("DIFFERS") == std::string::npos) {
      EXPECT_EQ(a.exit_code, 0) << "traces without fingerprints align: " << a.out << a.err;
      continue;
    }
    EXPECT_EQ(a.exit_code, 2) << ext << ": " << a.out << a.err;
    EXPECT_NE(a.err.find("not comparable"), std::string::npos) << a.err;
  }
  for (const std::string& cmd :
       {"tokenize --model " + d + "/nope hi", "tokenize --model " + d + "/7.h5 hi",
        "detokenize --model " + d + "/nope 104"}) {
    auto t = RunLockstep(cmd);
    EXPECT_EQ(t.exit_code, 2) << cmd << ": " << t.out << t.err;
    EXPECT_NE(t.err.find("is not a model"), std::string::npos) << t.err;
    EXPECT_EQ(t.out.find("104 105"), std::string::npos) << "no silent fall-back to bytes";
  }
  auto ok = RunLockstep("tokenize --model " + d + "/m7 hi");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "104 105\n");
}

}  // namespace
}  // namespace lockstep
