// Campaign runner end to end (issue "Harness and campaigns", Must-show 1-7): aa-smoke passes with
// its positive control caught; aa-latency stops after A1, A2 with the B arms not sent; SIGKILL at
// random points always resumes to the same ledger content; bad plans are exit 2 before anything
// runs; reports follow the seed's structure without paths; timing arms need 6 repeats.
#include "lockstep/harness/runner.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "campaign_files.h"
#include "chromium_probe.h"
#include "lockstep/compare/report.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/ledger.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using test::Events;
using test::ReadJson;
using test::ReadLedger;
using test::RunLockstep;
using test::Slurp;

const std::string kCampaigns = std::string(LOCKSTEP_SOURCE_DIR) + "/campaigns";

// aa-smoke with its model, run once per process and shared by the tests that only read it.
const std::string& SmokeRun() {
  static const std::string dir = [] {
    const std::string d = test::NewDir("smoke") + "/run";
    auto r = RunLockstep("run " + kCampaigns + "/aa-smoke.toml --out " + d + " --no-progress");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    // The summary line names what caught the control as failed gates.
    EXPECT_NE(r.out.find(
                  "control vs A1: caught (positive control; failed gates: state within thresholds"),
              std::string::npos)
        << r.out;
    return d;
  }();
  return dir;
}

TEST(Campaign, AaSmokePassesEndToEnd) {
  const std::string& dir = SmokeRun();
  const auto es = ReadLedger(dir);
  EXPECT_EQ(Events(es, "finished"), (std::vector<std::string>{"A1", "A2", "control"}));
  EXPECT_TRUE(Events(es, "failed").empty());
  EXPECT_EQ(Events(es, "compared"), (std::vector<std::string>{"A2", "control"}));
  ASSERT_FALSE(es.empty());
  EXPECT_EQ(es.back().event, "done");
  EXPECT_EQ(es.back().data["verdict"], "pass");
  // Two fresh processes: different run ids, identical outputs, all items pass, no divergence.
  const auto a1 = ReadJson(dir + "/arms/A1/stdout.json"),
             a2 = ReadJson(dir + "/arms/A2/stdout.json");
  EXPECT_EQ(a1["output_ids"], a2["output_ids"]);
  EXPECT_GT(a1["output_ids"].size(), 4u);
  const auto rec = ReadJson(dir + "/compare/A2.json");
  EXPECT_TRUE(rec["comparison"]["passed"].get<bool>());
  const auto& st = rec["report"]["state"];
  EXPECT_GT(st["compared"].get<int>(), 40);
  EXPECT_EQ(st["failed"].get<int>(), 0);
  EXPECT_EQ(st["skipped"].get<int>(), 0);
  EXPECT_FALSE(rec["report"]["alignment"]["diverged"].get<bool>());
  EXPECT_NE(rec["report"]["arms"]["a"]["run_id"], rec["report"]["arms"]["b"]["run_id"]);
  // Decision recorded; positive control caught (its comparison failed on state).
  bool decided = false;
  for (const auto& e : es)
    if (e.event == "decision") decided = e.data["name"] == "aa_stable" && e.data["value"] == true;
  EXPECT_TRUE(decided);
  const auto ctl = ReadJson(dir + "/compare/control.json");
  EXPECT_FALSE(ctl["comparison"]["passed"].get<bool>());
  EXPECT_TRUE(ctl["comparison"]["predicates"]["state_failed"].get<bool>());
  const std::string md = Slurp(dir + "/report.md");
  EXPECT_NE(md.find("was caught by the gates"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir + "/junit.xml"));
  // Every arm reports its prefill progress (what the runner shows on a terminal).
  EXPECT_NE(Slurp(dir + "/arms/A1/stderr.log").find("progress: prefill "), std::string::npos);
}

// Issue 20 Must-show 2 for the campaign report: the verdict box is the first block of the Markdown
// and the first element of the HTML body; the control's row reads "failed as expected: caught";
// every comparison links its pages; the failing control's heat map is embedded; the box lies
// within the first 800 px in headless Chromium.
TEST(Campaign, ReportLeadsWithTheVerdict) {
  const std::string& dir = SmokeRun();
  const std::string md = Slurp(dir + "/report.md");
  EXPECT_TRUE(
      md.starts_with("> **PASS**: Every comparison passed its gates and the positive "
                     "control was caught.\n"))
      << md.substr(0, 300);
  const auto box_end = md.find("\n\n");
  ASSERT_NE(box_end, std::string::npos);
  const std::string box = md.substr(0, box_end);
  EXPECT_NE(box.find("> - Arms: 3 of 3 sent (A1, A2, control)"), std::string::npos) << box;
  EXPECT_NE(box.find("> - Comparisons: A2 vs A1; control vs A1."), std::string::npos) << box;
  // The gate that caught it is named as a failed gate (issue 35: "caught (state within
  // thresholds)" read as its opposite).
  EXPECT_NE(box.find("failed as expected: caught by the failed gate 'state within thresholds'"),
            std::string::npos)
      << box;
  EXPECT_TRUE(md.substr(box_end + 2).starts_with("# aa-smoke: "));
  EXPECT_NE(md.find("| control vs A1 (positive control) | failed as expected: caught by the "
                    "failed gate 'state within thresholds' | [HTML](compare/control.html), "
                    "[Markdown](compare/control.md) |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| control vs A1 | state within thresholds | failed as expected |"),
            std::string::npos);
  EXPECT_EQ(md.find("timing arms recorded the trace only"), std::string::npos)
      << "aa-smoke has no timing arm";
  const std::string html = Slurp(dir + "/report.html");
  const auto body = html.find("<body>\n");
  ASSERT_NE(body, std::string::npos);
  EXPECT_TRUE(
      html.substr(body + 7).starts_with("<div id=\"verdict\" class=\"verdict verdict-pass\""))
      << html.substr(body, 200);
  EXPECT_NE(html.find("<a href=\"compare/control.html\">HTML</a>"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir + "/compare/control.html"));
  EXPECT_NE(html.find("control vs A1: NRMSE per item group and checkpoint</h3>\n<svg"),
            std::string::npos)
      << "the failing pair's heat map is embedded";
  EXPECT_EQ(html.find("A2 vs A1: NRMSE per item group"), std::string::npos)
      << "a passing pair's heat map is not";
  EXPECT_EQ(html.find("<script"), std::string::npos);

  const std::string chromium = test::FindChromium();
  if (chromium.empty())
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh lists it as optional): "
                    "the verdict placement check did not run";
  const auto v = test::MeasureVerdict(chromium, html, test::NewDir("campaign_px"), "campaign.png");
  ASSERT_TRUE(v.has_value()) << "no verdict box measured";
  EXPECT_GE(v->top, 0.0);
  EXPECT_LE(v->bottom, 800.0) << "the verdict box ends at " << v->bottom << " px";
}

TEST(Campaign, AaLatencyStopsAfterTheAA) {
  const std::string dir = test::NewDir("latency") + "/run";
  auto r = RunLockstep("run " + kCampaigns + "/aa-latency.toml --out " + dir + " --no-progress");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto es = ReadLedger(dir);
  EXPECT_EQ(Events(es, "sent"), (std::vector<std::string>{"A1", "A2"}));
  EXPECT_EQ(Events(es, "not_sent"), (std::vector<std::string>{"B-prefill-8192", "B-mtp-off"}));
  ASSERT_EQ(Events(es, "stopped").size(), 1u);
  for (const auto& e : es)
    if (e.event == "stopped") {
      EXPECT_EQ(e.data["rule"], "unstable_aa");
      EXPECT_EQ(e.data["before_arm"], "B-prefill-8192");
    }
  const auto rec = ReadJson(dir + "/compare/A2.json");
  const auto& al = rec["report"]["alignment"];
  ASSERT_TRUE(al["diverged"].get<bool>());
  const int div = al["div_idx"].get<int>();
  // Usually window 5 (the policy pauses drafting after the stall at window 4); on a loaded machine
  // a natural stall can come first: the latency policy is timing-dependent on purpose.
  EXPECT_GE(div, 1);

  // Must-show 5: the Markdown reads like the seed issue (golden structure) and carries no paths.
  const std::string md = Slurp(dir + "/report.md");
  const std::vector<std::string> headings{"# aa-latency: predeclared A/A diagnostic campaign",
                                          "## Summary",
                                          "## Tested configuration and scope",
                                          "## Early state and output checks",
                                          "## Timing and execution-path observations",
                                          "## Gates",
                                          "## Stop decision and measurement limitations",
                                          "## Conclusion"};
  std::size_t at = 0;
  for (const auto& h : headings) {
    const std::size_t pos = md.find("\n" + h + "\n") != std::string::npos
                                ? md.find("\n" + h + "\n") + 1
                                : md.find(h + "\n");
    ASSERT_NE(pos, std::string::npos) << h << "\n" << md;
    EXPECT_GE(pos, at) << h;
    at = pos;
  }
  for (const std::string& line :
       {std::string(
            "Thresholds: NRMSE <= 2.0e-04, logits KL <= 1.0e-05; no tolerance was relaxed."),
        std::string("Unused paged tails were excluded"),
        "The first recorded path difference occurred at zero-based window " + std::to_string(div) +
            ", p=",
        std::string("- A1: p="), std::string("- A2: p="),
        std::string("Windows after that point are not paired by index"),
        std::string("the predeclared rule `unstable_aa` fired"),
        std::string("\"unstable A/A => stop attribution\""),
        std::string(
            "The request ledger contains only A1, A2; not sent: B-prefill-8192, B-mtp-off."),
        std::string("We stopped before the planned B-prefill-8192, B-mtp-off arm(s)."),
        std::string("No fix is claimed."),
        // Issue 20: the box leads, the stall is tied to the injected delay, the hypothesis judged.
        std::string("> **STOPPED**: A stop rule fired; attribution stopped."),
        std::string("> - Stopped by rule 'unstable_aa'"),
        std::string("Injected: A2 carried `delay:stage=2:window=4:ms=120` (a simulated stall)."),
        std::string("Hypothesis check: the hypothesis expects `stopped`; the verdict is "
                    "`stopped`: the hypothesis held.")}) {
    EXPECT_NE(md.find(line), std::string::npos) << "missing: " << line << "\n" << md;
  }
  EXPECT_EQ(md.find("timing arms"), std::string::npos) << "aa-latency has no timing arm";
  EXPECT_TRUE(md.starts_with("> **STOPPED**")) << md.substr(0, 200);
  const std::string html = Slurp(dir + "/report.html");
  for (const std::string* doc : {&md, &html}) {
    auto bad = FindForbiddenText(
        *doc, {dir, test::ScratchDir(), "the cat sat on the mat", "dog sat on the log"});
    EXPECT_TRUE(bad.empty()) << bad.front();
  }
  EXPECT_NE(html.find("<svg"), std::string::npos);

  // HTML renders in headless Chromium when installed.
  std::string chromium;
  for (const char* c : {"chromium", "chromium-browser", "google-chrome"})
    if (std::system((std::string("command -v ") + c + " >/dev/null 2>&1").c_str()) == 0)
      chromium = c;
  if (chromium.empty())
    GTEST_SKIP() << "chromium is not installed: the HTML screenshot check did not run";
  const std::string png = dir + "/report.png";
  const int rc =
      std::system((chromium + " --headless --no-sandbox --disable-gpu --screenshot=" + png +
                   " --window-size=1200,2000 file://" + dir + "/report.html >/dev/null 2>&1")
                      .c_str());
  EXPECT_EQ(rc, 0);
  EXPECT_GT(fs::file_size(png), 10000u);
}

// Every (arm, repeat) is sent at most once after... never again once it finished.
void ExpectNoSendAfterFinish(const std::vector<LedgerEntry>& es) {
  std::set<std::pair<std::string, int>> finished;
  for (const auto& e : es) {
    const auto key = std::make_pair(e.arm, e.data.value("repeat", 0));
    if (e.event == "sent") {
      EXPECT_FALSE(finished.count(key)) << e.arm << " sent again after it finished";
    }
    if (e.event == "finished" || e.event == "failed") finished.insert(key);
  }
}

TEST(Campaign, SigkillAtRandomPointsResumesToTheSameLedger) {
  const std::string plan = kCampaigns + "/aa-smoke.toml";
  const auto reference = LedgerDigest(ReadLedger(SmokeRun()));
  ASSERT_FALSE(reference.empty());
  // Time of an uninterrupted run, to spread the kill points over the whole campaign.
  const std::string timing_dir = test::NewDir("kill-timing") + "/run";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(
      test::WaitChild(test::SpawnLockstep({"run", plan, "--out", timing_dir, "--no-progress"})), 0);
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::mt19937 rng(4069);
  int kills = 0, resumes = 0;
  for (int iter = 0; iter < 20; ++iter) {
    const std::string dir = test::NewDir("kill" + std::to_string(iter)) + "/run";
    // First attempt plus up to two more killed attempts, then one that runs to the end.
    const int n_kills = 1 + static_cast<int>(rng() % 2);
    for (int k = 0; k <= n_kills; ++k) {
      const bool fresh = !fs::exists(dir + "/ledger.jsonl");
      std::vector<std::string> args =
          fresh ? std::vector<std::string>{"run", plan, "--out", dir, "--no-progress"}
                : std::vector<std::string>{"run", "--resume", dir, "--no-progress"};
      resumes += fresh ? 0 : 1;
      const pid_t pid = test::SpawnLockstep(args);
      if (k == n_kills) {
        ASSERT_EQ(test::WaitChild(pid), 0) << "final attempt of iteration " << iter;
        break;
      }
      const double at = std::uniform_real_distribution<double>(0.0, total_ms * 1.1)(rng);
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(at * 1000)));
      ::kill(pid, SIGKILL);
      test::WaitChild(pid);
      ++kills;
    }
    const auto es = ReadLedger(dir);
    EXPECT_EQ(LedgerDigest(es), reference) << "iteration " << iter;
    ExpectNoSendAfterFinish(es);
    ASSERT_FALSE(es.empty());
    EXPECT_EQ(es.back().data.value("verdict", ""), "pass");
  }
  EXPECT_GE(kills, 20);
  EXPECT_GT(resumes, 0);
}

TEST(Campaign, ResumeRefusesAChangedPlanAndDoneIsIdempotent) {
  const std::string dir = test::NewDir("resume") + "/run";
  ASSERT_EQ(
      RunLockstep("run " + kCampaigns + "/aa-smoke.toml --out " + dir + " --no-progress").exit_code,
      0);
  const auto before = ReadLedger(dir);
  auto again = RunLockstep("run --resume " + dir + " --no-progress");
  EXPECT_EQ(again.exit_code, 0) << again.err;
  const auto after = ReadLedger(dir);
  EXPECT_EQ(LedgerDigest(before), LedgerDigest(after));
  EXPECT_EQ(Events(after, "sent"), Events(before, "sent"));  // nothing re-sent
  std::string plan = Slurp(dir + "/plan.toml");
  ASSERT_TRUE(WriteFileAtomic(dir + "/plan.toml", plan + "\n# edited\n").ok());
  auto refused = RunLockstep("run --resume " + dir + " --no-progress");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("plan changed"), std::string::npos) << refused.err;
  // A non-empty folder is never overwritten by a new run.
  EXPECT_EQ(
      RunLockstep("run " + kCampaigns + "/aa-smoke.toml --out " + dir + " --no-progress").exit_code,
      2);
}

std::string WritePlan(const std::string& name, const std::string& text) {
  const std::string dir = test::NewDir("plan-" + name);
  EXPECT_TRUE(WriteFileAtomic(dir + "/" + name + ".toml", text).ok());
  return dir + "/" + name + ".toml";
}

const char* kBase = R"(name = "t"
question = "q"
[model]
preset = "tiny"
seed = 7
[request]
prompt = "abcabcabcabcabc"
[engine]
threads = 1
max_new = 8
spec = 2
)";

TEST(Campaign, BadPlansAreExitTwoBeforeAnythingRuns) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"unknown-key", std::string(kBase) + "bogus = 1\n[[arm]]\nname = \"A1\"\n"},
      {"wrong-type", std::string(kBase) + "[[arm]]\nname = \"A1\"\nrepeat = \"two\"\n"},
      {"unknown-field",
       std::string(kBase) + "[[arm]]\nname = \"A1\"\n[arm.engine]\nwarp_drive = true\n"},
      {"unknown-predicate",
       std::string(kBase) +
           "[[arm]]\nname = \"A1\"\n[[stop]]\nname = \"s\"\npredicates = [\"moon_phase\"]\n"},
      {"missing-model",
       "name = \"t\"\nquestion = \"q\"\n[request]\nprompt = \"x\"\n[[arm]]\nname = \"A1\"\n"},
  };
  for (const auto& [name, text] : cases) {
    const std::string plan = WritePlan(name, text);
    const std::string out = test::NewDir("bad-out-" + name) + "/run";
    auto r = RunLockstep("run " + plan + " --out " + out + " --no-progress");
    EXPECT_EQ(r.exit_code, 2) << name << ": " << r.err;
    EXPECT_NE(r.err.find(".toml"), std::string::npos) << name << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << name << ": the run folder was created";
  }
  // line:column for the unknown key (line 12: after the 11 base lines).
  auto r = RunLockstep("run " + WritePlan("uk", std::string(kBase) + "bogus = 1\n") + " --out " +
                       test::NewDir("uk") + "/run");
  EXPECT_NE(r.err.find(":12:"), std::string::npos) << r.err;
}

TEST(Campaign, InsensitiveControlFailsTheCampaign) {
  std::string text = Slurp(kCampaigns + "/aa-smoke.toml");
  const std::string from = "eps=1e-2", to = "eps=1e-12";
  text.replace(text.find(from), from.size(), to);
  const std::string dir = test::NewDir("insensitive") + "/run";
  auto r =
      RunLockstep("run " + WritePlan("insensitive", text) + " --out " + dir + " --no-progress");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto es = ReadLedger(dir);
  ASSERT_FALSE(es.empty());
  EXPECT_EQ(es.back().data["verdict"], "insensitive");
  EXPECT_NE(Slurp(dir + "/report.md").find("INSENSITIVE"), std::string::npos);
  EXPECT_NE(Slurp(dir + "/junit.xml").find("insensitive"), std::string::npos);
}

// A control whose injection never fires tests nothing: the campaign fails as "control not
// applied", never as "caught" or "insensitive" (issue 20).
TEST(Campaign, AnUnfiredControlIsControlNotApplied) {
  std::string text = Slurp(kCampaigns + "/aa-smoke.toml");
  // max_new 16 allows window 15, but with drafts the request ends after fewer windows.
  const std::string from = "window=1\"", to = "window=15\"";
  text.replace(text.find(from), from.size(), to);
  const std::string dir = test::NewDir("unapplied") + "/run";
  auto r = RunLockstep("run " + WritePlan("unapplied", text) + " --out " + dir + " --no-progress");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("control vs A1: NOT APPLIED"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("caught"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict: FAIL (control not applied)"), std::string::npos) << r.out;
  const auto es = ReadLedger(dir);
  ASSERT_FALSE(es.empty());
  EXPECT_EQ(es.back().data["verdict"], "control_not_applied");
  EXPECT_NE(es.back().data["reason"].get<std::string>().find("did not fire"), std::string::npos);
  const auto cmp = ReadJson(dir + "/compare/control.json")["comparison"];
  EXPECT_EQ(cmp["control_applied"], false);
  bool gate_seen = false;
  for (const auto& g : cmp["gates"])
    if (g["name"] == "control applied") {
      gate_seen = true;
      EXPECT_EQ(g["passed"], false);
      EXPECT_NE(g["message"].get<std::string>().find("never fired"), std::string::npos);
    }
  EXPECT_TRUE(gate_seen) << cmp.dump();
  const std::string md = Slurp(dir + "/report.md");
  EXPECT_NE(md.find("control not applied"), std::string::npos);
  // The verdict box leads the report with the words, and the control's row says what happened.
  EXPECT_LT(md.find("**CONTROL NOT APPLIED**"), md.find("\n#")) << md.substr(0, 600);
  EXPECT_NE(md.find("NOT APPLIED: its injection did not fire"), std::string::npos);
  EXPECT_EQ(md.find("was caught by the gates"), std::string::npos);
  EXPECT_EQ(md.find("INSENSITIVE"), std::string::npos);
  EXPECT_NE(Slurp(dir + "/junit.xml").find("control not applied"), std::string::npos);
  // A control window at or past max_new can never run: exit 2 before anything runs.
  text.replace(text.find(to), to.size(), "window=16\"");
  const std::string never = test::NewDir("never") + "/run";
  auto n = RunLockstep("run " + WritePlan("never", text) + " --out " + never + " --no-progress");
  EXPECT_EQ(n.exit_code, 2) << n.out << n.err;
  EXPECT_NE(n.err.find("window 16 never runs: max_new 16"), std::string::npos) << n.err;
  EXPECT_FALSE(fs::exists(never));
}

std::string TimingPlan(int repeat) {
  return std::string(kBase) +
         "[gates]\naggregate_timing = { rel_max = 0.5 }\n[[arm]]\nname = \"T1\"\nmode = "
         "\"timing\"\n"
         "repeat = " +
         std::to_string(repeat) +
         "\n[[arm]]\nname = \"T2\"\nmode = \"timing\"\nrepeat = " + std::to_string(repeat) +
         "\nbaseline = \"T1\"\n";
}

TEST(Campaign, TimingArmsNeedSixRepeats) {
  const std::string six = test::NewDir("timing6") + "/run";
  auto r6 =
      RunLockstep("run " + WritePlan("t6", TimingPlan(6)) + " --out " + six + " --no-progress");
  EXPECT_NE(r6.exit_code, 2) << r6.err;
  const auto rec6 = ReadJson(six + "/compare/T2.json");
  const auto& t6 = rec6["comparison"]["timing"];
  EXPECT_FALSE(t6["refused"].get<bool>());
  EXPECT_EQ(t6["repeats"][0].get<int>(), 6);
  ASSERT_GT(t6["window_a"].size(), 2u);
  EXPECT_EQ(t6["window_a"][0]["n"].get<int>(), 6);
  EXPECT_LE(t6["window_a"][0]["lo95"].get<double>(), t6["window_a"][0]["median"].get<double>());
  const std::string md6 = Slurp(six + "/report.md");
  EXPECT_NE(md6.find("Timing over 6 / 6 fresh processes"), std::string::npos) << md6;
  EXPECT_NE(md6.find("| window | median T1 ms [95%]"), std::string::npos);

  const std::string two = test::NewDir("timing2") + "/run";
  auto r2 =
      RunLockstep("run " + WritePlan("t2", TimingPlan(2)) + " --out " + two + " --no-progress");
  EXPECT_EQ(r2.exit_code, 1) << r2.out
                             << r2.err;  // the aggregate gate cannot pass without a verdict
  const auto rec2 = ReadJson(two + "/compare/T2.json");
  EXPECT_TRUE(rec2["comparison"]["timing"]["refused"].get<bool>());
  const std::string md2 = Slurp(two + "/report.md");
  EXPECT_NE(md2.find("Timing verdict refused"), std::string::npos) << md2;
  EXPECT_NE(md2.find("at least 6"), std::string::npos) << md2;
}

TEST(Campaign, GateCommandWritesJUnit) {
  const std::string dir = test::NewDir("gate");
  auto r = RunLockstep("gate " + kCampaigns + "/aa-smoke.toml --out " + dir + "/run --junit " +
                       dir + "/junit.xml --no-progress");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string x = Slurp(dir + "/junit.xml");
  EXPECT_NE(x.find("<testsuite name=\"lockstep.campaign.aa-smoke\""), std::string::npos) << x;
  EXPECT_NE(x.find("failures=\"0\""), std::string::npos) << x;
  EXPECT_NE(x.find("positive control caught"), std::string::npos);
  // `report` re-renders from the folder alone.
  auto rep = RunLockstep("report " + dir + "/run --md " + dir + "/again.md");
  EXPECT_EQ(rep.exit_code, 0) << rep.err;
  EXPECT_EQ(Slurp(dir + "/again.md"), Slurp(dir + "/run/report.md"));
}

TEST(Campaign, LedgerDigestDropsVolatileAndInterruptedEntries) {
  auto e = [](std::string ev, std::string arm, nlohmann::json d) {
    return LedgerEntry{0, ev, arm, d};
  };
  std::vector<LedgerEntry> killed{
      e("planned", "", {{"plan_sha256", "x"}}), e("sent", "A1", {{"repeat", 0}}),
      e("resumed", "", {{"rerun", {"A1"}}}), e("sent", "A1", {{"repeat", 0}}),
      e("finished", "A1", {{"repeat", 0}, {"seconds", 1.5}})};
  std::vector<LedgerEntry> clean{e("planned", "", {{"plan_sha256", "x"}}),
                                 e("sent", "A1", {{"repeat", 0}}),
                                 e("finished", "A1", {{"repeat", 0}, {"seconds", 0.7}})};
  EXPECT_EQ(LedgerDigest(killed), LedgerDigest(clean));
  clean.push_back(e("not_sent", "A2", {{"reason", "requires aa_stable (failed)"}}));
  EXPECT_NE(LedgerDigest(killed), LedgerDigest(clean));
}

}  // namespace
}  // namespace lockstep
