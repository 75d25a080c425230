// RunRecord (issue 36, item 3): the one typed replay of a run folder's ledger that the runner, its
// resume, the campaign report and the summary read; and RunPaths' names.
#include "lockstep/harness/run_record.h"

#include <gtest/gtest.h>

#include "lockstep/harness/campaign.h"
#include "lockstep/harness/gates.h"

namespace lockstep {
namespace {

LedgerEntry E(std::int64_t seq, const std::string& event, const std::string& arm,
              nlohmann::json data) {
  return LedgerEntry{seq, event, arm, std::move(data)};
}

TEST(RunRecord, ReplaysEveryEventIntoItsField) {
  ComparisonResult cr;
  cr.arm = "A2";
  cr.baseline = "A1";
  cr.passed = false;
  cr.checked = {16, 0, 9};
  cr.gates.push_back(GateOutcome{"arms ran", false, "A2 exited 2"});
  const std::vector<LedgerEntry> es = {
      E(0, "planned", "",
        {{"campaign", "c"},
         {"plan_sha256", "abc"},
         {"plan_dir", "/p"},
         {"arms", {"A1", "A2", "B"}},
         {"arm_builds", {{"A1", "self"}}}}),
      E(1, "sent", "A1", {{"repeat", 0}}),
      E(2, "finished", "A1", {{"repeat", 0}, {"exit_code", 0}, {"service", {{"cold", true}}}}),
      E(3, "sent", "A2", {{"repeat", 0}}),
      E(4, "failed", "A2", {{"repeat", 0}, {"exit_code", 2}}),
      E(5, "compared", "A2", ToJson(cr)),
      E(6, "decision", "A2", {{"name", "aa_stable"}, {"value", false}}),
      E(7, "stopped", "", {{"rule", "unstable_aa"}}),
      E(8, "not_sent", "B", {{"reason", "the campaign stopped"}}),
      E(9, "remote_checked", "A1", {{"model_sha256", "m"}}),
      E(10, "done", "", {{"verdict", "stopped"}, {"reason", "a stop rule fired"}}),
      E(11, "from_a_newer_build", "", {{"x", 1}}),
  };
  const RunRecord r = RunRecord::Replay(es);
  EXPECT_EQ(r.campaign, "c");
  EXPECT_EQ(r.plan_sha256, "abc");
  EXPECT_EQ(r.plan_dir, "/p");
  EXPECT_EQ(r.arm_order, (std::vector<std::string>{"A1", "A2", "B"}));
  EXPECT_EQ(r.arm_builds["A1"], "self");
  EXPECT_TRUE(r.sent.count({"A1", 0}) && r.sent.count({"A2", 0}));
  EXPECT_TRUE(r.finished.count({"A1", 0}) && r.finished.count({"A2", 0}));
  EXPECT_TRUE(r.ran.count({"A1", 0}));
  EXPECT_FALSE(r.ran.count({"A2", 0})) << "a failed entry is not a run";
  EXPECT_TRUE(r.failed.count({"A2", 0}));
  EXPECT_EQ(r.exit_codes.at({"A2", 0}), 2);
  EXPECT_EQ(r.first_service.at("A1")["cold"], true);
  ASSERT_EQ(r.compared.count("A2"), 1u);
  EXPECT_EQ(r.compared.at("A2").checked.windows, 9);
  EXPECT_EQ(r.compared_order, std::vector<std::string>{"A2"});
  EXPECT_FALSE(r.decisions.at("aa_stable"));
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stopped_data["rule"], "unstable_aa");
  EXPECT_TRUE(r.not_sent.count("B"));
  EXPECT_EQ(r.not_sent_reason.at("B"), "the campaign stopped");
  EXPECT_TRUE(r.remote_checked);
  EXPECT_EQ(r.remote["model_sha256"], "m");
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.verdict, "stopped");
  EXPECT_EQ(r.verdict_reason, "a stop rule fired");
}

TEST(RunRecord, AResentRepeatThatFinishedCountsAsRun) {
  const RunRecord r = RunRecord::Replay({E(0, "sent", "T", {{"repeat", 1}}),
                                         E(1, "failed", "T", {{"repeat", 1}, {"exit_code", 3}}),
                                         E(2, "sent", "T", {{"repeat", 1}}),
                                         E(3, "finished", "T", {{"repeat", 1}, {"exit_code", 0}})});
  EXPECT_TRUE(r.ran.count({"T", 1}));
  EXPECT_EQ(r.exit_codes.at({"T", 1}), 0) << "the last attempt's exit code";
}

// Every entry type decodes what it encodes, and writes the keys the ledgers of earlier builds
// have (campaigns/README.md "Ledger events"): a resumed old run folder reads the same.
TEST(RunRecord, EntryTypesRoundTripWithTheLedgersKeys) {
  const SentEntry sent{1, "timing", "shared", "cfg", "candidate", "exe"};
  const SentEntry s = SentEntry::Decode(sent.Encode());
  EXPECT_EQ(s.repeat, 1);
  EXPECT_EQ(s.server, "shared");
  EXPECT_EQ(s.executable_sha256, "exe");
  const SentEntry process{0, "state", "", "c", "b", "e"};
  EXPECT_FALSE(process.Encode().contains("server"))
      << "a process arm's sent entry has no server key";
  RunEndEntry end;
  end.failed = true;
  end.repeat = 2;
  end.exit_code = 2;
  end.signal = 9;
  end.seconds = 1.5;
  end.error = "refused";
  const nlohmann::json ej = end.Encode();
  EXPECT_EQ(ej, nlohmann::json::parse(
                    R"({"repeat":2,"exit_code":2,"signal":9,"seconds":1.5,"error":"refused"})"));
  const RunEndEntry e = RunEndEntry::Decode(LedgerEntry{0, end.event(), "A2", ej});
  EXPECT_TRUE(e.failed);
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_EQ(e.error, "refused");
  const StoppedEntry stop{"r", "m", "B", {"path_diverged"}};
  EXPECT_EQ(StoppedEntry::Decode(stop.Encode()).fired_by,
            std::vector<std::string>{"path_diverged"});
  EXPECT_EQ(StoppedEntry::Decode(stop.Encode()).before_arm, "B");
  const NotSentEntry not_sent{"requires x"};
  EXPECT_EQ(NotSentEntry::Decode(not_sent.Encode()).reason, "requires x");
  const DecisionEntry decision{"aa_stable", true};
  EXPECT_TRUE(DecisionEntry::Decode(decision.Encode()).value);
  const DoneEntry done{"not_checked", "why"};
  EXPECT_EQ(DoneEntry::Decode(done.Encode()).verdict, "not_checked");
  PlannedEntry p;
  p.campaign = "c";
  p.arms = {"A1", "A2"};
  EXPECT_FALSE(p.Encode().contains("service")) << "no remote server: no key";
  EXPECT_EQ(PlannedEntry::Decode(p.Encode()).arms, p.arms);
}

TEST(RunPaths, NamesEveryPathOfARunFolder) {
  const RunPaths p("/r");
  ArmSpec timing;
  timing.name = "T1";
  timing.mode = "timing";
  ArmSpec state;
  state.name = "A1";
  EXPECT_EQ(p.Ledger(), "/r/ledger.jsonl");
  EXPECT_EQ(p.Plan(), "/r/plan.toml");
  EXPECT_EQ(p.Model(), "/r/model");
  EXPECT_EQ(p.RepeatDir(timing, 2), "/r/arms/T1/r2");
  EXPECT_EQ(p.RepeatDir(state, 0), "/r/arms/A1");
  EXPECT_EQ(p.FirstRunFile(timing, arm_file::kStdout), "/r/arms/T1/r0/stdout.json");
  EXPECT_EQ(p.Compare("A2", ".json"), "/r/compare/A2.json");
}

}  // namespace
}  // namespace lockstep
