// Gates and stop rules as pure logic (issue "Harness and campaigns"): what each gate decides from
// hand-built arm outcomes and alignments, and how stop rules combine predicates.
#include "lockstep/harness/gates.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace lockstep {
namespace {

WindowRecord W(int idx, int T, double verify_ms) {
  WindowRecord w;
  w.idx = idx;
  w.p = 100 + idx;
  w.T = T;
  w.verify_ns = static_cast<std::int64_t>(verify_ms * 1e6);
  w.wait_ns = w.compute_ns = w.verify_ns;
  return w;
}

ArmOutcome Arm(const std::string& name, std::vector<WindowRecord> ws) {
  ArmOutcome o;
  o.name = name;
  o.ok = true;
  o.exit_code = 0;
  o.output_ids = {1, 2, 3};
  o.stop_reason = "length";
  o.windows = ws;
  o.repeats = {ws};
  return o;
}

Campaign Plan() {
  Campaign c;
  c.gates.output = true;
  c.gates.state = true;
  c.gates.path_within = 0;
  c.gates.aggregate_rel_max = 0.10;
  c.gates.window_abs_ms = 5.0;
  c.gates.window_rel = 0.5;
  return c;
}

const GateOutcome* Find(const ComparisonResult& r, const std::string& name) {
  for (const auto& g : r.gates)
    if (g.name == name) return &g;
  return nullptr;
}

TEST(Gates, IdenticalArmsPassEveryGate) {
  Campaign c = Plan();
  ArmSpec arm;
  arm.name = "A2";
  auto a = Arm("A1", {W(0, 1, 10), W(1, 3, 12), W(2, 2, 11)});
  auto b = Arm("A2", {W(0, 1, 10), W(1, 3, 12), W(2, 2, 11)});
  DiffResult d;
  d.compared = d.passed = 5;
  auto r = EvaluateComparison(c, arm, a, b, &d, AlignWindows(a.windows, b.windows));
  EXPECT_TRUE(r.passed);
  EXPECT_EQ(r.gates.size(), 5u);  // output, state, path, aggregate, per-window
  EXPECT_FALSE(r.predicates.at("path_diverged"));
  EXPECT_FALSE(r.predicates.at("window_timing_unstable"));
}

TEST(Gates, EachGateFailsOnItsOwnEvidence) {
  Campaign c = Plan();
  ArmSpec arm;
  arm.name = "A2";
  auto a = Arm("A1", {W(0, 1, 10), W(1, 3, 12), W(2, 2, 11), W(3, 2, 11)});
  auto b = Arm("A2", {W(0, 1, 10), W(1, 3, 40), W(2, 4, 11),
                      W(3, 2, 11)});  // slow window 1, path differs at 2
  b.output_ids = {1, 2, 4};
  DiffResult d;
  d.compared = 5;
  d.passed = 4;
  d.failed = 1;
  auto r = EvaluateComparison(c, arm, a, b, &d, AlignWindows(a.windows, b.windows));
  EXPECT_FALSE(r.passed);
  for (const char* g : {"output identical", "state within thresholds", "no path divergence",
                        "aggregate timing", "per-window timing"}) {
    ASSERT_NE(Find(r, g), nullptr) << g;
    EXPECT_FALSE(Find(r, g)->passed) << g;
  }
  EXPECT_TRUE(r.predicates.at("path_diverged"));
  EXPECT_TRUE(r.predicates.at("window_timing_unstable"));
  EXPECT_TRUE(r.predicates.at("output_differs"));
  EXPECT_TRUE(r.predicates.at("state_failed"));
}

TEST(Gates, PathWithinNToleratesALaterDivergence) {
  Campaign c = Plan();
  c.gates.path_within = 3;
  ArmSpec arm;
  arm.name = "A2";
  auto a = Arm("A1", {W(0, 1, 10), W(1, 3, 10), W(2, 2, 10), W(3, 2, 10)});
  auto b = Arm("A2", {W(0, 1, 10), W(1, 3, 10), W(2, 2, 10), W(3, 5, 10)});
  auto r = EvaluateComparison(c, arm, a, b, nullptr, AlignWindows(a.windows, b.windows));
  EXPECT_TRUE(Find(r, "no path divergence in the first 3 windows")->passed);
  EXPECT_TRUE(r.predicates.at("path_diverged"));
  EXPECT_FALSE(r.predicates.at("path_diverged_early"));
}

TEST(Gates, TimingPredicatesOnlyWhenThePlanAsks) {
  Campaign c;
  c.gates.output = true;
  ArmSpec arm;
  arm.name = "A2";
  auto a = Arm("A1", {W(0, 1, 10)});
  auto r = EvaluateComparison(c, arm, a, a, nullptr, AlignWindows(a.windows, a.windows));
  EXPECT_EQ(r.predicates.count("window_timing_unstable"), 0u);
  c.stop.push_back(StopRule{"s", false, {"aggregate_timing_failed"}, ""});
  r = EvaluateComparison(c, arm, a, a, nullptr, AlignWindows(a.windows, a.windows));
  EXPECT_EQ(r.predicates.count("window_timing_unstable"), 1u);
}

TEST(StopRules, AnyAllAndControlsExcluded) {
  Campaign c;
  c.stop.push_back(StopRule{"all-of", true, {"path_diverged", "state_failed"}, "both"});
  c.stop.push_back(StopRule{"any-of", false, {"output_differs", "path_diverged"}, "either"});
  ComparisonResult aa;
  aa.predicates = {{"path_diverged", true}, {"state_failed", false}, {"output_differs", false}};
  auto s = EvaluateStopRules(c, {aa});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rule->name, "any-of");  // all-of needs state_failed too
  EXPECT_EQ(s->fired_by, std::vector<std::string>{"path_diverged"});
  aa.predicates["state_failed"] = true;
  EXPECT_EQ(EvaluateStopRules(c, {aa})->rule->name, "all-of");
  // A positive control's failures never stop the campaign (it is meant to fail).
  ComparisonResult control;
  control.control = true;
  control.predicates = {{"path_diverged", true}, {"state_failed", true}, {"output_differs", true}};
  EXPECT_FALSE(EvaluateStopRules(c, {control}).has_value());
  EXPECT_FALSE(EvaluateStopRules(c, {}).has_value());
}

// No vacuous gates (issue 20): skips beyond the plan's max_skipped, a path that cannot differ and
// a control whose injection never fired all fail with their reason.
TEST(Gates, VacuousStateAndPathFail) {
  Campaign c = Plan();
  ArmSpec arm;
  arm.name = "A2";
  auto a = Arm("A1", {W(0, 1, 10), W(1, 3, 12)});
  DiffResult d;
  d.compared = d.passed = 62;
  d.skipped = 186;
  d.vacuous = "186 items skipped, more than --max-skipped 0 (62 compared)";
  auto r = EvaluateComparison(c, arm, a, a, &d, AlignWindows(a.windows, a.windows));
  ASSERT_NE(Find(r, "state within thresholds"), nullptr);
  EXPECT_FALSE(Find(r, "state within thresholds")->passed);
  EXPECT_NE(Find(r, "state within thresholds")->message.find("more than --max-skipped 0"),
            std::string::npos);
  EXPECT_TRUE(r.predicates.at("state_failed"));
  auto t1 = Arm("A1", {W(0, 1, 10), W(1, 1, 10), W(2, 1, 10)});
  auto p = EvaluateComparison(c, arm, t1, t1, nullptr, AlignWindows(t1.windows, t1.windows));
  ASSERT_NE(Find(p, "no path divergence"), nullptr);
  EXPECT_FALSE(Find(p, "no path divergence")->passed);
  EXPECT_NE(Find(p, "no path divergence")->message.find("nothing compared: every one of the 3"),
            std::string::npos)
      << Find(p, "no path divergence")->message;
}

TEST(Gates, AControlWhoseInjectionDidNotFireIsNotApplied) {
  Campaign c = Plan();
  c.gates = GateSpec{};
  c.gates.state = true;
  c.control = "perturb:layer=3:item=k:eps=1e-2:window=15";
  ArmSpec arm;
  arm.name = "control";
  arm.control = true;
  auto a = Arm("A1", {W(0, 1, 10), W(1, 3, 12)});
  auto b = a;
  b.name = "control";
  b.injections = {{{"text", c.control}, {"fired", false}, {"count", 0}}};
  DiffResult d;
  d.compared = d.passed = 5;
  auto r = EvaluateComparison(c, arm, a, b, &d, AlignWindows(a.windows, b.windows));
  EXPECT_FALSE(r.control_applied);
  ASSERT_NE(Find(r, "control applied"), nullptr);
  EXPECT_FALSE(Find(r, "control applied")->passed);
  EXPECT_TRUE(r.predicates.at("control_missed"));
  auto back = ComparisonFromJson(ToJson(r));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->control_applied);
  // Fired: applied, and the gates decide as before.
  b.injections[0]["fired"] = true;
  auto fired = EvaluateComparison(c, arm, a, b, &d, AlignWindows(a.windows, b.windows));
  EXPECT_TRUE(fired.control_applied);
  EXPECT_TRUE(Find(fired, "control applied")->passed);
  // Any other arm whose injection never fired fails "injections applied".
  ArmSpec other;
  other.name = "A2";
  auto o = EvaluateComparison(c, other, a, b, &d, AlignWindows(a.windows, b.windows));
  EXPECT_EQ(Find(o, "injections applied"), nullptr);
  b.injections[0]["fired"] = false;
  o = EvaluateComparison(c, other, a, b, &d, AlignWindows(a.windows, b.windows));
  ASSERT_NE(Find(o, "injections applied"), nullptr);
  EXPECT_FALSE(o.passed);
}

TEST(Gates, ComparisonJsonRoundTrip) {
  ComparisonResult r;
  r.arm = "A2";
  r.baseline = "A1";
  r.passed = false;
  r.gates = {GateOutcome{"state within thresholds", false, "1 failed"}};
  r.predicates = {{"state_failed", true}};
  auto back = ComparisonFromJson(ToJson(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->arm, "A2");
  EXPECT_FALSE(back->passed);
  EXPECT_EQ(back->gates.size(), 1u);
  EXPECT_TRUE(back->predicates.at("state_failed"));
  EXPECT_FALSE(ComparisonFromJson(nlohmann::json::object()).ok());
}

// ---- the service predicates (issue 25): from both sides' ArmOutcome::service and the diff ----

nlohmann::json Service(const std::string& server, bool cold, int requests_before,
                       const std::string& load_digest = "") {
  nlohmann::json s = {{"server", server},
                      {"cold", cold},
                      {"prompt_tokens_reused", cold ? 0 : 32},
                      {"requests_before", requests_before},
                      {"load", nullptr}};
  if (!load_digest.empty())
    s["load"] = {{"requests", 8}, {"completed", 8}, {"failed", 0}, {"digest", load_digest}};
  return s;
}

// A diff of 4 compared items; `changed` of them differ in some bits (still within thresholds).
DiffResult Diff(int changed) {
  DiffResult d;
  d.compared = d.passed = 4;
  for (int i = 0; i < 4; ++i) {
    ItemResult it;
    it.checkpoint = "00001_commit";
    it.rel = "stage0/layer" + std::to_string(i) + "/k";
    it.stats.n_diff = i < changed ? 3 : 0;
    d.items.push_back(it);
  }
  return d;
}

struct Pair {
  ArmOutcome a, b;
};

ComparisonResult Judge(const Pair& p, const DiffResult* d, const Campaign& c = Plan()) {
  ArmSpec arm;
  arm.name = p.b.name;
  return EvaluateComparison(c, arm, p.a, p.b, d, AlignWindows(p.a.windows, p.b.windows));
}

Pair Sides(nlohmann::json sa, nlohmann::json sb) {
  Pair p{Arm("A1", {W(0, 1, 10), W(1, 3, 12), W(2, 2, 11)}),
         Arm("A3", {W(0, 1, 10), W(1, 3, 12), W(2, 2, 11)})};
  p.a.service = std::move(sa);
  p.b.service = std::move(sb);
  return p;
}

TEST(ServicePredicates, WarmDiffersFromColdNeedsAWarmSideAndABitwiseDifference) {
  const DiffResult equal = Diff(0), changed = Diff(1);
  // Cold vs warm, bitwise equal: recorded, false.
  auto r = Judge(Sides(Service("fresh", true, 0), Service("shared", false, 1)), &equal);
  EXPECT_FALSE(r.predicates.at("warm_differs_from_cold"));
  EXPECT_TRUE(r.passed) << "a difference within thresholds passes the gates";
  // Cold vs warm, one item differs in some bits: true.
  r = Judge(Sides(Service("fresh", true, 0), Service("shared", false, 1)), &changed);
  EXPECT_TRUE(r.predicates.at("warm_differs_from_cold"));
  EXPECT_TRUE(r.predicates.at("engine_reuse_changes_state")) << "A3's engine served A1 first";
  EXPECT_FALSE(r.predicates.at("load_changes_state"));
  EXPECT_FALSE(r.service.at("bitwise_equal").get<bool>());
  EXPECT_EQ(r.service.at("contrast"), (nlohmann::json{"cold_warm", "engine_reuse"}));
  EXPECT_EQ(r.service["b"]["prompt_tokens_reused"], 32);
  // Both cold: no contrast, so no predicate, whatever differs.
  r = Judge(Sides(Service("fresh", true, 0), Service("fresh", true, 0)), &changed);
  EXPECT_FALSE(r.predicates.at("warm_differs_from_cold"));
  EXPECT_FALSE(r.predicates.at("engine_reuse_changes_state"));
  // Cold vs warm with only the output different (no state diff: a timing arm).
  auto p = Sides(Service("fresh", true, 0), Service("shared", false, 2));
  p.b.output_ids = {1, 2, 9};
  r = Judge(p, nullptr);
  EXPECT_TRUE(r.predicates.at("warm_differs_from_cold"));
  EXPECT_FALSE(r.service.at("state_compared").get<bool>());
}

TEST(ServicePredicates, LoadChangesStateAndPath) {
  const DiffResult equal = Diff(0), changed = Diff(2);
  auto r = Judge(Sides(Service("fresh", true, 0), Service("fresh", true, 0, "d1")), &changed);
  EXPECT_TRUE(r.predicates.at("load_changes_state"));
  EXPECT_FALSE(r.predicates.at("load_changes_path")) << "same windows";
  EXPECT_FALSE(r.predicates.at("warm_differs_from_cold"));
  EXPECT_EQ(r.service.at("contrast"), (nlohmann::json{"load"}));
  EXPECT_EQ(r.service["b"]["load_digest"], "d1");
  EXPECT_TRUE(r.service["a"]["load_digest"].is_null());
  // Same load on both sides: no contrast.
  r = Judge(Sides(Service("fresh", true, 0, "d1"), Service("fresh", true, 0, "d1")), &changed);
  EXPECT_FALSE(r.predicates.at("load_changes_state"));
  // Different loads (digests) are a contrast.
  r = Judge(Sides(Service("fresh", true, 0, "d1"), Service("fresh", true, 0, "d2")), &changed);
  EXPECT_TRUE(r.predicates.at("load_changes_state"));
  // Under load, bitwise equal: false.
  r = Judge(Sides(Service("fresh", true, 0), Service("fresh", true, 0, "d1")), &equal);
  EXPECT_FALSE(r.predicates.at("load_changes_state"));
  EXPECT_TRUE(r.service.at("bitwise_equal").get<bool>());
  // The path diverges under load (window 2 has another T): load_changes_path.
  auto p = Sides(Service("fresh", true, 0), Service("fresh", true, 0, "d1"));
  p.b.windows[2].T = 4;
  r = Judge(p, &equal);
  EXPECT_TRUE(r.predicates.at("load_changes_path"));
  EXPECT_FALSE(r.predicates.at("load_changes_state")) << "state and output bitwise equal";
  // A process baseline is a fresh engine's cold request without load.
  r = Judge(Sides(nullptr, Service("fresh", true, 0, "d1")), &changed);
  EXPECT_TRUE(r.predicates.at("load_changes_state"));
  EXPECT_EQ(r.service["a"]["server"], "process");
  // A failed item (a shape mismatch) is not bitwise equal either.
  DiffResult failed = Diff(0);
  failed.items[1].verdict = Verdict::kFail;
  r = Judge(Sides(Service("fresh", true, 0), Service("fresh", true, 0, "d1")), &failed);
  EXPECT_TRUE(r.predicates.at("load_changes_state"));
}

TEST(ServicePredicates, AFailedArmsNullFieldsReadAsUnknown) {
  const DiffResult changed = Diff(1);
  nlohmann::json failed = {
      {"server", "remote"},         {"cold", nullptr}, {"prompt_tokens_reused", nullptr},
      {"requests_before", nullptr}, {"load", nullptr}, {"instance", nullptr}};
  auto r = Judge(Sides(Service("fresh", true, 0), failed), &changed);
  EXPECT_FALSE(r.predicates.at("warm_differs_from_cold")) << "unknown reads as cold";
  EXPECT_EQ(r.service["b"]["prompt_tokens_reused"], 0);
  EXPECT_EQ(r.service["b"]["server"], "remote");
}

TEST(ServicePredicates, EngineReuseChangesState) {
  const DiffResult changed = Diff(1);
  auto r = Judge(Sides(Service("fresh", true, 0), Service("shared", true, 3)), &changed);
  EXPECT_TRUE(r.predicates.at("engine_reuse_changes_state"));
  EXPECT_FALSE(r.predicates.at("warm_differs_from_cold")) << "both cold";
  r = Judge(Sides(Service("shared", true, 1), Service("shared", true, 3)), &changed);
  EXPECT_FALSE(r.predicates.at("engine_reuse_changes_state")) << "both engines had served";
}

TEST(ServicePredicates, RecordedOnlyForServiceArmsOrWhenAStopRuleNamesThem) {
  const DiffResult changed = Diff(1);
  auto r = Judge(Sides(nullptr, nullptr), &changed);
  EXPECT_EQ(r.predicates.count("load_changes_state"), 0u);
  EXPECT_TRUE(r.service.is_null());
  EXPECT_FALSE(ToJson(r).contains("service"));
  Campaign c = Plan();
  c.stop.push_back(StopRule{"s", false, {"load_changes_state"}, "m", {}});
  r = Judge(Sides(nullptr, nullptr), &changed, c);
  EXPECT_FALSE(r.predicates.at("load_changes_state"));
  EXPECT_FALSE(r.predicates.at("warm_differs_from_cold"));
  // Every service predicate is a name stop rules accept.
  for (const char* p : {"warm_differs_from_cold", "load_changes_state", "load_changes_path",
                        "engine_reuse_changes_state"})
    EXPECT_NE(std::find(StopPredicates().begin(), StopPredicates().end(), p),
              StopPredicates().end())
        << p;
}

TEST(ServicePredicates, ComparisonRecordKeepsServiceAndAStopRuleFiresOnIt) {
  const DiffResult changed = Diff(1);
  auto r = Judge(Sides(Service("fresh", true, 0), Service("fresh", true, 0, "d1")), &changed);
  auto back = ComparisonFromJson(ToJson(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->service, r.service);
  EXPECT_TRUE(back->predicates.at("load_changes_state"));
  Campaign c = Plan();
  c.stop.push_back(StopRule{"load_breaks_aa", false, {"load_changes_state"}, "m", {}});
  auto stop = EvaluateStopRules(c, {*back});
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->fired_by, (std::vector<std::string>{"load_changes_state"}));
}

}  // namespace
}  // namespace lockstep
