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
