// Speculative decoding benchmarks (issue "Speculative decoding", Must show 7): decode tokens/s and
// tokens per verify window against plain decoding, on a repetitive and a non-repetitive prompt
// (`small`). Speed-ups are ratios within one run.
//
//   build/tests/bench/spec_bench --benchmark_counters_tabular=true
//
// env: LOCKSTEP_BENCH_MODEL  folder of an existing `small --induction` model (else one is
// generated)
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "bench_model.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/synthetic.h"
#include "lockstep/engine/tokenizer.h"

namespace lockstep {
namespace {

const ModelWeights& SmallModel() { return BenchSmallModel(true /* in-context copying */); }

// Repetitive: a block of 48 distinct token ids repeated 10 times (like a log or a table); the
// model's induction heads continue the repetition, so suffix drafts are accepted.
// Non-repetitive: byte-level English text.
std::vector<std::int32_t> Prompt(bool repetitive) {
  std::string text;
  if (repetitive) {
    std::vector<std::int32_t> block, ids;
    for (std::uint64_t i = 0; i < 48; ++i)
      block.push_back(static_cast<std::int32_t>(300 + (i * 2654435761ull) % 3700));
    for (int r = 0; r < 10; ++r) ids.insert(ids.end(), block.begin(), block.end());
    return ids;
  } else {
    text =
        "Two runs of the same configuration on a fresh engine should compute the same thing; where "
        "do they "
        "first differ, and is the difference numeric, scheduling, or timing? A bounded diagnostic "
        "answers.";
  }
  return EncodeBytes(text);
}

struct Mode {
  const char* name;
  int spec;
  const char* policy;
};
const Mode kModes[] = {
    {"plain", 0, "static"}, {"static", 4, "static"}, {"adaptive", 4, "adaptive"}};

std::map<std::string, double> g_tps;  // "prompt/mode" -> tokens/s, for the speed-up lines

void BM_Speculative(benchmark::State& state) {
  const bool repetitive = state.range(0) != 0;
  const Mode& mode = kModes[state.range(1)];
  EngineConfig c;
  c.threads = 2;
  c.max_new = 96;
  c.ignore_eos = true;
  c.spec = mode.spec;
  c.draft_policy = mode.policy;
  const auto prompt = Prompt(repetitive);
  double tokens = 0, windows = 0, decode_s = 0;
  for (auto _ : state) {
    auto e = Engine::Create(c, SmallModel());
    if (!e.ok()) {
      state.SkipWithError("engine");
      break;
    }
    auto r = Generate(**e, prompt);
    if (!r.ok()) {
      state.SkipWithError("generate");
      break;
    }
    tokens += static_cast<double>(r->output.size());
    windows += r->n_windows;
    decode_s += static_cast<double>(r->decode_ns) * 1e-9;
    state.SetIterationTime(static_cast<double>(r->decode_ns) * 1e-9);  // decode only
  }
  state.counters["tokens_per_s"] = tokens / decode_s;
  state.counters["tokens_per_window"] = tokens / windows;
  g_tps[std::string(repetitive ? "repetitive" : "varied") + "/" + mode.name] = tokens / decode_s;
  state.SetLabel(std::string(repetitive ? "repetitive/" : "varied/") + mode.name);
}

BENCHMARK(BM_Speculative)
    ->ArgsProduct({{1, 0}, {0, 1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  auto& t = lockstep::g_tps;
  for (const char* p : {"repetitive", "varied"}) {
    const std::string k = p;
    if (t.count(k + "/plain") == 0) continue;
    for (const char* m : {"static", "adaptive"})
      if (t.count(k + "/" + m))
        std::printf("%-10s %-8s speed-up vs plain: %.2fx\n", p, m,
                    t[k + "/" + m] / t[k + "/plain"]);
  }
  std::printf("goals: repetitive >= 2.00x (best policy); varied adaptive >= 0.95x\n");
  return 0;
}
