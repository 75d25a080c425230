// Golden structure of every comparison report kind (diff: state only; align: windows only, from
// traces; summarize: both): the verdict box is the first block of the Markdown and the first
// element of the HTML body, it says PASS / FAIL / NOTHING COMPARED as the command's exit does, what
// was compared, and the first failing item or path divergence; the JSON carries the same verdict.
// Then headless Chromium checks that the box of a long diff page lies within the first 800 px.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chromium_probe.h"
#include "lockstep/compare/report.h"
#include "test_util.h"

namespace lockstep {
namespace {

ArmInfo ExportArm(const std::string& name) {
  ArmInfo a;
  a.arm = name;
  a.has_export = true;
  a.run_id = "run-" + name;
  a.model_sha256_12 = a.request_sha256_12 = a.config_sha256_12 = "0123456789ab";
  a.config = {{"backend", "\"cpu\""}};
  a.prompt_tokens = 10;
  a.output_tokens = 4;
  a.stop_reason = "length";
  a.windows = 4;
  a.checkpoints = 3;
  a.sampler.n_samples = 5;
  a.sampler.nvml = "read";
  return a;
}

DiffResult Diff(int checkpoints, bool fail) {
  DiffResult d;
  for (int w = 0; w < checkpoints; ++w) {
    CheckpointSummary c;
    c.name = "0000" + std::to_string(w) + "_commit";
    c.window = w;
    c.point = "commit";
    c.compared = c.passed = 10;
    d.checkpoints.push_back(c);
    ItemResult it;
    it.checkpoint = c.name;
    it.window = w;
    it.point = "commit";
    it.rel = "stage0/layer3/k";
    it.kind = "k";
    it.stage = 0;
    it.layer = 3;
    it.elements = 64;
    it.nrmse_max = 2e-4;
    it.stats.nrmse = fail && w == 1 ? 1e-2 : 0.0;
    it.verdict = fail && w == 1 ? Verdict::kFail : Verdict::kPass;
    d.items.push_back(it);
  }
  d.compared = d.passed = 10 * checkpoints;
  if (fail) {
    d.failed = 1;
    d.passed -= 1;
    d.first_failure = 1;
  }
  return d;
}

AlignResult Align(bool diverge) {
  AlignResult al;
  al.fields = {"p", "T"};
  al.n_a = al.n_b = 8;
  al.matched = diverge ? 5 : 8;
  if (diverge) {
    al.diverged = true;
    al.div_idx = 5;
    WindowRecord a, b;
    a.idx = b.idx = 5;
    a.p = b.p = 120;
    a.T = 6;
    b.T = 4;
    al.div_a = a;
    al.div_b = b;
    al.differing_fields = {"T"};
  }
  return al;
}

struct Rendered {
  std::string md, html;
  nlohmann::json json;
};

Rendered Render(const ReportInput& in) {
  return {RenderMarkdown(in), RenderHtml(in), nlohmann::json::parse(RenderJson(in))};
}

// The box is the Markdown's first block (quote lines up to the first blank line, the title after
// it) and the first element of the HTML body; returns the box's Markdown.
std::string ExpectBoxFirst(const Rendered& r, const std::string& label) {
  EXPECT_TRUE(r.md.starts_with("> **" + label + "**: ")) << r.md.substr(0, 400);
  const auto end = r.md.find("\n\n");
  EXPECT_NE(end, std::string::npos);
  const std::string box = r.md.substr(0, end);
  for (std::size_t p = 0; p < box.size(); p = box.find('\n', p) + 1) {
    EXPECT_EQ(box[p], '>') << "every line of the box is a quote line: " << box;
    if (box.find('\n', p) == std::string::npos) break;
  }
  EXPECT_EQ(r.md.compare(end + 2, 2, "# "), 0) << "the title follows the box";
  const auto body = r.html.find("<body>\n");
  EXPECT_NE(body, std::string::npos);
  EXPECT_EQ(r.html.compare(body + 7, 17, "<div id=\"verdict\""), 0) << r.html.substr(body, 300);
  EXPECT_NE(r.html.find("<p class=\"word\">" + label + "</p>"), std::string::npos);
  EXPECT_EQ(r.json["verdict"]["label"], label);
  return box;
}

TEST(ReportStructureTest, DiffReportLeadsWithItsVerdict) {
  ReportInput in;
  in.a = ExportArm("A1");
  in.b = ExportArm("A2");
  DiffResult pass = Diff(3, false);
  in.diff = &pass;
  Rendered r = Render(in);
  std::string box = ExpectBoxFirst(r, "PASS");
  EXPECT_NE(box.find("State: 30 items compared at 3 checkpoints (windows 0-2)."), std::string::npos)
      << box;
  EXPECT_NE(r.html.find("verdict verdict-pass"), std::string::npos);
  EXPECT_EQ(r.json["verdict"]["status"], "pass");

  DiffResult fail = Diff(3, true);
  in.diff = &fail;
  r = Render(in);
  box = ExpectBoxFirst(r, "FAIL");
  EXPECT_NE(box.find("1 of 30 compared items failed the thresholds"), std::string::npos) << box;
  EXPECT_NE(box.find("First failing item: 00001_commit stage 0 layer 3 k (NRMSE 1.0e-02 > "
                     "2e-04)."),
            std::string::npos)
      << box;
  EXPECT_NE(r.html.find("verdict verdict-fail"), std::string::npos);

  DiffResult vacuous = Diff(0, false);
  vacuous.vacuous = "nothing compared: the exports share no window";
  in.diff = &vacuous;
  r = Render(in);
  box = ExpectBoxFirst(r, "NOTHING COMPARED");
  EXPECT_NE(box.find("Nothing compared: the exports share no window."), std::string::npos) << box;
  EXPECT_EQ(r.json["verdict"]["status"], "fail");
}

TEST(ReportStructureTest, AlignReportOfTracesLeadsWithItsVerdict) {
  ReportInput in;  // align of two JSON-lines traces: arms without exports
  in.a.arm = "A1";
  in.b.arm = "A2";
  in.a.windows = in.b.windows = 8;
  AlignResult al = Align(true);
  in.align = &al;
  Rendered r = Render(in);
  const std::string box = ExpectBoxFirst(r, "FAIL");
  EXPECT_NE(box.find("The paths diverge at window 5."), std::string::npos) << box;
  EXPECT_NE(box.find("First path divergence at window 5 (T differs): A1: p=120, T=6; A2: p=120, "
                     "T=4."),
            std::string::npos)
      << box;
  // A trace carries no hashes or token counts: unknown, never 0 or an empty code span.
  EXPECT_NE(r.md.find("| model SHA-256 (first 12) | unknown | unknown |"), std::string::npos);
  EXPECT_NE(r.md.find("| prompt tokens | unknown | unknown |"), std::string::npos);
  EXPECT_EQ(r.md.find("``"), std::string::npos);
  EXPECT_EQ(r.md.find("| prompt tokens | 0"), std::string::npos);
  EXPECT_TRUE(r.json["arms"]["a"]["prompt_tokens"].is_null());
  EXPECT_TRUE(r.json["arms"]["a"]["model_sha256_12"].is_null());
  EXPECT_NE(r.md.find("Configuration differences: unknown (a trace carries no configuration)."),
            std::string::npos);
  // JUnit agrees with the box: the path gate fails, and no config gate passes on no data.
  std::vector<GateOutcome> gates = InferredGates(in);
  ASSERT_EQ(gates.size(), 1u);
  EXPECT_EQ(gates[0].name, "path_identical");
  EXPECT_FALSE(gates[0].passed);

  AlignResult unchecked = Align(false);
  unchecked.path_unchecked = "every window has T = 1 and no drafts";
  in.align = &unchecked;
  r = Render(in);
  ExpectBoxFirst(r, "NOTHING COMPARED");
  EXPECT_EQ(r.md.find("No path divergence over"), std::string::npos) << r.md;
  gates = InferredGates(in);
  ASSERT_EQ(gates.size(), 1u);
  EXPECT_FALSE(gates[0].passed) << "a path check that cannot fail is no pass";
  EXPECT_EQ(gates[0].message, "path not checked: every window has T = 1 and no drafts");

  AlignResult other_model = Align(false);
  other_model.fingerprint_differences = {"model"};
  in.align = &other_model;
  r = Render(in);
  const std::string b2 = ExpectBoxFirst(r, "FAIL");
  EXPECT_NE(b2.find("The model fingerprints differ: the paths are not comparable."),
            std::string::npos)
      << b2;
}

TEST(ReportStructureTest, SummarizeReportLeadsWithItsVerdict) {
  ReportInput in;
  in.a = ExportArm("A1");
  in.b = ExportArm("A2");
  DiffResult d = Diff(3, false);
  AlignResult al = Align(false);
  in.diff = &d;
  in.align = &al;
  Rendered r = Render(in);
  const std::string box = ExpectBoxFirst(r, "PASS");
  EXPECT_NE(box.find("> **PASS**: All 30 compared items within the thresholds; no path "
                     "divergence over 8 windows."),
            std::string::npos)
      << box;
  EXPECT_NE(box.find("Path: 8 windows aligned on p, T (A1: 8, A2: 8)."), std::string::npos);
  // A summarize whose path cannot differ still passes on its state, and says so.
  al.path_unchecked = "every window has T = 1 and no drafts";
  r = Render(in);
  EXPECT_NE(ExpectBoxFirst(r, "PASS").find("Path not checked: every window has T = 1"),
            std::string::npos);
}

// The verdict of a long diff page (60 checkpoints, a heat map, a failed-items table) is on the
// first screen.
TEST(ReportStructureTest, ChromiumShowsTheDiffVerdictInTheFirst800Px) {
  const std::string chromium = test::FindChromium();
  if (chromium.empty())
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh lists it as optional): "
                    "the verdict placement check did not run";
  ReportInput in;
  in.a = ExportArm("A1");
  in.b = ExportArm("A2");
  DiffResult d = Diff(60, true);
  in.diff = &d;
  const std::string dir = test::NewDir("verdict_px");
  const auto v = test::MeasureVerdict(chromium, RenderHtml(in), dir, "diff.png");
  ASSERT_TRUE(v.has_value()) << "no verdict box measured";
  EXPECT_GE(v->top, 0.0);
  EXPECT_LE(v->bottom, 800.0) << "the verdict box ends at " << v->bottom << " px";
  EXPECT_TRUE(std::filesystem::exists(dir + "/diff.png"));
}

}  // namespace
}  // namespace lockstep
