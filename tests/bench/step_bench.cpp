// Fused engine steps (issue 22, Must show 5 groundwork): decode steps of 1, 4 and 16 sequences on
// the `small` synthetic model, 2 threads, 4 stages; each sequence contributes one verify row
// (T = 1) to the step, so aggregate tokens/s = groups / step time. batch_invariant (the default)
// shares kInvariant products across the sequences' rows; the fuse_all rows run every product as
// one GEMM over all rows (batch_invariant = off). Ratios to one group come from the same run.
//
//   build/tests/bench/step_bench --benchmark_counters_tabular=true
//
// env: LOCKSTEP_BENCH_MODEL  folder of an existing `small` model (else one is generated in /tmp)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench_model.h"
#include "lockstep/engine/engine.h"

namespace lockstep {
namespace {

constexpr int kMaxGroups = 16;
constexpr int kPrompt = 64;  // tokens prefilled per sequence before its decode steps
constexpr int kSteps = 192;  // decode steps before the engine is rebuilt (context <= 256)

std::int32_t Hashed(unsigned i, int vocab) {
  return static_cast<std::int32_t>((i * 2654435761u) % static_cast<unsigned>(vocab));
}

// An engine whose slots [0, groups) each hold a kPrompt-token sequence (different tokens).
EnginePtr MakeEngine(int groups) {
  const ModelWeights& w = BenchSmallModel(false);
  EngineConfig c;
  c.threads = 2;
  c.stages = 4;
  c.slots = kMaxGroups;
  c.prefill_chunk = kPrompt;
  auto made = Engine::Create(c, w);
  if (!made.ok()) std::abort();
  EnginePtr e = std::move(made).value();
  for (int s = 0; s < groups; ++s) {
    if (!e->OpenSlot(s).ok()) std::abort();
    e->UseSlot(s);
    std::vector<std::int32_t> prompt;
    for (int i = 0; i < kPrompt; ++i)
      prompt.push_back(Hashed(static_cast<unsigned>(s * 1000 + i + 1), w.config.n_vocab));
    if (!e->Prefill(prompt).ok()) std::abort();
  }
  e->UseSlot(0);
  return e;
}

// One decode step of `groups` sequences (one verify row each), then each commits its row.
void BM_DecodeStep(benchmark::State& state) {
  const int groups = static_cast<int>(state.range(0));
  const bool fuse_all = state.range(1) != 0;
  const int vocab = BenchSmallModel(false).config.n_vocab;
  EnginePtr e;
  int steps = 0;
  Engine::StepOutputs out;
  for (auto _ : state) {
    if (!e || steps == kSteps) {
      state.PauseTiming();
      e = MakeEngine(groups);
      steps = 0;
      state.ResumeTiming();
    }
    StepPlan plan;
    plan.fuse_all = fuse_all;
    std::vector<std::int32_t> toks;
    for (int s = 0; s < groups; ++s) {
      e->UseSlot(s);
      plan.groups.push_back(RowGroup{s, ForwardMode::kVerify, e->position(), s, 1});
      // A hashed token stream keeps routing varied (the greedy output can cycle).
      toks.push_back(Hashed(static_cast<unsigned>(steps * kMaxGroups + s + 7), vocab));
    }
    if (!e->RunStep(plan, toks, &out).ok()) state.SkipWithError("step failed");
    for (int s = 0; s < groups; ++s) {
      e->UseSlot(s);
      if (!e->Commit(1).ok()) state.SkipWithError("commit failed");
    }
    benchmark::DoNotOptimize(out.logits.data());
    ++steps;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * groups);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * groups, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"groups", "fuse_all"})
    ->Args({1, 0})
    ->Args({4, 0})
    ->Args({16, 0})
    ->Args({16, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

// Prints each benchmark's tokens/s as a ratio to the one-group step of the same run (the median
// when run with --benchmark_repetitions).
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      auto it = r.counters.find("tokens_per_s");
      const bool plain = r.aggregate_name.empty();
      if (it == r.counters.end() || !(plain || r.aggregate_name == "median")) continue;
      std::string name = r.run_name.function_name + "/" + r.run_name.args;
      tps_[name] = it->second;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const auto one = tps_.find("BM_DecodeStep/groups:1/fuse_all:0");
    if (one == tps_.end() || one->second <= 0) return;
    for (const auto& [name, tps] : tps_)
      std::printf("%-40s %8.1f tokens/s  %5.2fx one group\n", name.c_str(), tps, tps / one->second);
  }

 private:
  std::map<std::string, double> tps_;
};

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  lockstep::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
