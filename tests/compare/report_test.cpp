// Tests for compare/report.{h,cpp} and compare/report_html.cpp: Markdown structure and key lines,
// JSON keys against compare/REPORTS.md, HTML and JUnit well-formedness, escaping, the allowlist
// (FindForbiddenText on every rendered format) and the limitations list. Inputs are built by
// hand, so these tests do not depend on the diff or alignment code.
#include "lockstep/compare/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace lockstep {
namespace {

using json = nlohmann::ordered_json;  // keeps the rendered key order for the REPORTS.md check

// ---- hand-built inputs ----

ArmInfo Arm(const std::string& name, int spec) {
  ArmInfo a;
  a.arm = name;
  a.run_id = "20261025T120000Z-" + name;
  a.model_sha256_12 = "bb472f0af814";
  a.request_sha256_12 = "5c8dd3225281";
  a.config_sha256_12 = spec == 4 ? "0123456789ab" : "ba9876543210";
  a.config = {{"backend", "\"cpu\""},         {"stages", "4"},       {"split", "[12,24,36]"},
              {"spec", std::to_string(spec)}, {"pcie_frac", "0.55"}, {"mtp", "true"}};
  a.prompt_tokens = 130658;
  a.output_tokens = 231;
  a.stop_reason = "eos";
  a.windows = 60;
  a.checkpoints = 3;
  a.sampler.n_samples = 25;
  a.sampler.interval_median_ns = 100'400'000;
  a.sampler.interval_max_ns = 111'600'000;
  a.sampler.nvml = "unknown: no NVIDIA driver";
  a.unknowns = {"counters/stage0 first_call_ns", "counters/stage1 graph_captures"};
  a.has_export = true;
  return a;
}

ItemResult Item(const std::string& cp, int window, const std::string& point, int stage, int layer,
                const std::string& kind) {
  ItemResult it;
  it.checkpoint = cp;
  it.window = window;
  it.point = point;
  it.stage = stage;
  it.layer = layer;
  it.kind = kind;
  it.rel = layer >= 0
               ? "stage" + std::to_string(stage) + "/layer" + std::to_string(layer) + "/" + kind
               : "stage" + std::to_string(stage) + "/" + kind;
  it.dtype = kind == "logits" ? "f32" : "bf16";
  it.label = kind == "logits" ? "logits" : (kind == "k" || kind == "v" ? "committed" : "state");
  it.rows = 16;
  it.capacity_rows = 64;
  it.elements = 1024;
  it.stats.nrmse =
      layer == 3 ? 1.5e-6 : 0.0;  // one group off zero, so the heat map has a scale colour
  it.nrmse_max = 2e-4;
  if (kind == "logits") {
    it.has_kl = true;
    it.kl.kl_max = 1e-9;
    it.kl.kl_mean = 1e-10;
    it.kl.rows = 1;
    it.kl.top1_agree = 1;
    it.kl_max = 1e-5;
  }
  return it;
}

// Three checkpoints with 93 / 94 / 93 compared items; the first also skips one item.
DiffResult PassingDiff() {
  DiffResult d;
  d.thresholds.nrmse_max = 2e-4;
  d.thresholds.kl_max = 1e-5;
  const std::vector<std::tuple<std::string, int, std::string, int, std::int64_t>> cps = {
      {"00000_pre_verify", 0, "pre_verify", 93, 1},
      {"00000_post_verify", 0, "post_verify", 94, 1},
      {"00000_commit", 0, "commit", 93, 1}};
  for (const auto& [name, window, point, n, T] : cps) {
    CheckpointSummary c;
    c.name = name;
    c.window = window;
    c.point = point;
    c.p = 130657;
    c.T = T;
    for (int i = 0; i < n - 1; ++i)
      d.items.push_back(Item(name, window, point, i % 4, i / 4, i % 2 ? "v" : "k"));
    d.items.push_back(Item(name, window, point, 3, -1, "logits"));
    c.compared = c.passed = n;
    if (point == "pre_verify") {
      ItemResult s = Item(name, window, point, 0, 40, "k_spec");  // a group of its own: a grey cell
      s.verdict = Verdict::kSkip;
      s.reason = "no speculative rows in A";
      s.elements = 0;
      d.items.push_back(s);
      c.skipped = 1;
      c.skip_reasons["no speculative rows in A"] = 1;
    }
    d.compared += c.compared;
    d.passed += c.passed;
    d.skipped += c.skipped;
    d.checkpoints.push_back(c);
  }
  return d;
}

// A second window's commit fails at stage 1 layer 5 k (NRMSE 3.1e-02).
DiffResult FailingDiff() {
  DiffResult d = PassingDiff();
  CheckpointSummary c;
  c.name = "00001_commit";
  c.window = 1;
  c.point = "commit";
  c.p = 130658;
  c.T = 4;
  d.items.push_back(Item(c.name, 1, "commit", 1, 4, "k"));
  ItemResult bad = Item(c.name, 1, "commit", 1, 5, "k");
  bad.verdict = Verdict::kFail;
  bad.stats.nrmse = 3.1e-2;
  bad.stats.max_abs = 0.25;
  bad.stats.n_diff = 17;
  bad.stats.first_diff = 3;
  d.first_failure = static_cast<std::int64_t>(d.items.size());
  d.items.push_back(bad);
  ItemResult nan = Item(c.name, 1, "commit", 2, 7, "ssm_state");
  nan.verdict = Verdict::kFail;
  nan.stats.nrmse = std::numeric_limits<double>::quiet_NaN();
  nan.stats.non_finite = true;
  d.items.push_back(nan);
  c.compared = 3;
  c.passed = 1;
  c.failed = 2;
  d.compared += 3;
  d.passed += 1;
  d.failed += 2;
  d.checkpoints.push_back(c);
  d.thresholds.nrmse_by_kind["ssm_state"] = 1e-3;
  return d;
}

WindowRecord Window(int idx, int p, int T, double verify_ms) {
  WindowRecord w;
  w.idx = idx;
  w.p = p;
  w.T = T;
  w.T_mtp = T - 1;
  w.verify_ns = static_cast<std::int64_t>(verify_ms * 1e6);
  return w;
}

struct Traces {
  std::vector<WindowRecord> a, b;
};

Traces MakeTraces() {
  Traces t;
  for (int i = 0; i < 60; ++i) t.a.push_back(Window(i, 1190 + i, 4, 30.0 + (i % 3)));
  for (int i = 0; i < 58; ++i) t.b.push_back(Window(i, 1190 + i, 4, 31.0 + (i % 2)));
  t.b[47].verify_ns = 395'988'000;
  t.b[47].T = 2;
  return t;
}

// Diverges at window 45 (p=1234): A1 T=6 from the suffix index, A2 T=4 from the MTP head.
AlignResult DivergedAlign(const Traces& t) {
  AlignResult al;
  al.fields = {"p", "T", "T_mtp", "merged", "from_sfx", "chain_n"};
  al.n_a = static_cast<int>(t.a.size());
  al.n_b = static_cast<int>(t.b.size());
  al.matched = 45;
  al.diverged = true;
  al.div_idx = 45;
  WindowRecord wa = Window(45, 1234, 6, 30.0), wb = Window(45, 1234, 4, 31.0);
  wa.T_mtp = 6;
  wa.from_sfx = true;
  wb.T_mtp = 4;
  al.div_a = wa;
  al.div_b = wb;
  al.differing_fields = {"T", "T_mtp", "from_sfx"};
  for (const char* name : {"verify", "wait", "compute", "draft", "commit", "export"}) {
    IntervalDiff d;
    d.name = name;
    d.known = std::string(name) != "export";
    if (d.known) {
      d.delta_ms.assign(45, 0.5);
      d.max_abs_delta_ms = 591.667;
      d.max_at = 1;
      d.median_delta_ms = 0.5;
      d.median_abs_delta_ms = 0.5;
      d.sum_a_ms = 1400.0;
      d.sum_b_ms = 1422.5;
      d.rel_diff = 22.5 / 1400.0;
    }
    al.timing.push_back(d);
  }
  al.rest_a.assign(t.a.begin() + 45, t.a.end());
  al.rest_b.assign(t.b.begin() + 45, t.b.end());
  NotableWindow n;
  n.idx = 47;
  n.p = 1236;
  n.T = 2;
  n.verify_ms = 395.988;
  n.ratio_to_median = 12.5;
  n.after_divergence = true;
  al.notable_b.push_back(n);
  NotableWindow m = n;
  m.idx = 10;
  m.T = 4;
  m.verify_ms = 250.0;
  m.after_divergence = false;
  al.notable_a.push_back(m);
  al.median_verify_ms_a = 31.0;
  al.median_verify_ms_b = 31.5;
  return al;
}

AlignResult EqualAlign(int n) {
  AlignResult al;
  al.fields = {"p", "T", "T_mtp", "merged", "from_sfx", "chain_n"};
  al.n_a = al.n_b = al.matched = n;
  IntervalDiff d;
  d.name = "verify";
  d.sum_a_ms = d.sum_b_ms = 10.0;
  al.timing.push_back(d);
  return al;
}

// One fully populated input: every nullable JSON object is present.
struct Fixture {
  DiffResult diff = FailingDiff();
  Traces traces = MakeTraces();
  AlignResult align = DivergedAlign(traces);
  ReportInput in;
  Fixture() {
    in.a = Arm("A1", 4);
    in.b = Arm("A2", 4);
    in.diff = &diff;
    in.align = &align;
    in.windows_a = &traces.a;
    in.windows_b = &traces.b;
  }
};

// ---- small text helpers ----

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::size_t Count(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string line; std::getline(is, line);) out.push_back(line);
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += "[" + x + "] ";
  return s;
}

// ---- Markdown ----

TEST(ReportMarkdownTest, HeadingsInOrder) {
  Fixture f;
  const std::string md = RenderMarkdown(f.in);
  std::vector<std::string> headings;
  for (const std::string& line : Lines(md))
    if (line.starts_with("#")) headings.push_back(line);
  const std::vector<std::string> want = {
      "# lockstep A/A diagnostic",  "## Tested configuration and scope",
      "## Early state checks",      "## Timing and execution-path observations",
      "## Measurement limitations", "## Conclusion"};
  EXPECT_EQ(headings, want);
}

// Host memory is MiB in every report (issue 36: the campaign report's unit), never GiB.
TEST(ReportMarkdownTest, MemoryIsInMiB) {
  Fixture f;
  f.in.a.sampler.min_host_available_bytes = std::int64_t{3} << 30;
  f.in.a.sampler.max_swap_used_bytes = std::int64_t{5} << 20;
  const std::string md = RenderMarkdown(f.in);
  EXPECT_NE(md.find("minimum host available memory 3072 MiB; maximum swap used 5 MiB"),
            std::string::npos)
      << md;
  EXPECT_EQ(md.find("GiB"), std::string::npos) << md;
}

TEST(ReportMarkdownTest, PassingStateKeyLines) {
  Fixture f;
  DiffResult pass = PassingDiff();
  f.in.diff = &pass;
  const std::string md = RenderMarkdown(f.in);
  EXPECT_TRUE(Contains(md, "There were 93 / 94 / 93 compared items at the respective checkpoints"))
      << md;
  EXPECT_TRUE(
      Contains(md,
               "- `00000_pre_verify`: 93 compared / 93 passed / 0 failed / 1 skipped (reason: no "
               "speculative rows in A), p=130657, T=1\n"))
      << md;
  EXPECT_TRUE(Contains(
      md,
      "- `00000_post_verify`: 94 compared / 94 passed / 0 failed / 0 skipped, p=130657, T=1\n"));
  EXPECT_TRUE(
      Contains(md, "Thresholds: NRMSE <= 2e-04 (no per kind overrides), logits KL <= 1e-05."))
      << md;
  EXPECT_TRUE(Contains(
      md,
      "Unused paged tails were excluded; speculative rows were compared only against speculative "
      "rows of the same (p, T), never as committed state."));
  EXPECT_TRUE(Contains(md, "All compared items passed."));
  EXPECT_FALSE(Contains(md, "First failing item"));
  const std::string tail = "No fix is claimed.\n";
  ASSERT_GE(md.size(), tail.size());
  EXPECT_EQ(md.substr(md.size() - tail.size()), tail);
  // The conclusion is the last section and ends with the sentence.
  EXPECT_LT(md.rfind("## Conclusion"), md.rfind("No fix is claimed."));
}

TEST(ReportMarkdownTest, FailingStateNamesFirstItem) {
  Fixture f;
  const std::string md = RenderMarkdown(f.in);
  EXPECT_TRUE(Contains(
      md, "First failing item: `00001_commit` stage 1 layer 5 `k` (NRMSE 3.1e-02 > 2e-04)"))
      << md;
  EXPECT_TRUE(Contains(
      md, "Thresholds: NRMSE <= 2e-04 (per kind overrides: ssm_state 1e-03), logits KL <= 1e-05"));
  EXPECT_TRUE(Contains(
      md, "- `00001_commit`: 3 compared / 1 passed / 2 failed / 0 skipped, p=130658, T=4"));
  EXPECT_TRUE(
      Contains(md, "| `00001_commit` | `stage2/layer7/ssm_state` | state | non-finite values |"))
      << md;
  EXPECT_FALSE(Contains(md, "All compared items passed."));
  EXPECT_TRUE(Contains(md, "- State: 2 of 283 compared items failed the thresholds."));
}

TEST(ReportMarkdownTest, DivergenceLinesNameBothArms) {
  Fixture f;
  const std::string md = RenderMarkdown(f.in);
  EXPECT_TRUE(Contains(md,
                       "First path divergence at window 45 (p=1234):\n\n"
                       "- A1: T=6, T_mtp=6, merged=false, from_sfx=true, chain_n=0.\n"
                       "- A2: T=4, T_mtp=4, merged=false, from_sfx=false, chain_n=0.\n"))
      << md;
  EXPECT_TRUE(Contains(md, "Differing fields: T, T_mtp, from_sfx."));
  EXPECT_TRUE(Contains(md, "Matched prefix: 45 windows."));
  EXPECT_TRUE(Contains(
      md,
      "| interval | sum A1 ms | sum A2 ms | rel diff | median delta ms | largest \\|delta\\| ms | "
      "at window |"));
  EXPECT_TRUE(Contains(md, "| verify | 1400.000 | 1422.500 | +1.61% | 0.500 | 591.667 | 1 |"))
      << md;
  EXPECT_TRUE(Contains(md, "| export | unknown | unknown |"));
  EXPECT_TRUE(
      Contains(md, "- A2 had a 395.988 ms T=2 verify at its own window 47 (after the divergence)"))
      << md;
  EXPECT_TRUE(Contains(
      md, "- A1 had a 250.000 ms T=4 verify at its own window 10 (in the matched prefix)"));
  EXPECT_TRUE(Contains(
      md,
      "After the divergence: A1 ran 15 more windows, A2 ran 13 (listed per side, not paired)."));
  EXPECT_TRUE(
      Contains(md, "- A1: windows 45 to 59, T of the first 8: 4, 4, 4, 4, 4, 4, 4, 4, ...;"))
      << md;
}

TEST(ReportMarkdownTest, DivergenceWhereOneTraceEnded) {
  Fixture f;
  f.align.div_b.reset();
  f.align.differing_fields.clear();
  f.align.n_b = 45;
  f.align.rest_b.clear();
  const std::string md = RenderMarkdown(f.in);
  EXPECT_TRUE(Contains(md, "First path divergence at window 45 (p=1234):")) << md;
  EXPECT_TRUE(Contains(md, "- A1: p=1234, T=6,")) << md;
  EXPECT_TRUE(Contains(md, "- A2: no window 45 (its trace ended after 45 windows).")) << md;
}

TEST(ReportMarkdownTest, NoDivergenceAndNothingCompared) {
  ReportInput in;
  AlignResult al = EqualAlign(12);
  in.align = &al;
  const std::string md = RenderMarkdown(in);
  EXPECT_TRUE(Contains(md, "No path divergence over 12 windows.")) << md;
  EXPECT_TRUE(Contains(md, "Matched prefix: 12 windows."));
  EXPECT_TRUE(Contains(md, "State was not compared in this report."));
  EXPECT_TRUE(Contains(md, "- State not compared for B vs A: this comparison has no state diff."))
      << md;
  EXPECT_FALSE(Contains(md, "After the divergence"));
  EXPECT_TRUE(md.ends_with("No fix is claimed.\n"));
}

// Device rows (a cuda trace) come with the note saying what they measure; host-only reports have
// neither.
TEST(ReportMarkdownTest, DeviceTimingRowsAndTheirNote) {
  Fixture f;
  std::string md = RenderMarkdown(f.in);
  EXPECT_FALSE(Contains(md, "dev_compute")) << md;
  EXPECT_FALSE(Contains(md, "CUDA-event"));
  for (const std::string& name : DeviceTimingIntervals()) {
    IntervalDiff d;
    d.name = name;
    d.delta_ms.assign(45, 0.25);
    d.max_at = 3;
    d.max_abs_delta_ms = 0.25;
    d.sum_a_ms = 100.0;
    d.sum_b_ms = 111.25;
    d.rel_diff = 0.1125;
    f.align.timing.push_back(d);
  }
  md = RenderMarkdown(f.in);
  EXPECT_TRUE(Contains(md, "| dev_compute | 100.000 | 111.250 | +11.25% |")) << md;
  EXPECT_TRUE(Contains(md, "| init | 100.000 |"));
  EXPECT_TRUE(Contains(
      md, "dev_wait, dev_compute and dev_copy are CUDA-event intervals on each stage's stream"));
  EXPECT_TRUE(Contains(md, "per-stage CUDA-event spans (dev_*)"));
  const json j = json::parse(RenderJson(f.in));
  ASSERT_EQ(j["alignment"]["timing"].size(),
            TimingIntervals().size() + DeviceTimingIntervals().size());
  EXPECT_EQ(j["alignment"]["timing"][7]["name"], "dev_compute");
  EXPECT_EQ(j["alignment"]["timing"][7]["sum_b_ms"], 111.25);
}

TEST(ReportMarkdownTest, ConfigurationTableMarksDifferences) {
  Fixture f;
  f.in.b = Arm("A2", 2);
  f.diff.config_differences = {"spec: 4 | 2", "model: /home/alice/m1 | /home/alice/m2"};
  const std::string md = RenderMarkdown(f.in);
  EXPECT_TRUE(Contains(md, "| `spec` | 4 | 2 | **differs** |")) << md;
  EXPECT_TRUE(Contains(md, "| `backend` | cpu | cpu |  |"));
  EXPECT_TRUE(Contains(md, "| model SHA-256 (first 12) | `bb472f0af814` | `bb472f0af814` |"));
  EXPECT_TRUE(Contains(md, "| output tokens | 231 | 231 |"));
  EXPECT_TRUE(Contains(md, "- spec: 4 \\| 2"));
  EXPECT_TRUE(Contains(md, "- model: differs (value not shown: not an allowlisted key)"));
  EXPECT_TRUE(FindForbiddenText(md).empty()) << Join(FindForbiddenText(md));
}

// ---- JSON ----

// Every `quoted` span of a line.
std::vector<std::string> Backticked(const std::string& line) {
  std::vector<std::string> out;
  for (std::size_t b = line.find('`'); b != std::string::npos; b = line.find('`', b + 1)) {
    const std::size_t e = line.find('`', b + 1);
    if (e == std::string::npos) break;
    out.push_back(line.substr(b + 1, e - b - 1));
    b = e;
  }
  return out;
}

// Object path -> documented keys, from the tables in compare/REPORTS.md.
std::map<std::string, std::vector<std::string>> DocumentedKeys() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
#ifdef LOCKSTEP_SOURCE_DIR
  candidates.emplace_back(fs::path(LOCKSTEP_SOURCE_DIR) / "compare/REPORTS.md");
#endif
  candidates.push_back(fs::path(__FILE__).parent_path() / "../../compare/REPORTS.md");
  for (fs::path dir = fs::current_path(); !dir.empty(); dir = dir.parent_path()) {
    candidates.push_back(dir / "compare/REPORTS.md");
    if (dir == dir.parent_path()) break;
  }
  std::ifstream file;
  for (const fs::path& p : candidates) {
    file.open(p);
    if (file) break;
    file.clear();
  }
  EXPECT_TRUE(file.is_open()) << "compare/REPORTS.md not found (HINT: run from the source tree)";
  std::map<std::string, std::vector<std::string>> out;
  std::vector<std::string> paths;
  for (std::string line; std::getline(file, line);) {
    if (line.starts_with("Path: ")) {
      paths.clear();
      paths = Backticked(line);
    } else if (!paths.empty() && line.starts_with("| `")) {
      const std::vector<std::string> key = Backticked(line.substr(0, line.find(" |", 2)));
      if (key.size() == 1) {
        for (const std::string& p : paths) out[p].push_back(key[0]);
      }
    } else if (!line.starts_with("|") && !line.empty()) {
      paths.clear();
    }
  }
  return out;
}

// "$.state.items[]" -> every object at that path.
std::vector<const json*> Resolve(const json& root, const std::string& path) {
  std::vector<const json*> cur = {&root};
  std::istringstream is(path.substr(1));
  for (std::string part; std::getline(is, part, '.');) {
    if (part.empty()) continue;
    const bool each = part.ends_with("[]");
    if (each) part.resize(part.size() - 2);
    std::vector<const json*> next;
    for (const json* j : cur) {
      if (!j->is_object() || !j->contains(part)) continue;
      const json& v = (*j)[part];
      if (each) {
        for (const json& e : v) next.push_back(&e);
      } else {
        next.push_back(&v);
      }
    }
    cur = next;
  }
  return cur;
}

TEST(ReportJsonTest, KeysMatchReportsMd) {
  Fixture f;
  const json j = json::parse(RenderJson(f.in));
  const auto documented = DocumentedKeys();
  ASSERT_GE(documented.size(), 14u);
  std::set<std::string> checked;
  for (const auto& [path, keys] : documented) {
    const std::vector<const json*> objs = Resolve(j, path);
    ASSERT_FALSE(objs.empty()) << path << " not in the rendered JSON (or null in the fixture)";
    for (const json* o : objs) {
      ASSERT_TRUE(o->is_object()) << path;
      std::vector<std::string> got;
      for (auto it = o->begin(); it != o->end(); ++it) got.push_back(it.key());
      EXPECT_EQ(got, keys) << path
                           << ": code and compare/REPORTS.md disagree (keys in documented order)";
    }
    checked.insert(path);
  }
  // Every object in the JSON that is not a free-form map is documented.
  for (const char* p :
       {"$", "$.arms.a", "$.arms.b", "$.arms.a.sampler", "$.thresholds", "$.state",
        "$.state.first_failure", "$.state.checkpoints[]", "$.state.items[]", "$.alignment",
        "$.alignment.div_a", "$.alignment.div_b", "$.alignment.timing[]", "$.alignment.notable_a[]",
        "$.alignment.notable_b[]"})
    EXPECT_TRUE(checked.count(p)) << p << " has no table in compare/REPORTS.md";
}

TEST(ReportJsonTest, ValuesAndNulls) {
  Fixture f;
  const json j = json::parse(RenderJson(f.in));
  EXPECT_EQ(j["schema"], "lockstep.report");
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["arms"]["a"]["arm"], "A1");
  EXPECT_EQ(j["arms"]["a"]["config"]["split"], json::array({12, 24, 36}));
  EXPECT_EQ(j["arms"]["a"]["sampler"]["min_device_free_bytes"], nullptr);  // unknown, never 0
  EXPECT_EQ(j["thresholds"]["nrmse_max"], 2e-4);
  EXPECT_EQ(j["thresholds"]["nrmse_by_kind"]["ssm_state"], 1e-3);
  EXPECT_EQ(j["state"]["passed"], false);
  EXPECT_EQ(j["state"]["failed"], 2);
  EXPECT_EQ(j["state"]["first_failure"]["rel"], "stage1/layer5/k");
  EXPECT_EQ(j["state"]["first_failure"]["reason"], "NRMSE 3.1e-02 > 2e-04");
  const json& items = j["state"]["items"];
  ASSERT_EQ(items.size(), f.diff.items.size());
  EXPECT_EQ(items.back()["nrmse"], "nan");  // JSON has no NaN; null would read as "unknown"
  EXPECT_EQ(items.back()["non_finite"], true);
  EXPECT_EQ(items[0]["verdict"], "pass");
  EXPECT_EQ(items[0]["kl_max"], nullptr);
  EXPECT_EQ(items[92]["kind"], "logits");
  EXPECT_EQ(items[92]["kl_max_threshold"], 1e-5);
  EXPECT_EQ(items[93]["verdict"], "skip");
  EXPECT_EQ(items[93]["nrmse"], nullptr);  // not measured
  EXPECT_EQ(j["alignment"]["div_idx"], 45);
  EXPECT_EQ(j["alignment"]["div_a"]["from_sfx"], true);
  EXPECT_EQ(j["alignment"]["timing"][5]["known"], false);
  EXPECT_EQ(j["alignment"]["timing"][5]["sum_a_ms"], nullptr);
  EXPECT_EQ(j["alignment"]["rest_b_count"], 13);
  EXPECT_FALSE(j["limitations"].empty());
}

TEST(ReportJsonTest, NullSectionsAndInfinity) {
  ReportInput in;
  DiffResult d;
  d.thresholds.nrmse_max = std::numeric_limits<double>::infinity();
  in.diff = &d;
  json j = json::parse(RenderJson(in));
  EXPECT_EQ(j["alignment"], nullptr);
  EXPECT_EQ(j["state"]["first_failure"], nullptr);
  EXPECT_EQ(j["thresholds"]["nrmse_max"], "inf");
  in.diff = nullptr;
  j = json::parse(RenderJson(in));
  EXPECT_EQ(j["state"], nullptr);
  EXPECT_EQ(j["thresholds"], nullptr);
  EXPECT_EQ(j["arms"]["a"]["arm"], "A");  // fallback names
  EXPECT_EQ(j["arms"]["b"]["arm"], "B");
}

TEST(ReportJsonTest, InvalidUtf8DoesNotThrow) {
  ReportInput in;
  in.a.stop_reason = std::string("eos\xff\xfe");
  std::string out;
  ASSERT_NO_THROW(out = RenderJson(in));
  EXPECT_TRUE(json::accept(out));
}

// ---- HTML ----

TEST(ReportHtmlTest, SelfContainedWithTwoCharts) {
  Fixture f;
  const std::string html = RenderHtml(f.in);
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>")) << html.substr(0, 60);
  EXPECT_EQ(Count(html, "<svg"), 2u);
  EXPECT_EQ(Count(html, "<svg"), Count(html, "</svg>"));
  EXPECT_EQ(Count(html, "<section>"), Count(html, "</section>"));
  EXPECT_EQ(Count(html, "<table>"), Count(html, "</table>"));
  EXPECT_EQ(Count(html, "<ul>"), Count(html, "</ul>"));
  EXPECT_EQ(Count(html, "<strong>"), Count(html, "</strong>"));
  EXPECT_FALSE(Contains(html, "http"));
  EXPECT_FALSE(Contains(html, "<script"));
  EXPECT_TRUE(Contains(html, "<style>"));
  for (const char* h :
       {"Tested configuration and scope", "Early state checks",
        "Timing and execution-path observations", "Measurement limitations", "Conclusion"})
    EXPECT_TRUE(Contains(html, std::string("<h2>") + h + "</h2>")) << h;
  EXPECT_TRUE(Contains(html, "First path divergence at window 45 (p=1234):"));
  EXPECT_TRUE(Contains(html, "stroke-dasharray"));  // the divergence marker
  EXPECT_TRUE(Contains(html, "first path divergence (window 45)"));
  EXPECT_TRUE(Contains(html, "<polyline"));
  EXPECT_TRUE(Contains(html, "No fix is claimed."));
  EXPECT_TRUE(Contains(html, "<td><code>spec</code></td>")) << "config table rendered as a table";
  EXPECT_TRUE(Contains(html, "largest |delta| ms"));  // Markdown escapes undone
}

TEST(ReportHtmlTest, EscapesHostileNames) {
  Fixture f;
  const std::string hostile = "<script>&\"'";
  f.in.a.arm = hostile;
  f.in.title = "t " + hostile;
  f.diff.items.back().reason = hostile;
  const std::string html = RenderHtml(f.in);
  EXPECT_FALSE(Contains(html, "<script")) << "unescaped";
  EXPECT_FALSE(Contains(html, "&\"'"));
  EXPECT_TRUE(Contains(html, "&lt;script&gt;&amp;&quot;&#39;")) << "HTML-escaped in the text";
  EXPECT_TRUE(Contains(html, "&lt;script&gt;&amp;&quot;&apos;")) << "XML-escaped in the SVG legend";
  // Markdown backslash-escapes '<' (and '&', '|', '`', ...): no tag can start in the rendered text.
  const std::string md = RenderMarkdown(f.in);
  EXPECT_TRUE(Contains(md, "\\<script>\\&\"'")) << md.substr(0, 300);
  for (std::size_t p = md.find('<'); p != std::string::npos; p = md.find('<', p + 1)) {
    const char next = p + 1 < md.size() ? md[p + 1] : ' ';
    const bool tag_like = std::isalpha(static_cast<unsigned char>(next)) || next == '/';
    EXPECT_FALSE(tag_like && (p == 0 || md[p - 1] != '\\'))
        << "an unescaped tag in Markdown at " << p;
  }
  EXPECT_EQ(HtmlEscape("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&#39;f");
  EXPECT_EQ(XmlEscape("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
  EXPECT_EQ(XmlEscape(std::string("x\x01y", 3)), "x\xEF\xBF\xBDy");  // invalid in XML 1.0
}

TEST(ReportHtmlTest, VerifyChartEdgeCases) {
  AlignResult al;
  const std::vector<WindowRecord> none;
  std::string svg = SvgVerifyChart(al, none, none, "A", "B");
  EXPECT_TRUE(svg.starts_with("<svg"));
  EXPECT_TRUE(Contains(svg, "No per-window verify times to plot."));
  const std::vector<WindowRecord> one = {Window(0, 5, 1, 12.0)};
  svg = SvgVerifyChart(al, one, one, "A", "B");
  EXPECT_EQ(Count(svg, "<circle"), 2u) << "a single window is drawn as a marker per arm";
  EXPECT_FALSE(Contains(svg, "nan"));
  EXPECT_FALSE(Contains(svg, "inf"));
  // A long trace is reduced, and its spike survives.
  std::vector<WindowRecord> longer;
  for (int i = 0; i < 100000; ++i) longer.push_back(Window(i, i, 1, i == 77777 ? 900.0 : 10.0));
  svg = SvgVerifyChart(al, longer, none, "A", "B");
  EXPECT_LT(svg.size(), 100000u);
  EXPECT_TRUE(Contains(svg, ">900<") || Contains(svg, ">1000<")) << "y axis reaches the spike";
}

TEST(ReportHtmlTest, HeatmapColoursAndTooltips) {
  DiffResult d = FailingDiff();
  const std::string svg = SvgNrmseHeatmap(d);
  EXPECT_EQ(Count(svg, "<svg"), 1u);
  EXPECT_TRUE(Contains(svg, "fill=\"#000000\""));  // the NaN item
  EXPECT_TRUE(Contains(svg, "fill=\"#bdbdbd\""));  // the skipped k_spec group cell
  EXPECT_TRUE(Contains(svg, "fill=\"#2166ac\""));  // NRMSE 0
  EXPECT_TRUE(Contains(svg, "fill=\"#a50026\""));  // 3.1e-02 is > 100 x the threshold: deepest red
  EXPECT_TRUE(Contains(
      svg, "<title>s1 L5 @ 00001_commit: 1 items, 1 failed, 0 skipped; worst NRMSE 3.1e-02"))
      << svg.substr(0, 2000);
  EXPECT_TRUE(Contains(svg, ">s3 logits<"));
  EXPECT_TRUE(Contains(svg, "NRMSE / threshold (log scale)"));
  EXPECT_TRUE(Contains(SvgNrmseHeatmap(DiffResult{}), "No state items to plot."));
}

// ---- JUnit ----

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string parent;
};

// A small well-formedness check: balanced tags, quoted attributes, known entities only.
bool ParseXml(const std::string& x, std::vector<XmlElement>& out, std::string& error) {
  std::vector<std::string> stack;
  std::size_t i = x.find("?>");
  if (!x.starts_with("<?xml") || i == std::string::npos) return error = "no XML declaration", false;
  i += 2;
  auto is_name = [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  };
  while (i < x.size()) {
    if (x[i] == '&') {
      const std::string ent = x.substr(i, x.find(';', i) - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;")
        return error = "bad entity at " + std::to_string(i), false;
      ++i;
      continue;
    }
    if (x[i] == '>') return error = "stray '>' at " + std::to_string(i), false;
    if (x[i] != '<') {
      ++i;
      continue;
    }
    const std::size_t e = x.find('>', i);
    if (e == std::string::npos) return error = "unterminated tag", false;
    std::string tag = x.substr(i + 1, e - i - 1);
    i = e + 1;
    if (tag.starts_with("/")) {
      if (stack.empty() || stack.back() != tag.substr(1))
        return error = "mismatched </" + tag.substr(1) + ">", false;
      stack.pop_back();
      continue;
    }
    const bool self_closing = tag.ends_with("/");
    if (self_closing) tag.pop_back();
    XmlElement el;
    el.parent = stack.empty() ? "" : stack.back();
    std::size_t k = 0;
    while (k < tag.size() && is_name(tag[k])) ++k;
    if (k == 0) return error = "bad tag <" + tag + ">", false;
    el.name = tag.substr(0, k);
    while (k < tag.size()) {  // ' name="value"' pairs; values hold no '"' or '<'
      const std::size_t n0 = tag.find_first_not_of(' ', k);
      if (n0 == std::string::npos) break;
      if (n0 == k) return error = "no space before an attribute in <" + tag + ">", false;
      std::size_t n1 = n0;
      while (n1 < tag.size() && is_name(tag[n1])) ++n1;
      if (n1 == n0 || tag.compare(n1, 2, "=\"") != 0)
        return error = "bad attribute in <" + tag + ">", false;
      const std::size_t v1 = tag.find('"', n1 + 2);
      if (v1 == std::string::npos) return error = "unterminated attribute in <" + tag + ">", false;
      const std::string value = tag.substr(n1 + 2, v1 - n1 - 2);
      if (value.find('<') != std::string::npos)
        return error = "'<' in an attribute of <" + tag + ">", false;
      el.attrs[tag.substr(n0, n1 - n0)] = value;
      k = v1 + 1;
    }
    out.push_back(el);
    if (!self_closing) stack.push_back(el.name);
  }
  if (!stack.empty()) return error = "unclosed <" + stack.back() + ">", false;
  return true;
}

TEST(ReportJUnitTest, ParsesAndCounts) {
  Fixture f;
  const std::string x = RenderJUnit(f.in);
  std::vector<XmlElement> els;
  std::string error;
  ASSERT_TRUE(ParseXml(x, els, error)) << error << "\n" << x.substr(0, 1500);
  std::size_t testcases = 0, failures = 0, skipped = 0;
  std::map<std::string, XmlElement> suites;
  for (const XmlElement& e : els) {
    testcases += e.name == "testcase";
    failures += e.name == "failure";
    skipped += e.name == "skipped";
    if (e.name == "testsuite") suites[e.attrs.at("name")] = e;
  }
  const std::vector<GateOutcome> gates = InferredGates(f.in);
  ASSERT_EQ(gates.size(), 4u);  // state, output_identical, path_identical, config_identical
  EXPECT_EQ(testcases, f.diff.items.size() + gates.size());
  EXPECT_EQ(failures, 2u + 2u);  // two items; the state and path gates
  EXPECT_EQ(skipped, 1u);
  ASSERT_TRUE(suites.count("lockstep.state") && suites.count("lockstep.gates"));
  EXPECT_EQ(suites["lockstep.state"].attrs["tests"], std::to_string(f.diff.items.size()));
  EXPECT_EQ(suites["lockstep.state"].attrs["failures"], "2");
  EXPECT_EQ(suites["lockstep.state"].attrs["skipped"], "1");
  EXPECT_EQ(suites["lockstep.gates"].attrs["tests"], "4");
  EXPECT_EQ(suites["lockstep.gates"].attrs["failures"], "2");
  EXPECT_TRUE(Contains(x,
                       "<testcase classname=\"00001_commit\" name=\"stage1/layer5/k\">\n"
                       "      <failure message=\"NRMSE 3.1e-02 &gt; 2e-04\" type=\"threshold\">"));
  EXPECT_TRUE(Contains(x, "<skipped message=\"no speculative rows in A\"/>"));
  EXPECT_TRUE(Contains(x,
                       "<failure message=\"first divergence at window 45 (T, T_mtp, from_sfx "
                       "differ)\" type=\"gate\"/>"));
}

TEST(ReportJUnitTest, ExtraGatesAppendOrReplace) {
  Fixture f;
  DiffResult pass = PassingDiff();
  f.in.diff = &pass;
  const std::string x = RenderJUnit(
      f.in, {{"timing_aggregate", true, "within 5%"}, {"path_identical", true, "waived"}});
  std::vector<XmlElement> els;
  std::string error;
  ASSERT_TRUE(ParseXml(x, els, error)) << error;
  std::vector<std::string> gate_names;
  for (const XmlElement& e : els)
    if (e.name == "testcase" && e.attrs.at("classname") == "gates")
      gate_names.push_back(e.attrs.at("name"));
  const std::vector<std::string> want = {"state", "output_identical", "path_identical",
                                         "config_identical", "timing_aggregate"};
  EXPECT_EQ(gate_names, want);
  EXPECT_TRUE(Contains(x, "<testsuite name=\"lockstep.gates\" tests=\"5\" failures=\"0\""));
  EXPECT_EQ(RenderJUnit(f.in), RenderJUnit(f.in, {}));
}

TEST(ReportJUnitTest, GatesWithoutDiffOrAlignment) {
  ReportInput in;
  in.a = Arm("A1", 4);
  in.b = Arm("A2", 2);
  const std::vector<GateOutcome> gates = InferredGates(in);
  ASSERT_EQ(gates.size(), 1u);
  EXPECT_EQ(gates[0].name, "config_identical");
  EXPECT_FALSE(gates[0].passed);
  EXPECT_EQ(gates[0].message, "1 differing key: spec: 4 | 2");
  std::vector<XmlElement> els;
  std::string error;
  EXPECT_TRUE(ParseXml(RenderJUnit(in), els, error)) << error;
}

// ---- allowlist ----

std::string UserName() {
  if (const char* u = std::getenv("USER"); u != nullptr && *u != '\0') return u;
  char buf[256] = {};
  if (getlogin_r(buf, sizeof(buf)) == 0) return buf;
  return "";
}

TEST(ReportForbiddenTest, CatchesPathsAndNames) {
  EXPECT_FALSE(FindForbiddenText("data in /home/alice/x.h5 here").empty());
  EXPECT_TRUE(
      Contains(Join(FindForbiddenText("data in /home/alice/x.h5 here")), "/home/alice/x.h5"));
  EXPECT_FALSE(FindForbiddenText("weights at ~/models").empty());
  EXPECT_FALSE(FindForbiddenText("run=/data/runs/a1").empty());
  EXPECT_FALSE(FindForbiddenText("(/scratch/x/y)").empty());
  EXPECT_FALSE(FindForbiddenText("C:\\Users\\bob").empty());
  EXPECT_FALSE(FindForbiddenText("tmp:/tmp/x").empty());
  EXPECT_FALSE(FindForbiddenText("the needle is 42", {"the needle is"}).empty());
  EXPECT_TRUE(FindForbiddenText("the needle is 42", {"", "haystack"}).empty());

  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  if (std::string(host).size() > 2) {
    EXPECT_FALSE(FindForbiddenText(std::string("ran on ") + host + ".").empty()) << host;
  }
  // getpwuid() is consulted by FindForbiddenText as well, so "root" counts when running as uid 0.
  std::string user = UserName();
  if (user.empty() && geteuid() == 0) user = "root";
  if (user.size() > 2) {
    EXPECT_FALSE(FindForbiddenText("by " + user + " today").empty()) << user;
  }
}

TEST(ReportForbiddenTest, NoFalsePositives) {
  for (const char* ok :
       {"p/T ratio", "1/2 of it", "A/A diagnostic", "</svg></p>", "<br/>", "x / y", "a // b",
        "stage0/layer3/k", "counters/stage0 first_call_ns", "<failure message=\"x\"/>", "MB/s"})
    EXPECT_TRUE(FindForbiddenText(ok).empty()) << ok << ": " << Join(FindForbiddenText(ok));
}

TEST(ReportForbiddenTest, CleanInputsGiveCleanReports) {
  ExportMeta meta;
  meta.arm = "A1";
  meta.run_id = "20261025T120000Z-a1";
  meta.model_sha256 = "bb472f0af8145c18c1b324f4056e8319ac8dedd8f364b018c2c135f963f2a1d9";
  meta.request_sha256 = "/home/alice/not-a-hash";  // not hex: never printed
  meta.config_sha256 = "0123456789abcdef";
  meta.config_json =
      R"({"backend":"cpu","model":"/home/alice/models/qwen","replay_path":"/tmp/r.jsonl","spec":4,)"
      R"("split":[12,24,36],"inject":[]})";
  meta.request_tokens.assign(100, 7);
  meta.output_tokens.assign(20, 9);
  meta.stop_reason = "eos";
  meta.unknowns = {"counters/stage0 first_call_ns"};
  Fixture f;
  f.in.a = SummarizeArm(meta, "A");
  f.in.b = SummarizeArm(meta, "B");
  f.in.b.arm = "A2";
  EXPECT_EQ(f.in.a.config.count("model"), 0u);
  EXPECT_EQ(f.in.a.config.count("replay_path"), 0u);
  EXPECT_EQ(f.in.a.request_sha256_12, "unknown");
  const std::vector<std::string> prompt = {"The needle is hidden in the haystack"};
  for (const std::string& text :
       {RenderMarkdown(f.in), RenderHtml(f.in), RenderJson(f.in), RenderJUnit(f.in)}) {
    EXPECT_TRUE(FindForbiddenText(text, prompt).empty()) << Join(FindForbiddenText(text, prompt));
  }
  // A reason string that carries a path is redacted, not printed.
  f.diff.items.back().reason = "read failed: /var/lib/run7/a.h5";
  f.diff.checkpoints[0].skip_reasons["missing in /home/bob/b.h5"] = 1;
  f.in.a.unknowns.push_back("nvml: unknown: /usr/lib/libnvidia-ml.so.1 not found");
  for (const std::string& text :
       {RenderMarkdown(f.in), RenderHtml(f.in), RenderJson(f.in), RenderJUnit(f.in)}) {
    EXPECT_TRUE(FindForbiddenText(text).empty()) << Join(FindForbiddenText(text));
  }
  EXPECT_TRUE(Contains(RenderMarkdown(f.in), "missing in (redacted)"));
}

// ---- SummarizeArm, Limitations, FormatMetric ----

TEST(ReportSummaryTest, SummarizeArm) {
  ExportMeta meta;
  meta.config_json =
      R"({"backend":"cuda","spec":4,"pcie_frac":0.55,"split":[12,24,36],"mtp":true,"unknown_key":1})";
  meta.model_sha256 = "ABCDEF0123456789abcdef";
  meta.windows.resize(7);
  meta.checkpoints.resize(3);
  meta.sampler.nvml = "read";
  ArmInfo a = SummarizeArm(meta, "B");
  EXPECT_EQ(a.arm, "B");
  EXPECT_EQ(a.model_sha256_12, "ABCDEF012345");
  EXPECT_EQ(a.config_sha256_12, "unknown");
  const std::map<std::string, std::string> want = {{"backend", "\"cuda\""},
                                                   {"spec", "4"},
                                                   {"pcie_frac", "0.55"},
                                                   {"split", "[12,24,36]"},
                                                   {"mtp", "true"}};
  EXPECT_EQ(a.config, want);
  EXPECT_EQ(a.windows, 7);
  EXPECT_EQ(a.checkpoints, 3);
  meta.config_json = "{not json";
  ASSERT_NO_THROW(a = SummarizeArm(meta, "B"));
  EXPECT_TRUE(a.config.empty());
  meta.config_json = "[1,2]";
  EXPECT_TRUE(SummarizeArm(meta, "B").config.empty());
  const auto& keys = ReportConfigKeys();
  EXPECT_EQ(keys.size(), 21u);
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "model"), 0);
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "replay_path"), 0);
}

TEST(ReportSummaryTest, FormatMetric) {
  EXPECT_EQ(FormatMetric(0.0), "0");
  EXPECT_EQ(FormatMetric(3.2e-4), "3.2e-04");
  EXPECT_EQ(FormatMetric(3.14159e-2), "3.1e-02");
  EXPECT_EQ(FormatMetric(12.0), "1.2e+01");
  EXPECT_EQ(FormatMetric(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(FormatMetric(std::numeric_limits<double>::quiet_NaN()), "nan");
}

}  // namespace
}  // namespace lockstep
