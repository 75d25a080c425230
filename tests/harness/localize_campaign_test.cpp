// `lockstep localize` on a campaign run folder (issue 37, "Must show" 5 and item 6): an A/A whose
// second arm carries a planted op fault (`perturb-op`) and whose exports hold no op digests fails;
// `localize RUN_DIR --rerun` re-runs both arms' requests with digests and names the op, and the
// plan key `localize = true` does the same during the campaign, into the verdict box and the JSON
// summary (allowlisted fields only). Real `lockstep run` processes on `tiny`.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "campaign_files.h"
#include "lockstep/engine/atomic_file.h"
#include "test_util.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
using test::ReadJson;
using test::RunLockstep;
using test::Slurp;

// An A/A on tiny whose A2 changes one element of layer 5's moe_combine at window 3, row 0.
std::string PlanText(bool localize) {
  return std::string("name = \"aa-planted\"\n") +
         "question = \"Does localize name an op planted in one A/A arm?\"\n" +
         "hypothesis = \"A2 differs from A1 only by the planted perturb-op.\"\n" +
         (localize ? "localize = true\n" : "") +
         "\n[model]\npreset = \"tiny\"\nseed = 7\n"
         "\n[request]\nprompt = \"Re-run me with digests, please.\"\n"
         "\n[engine]\nthreads = 2\nspec = 4\nmax_new = 12\nignore_eos = true\n"
         "\n[export]\nwindows = \"2-5\"\n"
         "\n[gates]\noutput = true\nstate = true\nexact = true\npath = { within = 0 }\n"
         "\n[[arm]]\nname = \"A1\"\n"
         "\n[[arm]]\nname = \"A2\"\nbaseline = \"A1\"\ndecision = \"aa_stable\"\n"
         "[arm.engine]\n"
         "inject = [\"perturb-op:layer=5:op=moe_combine:window=3:row=0:ulps=2\"]\n";
}

// Runs the plan into dir/run (exit 1: the A/A fails) and returns the run folder.
std::string RunPlan(const std::string& dir, bool localize, const std::string& extra = "") {
  const std::string plan = dir + "/plan.toml";
  EXPECT_TRUE(WriteFileAtomic(plan, PlanText(localize)).ok());
  auto r = RunLockstep("run " + plan + " --out " + dir + "/run " + extra);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  return dir + "/run";
}

// Must show 5, from a run folder: no op digests, so a plain localize is exit 2 (never a pass);
// with --rerun both arms' requests are re-run with digests and the planted op is named exactly.
TEST(LocalizeRunFolder, RerunNamesThePlantedOpStageLayerWindowRow) {
  const std::string dir = test::NewDir("localize-folder");
  const std::string run = RunPlan(dir, false);
  EXPECT_FALSE(std::filesystem::exists(run + "/localize/A1-A2.json")) << "localize is off";
  auto plain = RunLockstep("localize " + run);
  EXPECT_EQ(plain.exit_code, 2) << plain.out << plain.err;
  EXPECT_NE((plain.out + plain.err).find("holds op records"), std::string::npos) << plain.err;
  auto other = RunLockstep("localize " + run + " --comparison A1:A9 --rerun");
  EXPECT_EQ(other.exit_code, 2) << other.err;
  EXPECT_NE(other.err.find("no comparison A1:A9"), std::string::npos) << other.err;
  EXPECT_NE(other.err.find("A1:A2 (failed)"), std::string::npos) << other.err;

  const std::string out = dir + "/loc.json";
  auto r = RunLockstep("localize " + run + " --rerun --json " + out);
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  const json j = ReadJson(out);
  EXPECT_EQ(j["pair"], "A1 vs A2");
  EXPECT_EQ(j["verdict"], "born") << j.dump(2);
  EXPECT_EQ(j["kind"], "same inputs, different output");
  EXPECT_EQ(j["first"]["op"], "moe_combine");
  EXPECT_EQ(j["first"]["stage"], 2);
  EXPECT_EQ(j["first"]["layer"], 5);
  EXPECT_EQ(j["first"]["window"], 3);
  EXPECT_EQ(j["first"]["row"], 0);
  EXPECT_TRUE(j["rerun"]["reproduced"].get<bool>());
  // The re-runs go to the run folder's localize/ by default.
  EXPECT_TRUE(std::filesystem::exists(run + "/localize/work-A1-A2/a.rerun.h5"));
}

// Item 6: with `localize = true` the failing A/A is localised during the campaign: the verdict
// box names the op, and the JSON summary's pairs[].localize holds the allowlisted fields only.
TEST(LocalizeRunFolder, PlanKeyPutsTheBirthInTheVerdictBoxAndTheSummary) {
  const std::string dir = test::NewDir("localize-plan-key");
  const std::string run = RunPlan(dir, true, "--json " + dir + "/summary.json");
  const std::string md = Slurp(run + "/report.md");
  const std::string box = md.substr(0, md.find("\n## "));
  EXPECT_NE(box.find("Localized: A1 vs A2 differ from window 3; born at stage 2, layer 5, "),
            std::string::npos)
      << box;
  EXPECT_NE(box.find("moe_combine"), std::string::npos) << box;
  EXPECT_NE(box.find("row 0 (inputs equal)."), std::string::npos) << box;
  const json s = ReadJson(dir + "/summary.json");
  ASSERT_EQ(s["pairs"].size(), 1u) << s.dump(2);
  const json& loc = s["pairs"][0]["localize"];
  ASSERT_TRUE(loc.is_object()) << s.dump(2);
  EXPECT_EQ(loc["verdict"], "born");
  EXPECT_EQ(loc["op"], "moe_combine");
  EXPECT_EQ(loc["stage"], 2);
  EXPECT_EQ(loc["layer"], 5);
  EXPECT_EQ(loc["window"], 3);
  EXPECT_EQ(loc["row"], 0);
  const std::set<std::string> allowed = {"pair",           "verdict", "kind",    "window",
                                         "stage",          "layer",   "op",      "row",
                                         "state_is_cause", "item",    "sentence"};
  for (const auto& [k, v] : loc.items()) {
    EXPECT_TRUE(allowed.count(k)) << "not allowlisted: " << k;
    if (v.is_string()) {  // no paths
      EXPECT_EQ(v.get<std::string>().find(dir), std::string::npos) << k << ": " << v;
    }
  }
}

}  // namespace
}  // namespace lockstep
