// Named ops (op_table.h): the table, the row digest, and what the CPU backend reports through the
// observation seam (Observer::WantsOps / OnOp), tested with a recording observer on `tiny`.
#include "lockstep/engine/op_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/inject.h"
#include "lockstep/engine/tokenizer.h"
#include "test_util.h"

namespace lockstep {
namespace {

struct Rec {
  std::string op;
  int window, stage, layer, index, position, row;
  std::uint64_t digest;
  std::vector<float> data;
};

// Keeps every op record it is shown (rows copied) for the windows it wants.
class OpRecorder final : public Observer {
 public:
  explicit OpRecorder(std::set<int> windows) : windows_(std::move(windows)) {}
  bool WantsCheckpoint(int, CheckpointPoint) const override { return false; }
  void OnCheckpointBegin(const CheckpointInfo&) override {}
  void OnState(const CheckpointInfo&, const StateView&) override {}
  void OnCheckpointEnd(const CheckpointInfo&) override {}
  bool WantsOps(int window) const override { return windows_.count(window) > 0; }
  void OnOp(const OpRecord& r) override {
    Rec x{r.def->name, r.window, r.stage, r.layer, r.index, r.position, r.row, r.digest, {}};
    if (r.data != nullptr) {
      x.data.assign(r.data, r.data + r.width);
      EXPECT_EQ(r.digest, RowDigest(r.data, r.width * sizeof(float))) << r.def->name;
    }
    recs.push_back(std::move(x));
  }
  std::set<int> windows_;
  std::vector<Rec> recs;
};

TEST(OpTable, NamesAreUniqueAndEveryInputIsAName) {
  std::set<std::string> names;
  for (const OpDef& d : OpTable()) EXPECT_TRUE(names.insert(d.name).second) << d.name;
  EXPECT_EQ(names.size(), kNumOps);
  for (const OpDef& d : OpTable()) {
    EXPECT_EQ(FindOpDef(d.name), &d);
    std::string in = d.inputs;
    std::size_t b = 0;
    while (b < in.size()) {
      std::size_t e = in.find(',', b);
      if (e == std::string::npos) e = in.size();
      std::string item = in.substr(b, e - b);
      if (item.rfind("state:", 0) == 0) {
        const OpDef* s = FindOpDef(item.substr(6));
        ASSERT_NE(s, nullptr) << d.name << " reads " << item;
        EXPECT_TRUE(s->state) << item;
      } else {
        std::size_t a = 0;
        while (a <= item.size()) {
          std::size_t z = item.find('|', a);
          if (z == std::string::npos) z = item.size();
          EXPECT_NE(FindOpDef(item.substr(a, z - a)), nullptr) << d.name << " reads " << item;
          a = z + 1;
        }
      }
      b = e + 1;
    }
  }
  EXPECT_EQ(FindOpDef("no_such_op"), nullptr);
}

TEST(OpTable, DigestIsOfTheBytes) {
  std::vector<float> x(37);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.25f - 3.0f;
  const std::uint64_t d = RowDigest(x.data(), x.size() * 4);
  EXPECT_EQ(d, RowDigest(x.data(), x.size() * 4));
  for (std::size_t i = 0; i < x.size(); ++i) {  // every element, one bit
    std::vector<float> y = x;
    std::uint32_t bits;
    std::memcpy(&bits, &y[i], 4);
    bits ^= 1u;
    std::memcpy(&y[i], &bits, 4);
    EXPECT_NE(RowDigest(y.data(), y.size() * 4), d) << "element " << i;
  }
  EXPECT_NE(RowDigest(x.data(), 36 * 4), d) << "the length is part of the digest";
  EXPECT_DOUBLE_EQ(RowL2(x.data(), 0), 0.0);
}

EngineConfig TinySpec() {
  EngineConfig c;
  c.model = test::ModelDir("tiny");
  c.threads = 2;
  c.max_new = 12;
  c.ignore_eos = true;
  c.spec = 3;
  return c;
}

// Every op of the table shows up (tiny has attention, GDN, MoE layers and MTP), each row once,
// and recording ops changes no bit of what the engine computes.
TEST(OpReports, EveryOpIsReportedAndRecordingChangesNothing) {
  const auto& w = test::Model("tiny");
  const auto prompt = EncodeBytes("Ops are named, reported and digested.");
  auto a = Engine::Create(TinySpec(), w);
  auto b = Engine::Create(TinySpec(), w);
  ASSERT_TRUE(a.ok() && b.ok());
  OpRecorder obs({-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  GenerateHooks hooks;
  hooks.observer = &obs;
  auto ra = Generate(**a, prompt);
  auto rb = Generate(**b, prompt, &hooks);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->output, rb->output);
  ASSERT_EQ(ra->windows.size(), rb->windows.size());
  for (std::size_t i = 0; i < ra->windows.size(); ++i)
    EXPECT_TRUE(ra->windows[i].SamePath(rb->windows[i])) << "window " << i;
  std::set<std::string> seen;
  for (const Rec& r : obs.recs) seen.insert(r.op);
  for (const OpDef& d : OpTable()) {
    if (std::string(d.name) == "ffn_out") continue;  // tiny's layers are all MoE
    EXPECT_TRUE(seen.count(d.name)) << "op " << d.name << " never reported";
  }
  // Each verify window's main-layer rows: one record per (op, layer, index, row).
  std::map<std::tuple<int, std::string, int, int, int>, int> n;
  for (const Rec& r : obs.recs)
    if (r.window >= 0 && r.layer >= 0 && r.layer < w.config.n_layers && r.row >= 0)
      ++n[{r.window, r.op, r.layer, r.index, r.row}];
  for (const auto& [k, count] : n)
    EXPECT_EQ(count, 1) << std::get<1>(k) << " window " << std::get<0>(k);
  // Window 3's residual rows are its T rows at positions p..p+T-1.
  const WindowRecord& w3 = rb->windows[3];
  int rows = 0;
  for (const Rec& r : obs.recs)
    if (r.window == 3 && r.op == "residual" && r.layer == 0) {
      EXPECT_EQ(r.position, w3.p + r.row);
      ++rows;
    }
  EXPECT_EQ(rows, w3.T);
}

// Dense FFN layers report ffn_out instead of the MoE ops (tiny-dense: layers 2 and 3 dense).
TEST(OpReports, DenseLayersReportFfnOut) {
  const auto& w = test::Model("tiny-dense");
  auto e = Engine::Create(TinySpec(), w);
  ASSERT_TRUE(e.ok());
  OpRecorder obs({0, 1});
  GenerateHooks hooks;
  hooks.observer = &obs;
  auto r = Generate(**e, EncodeBytes("dense layers"), &hooks);
  ASSERT_TRUE(r.ok());
  std::map<int, std::set<std::string>> by_layer;
  for (const Rec& x : obs.recs) by_layer[x.layer].insert(x.op);
  for (int il : {2, 3}) {
    EXPECT_TRUE(by_layer[il].count("ffn_out")) << il;
    EXPECT_FALSE(by_layer[il].count("moe_combine")) << il;
  }
  EXPECT_TRUE(by_layer[1].count("moe_combine"));
  EXPECT_FALSE(by_layer[1].count("ffn_out"));
}

// A perturb-op moves exactly the named row's largest element by K ULPs before anything reads it:
// the first record that differs from a clean run is that op's row; the record says it fired.
TEST(OpReports, PerturbOpChangesExactlyTheNamedRowFirst) {
  const auto& w = test::Model("tiny");
  const auto prompt = EncodeBytes("Plant one fault, find it exactly.");
  EngineConfig clean = TinySpec();
  EngineConfig bad = TinySpec();
  bad.inject = {"perturb-op:layer=3:op=q_proj:window=4:row=0:ulps=3"};  // layer 3: attention
  auto a = Engine::Create(clean, w);
  auto b = Engine::Create(bad, w);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  OpRecorder oa({4}), ob({4});
  GenerateHooks ha, hb;
  ha.observer = &oa;
  hb.observer = &ob;
  auto ra = Generate(**a, prompt, &ha);
  auto rb = Generate(**b, prompt, &hb);
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(oa.recs.size(), ob.recs.size());
  std::size_t i = 0;
  while (i < oa.recs.size() && oa.recs[i].digest == ob.recs[i].digest) ++i;
  ASSERT_LT(i, oa.recs.size()) << "the perturbation changed nothing";
  EXPECT_EQ(ob.recs[i].op, "q_proj");
  EXPECT_EQ(ob.recs[i].layer, 3);
  EXPECT_EQ(ob.recs[i].window, 4);
  EXPECT_EQ(ob.recs[i].row, 0);
  int changed = 0;
  for (std::size_t e = 0; e < oa.recs[i].data.size(); ++e)
    if (std::memcmp(&oa.recs[i].data[e], &ob.recs[i].data[e], 4) != 0) ++changed;
  EXPECT_EQ(changed, 1) << "one element moved";
  const std::vector<std::string> report = (*b)->InjectionReport();
  ASSERT_EQ(report.size(), 1u);
  EXPECT_NE(report[0].find("\"fired\":true"), std::string::npos) << report[0];
  EXPECT_NE(report[0].find("\"kind\":\"perturb-op\""), std::string::npos) << report[0];
}

TEST(OpReports, PerturbOpThatCanNeverFireIsRefused) {
  const auto& w = test::Model("tiny");
  for (const char* text : {"perturb-op:layer=3:op=no_such:window=1:row=0:ulps=1",
                           "perturb-op:layer=0:op=q_proj:window=1:row=0:ulps=1",  // GDN layer
                           "perturb-op:layer=99:op=residual:window=1:row=0:ulps=1",
                           "perturb-op:layer=2:op=lm_head:window=1:row=0:ulps=1",
                           "perturb-op:layer=3:op=q_proj:window=1:row=0:ulps=0",
                           "perturb-op:layer=3:op=q_proj:row=0:ulps=1"}) {
    EngineConfig c = TinySpec();
    c.inject = {text};
    auto e = Engine::Create(c, w);
    EXPECT_FALSE(e.ok()) << text;
    if (!e.ok()) {
      EXPECT_EQ(e.status().exit_code(), 2) << text;
    }
  }
}

}  // namespace
}  // namespace lockstep
