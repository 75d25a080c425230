// State diff end to end (issue "Comparator", Must-show 2): an A/A of two identical runs passes
// every item with NRMSE 0 and KL 0; an injected perturbation fails exactly the perturbed item and
// what is computed from it afterwards, and the diff names the first failing item. Plus the
// `lockstep diff / align / summarize` commands: exit codes, reports, bad input, --isolate.
#include "lockstep/compare/state_diff.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/report.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/compare_commands.h"
#include "lockstep/harness/process.h"
#include "test_util.h"

namespace lockstep {
namespace {

using test::RunLockstep;

// One export of the tiny induction model (4 stages: layers 0-1, 2-3, 4-5, 6-7; attention at 3, 7).
std::string Export(const std::string& name, const std::string& extra,
                   const std::string& model = "tiny-induction") {
  const std::string dir = test::NewDir("diff-" + name);
  const std::string path = dir + "/" + name + ".h5";
  const std::string spec = extra.find("--spec") == std::string::npos ? " --spec 3" : "";
  const std::string windows =
      extra.find("--export-windows") == std::string::npos ? " --export-windows all" : "";
  const std::string max_new = extra.find("--max-new") == std::string::npos ? " --max-new 12" : "";
  auto r = RunLockstep("generate --model " + test::ModelDir(model) +
                       " --prompt 'the cat sat on the mat. the cat sat on the' --threads 1"
                       " --draft-policy adaptive --arm " +
                       name + " --export " + path + spec + windows + max_new + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

struct Pair {
  std::unique_ptr<ExportReader> a, b;
};

Pair Open(const std::string& a, const std::string& b) {
  auto ra = ExportReader::Open(a);
  auto rb = ExportReader::Open(b);
  EXPECT_TRUE(ra.ok()) << ra.status().message();
  EXPECT_TRUE(rb.ok()) << rb.status().message();
  return {std::move(ra).value(), std::move(rb).value()};
}

const std::string& ArmA() {
  static const std::string p = Export("A1", "");
  return p;
}
const std::string& ArmB() {
  static const std::string p = Export("A2", "");
  return p;
}

TEST(StateDiff, IdenticalRunsPassWithExactZeros) {
  Pair p = Open(ArmA(), ArmB());
  auto d = DiffExports(*p.a, *p.b, DiffOptions{});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_TRUE(d->Passed());
  EXPECT_GT(d->compared, 50);
  EXPECT_EQ(d->failed, 0);
  EXPECT_EQ(d->skipped, 0);
  EXPECT_TRUE(d->config_differences.empty());
  EXPECT_FALSE(d->output_differs);
  int logits = 0, spec = 0;
  for (const auto& it : d->items) {
    ASSERT_EQ(it.verdict, Verdict::kPass) << it.checkpoint << "/" << it.rel << ": " << it.reason;
    EXPECT_EQ(it.stats.nrmse, 0.0) << it.rel;  // exactly zero, not just small
    EXPECT_EQ(it.stats.n_diff, 0u) << it.rel;
    EXPECT_EQ(it.stats.max_abs, 0.0) << it.rel;
    if (it.has_kl) {
      ++logits;
      EXPECT_EQ(it.kl.kl_max, 0.0);
      EXPECT_EQ(it.kl.kl_mean, 0.0);
      EXPECT_EQ(it.kl.top1_agree, it.kl.rows);
    }
    if (it.label == "speculative") ++spec;
  }
  EXPECT_GT(logits, 0);
  EXPECT_GT(spec, 0);
  // Per checkpoint: compared = passed, in (window, point) order.
  ASSERT_FALSE(d->checkpoints.empty());
  EXPECT_EQ(d->checkpoints.front().name, "00000_pre_verify");
  for (const auto& cs : d->checkpoints) EXPECT_EQ(cs.compared, cs.passed);
}

// Where a failing item sits in causal order: (window, point, stage, layer).
std::tuple<int, int, int, int> Order(const ItemResult& r) {
  const int pt = r.point == "pre_verify" ? 0 : r.point == "post_verify" ? 1 : 2;
  return {r.window, pt, r.stage, r.layer < 0 ? 1000 : r.layer};
}

TEST(StateDiff, PerturbationFailsExactlyThePerturbedItemAndDownstream) {
  const std::string c = Export("control", "--inject perturb:layer=3:item=k:eps=1e-2:window=1");
  Pair p = Open(ArmA(), c);
  auto d = DiffExports(*p.a, *p.b, DiffOptions{});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_FALSE(d->Passed());
  ASSERT_GE(d->first_failure, 0);
  const ItemResult& first = d->items[static_cast<std::size_t>(d->first_failure)];
  // The perturbation lands after window 1's forward: post_verify holds it in the speculative rows.
  EXPECT_EQ(first.checkpoint, "00001_post_verify");
  EXPECT_EQ(first.stage, 1);
  EXPECT_EQ(first.layer, 3);
  EXPECT_EQ(first.kind, "k_spec");
  EXPECT_EQ(first.label, "speculative");
  // Only the inject key differs in the config, and it is reported.
  ASSERT_EQ(d->config_differences.size(), 1u);
  EXPECT_EQ(d->config_differences[0].rfind("inject:", 0), 0u);
  for (const auto& it : d->items) {
    if (Order(it) < Order(first)) {
      EXPECT_EQ(it.verdict, Verdict::kPass)
          << "upstream item failed: " << it.checkpoint << "/" << it.rel;
    }
    // In the perturbed checkpoint only the perturbed item fails (V of the same layer is untouched).
    if (it.checkpoint == first.checkpoint && it.rel != first.rel) {
      EXPECT_EQ(it.verdict, Verdict::kPass) << it.rel;
    }
  }
  // Downstream: the committed K of layer 3 from window 1's commit on fails; in later windows what
  // reads it (layers after 3, the logits) differs, while layers before 3 stay bitwise equal as
  // long as the emitted tokens are the same.
  bool committed_k = false, later_logits_differ = false;
  for (const auto& it : d->items) {
    if (it.checkpoint == "00001_commit" && it.rel == "stage1/layer3/k")
      committed_k = it.verdict == Verdict::kFail;
    if (it.window >= 2 && it.kind == "logits" && it.stats.n_diff > 0) later_logits_differ = true;
    if (!d->output_differs && it.window >= 2 && it.layer >= 0 && it.layer < 3) {
      EXPECT_EQ(it.stats.n_diff, 0u) << it.checkpoint << "/" << it.rel;
    }
  }
  EXPECT_TRUE(committed_k);
  EXPECT_TRUE(later_logits_differ);
}

TEST(StateDiff, MaskingSkipsDifferentWindowsAndFailsMissingItems) {
  // Different draft budgets: windows differ in T, so from window 1 on the checkpoints are not the
  // same state boundary and are skipped with the reason, never compared blindly.
  const std::string s2 = Export("spec0", "--spec 0");
  Pair p = Open(ArmA(), s2);
  auto d = DiffExports(*p.a, *p.b, DiffOptions{});
  ASSERT_TRUE(d.ok()) << d.status().message();
  bool skipped_window = false;
  for (const auto& it : d->items)
    if (it.verdict == Verdict::kSkip &&
        it.reason.find("not the same state boundary") != std::string::npos)
      skipped_window = true;
  EXPECT_TRUE(skipped_window);
  bool spec_diff = false;
  for (const auto& c : d->config_differences) spec_diff = spec_diff || c.rfind("spec: ", 0) == 0;
  EXPECT_TRUE(spec_diff);
  // Window 0 (p = n-1, T = 1) is the same boundary in both: its main state passes; only the draft
  // (MTP) K/V differs, because plain decoding never runs the MTP head (a shape difference, failed
  // with its reason, never compared blindly).
  for (const auto& it : d->items) {
    if (it.window != 0) continue;
    if (it.label == "draft") {
      EXPECT_EQ(it.verdict, Verdict::kFail) << it.rel;
      EXPECT_NE(it.reason.find("shape differs"), std::string::npos) << it.reason;
    } else {
      EXPECT_EQ(it.verdict, Verdict::kPass) << it.checkpoint << "/" << it.rel << ": " << it.reason;
    }
  }
}

TEST(StateDiff, WindowAndPointSelection) {
  Pair p = Open(ArmA(), ArmB());
  DiffOptions o;
  o.windows = "1";
  o.points = "commit";
  auto d = DiffExports(*p.a, *p.b, o);
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->checkpoints.size(), 1u);
  EXPECT_EQ(d->checkpoints[0].name, "00001_commit");
  o.windows = "x";
  EXPECT_EQ(DiffExports(*p.a, *p.b, o).status().exit_code(), 2);
}

TEST(StateDiff, SmallMemoryLimitGivesTheSameResult) {
  Pair p = Open(ArmA(), Export("small-mem", "--inject perturb:item=logits:eps=1e-3:window=2"));
  DiffOptions big, small;
  small.mem_limit_bytes = std::int64_t{16} << 20;
  small.threads = 1;
  auto a = DiffExports(*p.a, *p.b, big);
  auto b = DiffExports(*p.a, *p.b, small);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->items.size(), b->items.size());
  for (std::size_t i = 0; i < a->items.size(); ++i) {
    EXPECT_EQ(a->items[i].stats.nrmse, b->items[i].stats.nrmse);
    EXPECT_EQ(a->items[i].kl.kl_max, b->items[i].kl.kl_max);
  }
  EXPECT_GT(a->failed,
            0);  // logits KL of a 0.1% logit scale is above 1e-5? at least NRMSE 1e-3 > 2e-4
}

TEST(StateDiff, ThresholdOverrides) {
  Thresholds t;
  EXPECT_TRUE(t.SetKindOverride("ssm_state=1e-3").ok());
  EXPECT_EQ(t.NrmseFor("ssm_state"), 1e-3);
  EXPECT_EQ(t.NrmseFor("k"), 2e-4);
  EXPECT_EQ(t.SetKindOverride("bogus=1").exit_code(), 2);
  EXPECT_EQ(t.SetKindOverride("k=abc").exit_code(), 2);
}

// ---- no vacuous verdicts (issue 20): a diff that compared nothing is not a pass ----

const std::string& Windows02() {
  static const std::string p = Export("w02", "--export-windows 0-2");
  return p;
}

TEST(StateDiffVacuous, AWindowSelectionWithNoCheckpointComparesNothing) {
  Pair p = Open(ArmA(), ArmB());
  DiffOptions o;
  o.windows = "700";
  auto d = DiffExports(*p.a, *p.b, o);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->compared, 0);
  EXPECT_FALSE(d->Passed());
  EXPECT_NE(d->vacuous.find("nothing compared: no exported checkpoint is in --windows 700"),
            std::string::npos)
      << d->vacuous;
}

TEST(StateDiffVacuous, AnEmptyExportComparesNothing) {
  Pair p = Open(ArmA(), Export("empty", "--export-windows none"));
  auto d = DiffExports(*p.a, *p.b, DiffOptions{});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->compared, 0);
  EXPECT_FALSE(d->Passed());
  EXPECT_NE(d->vacuous.find("nothing compared: export B holds no checkpoint"), std::string::npos)
      << d->vacuous;
}

TEST(StateDiffVacuous, DisjointWindowsAndSkipsBeyondTheLimitFail) {
  Pair disjoint = Open(Windows02(), Export("w45", "--export-windows 4-5"));
  auto d = DiffExports(*disjoint.a, *disjoint.b, DiffOptions{});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->compared, 0);
  EXPECT_GT(d->skipped, 0);
  EXPECT_NE(d->vacuous.find("nothing compared: the exports share no window in the selection "
                            "(A exported windows 0-2, B windows 4-5)"),
            std::string::npos)
      << d->vacuous;
  // 0-2 against 1,5: window 1 is compared, the rest skipped; beyond --max-skipped that fails.
  Pair partial = Open(Windows02(), Export("w15", "--export-windows 1,5"));
  auto q = DiffExports(*partial.a, *partial.b, DiffOptions{});
  ASSERT_TRUE(q.ok());
  EXPECT_GT(q->compared, 0);
  EXPECT_EQ(q->failed, 0);
  EXPECT_FALSE(q->Passed());
  EXPECT_NE(
      q->vacuous.find(std::to_string(q->skipped) + " items skipped, more than --max-skipped 0"),
      std::string::npos)
      << q->vacuous;
  DiffOptions lenient;
  lenient.max_skipped = q->skipped;
  auto ok = DiffExports(*partial.a, *partial.b, lenient);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->Passed()) << ok->vacuous;
  lenient.max_skipped = -1;
  EXPECT_TRUE(DiffExports(*partial.a, *partial.b, lenient)->Passed());
}

TEST(StateDiffVacuous, EveryItemSkippedComparesNothing) {
  // spec 0 against spec 3: from window 1 on the windows differ in T, so each such checkpoint is
  // skipped ("not the same state boundary"); windows 1-3 then hold nothing comparable.
  Pair p = Open(ArmA(), Export("all-skipped", "--spec 0"));
  auto all = DiffExports(*p.a, *p.b, DiffOptions{});
  ASSERT_TRUE(all.ok()) << all.status().message();
  std::string skipped_windows;  // the windows whose every checkpoint was skipped
  for (const auto& cs : all->checkpoints)
    if (cs.point == "commit" && cs.compared == 0 && cs.skipped > 0)
      skipped_windows += (skipped_windows.empty() ? "" : ",") + std::to_string(cs.window);
  ASSERT_FALSE(skipped_windows.empty());
  DiffOptions o;
  o.windows = skipped_windows;
  auto d = DiffExports(*p.a, *p.b, o);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->compared, 0);
  EXPECT_GT(d->skipped, 0);
  EXPECT_FALSE(d->Passed());
  EXPECT_NE(d->vacuous.find("nothing compared: every item was skipped ("), std::string::npos)
      << d->vacuous;
  EXPECT_NE(d->vacuous.find("not the same state boundary"), std::string::npos) << d->vacuous;
}

TEST(StateDiffVacuous, ARunAgainstItselfIsBadInputUnlessAllowed) {
  Pair p = Open(ArmA(), ArmA());
  auto d = DiffExports(*p.a, *p.b, DiffOptions{});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().exit_code(), 2);
  EXPECT_NE(d.status().message().find("both exports are of the same run (run_id "),
            std::string::npos)
      << d.status().message();
  DiffOptions o;
  o.allow_self = true;
  auto self = DiffExports(*p.a, *p.b, o);
  ASSERT_TRUE(self.ok());
  EXPECT_TRUE(self->Passed());
}

TEST(DiffCliVacuous, NothingComparedIsExitOneWithTheReason) {
  const auto empty = RunLockstep("diff " + ArmA() + " " + ArmB() + " --windows 700");
  EXPECT_EQ(empty.exit_code, 1) << empty.err;
  EXPECT_NE(empty.out.find("FAIL: nothing compared: no exported checkpoint is in --windows 700"),
            std::string::npos)
      << empty.out;
  EXPECT_NE(empty.err.find("lockstep: error: diff: nothing compared:"), std::string::npos)
      << empty.err;
  const auto none = RunLockstep("diff " + ArmA() + " " + Export("cli-empty", "--max-new 0"));
  EXPECT_EQ(none.exit_code, 1) << none.err;
  EXPECT_NE(none.out.find("FAIL: nothing compared: export B holds no checkpoint"),
            std::string::npos)
      << none.out;
  const std::string w15 = Export("cli-w15", "--export-windows 1,5");
  const auto partial = RunLockstep("diff " + Windows02() + " " + w15);
  EXPECT_EQ(partial.exit_code, 1) << partial.out;
  EXPECT_NE(partial.out.find("skipped by reason:\n"), std::string::npos) << partial.out;
  EXPECT_NE(partial.out.find(": checkpoint exported by A only\n"), std::string::npos)
      << partial.out;
  EXPECT_NE(partial.out.find("more than --max-skipped 0"), std::string::npos) << partial.out;
  EXPECT_EQ(RunLockstep("diff " + Windows02() + " " + w15 + " --max-skipped -1").exit_code, 0);
  const auto disjoint =
      RunLockstep("diff " + Windows02() + " " + Export("cli-w45", "--export-windows 4-5"));
  EXPECT_EQ(disjoint.exit_code, 1);
  EXPECT_NE(disjoint.out.find("FAIL: nothing compared: the exports share no window"),
            std::string::npos)
      << disjoint.out;
}

TEST(DiffCliVacuous, SelfComparisonIsExitTwoUnlessAllowed) {
  const std::string dir = test::NewDir("self");
  std::filesystem::copy_file(ArmA(), dir + "/copy.h5");
  for (const char* cmd : {"diff", "summarize", "align"}) {
    const auto same = RunLockstep(std::string(cmd) + " " + ArmA() + " " + ArmA());
    EXPECT_EQ(same.exit_code, 2) << cmd << ": " << same.out;
    EXPECT_NE(same.err.find("are the same file"), std::string::npos) << cmd << ": " << same.err;
    const auto run = RunLockstep(std::string(cmd) + " " + ArmA() + " " + dir + "/copy.h5");
    EXPECT_EQ(run.exit_code, 2) << cmd << ": " << run.out;
    EXPECT_NE(run.err.find("both exports are of the same run"), std::string::npos)
        << cmd << ": " << run.err;
    const auto allowed =
        RunLockstep(std::string(cmd) + " " + ArmA() + " " + ArmA() + " --allow-self");
    EXPECT_EQ(allowed.exit_code, 0) << cmd << ": " << allowed.err;
  }
}

TEST(AlignCliVacuous, DifferentModelsAreNotComparable) {
  const std::string other = Export("other-model", "", "tiny");
  // Exit 2, as `diff` of the same pair (issue 35: it exited 0), with or without the gate flag.
  const auto r = RunLockstep("align " + ArmA() + " " + other);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.out.find("DIFFERS: the models differ: model_sha256 "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no path divergence"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("the paths are not comparable (the models differ"), std::string::npos)
      << r.err;
  const auto gate = RunLockstep("align " + ArmA() + " " + other + " --fail-on-divergence");
  EXPECT_EQ(gate.exit_code, 2) << gate.out;
  // Same model, same request: the fingerprints are named as checked.
  const auto same = RunLockstep("align " + ArmA() + " " + ArmB());
  EXPECT_NE(same.out.find("fingerprints: model, request and config identical"), std::string::npos)
      << same.out;
  EXPECT_NE(same.out.find("PASS: no path divergence over "), std::string::npos) << same.out;
}

// An align report of two exports carries what the exports record (fingerprints, tokens, config),
// read from the same isolated open that gave the windows; only traces leave them unknown.
TEST(AlignCli, ReportOfExportsCarriesTheirFacts) {
  const std::string dir = test::NewDir("align-facts");
  const auto r = RunLockstep("align " + ArmA() + " " + ArmB() + " --json " + dir + "/a.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto text = ReadFile(dir + "/a.json");
  ASSERT_TRUE(text.ok());
  auto meta = ExportReader::Open(ArmA());
  ASSERT_TRUE(meta.ok());
  const std::string model12 = (*meta)->meta().model_sha256.substr(0, 12);
  const std::string prompt =
      "\"prompt_tokens\": " + std::to_string((*meta)->meta().request_tokens.size());
  EXPECT_NE(text->find(model12), std::string::npos) << *text;
  EXPECT_NE(text->find(prompt), std::string::npos) << *text;
  EXPECT_NE(text->find("\"backend\""), std::string::npos) << *text;
}

TEST(AlignCliVacuous, AllTOnePathsAreNotChecked) {
  const std::string a = Export("t1-a", "--spec 0"), b = Export("t1-b", "--spec 0");
  const auto r = RunLockstep("align " + a + " " + b);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("path not checked: every one of the "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NOT CHECKED: "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no path divergence"), std::string::npos) << r.out;
  const auto gate = RunLockstep("align " + a + " " + b + " --fail-on-divergence");
  EXPECT_EQ(gate.exit_code, 1) << gate.out;
  EXPECT_NE(gate.err.find("align: nothing compared: every one of the "), std::string::npos)
      << gate.err;
}

TEST(DiffCliVacuous, TheVerdictLineIsColouredOnlyWhenAsked) {
  DiffCommandOptions o;
  o.a = ArmA();
  o.b = ArmB();
  o.quiet = true;
  o.color = true;  // main sets it when stdout is a TTY and NO_COLOR is unset
  std::ostringstream coloured;
  ASSERT_TRUE(RunDiff(o, coloured).ok());
  EXPECT_EQ(coloured.str().rfind("\x1b[32;1mPASS\x1b[0m: ", 0), 0u) << coloured.str();
  o.diff.windows = "700";
  std::ostringstream nothing;
  EXPECT_EQ(RunDiff(o, nothing).exit_code(), 1);
  EXPECT_EQ(nothing.str().rfind("\x1b[31;1mFAIL\x1b[0m: \x1b[33;1mnothing compared: ", 0), 0u)
      << nothing.str();
  // The binary's stdout is a pipe here: no escape sequences.
  const auto piped = RunLockstep("diff " + ArmA() + " " + ArmB() + " --quiet");
  EXPECT_EQ(piped.out.find('\x1b'), std::string::npos) << piped.out;
  EXPECT_EQ(piped.out.rfind("PASS: ", 0), 0u) << piped.out;
}

TEST(DiffCliVacuous, AMissingOutputFolderIsExitTwo) {
  for (const char* cmd : {"diff", "align", "summarize"})
    for (const char* flag : {"--json", "--md", "--html", "--junit"}) {
      const auto r = RunLockstep(std::string(cmd) + " " + ArmA() + " " + ArmB() + " " + flag +
                                 " /nonexistent-folder/r");
      EXPECT_EQ(r.exit_code, 2) << cmd << " " << flag << ": " << r.err;
      EXPECT_NE(r.err.find(std::string(flag) + " '/nonexistent-folder/r': the folder "
                                               "'/nonexistent-folder' does not exist"),
                std::string::npos)
          << r.err;
    }
}

// ---- the commands ----

TEST(DiffCli, PassFailAndReports) {
  const std::string dir = test::NewDir("diff-cli");
  auto ok = RunLockstep("diff " + ArmA() + " " + ArmB() + " --json " + dir + "/r.json --md " + dir +
                        "/r.md --html " + dir + "/r.html --junit " + dir + "/r.xml");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("PASS"), std::string::npos);
  EXPECT_NE(ok.out.find("NRMSE <= 2.0e-04"), std::string::npos) << ok.out;
  for (const char* f : {"/r.json", "/r.md", "/r.html", "/r.xml"})
    EXPECT_TRUE(std::filesystem::exists(dir + f)) << f;
  const std::string c = Export("cli-control", "--inject perturb:layer=7:item=v:eps=1e-2:window=0");
  auto bad = RunLockstep("diff " + ArmA() + " " + c);
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_NE(bad.out.find("first failing item: 00000_post_verify stage 3 layer 7 v_spec"),
            std::string::npos)
      << bad.out;
  // A threshold raised above the perturbation passes, and says so.
  auto loose = RunLockstep("diff " + ArmA() + " " + c + " --nrmse-max 1 --kl-max 1 --quiet");
  EXPECT_EQ(loose.exit_code, 0) << loose.out;
}

TEST(DiffCli, BadInputIsExitTwo) {
  const std::string dir = test::NewDir("diff-bad");
  ASSERT_TRUE(WriteFileAtomic(dir + "/text.h5", std::string("not an hdf5 file\n")).ok());
  auto full = ReadFile(ArmA());
  ASSERT_TRUE(full.ok());
  ASSERT_TRUE(
      WriteFileAtomic(dir + "/trunc.h5", std::string_view(*full).substr(0, full->size() / 2)).ok());
  for (const std::string& f : {dir + "/text.h5", dir + "/trunc.h5", dir + "/missing.h5"}) {
    for (const char* cmd : {"diff", "summarize", "align"}) {
      auto r = RunLockstep(std::string(cmd) + " " + ArmA() + " " + f);
      EXPECT_EQ(r.exit_code, 2) << cmd << " " << f << ": " << r.err;
      EXPECT_NE(r.err.find("lockstep: error:"), std::string::npos) << r.err;
    }
  }
  EXPECT_EQ(RunLockstep("diff " + ArmA() + " " + ArmB() + " --mem-limit 1K").exit_code, 2);
  EXPECT_EQ(RunLockstep("diff " + ArmA() + " " + ArmB() + " --points nowhere").exit_code, 2);
  EXPECT_EQ(RunLockstep("align " + ArmA() + " " + ArmB() + " --fields p,bogus").exit_code, 2);
}

TEST(AlignCli, SameRunsDoNotDivergeAndTracesWork) {
  auto r = RunLockstep("align " + ArmA() + " " + ArmB());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no path divergence"), std::string::npos) << r.out;
  const std::string s2 = Export("align-spec0", "--spec 0");
  auto d = RunLockstep("align " + ArmA() + " " + s2 + " --fail-on-divergence");
  EXPECT_EQ(d.exit_code, 1) << d.out;
  EXPECT_NE(d.out.find("first path divergence at window"), std::string::npos) << d.out;
}

// Traces from a device backend carry per-stage CUDA-event timings; align compares their sums per
// window (a cpu trace against it reads as unknown, never as a one-sided sum).
TEST(AlignCli, DeviceTimingsOfJsonlTraces) {
  const std::string dir = test::NewDir("align-dev");
  auto trace = [&](const std::string& name, bool device, double compute_ms) {
    std::string text;
    for (int i = 0; i < 3; ++i) {
      WindowRecord w;
      w.idx = i, w.p = 10 + i, w.emitted = {7}, w.verify_ns = 4'000'000;
      w.stages.resize(4);
      for (StageTiming& st : w.stages)
        if (device) {
          st.dev_wait_ns = 0, st.dev_copy_ns = 0, st.init_ns = 0;
          st.dev_compute_ns = static_cast<std::int64_t>(compute_ms * 1e6);
          st.graph = GraphUse::kReplay;
        }
      text += w.ToJsonLine() + "\n";
    }
    EXPECT_TRUE(WriteFileAtomic(dir + "/" + name, text).ok());
    return dir + "/" + name;
  };
  const std::string a = trace("a.jsonl", true, 1.0), b = trace("b.jsonl", true, 1.5),
                    c = trace("c.jsonl", false, 0);
  auto r = RunLockstep("align " + a + " " + b);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 3 windows x 4 stages x 1.0 / 1.5 ms.
  EXPECT_NE(r.out.find("  dev_compute       12.000       18.000    +50.0%"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("dev_*: CUDA-event spans"), std::string::npos) << r.out;
  auto m = RunLockstep("align " + c + " " + a);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_NE(m.out.find("  dev_compute unknown (recorded as -1 on at least one side)"),
            std::string::npos)
      << m.out;
  auto cpu = RunLockstep("align " + c + " " + c + " --allow-self");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(cpu.out.find("dev_"), std::string::npos) << cpu.out;
  // A trace whose writer was killed mid-record: its whole windows are aligned, and stderr says
  // what was dropped.
  auto whole = ReadFile(c);
  ASSERT_TRUE(whole.ok());
  const std::string torn = dir + "/torn.jsonl";
  ASSERT_TRUE(WriteFileAtomic(torn, *whole + whole->substr(0, 40)).ok());
  auto t = RunLockstep("align " + c + " " + torn);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.err.find("torn.jsonl:4: 40 bytes of an unfinished record"), std::string::npos)
      << t.err;
  EXPECT_NE(t.err.find("the 3 whole windows before it are read"), std::string::npos) << t.err;
  // These synthetic windows all have T = 1: the path fields cannot differ, and align says so
  // instead of "no path divergence" (issue 20).
  EXPECT_NE(t.out.find("path not checked: every one of the 3 windows has T = 1"), std::string::npos)
      << t.out;
  EXPECT_EQ(t.out.find("no path divergence"), std::string::npos) << t.out;
}

TEST(SummarizeCli, ReportsCarryNoPathsOrPrompt) {
  const std::string dir = test::NewDir("summ");
  auto r = RunLockstep("summarize " + ArmA() + " " + ArmB() + " --md " + dir + "/s.md --html " +
                       dir + "/s.html");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"/s.md", "/s.html"}) {
    auto text = ReadFile(dir + f);
    ASSERT_TRUE(text.ok());
    auto bad = FindForbiddenText(*text, {"the cat sat on the mat", test::ScratchDir()});
    EXPECT_TRUE(bad.empty()) << f << ": " << (bad.empty() ? "" : bad[0]);
  }
}

// Isolation is the reader's now (tests/compare/isolate_test.cpp): the flags still select it.
TEST(Isolate, DiffWithAndWithoutIsolation) {
  for (const char* flag : {"--isolate", "--no-isolate", "--isolate-timeout 5"}) {
    auto r = RunLockstep(std::string("diff ") + flag + " " + ArmA() + " " + ArmB());
    EXPECT_EQ(r.exit_code, 0) << flag << ": " << r.err;
    EXPECT_NE(r.out.find("PASS"), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// --export-compress lz4 is lossless: the compressed export diffs bit-exactly against the plain one
// (the reader locates chunked items through HDF5, the index marking them with offset -1).
TEST(CompressedExport, Lz4IsLosslessAndReadable) {
  const std::string plain = Export("plain-int8", "--kv int8");
  const std::string dir = test::NewDir("lz4");
  auto r = RunLockstep(
      "generate --model " + test::ModelDir("tiny-induction") +
      " --prompt 'the cat sat on the mat. the cat sat on the' --max-new 12 --threads 1 --spec 3"
      " --draft-policy adaptive --export-windows all --kv int8 --arm lz4 --export " +
      dir + "/c.h5 --export-compress lz4");
  if (r.exit_code == 2 && r.err.find("plugin") != std::string::npos)
    GTEST_SKIP() << "the LZ4 HDF5 filter plugin is not installed (hdf5-filter-plugin): " << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Pair p = Open(plain, dir + "/c.h5");
  EXPECT_FALSE(p.b->ReadsDirectly(p.b->meta().checkpoints.back(),
                                  p.b->meta().checkpoints.back().items.front()));
  auto d = DiffExports(*p.a, *p.b, DiffOptions{});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_TRUE(d->Passed());
  for (const auto& it : d->items) EXPECT_EQ(it.stats.n_diff, 0u) << it.checkpoint << "/" << it.rel;
  auto bad =
      RunLockstep("generate --model " + test::ModelDir("tiny") +
                  " --prompt x --max-new 2 --export " + dir + "/b.h5 --export-compress zstd");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
}

TEST(CompressedExport, MissingPluginIsExitTwo) {
  const std::string dir = test::NewDir("lz4-missing");
  const std::string cmd = "HDF5_PLUGIN_PATH=" + dir + " " + std::string(LOCKSTEP_BIN_PATH) +
                          " generate --model " + test::ModelDir("tiny") +
                          " --prompt x --max-new 2 --export " + dir +
                          "/m.h5 --export-compress lz4 >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 2);
  EXPECT_FALSE(std::filesystem::exists(dir + "/m.h5"));
}

}  // namespace
}  // namespace lockstep
