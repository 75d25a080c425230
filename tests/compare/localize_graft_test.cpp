// State transplant (issue 37, item 5 and "Must show" 6): `lockstep generate --graft` (its refusals
// and its /injections record) and `lockstep localize --graft` (a path divergence that the state
// does not carry, and one that a perturbed state item does). Real processes on `tiny`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/compare/export_reader.h"
#include "test_util.h"

namespace lockstep {
namespace {

using nlohmann::json;

json ReadJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// `lockstep localize A B --graft` into dir/name.json: its exit code and the JSON (null on exit 2).
std::pair<int, json> LocalizeGraft(const std::string& dir, const std::string& name,
                                   const std::string& a, const std::string& b) {
  const std::string out = dir + "/" + name + ".json";
  auto r = test::RunLockstep("localize " + a + " " + b + " --graft --work " + dir + "/work-" +
                             name + " --json " + out);
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r.out << r.err;
  return {r.exit_code, r.exit_code <= 1 ? ReadJson(out) : json()};
}

// Every refusal is exit 2 with one line naming the problem, and nothing is exported; a graft that
// fires is one /injections object of kind graft saying where it fired.
TEST(Graft, RefusalsNameTheProblemAndTheRecordSaysWhereItFired) {
  const std::string dir = test::NewDir("graft-cli");
  const std::string model = test::ModelDir("tiny");
  // One `lockstep generate` into dir/out; `knobs` the threads (and the model) of the run.
  const std::string knobs = "--threads 2 --model " + model;
  auto cmd = [&](const std::string& out, const std::string& extra,
                 const std::string& with = std::string()) {
    return "generate " + (with.empty() ? knobs : with) + " --ignore-eos --spec 4 --export " + dir +
           "/" + out + " " + extra;
  };
  auto run = [&](const std::string& out, const std::string& extra) {
    return test::RunLockstep(cmd(out, extra));
  };
  const std::string src = "--prompt 'graft source' --max-new 8 ";
  auto source = run("from.h5", src + "--export-windows all --export-points commit");
  ASSERT_EQ(source.exit_code, 0) << source.err;
  auto longer = run("long.h5",
                    "--prompt 'graft source, but a longer prompt than that one' "
                    "--max-new 8 --export-windows 2");
  ASSERT_EQ(longer.exit_code, 0) << longer.err;
  const std::string from = "--graft " + dir + "/from.h5:";
  struct Case {
    std::string what, cmd, says;
  };
  const std::vector<Case> cases = {
      {"unknown item", cmd("t.h5", src + from + "stage0/layer1/nope@2:commit"),
       "unknown item 'stage0/layer1/nope'"},
      {"not state", cmd("t.h5", src + from + "stage0/layer1/logits@2:commit"),
       "unknown item 'stage0/layer1/logits'"},
      {"absent window", cmd("t.h5", src + from + "stage0/layer1/ssm_state@99:commit"),
       "window 99 commit is absent"},
      {"absent point", cmd("t.h5", src + from + "stage0/layer1/ssm_state@2:pre_verify"),
       "window 2 pre_verify is absent"},
      {"another model",
       cmd("t.h5", src + from + "stage0/layer1/ssm_state@2:commit",
           "--threads 2 --model " + test::ModelDir("tiny-induction")),
       "another model"},
      {"another config",
       cmd("t.h5", src + from + "stage0/layer1/ssm_state@2:commit", "--threads 1 --model " + model),
       "another config (config threads: 2 | 1"},
      {"rows mismatch", cmd("t.h5", src + "--graft " + dir + "/long.h5:stage1/layer3/k@2:commit"),
       "committed rows there"},
      {"syntax", cmd("t.h5", src + from + "stage0/layer1/ssm_state:commit"), "no '@WINDOW'"},
  };
  for (const Case& c : cases) {
    auto r = test::RunLockstep(c.cmd);
    EXPECT_EQ(r.exit_code, 2) << c.what << "\n" << r.err;
    EXPECT_TRUE(Has(r.err, c.says)) << c.what << "\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir + "/t.h5")) << c.what;
  }
  auto ok = run("ok.h5", src + from + "stage0/layer1/ssm_state@2:commit " + from +
                             "stage1/layer3/k@3:commit");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  ReaderLimits lim;
  lim.isolate = false;
  auto r = ExportReader::Open(dir + "/ok.h5", lim);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<std::string>& inj = (*r)->meta().injections;
  ASSERT_EQ(inj.size(), 2u);
  const json g0 = json::parse(inj[0]), g1 = json::parse(inj[1]);
  EXPECT_EQ(g0["kind"], "graft");
  EXPECT_EQ(g0["item"], "stage0/layer1/ssm_state");
  EXPECT_EQ(g0["layer"], 1);
  EXPECT_EQ(g0["point"], "commit");
  EXPECT_TRUE(g0["fired"].get<bool>()) << g0.dump();
  EXPECT_EQ(g0["count"], 1);
  ASSERT_EQ(g0["firings"].size(), 1u);
  EXPECT_EQ(g0["firings"][0]["window"], 2);
  EXPECT_EQ(g1["item"], "stage1/layer3/k");
  EXPECT_EQ(g1["stage"], 1);
  EXPECT_TRUE(g1["fired"].get<bool>()) << g1.dump();
  EXPECT_EQ(g1["firings"][0]["window"], 3);
  EXPECT_GT(g1["firings"][0]["rows"].get<int>(), 0);
}

// Must show 6, first half: a path divergence caused by a delay under the latency draft policy
// (tiny-induction drafts from window 14 on this prompt; a 300 ms stall at window 12 pauses them).
// B given A's whole state at the last commit before the divergence still parts: the state is not
// the cause, the knob is named, and no op is.
TEST(LocalizeGraft, ADelayUnderTheLatencyPolicyIsNotTheState) {
  const std::string dir = test::NewDir("graft-latency");
  const std::string model = test::ModelDir("tiny-induction");
  auto run = [&](const std::string& name, const std::string& extra) {
    const std::string path = dir + "/" + name + ".h5";
    auto g = test::RunLockstep("generate --model " + model +
                               " --prompt 'one two three four one two three four one two three "
                               "four one two three four' --max-new 24 --ignore-eos --threads 2 "
                               "--spec 4 --draft-policy latency --export-windows none --export " +
                               path + " " + extra);
    EXPECT_EQ(g.exit_code, 0) << g.err;
    return path;
  };
  const std::string a = run("a", "");
  const std::string b = run("b", "--inject delay:stage=0:window=12:ms=300");
  auto [rc, j] = LocalizeGraft(dir, "loc", a, b);
  ASSERT_EQ(rc, 1) << j.dump(2);
  EXPECT_NE(j["verdict"], "born") << j.dump(2);
  EXPECT_EQ(j["first"]["op"], "") << "a timing knob never names an op: " << j.dump(2);
  const json& g = j["graft"];
  EXPECT_FALSE(g["state_is_cause"].get<bool>()) << g.dump(2);
  EXPECT_TRUE(g["culprit"].empty()) << g.dump(2);
  bool knob = false;
  for (const auto& k : j["rerun"]["timing_knobs"])
    knob = knob || k.get<std::string>() == "draft_policy=latency";
  EXPECT_TRUE(knob) << j.dump(2);
  const std::string finding = g["finding"].get<std::string>();
  EXPECT_TRUE(Has(finding, "draft_policy=latency")) << finding;
  // A machine stall in A's own re-run can pause its drafts too: then the re-runs agree and the
  // finding is "did not reproduce", still no op and no state.
  if (g["reproduced"].get<bool>()) {
    EXPECT_TRUE(Has(finding, "the state is not the cause")) << finding;
    EXPECT_EQ(g["graft_window"].get<int>() + 1, g["divergence"].get<int>());
    ASSERT_FALSE(g["trials"].empty());
    EXPECT_EQ(g["trials"][0]["items"].size(), g["items"].get<std::size_t>());
    EXPECT_FALSE(g["trials"][0]["agrees"].get<bool>());
  } else {
    EXPECT_TRUE(Has(finding, "did not reproduce")) << finding;
  }
}

// Must show 6, second half: a `perturb` of layer 1's ssm_state at window 4 moves B's path from
// window 5; grafting A's stage0/layer1/ssm_state at window 4's commit alone removes the divergence.
TEST(LocalizeGraft, GraftingThePerturbedItemRemovesTheDivergence) {
  const std::string dir = test::NewDir("graft-perturb");
  const std::string model = test::ModelDir("tiny");
  auto run = [&](const std::string& name, const std::string& extra) {
    const std::string path = dir + "/" + name + ".h5";
    auto g = test::RunLockstep("generate --model " + model +
                               " --prompt 'Re-run me with digests, please.' --max-new 14 "
                               "--ignore-eos --threads 2 --spec 4 "
                               "--export-windows none --export " +
                               path + " " + extra);
    EXPECT_EQ(g.exit_code, 0) << g.err;
    return path;
  };
  const std::string a = run("a", "");
  const std::string b = run("b", "--inject perturb:layer=1:item=ssm_state:eps=5:window=4");
  auto [rc, j] = LocalizeGraft(dir, "loc", a, b);
  ASSERT_EQ(rc, 1) << j.dump(2);
  const json& g = j["graft"];
  EXPECT_TRUE(g["reproduced"].get<bool>()) << g.dump(2);
  EXPECT_EQ(g["divergence"], 5) << g.dump(2);
  EXPECT_EQ(g["graft_window"], 4) << g.dump(2);
  EXPECT_TRUE(g["state_is_cause"].get<bool>()) << g.dump(2);
  EXPECT_EQ(g["culprit"], json::array({"stage0/layer1/ssm_state"})) << g.dump(2);
  EXPECT_NE(j["verdict"], "born") << "a perturbed state item is not an op's birth";
  EXPECT_TRUE(Has(g["finding"].get<std::string>(), "removes it")) << g.dump(2);
  // The trial that grafted the culprit alone agrees with A's path.
  bool alone = false;
  for (const auto& t : g["trials"])
    alone = alone ||
            (t["items"] == json::array({"stage0/layer1/ssm_state"}) && t["agrees"].get<bool>());
  EXPECT_TRUE(alone) << g.dump(2);
}

}  // namespace
}  // namespace lockstep
