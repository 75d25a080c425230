// The campaign report's service parts (issue 25) on hand-made run folders: the scope table of
// where each arm ran (fresh / shared, cold or warm with the tokens reused and the snapshot
// position, engine state including "lost: re-primed", the background load), what each pair's
// service contrast did (bitwise equal, or the first differing item), and the step composition
// of every matched window beside its verify time, in Markdown and as an inline SVG chart.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "lockstep/compare/align.h"
#include "lockstep/compare/report.h"
#include "lockstep/compare/state_diff.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/campaign_report.h"
#include "lockstep/harness/gates.h"
#include "lockstep/harness/ledger.h"
#include "test_util.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char* kServicePlan = R"(name = "svc-report"
question = "Does a request give the same state alone and under load, cold and warm?"
[model]
preset = "tiny"
[request]
prompt = "Where do two runs of the same configuration first differ?"
[engine]
slots = 9
max_new = 8
[gates]
output = true
state = true
exact = true
[[arm]]
name = "A1"
server = "fresh"
[[arm]]
name = "A3"
server = "shared"
prime = true
baseline = "A1"
[[arm]]
name = "A4"
server = "fresh"
baseline = "A1"
load = { requests = 8, concurrency = 4, prompt_tokens = [50, 400], max_new = 16, seed = 1 }
)";

const char* kProcessPlan = R"(name = "proc-report"
question = "q"
[model]
preset = "tiny"
[request]
prompt = "hello there"
[gates]
output = true
[[arm]]
name = "A1"
[[arm]]
name = "A2"
baseline = "A1"
)";

WindowRecord W(int idx, double verify_ms, int step_rows, int seqs, int prefill) {
  WindowRecord w;
  w.idx = idx;
  w.p = 58 + 2 * idx;
  w.T = 2;
  w.accepted = 1;
  w.source = DraftSource::kMtp;
  w.T_mtp = 1;
  w.draft = {5};
  w.emitted = {5, 6};
  w.verify_ns = static_cast<std::int64_t>(verify_ms * 1e6);
  w.step = 10 + idx;
  w.step_rows = step_rows;
  w.step_seqs = seqs;
  w.step_prefill_rows = prefill;
  return w;
}

// A1 alone in every step; A3 the same; A4 under load: window 1 shares its step with a 64-row
// prefill chunk (slow for that reason), window 3 with two other sequences' verify rows, window
// 5 is slow alone in its step.
std::vector<WindowRecord> Alone() {
  std::vector<WindowRecord> v;
  for (int i = 0; i < 6; ++i) v.push_back(W(i, 1.0, 2, 1, 0));
  return v;
}
std::vector<WindowRecord> UnderLoad() {
  std::vector<WindowRecord> v = Alone();
  v[1] = W(1, 4.0, 70, 3, 64);
  v[3] = W(3, 1.5, 6, 3, 0);
  v[5] = W(5, 5.0, 2, 1, 0);
  return v;
}

void WriteTrace(const std::string& path, const std::vector<WindowRecord>& ws) {
  std::string s;
  for (const auto& w : ws) s += w.ToJsonLine() + "\n";
  ASSERT_TRUE(WriteFileAtomic(path, s).ok());
  auto back = ReadWindowRecords(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
}

json Service(const std::string& server, bool cold, int reused, int snapshot,
             const std::string& state, int before, bool primed, bool load) {
  json s = {{"server", server},
            {"instance", server == "shared" ? "5ca1ab1e00112233445566778899aabb"
                                            : "f00dfeed00112233445566778899aabb"},
            {"engine_config_sha256", "c0ffee0000000000000000000000000000000000000000000000000000"},
            {"cold", cold},
            {"prompt_tokens_reused", reused},
            {"snapshot_position", snapshot},
            {"engine_state", state},
            {"primed", primed},
            {"requests_before", before},
            {"load", nullptr}};
  if (load) s["load_in_flight"] = true;
  if (load)
    s["load"] = {{"requests", 8},
                 {"concurrency", 4},
                 {"completed", 8},
                 {"failed", 0},
                 {"digest", "abcdef0123456789abcdef"},
                 {"digests", json::array()}};
  return s;
}

// A diff of two checkpoints of 3 items; `changed` items of window 1 differ in some bits
// (within the thresholds).
DiffResult Diff(int changed) {
  DiffResult d;
  d.compared = d.passed = 6;
  for (int w = 0; w < 2; ++w) {
    CheckpointSummary cp;
    cp.name = "0000" + std::to_string(w) + "_commit";
    cp.window = w;
    cp.point = "commit";
    cp.compared = cp.passed = 3;
    d.checkpoints.push_back(cp);
    for (int l = 0; l < 3; ++l) {
      ItemResult it;
      it.checkpoint = cp.name;
      it.window = w;
      it.point = "commit";
      it.stage = 0;
      it.layer = l;
      it.kind = "ssm_state";
      it.rel = "stage0/layer" + std::to_string(l) + "/ssm_state";
      it.dtype = "f32";
      it.label = "state";
      it.elements = it.rows = 16;
      it.stats.nrmse = w == 1 && l < changed ? 1e-7 : 0.0;
      it.stats.n_diff = w == 1 && l < changed ? 3 : 0;
      d.items.push_back(it);
    }
  }
  return d;
}

struct Arm {
  std::string name;
  std::vector<WindowRecord> windows;
  json service;
};

// A finished run folder: plan, ledger, each arm's stdout/trace/service.json, each pair's record.
std::string MakeRun(const std::string& plan, const std::vector<Arm>& arms, int changed_a4,
                    const std::string& verdict) {
  const std::string dir = test::NewDir("svc-report") + "/run";
  fs::create_directories(dir + "/compare");
  EXPECT_TRUE(WriteFileAtomic(dir + "/plan.toml", plan).ok());
  auto l = Ledger::Create(dir + "/ledger.jsonl");
  EXPECT_TRUE(l.ok());
  auto parsed = ParseCampaign(plan, "plan.toml", dir);
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_TRUE(l->Append("planned", "", {{"plan_dir", dir}}, true).ok());
  const Arm* base = nullptr;
  for (const Arm& a : arms) {
    const std::string ad = dir + "/arms/" + a.name;
    fs::create_directories(ad);
    WriteTrace(ad + "/trace.jsonl", a.windows);
    const json out = {{"output_ids", {1, 2, 3}}, {"output_tokens", 3}, {"stop_reason", "length"}};
    EXPECT_TRUE(WriteFileAtomic(ad + "/stdout.json", out.dump()).ok());
    if (a.service.is_object()) {
      EXPECT_TRUE(WriteFileAtomic(ad + "/service.json", a.service.dump()).ok());
    }
    EXPECT_TRUE(l->Append("sent", a.name, {{"repeat", 0}}, true).ok());
    json fin = {{"repeat", 0}, {"exit_code", 0}};
    if (a.service.is_object()) fin["service"] = a.service;
    EXPECT_TRUE(l->Append("finished", a.name, fin, true).ok());
    if (base == nullptr) {
      base = &a;
      continue;
    }
    ArmOutcome oa, ob;
    oa.name = base->name, ob.name = a.name;
    oa.ok = ob.ok = true;
    oa.exit_code = ob.exit_code = 0;
    oa.output_ids = ob.output_ids = {1, 2, 3};
    oa.stop_reason = ob.stop_reason = "length";
    oa.windows = base->windows, ob.windows = a.windows;
    oa.service = base->service, ob.service = a.service;
    const DiffResult d = Diff(a.name == "A4" ? changed_a4 : 0);
    const AlignResult al = AlignWindows(oa.windows, ob.windows);
    ArmSpec spec;
    for (const ArmSpec& s : parsed->arms)
      if (s.name == a.name) spec = s;
    const ComparisonResult cr = EvaluateComparison(*parsed, spec, oa, ob, &d, al);
    ReportInput in;
    in.a.arm = base->name, in.b.arm = a.name;
    in.diff = &d;
    in.align = &al;
    const json rec = {{"comparison", ToJson(cr)}, {"report", json::parse(RenderJson(in))}};
    EXPECT_TRUE(WriteFileAtomic(dir + "/compare/" + a.name + ".json", rec.dump()).ok());
    EXPECT_TRUE(l->Append("compared", a.name, ToJson(cr), true).ok());
  }
  EXPECT_TRUE(l->Append("done", "", {{"verdict", verdict}, {"reason", ""}}, true).ok());
  return dir;
}

std::vector<Arm> ServiceArms(const std::string& a3_state = "carried") {
  return {{"A1", Alone(), Service("fresh", true, 0, -1, "fresh", 0, false, false)},
          {"A3", Alone(), Service("shared", false, 56, 48, a3_state, 1, true, false)},
          {"A4", UnderLoad(), Service("fresh", true, 0, -1, "fresh", 0, false, true)}};
}

TEST(ServiceReport, ScopeStatesWhereEachArmRanColdOrWarmAndTheLoad) {
  const std::string dir = MakeRun(kServicePlan, ServiceArms(), 0, "pass");
  auto d = RenderCampaign(dir);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const std::string& md = d->markdown;
  EXPECT_NE(md.find("- Every arm's request ran on `lockstep serve` (below)"), std::string::npos);
  EXPECT_NE(md.find("| A1 | fresh | f00dfeed0011, config c0ffee000000 | fresh (a server started "
                    "for this arm) | cold | 0 | none | no | 0 | none |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| A3 | shared | 5ca1ab1e0011, config c0ffee000000 | carried (the shared "
                    "server of this run) | **warm** | 56 | 48 | yes | 1 | none |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| A4 | fresh | f00dfeed0011, config c0ffee000000 | fresh (a server started "
                    "for this arm) | cold | 0 | none | no | 0 | 8 requests (concurrency 4): 8 "
                    "completed, 0 failed; digest abcdef012345; in flight when the request was "
                    "sent |"),
            std::string::npos)
      << md;
  // Each pair's contrast and what it did.
  EXPECT_NE(md.find("Service contrast of A3 vs A1: cold against warm; a fresh engine against one "
                    "that had served requests. Output identical. Every one of the 6 compared "
                    "items is bitwise equal. No service predicate is true."),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("Service contrast of A4 vs A1: alone against under background load. Output "
                    "identical. Every one of the 6 compared items is bitwise equal."),
            std::string::npos)
      << md;
  EXPECT_TRUE(FindForbiddenText(md, {dir}).empty());
  EXPECT_TRUE(FindForbiddenText(d->html, {dir}).empty());
}

TEST(ServiceReport, AResumedSharedEngineIsReportedRePrimed) {
  const std::string dir = MakeRun(kServicePlan, ServiceArms("lost: re-primed"), 0, "pass");
  auto d = RenderCampaign(dir);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_NE(d->markdown.find("| A3 | shared | 5ca1ab1e0011, config c0ffee000000 | lost: re-primed "
                             "(the shared server was gone after a resume"),
            std::string::npos)
      << d->markdown;
}

TEST(ServiceReport, TheFirstDifferingItemUnderLoadIsNamed) {
  const std::string dir = MakeRun(kServicePlan, ServiceArms(), 2, "fail");
  auto d = RenderCampaign(dir);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const std::string& md = d->markdown;
  const auto at = md.find(
      "Service contrast of A4 vs A1: alone against under background load. "
      "Output identical. 2 of 6 compared items differ bitwise; the first "
      "differing item: window 1, checkpoint 00001_commit, stage 0, layer 0, "
      "item ssm_state: NRMSE 1.0e-07");
  ASSERT_NE(at, std::string::npos) << md;
  const std::string line = md.substr(at, md.find('\n', at) - at);
  EXPECT_NE(line.find("Against the thresholds: 0 items failed (every difference is within the "
                      "thresholds)."),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("True: `load_changes_state`."), std::string::npos) << line;
}

TEST(ServiceReport, StepCompositionBesideVerifyTimePerMatchedWindow) {
  const std::string dir = MakeRun(kServicePlan, ServiceArms(), 0, "pass");
  auto d = RenderCampaign(dir);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const std::string& md = d->markdown;
  EXPECT_NE(md.find("| window | p | T | A1 verify ms | A1 step rows / seqs / prefill | A4 verify "
                    "ms | A4 step rows / seqs / prefill | reading |"),
            std::string::npos)
      << md;
  // The prefill-shared window, the window shared with verify rows only, the slow lone window.
  EXPECT_NE(md.find("| 1 | 60 | 2 | 1.000 | 2 / 1 / 0 | 4.000 | 70 / 3 / 64 | A4: slow (3.2x its "
                    "median), step shared with 64 prefill rows (3 sequences) |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| 3 | 64 | 2 | 1.000 | 2 / 1 / 0 | 1.500 | 6 / 3 / 0 | A4: step shared with "
                    "2 other sequences |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| 5 | 68 | 2 | 1.000 | 2 / 1 / 0 | 5.000 | 2 / 1 / 0 | A4: slow (4.0x its "
                    "median), step not shared: not explained by batching |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("- A4: 1 shared with a prefill chunk (median verify 4.000 ms); 1 shared with "
                    "other sequences' rows only (median verify 1.500 ms); 4 alone in their step "
                    "(median verify 1.000 ms)."),
            std::string::npos)
      << md;
  // A3 vs A1 (a service pair with no step shared) still shows its table.
  EXPECT_NE(md.find("Step composition per matched window (A3 vs A1)"), std::string::npos);
  // The HTML plots it: one chart per pair, bars with the prefill rows marked.
  const std::string& html = d->html;
  EXPECT_NE(html.find("A4 vs A1: verify time and step composition per window</h3>\n<svg"),
            std::string::npos);
  EXPECT_NE(html.find("class=\"step-composition\""), std::string::npos);
  EXPECT_NE(html.find("A4 window 1: verify 4.000 ms; step 11: 70 rows, 3 sequences, 64 prefill "
                      "rows"),
            std::string::npos);
  EXPECT_NE(html.find("fill=\"#6a3d9a\""), std::string::npos) << "prefill rows are marked";
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(ServiceReport, AFailedArmsUnknownFieldsRender) {
  std::vector<Arm> arms = ServiceArms();
  for (const char* k : {"cold", "primed", "engine_state", "server", "prompt_tokens_reused",
                        "snapshot_position", "instance", "load_in_flight"})
    arms[2].service[k] = nullptr;
  const std::string dir = MakeRun(kServicePlan, arms, 0, "fail");
  auto d = RenderCampaign(dir);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_NE(d->markdown.find("| A4 | fresh | unknown, config c0ffee000000 | unknown | cold | 0 | "
                             "none | no | 0 | 8 requests"),
            std::string::npos)
      << d->markdown;
}

TEST(ServiceReport, ProcessOnlyCampaignsKeepTheirReport) {
  const std::string dir =
      MakeRun(kProcessPlan, {{"A1", Alone(), json()}, {"A2", Alone(), json()}}, 0, "pass");
  auto d = RenderCampaign(dir);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_NE(d->markdown.find("- Each arm ran as a fresh `lockstep generate` process"),
            std::string::npos);
  EXPECT_EQ(d->markdown.find("Where each arm's request ran"), std::string::npos);
  EXPECT_EQ(d->markdown.find("Service contrast"), std::string::npos);
  EXPECT_EQ(d->markdown.find("Step composition"), std::string::npos)
      << "no service arm and no shared step: nothing to show";
  EXPECT_EQ(d->html.find("step-composition"), std::string::npos);
  // A process pair whose windows did share steps (generate --background) gets the table.
  std::vector<WindowRecord> busy = UnderLoad();
  const std::string dir2 =
      MakeRun(kProcessPlan, {{"A1", Alone(), json()}, {"A2", busy, json()}}, 0, "pass");
  auto d2 = RenderCampaign(dir2);
  ASSERT_TRUE(d2.ok());
  EXPECT_NE(d2->markdown.find("Step composition per matched window (A2 vs A1)"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
