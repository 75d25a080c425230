// Every limitation sentence of Limitations() (compare/REPORTS.md "Measurement limitations"),
// rendered from crafted inputs: each appears exactly when its condition holds for the arms it
// names, and never next to the data that contradicts it (no "no samples" beside samples, no "no
// state diff" beside a state diff, no "unknown" for a quantity the arm measured).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/compare/report.h"

namespace lockstep {
namespace {

ArmInfo ExportArm(const std::string& name) {
  ArmInfo a;
  a.arm = name;
  a.has_export = true;
  a.model_sha256_12 = a.request_sha256_12 = a.config_sha256_12 = "0123456789ab";
  a.config = {{"backend", "\"cpu\""}};
  a.prompt_tokens = 10;
  a.output_tokens = 4;
  a.stop_reason = "length";
  a.windows = 4;
  a.checkpoints = 0;
  a.sampler.n_samples = 5;
  a.sampler.nvml = "read";
  return a;
}

std::string All(const ReportInput& in) {
  std::string s;
  for (const std::string& l : Limitations(in)) s += "[" + l + "]\n";
  return s;
}

bool Has(const ReportInput& in, const std::string& part) {
  return All(in).find(part) != std::string::npos;
}

int Count(const std::string& s, const std::string& part) {
  int n = 0;
  for (auto p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}

// A state diff and an alignment, both clean: the base every case adds one condition to.
struct Base {
  DiffResult diff;
  AlignResult align;
  std::vector<WindowRecord> wa, wb;
  ReportInput in;
  Base() {
    in.a = ExportArm("T1");
    in.b = ExportArm("T2");
    align.n_a = align.n_b = align.matched = 4;
    wa.resize(4);
    wb.resize(4);
    for (auto* w : {&wa, &wb})
      for (auto& r : *w) r.export_ns = 1000;
    in.diff = &diff;
    in.align = &align;
    in.windows_a = &wa;
    in.windows_b = &wb;
  }
};

TEST(LimitationsTest, CleanInputsSayNothingFalse) {
  Base b;
  EXPECT_EQ(All(b.in), "") << "two clean exports with samples, a diff and an alignment";
}

TEST(LimitationsTest, NoResourceSamplesOnlyWithoutSamples) {
  Base b;
  EXPECT_FALSE(Has(b.in, "No resource samples"));
  b.in.a.sampler.n_samples = 0;
  EXPECT_TRUE(Has(b.in, "[No resource samples were recorded in T1.]"));
  EXPECT_FALSE(Has(b.in, "in T2.]")) << All(b.in);
  // A trace-only arm's samples are unknown, not absent: no "no samples" sentence for it.
  Base t;
  t.in.a = ArmInfo();
  t.in.a.arm = "T1";
  EXPECT_FALSE(Has(t.in, "No resource samples")) << All(t.in);
  EXPECT_TRUE(Has(t.in, "[T1 has no export data in this report (windows only)")) << All(t.in);
}

TEST(LimitationsTest, StateNotComparedOnlyWithoutDiff) {
  Base b;
  EXPECT_FALSE(Has(b.in, "State not compared"));
  b.in.diff = nullptr;
  EXPECT_TRUE(Has(b.in, "[State not compared for T2 vs T1: this comparison has no state diff.]"));
  Base c;
  EXPECT_FALSE(Has(c.in, "Windows not aligned"));
  c.in.align = nullptr;
  EXPECT_TRUE(Has(c.in,
                  "[Windows not aligned for T2 vs T1: this comparison has no trace "
                  "alignment.]"));
}

TEST(LimitationsTest, TraceOnlyArmsAreOneUnknownLine) {
  Base b;
  b.in.a = ArmInfo();
  b.in.b = ArmInfo();
  b.in.a.arm = "T1";
  b.in.b.arm = "T2";
  const std::string all = All(b.in);
  EXPECT_EQ(Count(all, "no export data"), 1) << all;
  EXPECT_TRUE(
      Has(b.in,
          "[T1 and T2 have no export data in this report (windows only): model, request and "
          "config hashes, token counts, engine configuration and resource samples "
          "are unknown.]"));
  EXPECT_FALSE(Has(b.in, "GPU sampling")) << "a trace says nothing about NVML";
}

TEST(LimitationsTest, CudaOnlyCountersOneNotApplicableLineOnCpu) {
  Base b;
  for (ArmInfo* arm : {&b.in.a, &b.in.b})
    for (int s = 0; s < 4; ++s)
      for (const char* c : {"first_call_ns", "first_calls", "graph_captures", "graph_launches"})
        arm->unknowns.push_back("counters/stage" + std::to_string(s) + " " + c);
  const std::string all = All(b.in);
  EXPECT_EQ(Limitations(b.in).size(), 1u) << all;
  EXPECT_TRUE(Has(b.in,
                  "[First-call and graph counters (first_call_ns, first_calls, "
                  "graph_captures, graph_launches): CUDA backend only; not measured on cpu "
                  "(not applicable in T1 and T2).]"))
      << all;
  // On cuda the same -1 is a real unknown, grouped over the stages.
  b.in.a.config["backend"] = b.in.b.config["backend"] = "\"cuda\"";
  EXPECT_FALSE(Has(b.in, "not applicable"));
  EXPECT_TRUE(Has(b.in,
                  "[Counters recorded as unknown in T1 and T2: first_call_ns, first_calls, "
                  "graph_captures, graph_launches (stages 0-3).]"))
      << All(b.in);
  // Another unknown stays one line naming the arm that recorded it.
  Base c;
  c.in.b.unknowns = {"trace/samples rss_bytes: unknown in 3 of 9 samples"};
  EXPECT_TRUE(
      Has(c.in, "[Recorded as unknown in T2: trace/samples rss_bytes: unknown in 3 of 9 samples]"));
}

TEST(LimitationsTest, GpuSamplingExplainedOnce) {
  Base b;
  EXPECT_FALSE(Has(b.in, "GPU sampling"));
  const std::string raw =
      "unknown: libnvidia-ml.so.1 not found (dlopen: libnvidia-ml.so.1: cannot open shared "
      "object file: No such file or directory)";
  b.in.a.sampler.nvml = b.in.b.sampler.nvml = raw;
  b.in.a.unknowns = b.in.b.unknowns = {"nvml: " + raw};
  const std::string all = All(b.in);
  EXPECT_EQ(all,
            "[GPU sampling: no NVIDIA driver on this machine; GPU fields are unknown (T1 and "
            "T2).]\n");
  b.in.b.sampler.nvml = "read";
  b.in.b.unknowns.clear();
  EXPECT_TRUE(Has(b.in, "GPU fields are unknown (T1).]")) << All(b.in);
  b.in.a.sampler.nvml = "unknown: nvmlInit_v2 returned 9";
  EXPECT_TRUE(Has(b.in, "[GPU sampling: nvmlInit_v2 returned 9; GPU fields are unknown (T1).]"));
}

TEST(LimitationsTest, GuardSkipsAndFingerprints) {
  Base b;
  b.in.b.sampler.guard = "host available memory below 2 GiB";
  EXPECT_TRUE(Has(b.in, "[The resource guard tripped in T2: host available memory below 2 GiB]"));
  EXPECT_FALSE(Has(b.in, "tripped in T1"));
  CheckpointSummary cp;
  cp.skip_reasons = {{"no speculative rows in A", 2}};
  b.diff.checkpoints.push_back(cp);
  EXPECT_TRUE(Has(b.in, "[2 items skipped: no speculative rows in A]"));
  EXPECT_FALSE(Has(b.in, "differs between the arms"));
  b.diff.model_differs = true;
  EXPECT_TRUE(Has(b.in, "[The model differs between the arms: state was not compared.]"));
}

TEST(LimitationsTest, ExportIntervalNotApplicableVersusUnknown) {
  Base b;
  IntervalDiff t;
  t.name = "export";
  t.known = false;
  b.align.timing.push_back(t);
  // Measured in some windows only: unknown.
  b.wa[2].export_ns = -1;
  EXPECT_TRUE(Has(b.in, "[The export interval was recorded as unknown in at least one arm.]"));
  EXPECT_FALSE(Has(b.in, "not applicable"));
  // No window of either side measured it and neither exported a checkpoint: not applicable.
  for (auto* w : {&b.wa, &b.wb})
    for (auto& r : *w) r.export_ns = -1;
  EXPECT_TRUE(
      Has(b.in, "[The export interval is not applicable: no state was exported (T1 and T2).]"));
  EXPECT_FALSE(Has(b.in, "export interval was recorded as unknown"));
  // An arm that exported checkpoints did export: its -1 is unknown.
  b.in.a.checkpoints = 3;
  EXPECT_TRUE(Has(b.in, "[The export interval is not applicable: no state was exported (T2).]"))
      << All(b.in);
  EXPECT_TRUE(Has(b.in, "export interval was recorded as unknown"));
}

TEST(LimitationsTest, ExportPerturbsAndWindowCounts) {
  Base b;
  EXPECT_FALSE(Has(b.in, "perturbs execution"));
  b.in.b.checkpoints = 9;
  EXPECT_TRUE(Has(b.in, "State export perturbs execution: "));
  EXPECT_TRUE(Has(b.in, "an uninstrumented measurement (T2).]")) << All(b.in);
  EXPECT_FALSE(Has(b.in, "different numbers of windows"));
  b.align.n_b = 6;
  EXPECT_TRUE(Has(b.in, "different numbers of windows (T1: 4, T2: 6)"));
  // Unknown window counts (no alignment, trace arms) are never compared.
  b.in.align = nullptr;
  b.in.a.windows = -1;
  EXPECT_FALSE(Has(b.in, "different numbers of windows"));
}

}  // namespace
}  // namespace lockstep
