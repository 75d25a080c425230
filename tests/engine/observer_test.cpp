// The Observer contract (issue "Instrumentation", engine side): what the engine hands over at
// pre_verify / post_verify / commit, tested with a recording fake at the production interface.
#include "lockstep/engine/observer.h"

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

// Copies every view it is shown, keyed by (window, point, stage, layer, item).
class RecordingObserver final : public Observer {
 public:
  struct Item {
    StateView meta;     // without the callbacks' lifetime: only shape/rows fields are used
    std::string bytes;  // rows concatenated
  };
  using Key = std::tuple<int, CheckpointPoint, int, int, ItemKind>;

  explicit RecordingObserver(std::set<int> windows) : windows_(std::move(windows)) {}
  bool WantsCheckpoint(int window, CheckpointPoint) const override {
    return windows_.count(window) > 0;
  }
  void OnCheckpointBegin(const CheckpointInfo& info) override {
    infos[{info.window, info.point}] = info;
    ++begins;
  }
  void OnState(const CheckpointInfo& info, const StateView& v) override {
    Item it;
    it.meta = v;
    it.meta.row = nullptr;
    it.meta.scales = nullptr;
    for (int r = 0; r < v.rows; ++r)
      it.bytes.append(reinterpret_cast<const char*>(v.row(r)), v.row_bytes);
    EXPECT_LE(v.rows, v.rows_capacity) << ItemKindName(v.kind);
    items[{info.window, info.point, v.stage, v.layer, v.kind}] = std::move(it);
    ++counts[{info.window, info.point}];
  }
  void OnCheckpointEnd(const CheckpointInfo&) override { ++ends; }
  void OnWindow(const WindowRecord& rec) override { records.push_back(rec); }

  std::set<int> windows_;
  std::map<std::pair<int, CheckpointPoint>, CheckpointInfo> infos;
  std::map<std::pair<int, CheckpointPoint>, int> counts;
  std::map<Key, Item> items;
  std::vector<WindowRecord> records;
  int begins = 0, ends = 0;
};

// The one spelling of every kind and point: the schema's (instrument/SCHEMA.md), in its order.
TEST(ObserverNames, EveryKindAndPointRoundTripsInSchemaOrder) {
  const std::vector<std::string> kinds = {"k",          "v",         "k_spec",   "v_spec",
                                          "conv_state", "ssm_state", "mtp_k",    "mtp_v",
                                          "hidden_out", "logits",    "seq_state"};
  ASSERT_EQ(AllItemKinds().size(), kinds.size());
  std::size_t i = 0;
  for (ItemKind k : AllItemKinds()) {
    EXPECT_EQ(static_cast<std::size_t>(k), i);
    EXPECT_EQ(ItemKindName(k), kinds[i]);
    EXPECT_EQ(ParseItemKind(ItemKindName(k)), k) << ItemKindName(k);
    EXPECT_EQ(IsLayerItem(k), i <= 5) << ItemKindName(k);
    ++i;
  }
  const std::vector<std::string> points = {"pre_verify", "post_verify", "commit"};
  ASSERT_EQ(AllCheckpointPoints().size(), points.size());
  i = 0;
  for (CheckpointPoint p : AllCheckpointPoints()) {
    EXPECT_EQ(static_cast<std::size_t>(p), i);
    EXPECT_EQ(CheckpointPointName(p), points[i]);
    EXPECT_EQ(ParseCheckpointPoint(CheckpointPointName(p)), p) << CheckpointPointName(p);
    ++i;
  }
}

TEST(ObserverNames, UnknownNamesAreRejected) {
  for (const char* bad : {"", "K", "kv", "k ", "mtp", "mtp/k", "logit", "hidden", "?"})
    EXPECT_FALSE(ParseItemKind(bad).has_value()) << "'" << bad << "'";
  for (const char* bad : {"", "pre", "post", "Commit", "commit ", "?"})
    EXPECT_FALSE(ParseCheckpointPoint(bad).has_value()) << "'" << bad << "'";
  EXPECT_STREQ(ItemKindName(static_cast<ItemKind>(kNumItemKinds)), "?");
  EXPECT_STREQ(CheckpointPointName(static_cast<CheckpointPoint>(kNumCheckpointPoints)), "?");
}

// --inject perturb:...:item=I takes the perturbable kinds by their schema names; the messages
// list them.
// Every kind's fields go through the one key=value splitter: a field without '=' is refused by
// name, and the last field of a spec is read too (the splitter stops at the end, not before it).
TEST(ObserverNames, InjectionFieldsAreKeyValueForEveryKind) {
  for (const char* spec : {"delay:stage=1:window", "perturb:layer=1:item=k:eps",
                           "perturb-op:layer=1:op=q_proj:window=0:row=0:ulps"}) {
    auto bad = ParseInjections({spec});
    ASSERT_FALSE(bad.ok()) << spec;
    EXPECT_NE(bad.status().message().find("expected key=value, got '"), std::string::npos)
        << bad.status().ToString();
  }
  auto last = ParseInjections({"delay:stage=1:window=2:ms=7"});
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ((*last)[0].window, 2);
  EXPECT_DOUBLE_EQ((*last)[0].ms, 7.0);
}

TEST(ObserverNames, InjectionItemsAreKindsByName) {
  auto ok = ParseInjections({"perturb:layer=3:item=ssm_state:eps=0.1",
                             "perturb:stage=1:item=hidden_out:eps=1", "perturb:item=logits:eps=0.5",
                             "perturb:layer=0:item=v:eps=2"});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_EQ(ok->size(), 4u);
  EXPECT_EQ((*ok)[0].item, ItemKind::kSsmState);
  EXPECT_EQ((*ok)[1].item, ItemKind::kHiddenOut);
  EXPECT_EQ((*ok)[2].item, ItemKind::kLogits);
  EXPECT_EQ((*ok)[3].item, ItemKind::kV);
  for (const char* spec :
       {"perturb:layer=0:item=k_spec:eps=1", "perturb:item=mtp_k:eps=1", "perturb:item=K:eps=1"}) {
    auto bad = ParseInjections({spec});
    ASSERT_FALSE(bad.ok()) << spec;
    EXPECT_NE(
        bad.status().ToString().find("(expected k, v, conv_state, ssm_state, hidden_out, logits)"),
        std::string::npos)
        << bad.status().ToString();
  }
  auto no_layer = ParseInjections({"perturb:item=conv_state:eps=1"});
  ASSERT_FALSE(no_layer.ok());
  EXPECT_NE(no_layer.status().ToString().find("item conv_state needs layer=L"), std::string::npos);
  auto with_layer = ParseInjections({"perturb:layer=1:item=logits:eps=1"});
  ASSERT_FALSE(with_layer.ok());
  EXPECT_NE(with_layer.status().ToString().find("item logits takes no layer"), std::string::npos);
  auto no_item = ParseInjections({"perturb:layer=1:eps=1"});
  ASSERT_FALSE(no_item.ok());
  EXPECT_NE(no_item.status().ToString().find("a perturbation needs item=I"), std::string::npos);
}

TEST(Observer, CheckpointsHoldTheDocumentedState) {
  const auto& w = test::Model("tiny");
  EngineConfig c;
  c.model = test::ModelDir("tiny");
  c.threads = 2;
  c.max_new = 24;
  c.ignore_eos = true;
  c.spec = 4;
  RecordingObserver obs({0, 1, 2, 3, 4, 5});
  auto e = Engine::Create(c, w);
  ASSERT_TRUE(e.ok());
  GenerateHooks hooks;
  hooks.observer = &obs;
  auto r = Generate(**e, EncodeBytes("Observers see the state at every checkpoint."), &hooks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(obs.begins, 18);
  EXPECT_EQ(obs.ends, 18);
  ASSERT_EQ(obs.records.size(), r->windows.size());
  for (const auto& rec : obs.records)
    EXPECT_GE(rec.export_ns, 0) << "export time is measured when observed";

  const int n_attn = w.config.n_full_attention_layers(), n_gdn = w.config.n_layers - n_attn;
  const int base = 2 * n_attn + 2 * n_gdn + 2;  // k, v / conv, ssm / mtp k, v
  bool saw_draft = false;
  for (int win = 0; win < 6; ++win) {
    const WindowRecord& rec = r->windows[static_cast<std::size_t>(win)];
    saw_draft = saw_draft || rec.T > 1;
    // Item counts per checkpoint (the seed's "93 / 94 / 93" for this model).
    EXPECT_EQ((obs.counts[{win, CheckpointPoint::kPreVerify}]), base);
    EXPECT_EQ((obs.counts[{win, CheckpointPoint::kPostVerify}]),
              base + 2 * n_attn + (c.stages - 1) + 1);
    EXPECT_EQ((obs.counts[{win, CheckpointPoint::kCommit}]), base);
    for (int il = 0; il < w.config.n_layers; ++il) {
      const int is = [&] {
        for (int s = 0; s < (*e)->n_stages(); ++s)
          if (il >= (*e)->stage(s).layer_begin() && il < (*e)->stage(s).layer_end()) return s;
        return -1;
      }();
      if (w.config.is_full_attention(il)) {
        for (ItemKind kind : {ItemKind::kK, ItemKind::kV}) {
          const auto& pre = obs.items[{win, CheckpointPoint::kPreVerify, is, il, kind}];
          const auto& post = obs.items[{win, CheckpointPoint::kPostVerify, is, il, kind}];
          const auto& com = obs.items[{win, CheckpointPoint::kCommit, is, il, kind}];
          // post_verify: committed rows equal the previous commit's; commit: p + accepted + 1 rows.
          EXPECT_EQ(pre.meta.rows, rec.p);
          EXPECT_EQ(post.meta.rows, rec.p);
          EXPECT_EQ(post.bytes, pre.bytes) << "window " << win << " layer " << il;
          if (win > 0) {
            EXPECT_EQ(pre.bytes,
                      (obs.items[{win - 1, CheckpointPoint::kCommit, is, il, kind}].bytes));
          }
          EXPECT_EQ(com.meta.rows, rec.p + rec.accepted + 1);
          EXPECT_EQ(0, std::memcmp(com.bytes.data(), pre.bytes.data(), pre.bytes.size()))
              << "commit keeps the prefix";
        }
        const auto& spec = obs.items[{win, CheckpointPoint::kPostVerify, is, il, ItemKind::kKSpec}];
        EXPECT_EQ(spec.meta.rows, rec.T) << "speculative rows are exactly the window's T rows";
        // The accepted speculative rows become committed rows, bit for bit.
        const auto& com = obs.items[{win, CheckpointPoint::kCommit, is, il, ItemKind::kK}];
        const std::size_t rb = spec.meta.row_bytes;
        EXPECT_EQ(0,
                  std::memcmp(com.bytes.data() + static_cast<std::size_t>(rec.p) * rb,
                              spec.bytes.data(), static_cast<std::size_t>(rec.accepted + 1) * rb));
      } else {
        const auto& pre =
            obs.items[{win, CheckpointPoint::kPreVerify, is, il, ItemKind::kSsmState}];
        const auto& post =
            obs.items[{win, CheckpointPoint::kPostVerify, is, il, ItemKind::kSsmState}];
        EXPECT_EQ(post.bytes, pre.bytes) << "the recurrent checkpoint stays at p during verify";
      }
    }
    const auto& info = obs.infos[{win, CheckpointPoint::kCommit}];
    EXPECT_EQ(info.recurrent_pos, rec.p + rec.accepted + 1)
        << "checkpoint at the accepted position";
    EXPECT_EQ((obs.infos[{win, CheckpointPoint::kPostVerify}].recurrent_pos), rec.p);
    const auto& lg =
        obs.items[{win, CheckpointPoint::kPostVerify, c.stages - 1, -1, ItemKind::kLogits}];
    EXPECT_EQ(lg.meta.shape, (std::vector<std::int64_t>{rec.T, w.config.n_vocab}));
    const auto& h0 = obs.items[{win, CheckpointPoint::kPostVerify, 0, -1, ItemKind::kHiddenOut}];
    EXPECT_EQ(h0.meta.shape, (std::vector<std::int64_t>{rec.T, w.config.n_embd}));
  }
  EXPECT_TRUE(saw_draft) << "no speculative window among the observed ones";
}

TEST(Observer, UnobservedRunIsUnchangedAndExportUnknown) {
  const auto& w = test::Model("tiny");
  EngineConfig c;
  c.threads = 2;
  c.max_new = 16;
  c.ignore_eos = true;
  c.spec = 3;
  const auto prompt = EncodeBytes("Observing must not change what is computed.");
  auto a = Engine::Create(c, w);
  auto b = Engine::Create(c, w);
  RecordingObserver obs({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  GenerateHooks hooks;
  hooks.observer = &obs;
  auto ra = Generate(**a, prompt);
  auto rb = Generate(**b, prompt, &hooks);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->output, rb->output);
  ASSERT_EQ(ra->windows.size(), rb->windows.size());
  for (std::size_t i = 0; i < ra->windows.size(); ++i) {
    EXPECT_TRUE(ra->windows[i].SamePath(rb->windows[i]));
    EXPECT_EQ(ra->windows[i].export_ns, -1) << "no observer: export time is unknown, not zero";
  }
}

}  // namespace
}  // namespace lockstep
