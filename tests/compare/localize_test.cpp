// `lockstep localize` end to end (issue 37, "Must show" 1-4): real `lockstep generate` runs with
// --op-digests, localised by the real command; the JSON report is the assertion surface.
#include "lockstep/compare/localize.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/splitmix.h"
#include "test_util.h"

namespace lockstep {
namespace {

using nlohmann::json;

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One `lockstep generate` with op digests for every window into dir/name.h5.
std::string Generate(const std::string& dir, const std::string& name, const std::string& model,
                     const std::string& extra) {
  const std::string path = dir + "/" + name + ".h5";
  auto r = test::RunLockstep("generate --model " + model +
                             " --prompt 'Localise where two runs part: the op, the layer, the "
                             "window.' --max-new 14 --ignore-eos --threads 2 --export-windows "
                             "none --op-digests all --export " +
                             path + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << extra << "\n" << r.err;
  return path;
}

struct Localized {
  int exit_code = -1;
  json j;
  std::string err;
};

Localized RunLocalize(const std::string& a, const std::string& b, const std::string& dir) {
  const std::string out = dir + "/localize.json";
  auto r = test::RunLockstep("localize " + a + " " + b + " --json " + out);
  Localized l;
  l.exit_code = r.exit_code;
  l.err = r.out + r.err;
  if (r.exit_code == 0 || r.exit_code == 1) l.j = json::parse(Slurp(out), nullptr, false);
  return l;
}

const std::string kSpec = "--spec 4 --spec-max-suffix 4 --prefix-cache on";

// Must show 2: two clean A/A runs (fresh processes) are "no difference" with ops compared > 0; a
// pair without op digests is exit 2 saying so, never a pass.
TEST(Localize, CleanPairsAreNoDifferenceAndNoDigestsIsNotAPass) {
  const std::string dir = test::NewDir("localize-aa");
  const std::string model = test::ModelDir("tiny");
  const std::string a = Generate(dir, "a", model, kSpec);
  const std::string b = Generate(dir, "b", model, kSpec);
  Localized l = RunLocalize(a, b, dir);
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_EQ(l.j["verdict"], "no_difference");
  EXPECT_GT(l.j["compared"].get<std::int64_t>(), 1000);
  EXPECT_EQ(l.j["compared"], l.j["records_a"]);

  const std::string none = dir + "/none.h5";
  auto r = test::RunLockstep("generate --model " + model +
                             " --prompt hi --max-new 4 --threads 2 --export " + none);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto n = test::RunLockstep("localize " + none + " " + a);
  EXPECT_EQ(n.exit_code, 2) << n.out << n.err;
  EXPECT_NE((n.out + n.err).find("no op records"), std::string::npos) << n.out << n.err;
  auto bad = test::RunLockstep("localize " + dir + "/missing.h5 " + a);
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
}

// Must show 8 (the engine half; the goldens are the other): recording op digests for every
// window changes no state bit: every checkpoint item of a run with --op-digests all equals the
// same run's without (`lockstep diff` at NRMSE 0 and KL 0), and the export without digests has
// no /ops.
TEST(Localize, DigestsChangeNoStateBit) {
  const std::string dir = test::NewDir("localize-bits");
  const std::string model = test::ModelDir("tiny");
  auto run = [&](const std::string& name, const std::string& digests) {
    const std::string path = dir + "/" + name + ".h5";
    auto r = test::RunLockstep("generate --model " + model +
                               " --prompt 'byte for byte' --max-new 8 --ignore-eos --threads 2 "
                               "--spec 4 --export-windows all --op-digests " +
                               digests + " --export " + path);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return path;
  };
  const std::string off = run("off", "none"), on = run("on", "all");
  auto d = test::RunLockstep("diff " + off + " " + on + " --nrmse-max 0 --kl-max 0");
  EXPECT_EQ(d.exit_code, 0) << d.out << d.err;
  EXPECT_NE(d.out.find("0 failed, 0 skipped"), std::string::npos) << d.out;
  ReaderLimits lim;
  lim.isolate = false;
  auto ro = ExportReader::Open(off, lim);
  ASSERT_TRUE(ro.ok());
  EXPECT_TRUE((*ro)->meta().op_records.empty());
  EXPECT_TRUE((*ro)->meta().op_table.empty());
}

// The ops a draw may plant a fault in, for a layer of kind `attention`.
std::vector<std::string> LayerOps(bool attention) {
  std::vector<std::string> ops = {"attn_norm",     "attn_residual", "ffn_norm",
                                  "router_logits", "topk",          "expert_out",
                                  "shared_expert", "moe_combine",   "residual"};
  const std::vector<std::string> attn = {"q_proj", "k_proj",   "v_proj", "q_rope",
                                         "k_rope", "attn_out", "o_proj"};
  const std::vector<std::string> gdn = {"in_proj", "in_proj_ba", "conv",       "gates",
                                        "l2norm",  "recurrence", "gated_norm", "out_proj"};
  for (const auto& o : attention ? attn : gdn) ops.push_back(o);
  return ops;
}

// Must show 1: >= 30 seeded (layer, op, window, row) draws on `small` with spec decoding (MTP +
// suffix drafts) and the prefix cache on: each run with one perturb-op against a clean run;
// localize names the planted stage, layer, op, window and row every time, "same inputs,
// different output". Two stages, so the stage is part of what is found.
TEST(Localize, PlantedFaultsAreFoundExactly) {
  const std::string dir = test::NewDir("localize-planted");
  const std::string model = test::ModelDir("small");
  const std::string common = kSpec + " --stages 2";
  const std::string clean = Generate(dir, "clean", model, common);
  ReaderLimits lim;
  lim.isolate = false;
  auto rc = ExportReader::Open(clean, lim);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  const ExportMeta& m = (*rc)->meta();
  ASSERT_GE(m.windows.size(), 6u);
  // The layer kinds and stage boundaries, from the clean run's records.
  std::map<int, bool> attention;
  std::map<int, int> stage_of;
  for (const ExportOpRecord& r : m.op_records) {
    const std::string& op = m.op_table[static_cast<std::size_t>(r.op)].name;
    if (r.layer < 0 || r.layer >= 16) continue;
    if (op == "q_proj") attention[r.layer] = true;
    if (op == "in_proj") attention[r.layer] = false;
    stage_of[r.layer] = r.stage;
  }
  ASSERT_EQ(attention.size(), 16u);
  bool multi_row = false;
  for (int draw = 0; draw < 30; ++draw) {
    const std::uint64_t h = SplitMix64(0x10ca11eull + static_cast<std::uint64_t>(draw));
    const int layer = static_cast<int>(h % 16);
    const std::vector<std::string> ops = LayerOps(attention[layer]);
    const std::string op = ops[(h >> 8) % ops.size()];
    const int window = 1 + static_cast<int>((h >> 20) % (m.windows.size() - 1));
    const int T = m.windows[static_cast<std::size_t>(window)].T;
    const int row = static_cast<int>((h >> 32) % static_cast<std::uint64_t>(T));
    multi_row = multi_row || row > 0;
    const std::string inj = "perturb-op:layer=" + std::to_string(layer) + ":op=" + op +
                            ":window=" + std::to_string(window) + ":row=" + std::to_string(row) +
                            ":ulps=" + std::to_string(1 + (h >> 40) % 8);
    const std::string b =
        Generate(dir, "draw" + std::to_string(draw), model, common + " --inject " + inj);
    Localized l = RunLocalize(clean, b, dir);
    ASSERT_EQ(l.exit_code, 1) << inj << "\n" << l.err;
    const json& f = l.j["first"];
    EXPECT_EQ(l.j["verdict"], "born") << inj;
    EXPECT_EQ(l.j["kind"], "same inputs, different output") << inj;
    EXPECT_EQ(f["op"], op) << inj;
    EXPECT_EQ(f["layer"], layer) << inj;
    EXPECT_EQ(f["stage"], stage_of[layer]) << inj;
    EXPECT_EQ(f["window"], window) << inj;
    EXPECT_EQ(f["row"], row) << inj;
    EXPECT_TRUE(l.j["inputs_unrecorded"].empty()) << inj;
  }
  EXPECT_TRUE(multi_row) << "no draw planted a fault in a draft row";
}

// Must show 4: a perturbation of a state item (ssm_state of a GDN layer at window W) is born in
// no op: the first difference is that item as window W+1 reads it, and localize names the item,
// the window it was still equal in and the injection.
TEST(Localize, PerturbedStateIsCarriedNotBorn) {
  const std::string dir = test::NewDir("localize-carried");
  const std::string model = test::ModelDir("tiny");
  const std::string a = Generate(dir, "a", model, kSpec);
  const std::string inj = "perturb:layer=1:item=ssm_state:eps=0.001:window=4";
  const std::string b = Generate(dir, "b", model, kSpec + " --inject " + inj);
  Localized l = RunLocalize(a, b, dir);
  ASSERT_EQ(l.exit_code, 1) << l.err;
  EXPECT_EQ(l.j["verdict"], "carried") << l.j.dump(2);
  EXPECT_EQ(l.j["carried"]["item"], "stage0/layer1/ssm_state");
  EXPECT_EQ(l.j["carried"]["window"], 5);
  EXPECT_EQ(l.j["carried"]["equal_at_window"], 4);
  EXPECT_EQ(l.j["carried"]["injection"], inj);
  EXPECT_EQ(l.j["first"]["op"], "ssm_state");
}

// Must show 3: batch_invariant off, the request alone vs beside 7 background requests: localize
// names the first op that differs (a product fused over the step's rows), "same inputs,
// different output", and the rows that shared the step. With batch_invariant on: no difference.
TEST(Localize, BatchVariantProductIsARealBirth) {
  const std::string dir = test::NewDir("localize-batch");
  const std::string model = test::ModelDir("tiny");
  const std::string bg = " --background n=7,prompt=6:12,max_new=8:16,arrive=1:3,seed=5";
  for (const bool invariant : {false, true}) {
    const std::string knobs =
        std::string("--slots 8 --batch-invariant ") + (invariant ? "on" : "off");
    const std::string alone = Generate(dir, invariant ? "alone-on" : "alone-off", model, knobs);
    const std::string among =
        Generate(dir, invariant ? "among-on" : "among-off", model, knobs + bg);
    Localized l = RunLocalize(alone, among, dir);
    if (invariant) {
      EXPECT_EQ(l.exit_code, 0) << l.err;
      EXPECT_EQ(l.j["verdict"], "no_difference");
      continue;
    }
    ASSERT_EQ(l.exit_code, 1) << l.err;
    EXPECT_EQ(l.j["verdict"], "born") << l.j.dump(2);
    EXPECT_EQ(l.j["kind"], "same inputs, different output");
    const std::set<std::string> products = {"q_proj",  "k_proj",        "v_proj",   "o_proj",
                                            "in_proj", "in_proj_ba",    "out_proj", "router_logits",
                                            "mtp_fc",  "shared_expert", "lm_head",  "expert_out"};
    EXPECT_TRUE(products.count(l.j["first"]["op"].get<std::string>())) << l.j["first"].dump();
    EXPECT_GE(l.j["first"]["window"].get<int>(), 0) << "the background arrives after the prefill";
    EXPECT_GT(l.j["step"]["rows_b"].get<int>(), l.j["step"]["rows_a"].get<int>()) << l.j.dump(2);
    EXPECT_GT(l.j["step"]["seqs_b"].get<int>(), 1);
  }
}

// Must show 5 (for a pair of exports; not yet from a campaign folder): exports without op digests
// and `localize --rerun` re-run both requests (fresh processes, their recorded configs and
// prompts) with digests and name the op; a pair made different by a timing-only knob (the latency
// draft policy with a delay injection) never names an op: "did not reproduce" or a path
// difference, with the knob named.
TEST(Localize, RerunReproducesAndTimingKnobsNeverNameAnOp) {
  const std::string dir = test::NewDir("localize-rerun");
  const std::string model = test::ModelDir("tiny");
  auto plain = [&](const std::string& name, const std::string& extra) {
    const std::string path = dir + "/" + name + ".h5";
    auto r = test::RunLockstep("generate --model " + model +
                               " --prompt 'Re-run me with digests, please.' --max-new 12 "
                               "--ignore-eos --threads 2 --spec 4 --export-windows none --export " +
                               path + " " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return path;
  };
  const std::string a = plain("a", "");
  const std::string b =
      plain("b", "--inject perturb-op:layer=5:op=moe_combine:window=3:row=0:ulps=2");
  auto no = test::RunLockstep("localize " + a + " " + b);
  EXPECT_EQ(no.exit_code, 2) << "no digests and no --rerun is never a pass";
  const std::string out = dir + "/rerun.json";
  auto r = test::RunLockstep("localize " + a + " " + b + " --rerun --work " + dir +
                             "/work --json " + out);
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  json j = json::parse(Slurp(out));
  EXPECT_EQ(j["verdict"], "born") << j.dump(2);
  EXPECT_EQ(j["first"]["op"], "moe_combine");
  EXPECT_EQ(j["first"]["layer"], 5);
  EXPECT_EQ(j["first"]["window"], 3);
  EXPECT_TRUE(j["rerun"]["reproduced"].get<bool>());

  // The latency policy pauses drafting for 4 windows after a stalled verify: on tiny-induction
  // with a repeating prompt the drafts start at window 14, so a 300 ms stall at window 12 moves
  // the path there (align: first divergence at window 14).
  const std::string ind = test::ModelDir("tiny-induction");
  auto timing = [&](const std::string& name, const std::string& extra) {
    const std::string path = dir + "/" + name + ".h5";
    auto g = test::RunLockstep("generate --model " + ind +
                               " --prompt 'one two three four one two three four one two three "
                               "four one two three four' --max-new 24 --ignore-eos --threads 2 "
                               "--spec 4 --draft-policy latency --export-windows none --export " +
                               path + " " + extra);
    EXPECT_EQ(g.exit_code, 0) << g.err;
    return path;
  };
  const std::string la = timing("la", "");
  const std::string lb = timing("lb", "--inject delay:stage=0:window=12:ms=300");
  const std::string out2 = dir + "/timing.json";
  auto t = test::RunLockstep("localize " + la + " " + lb + " --rerun --work " + dir +
                             "/work2 --json " + out2);
  ASSERT_EQ(t.exit_code, 1) << t.out << t.err;
  json k = json::parse(Slurp(out2));
  EXPECT_NE(k["verdict"], "born") << k.dump(2);
  EXPECT_TRUE(k["verdict"] == "path" || k["kind"] == "did not reproduce") << k.dump(2);
  // A stall of the loaded machine in A's own run could pause its drafts too; when the given runs
  // do part, the re-runs (which replay the delay) part the same way, in no op.
  if (k["rerun"]["originals_differ"].get<bool>()) {
    EXPECT_EQ(k["verdict"], "path") << k.dump(2);
  }
  bool named = false;
  for (const auto& knob : k["rerun"]["timing_knobs"])
    named = named || knob.get<std::string>() == "draft_policy=latency";
  EXPECT_TRUE(named) << k.dump(2);
}

}  // namespace
}  // namespace lockstep
