// Engine benchmarks (issue "Foundation", Must show 10): prefill and decode tokens/s on the
// `small` synthetic model, and decode weight bytes read per second against memory bandwidth
// measured in the same run (ratios within one run: these machines are shared and noisy).
//
//   build/tests/bench/engine_bench --benchmark_counters_tabular=true
//
// env: LOCKSTEP_BENCH_MODEL  folder of an existing `small` model (else one is generated in /tmp)
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <vector>

#include "bench_model.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/synthetic.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/weights.h"
#include "read_pass.h"

namespace lockstep {
namespace {

const ModelWeights& SmallModel() { return BenchSmallModel(false); }

// ---- memory bandwidth references ----
constexpr std::size_t kBwBytes = std::size_t{512} << 20;  // well beyond the caches

struct Bandwidth {
  double read_bps[3] = {0, 0, 0};  // read-only streaming with 1 / 2 threads (bytes read per second)
  double copy_bps = 0;             // memcpy (bytes copied per second)
};
Bandwidth g_bw;

// Read-only streaming over 512 MiB with the engine's thread pool (contiguous ranges, like the
// decode kernels split weight rows).
void BM_MemReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  std::vector<float> buf(kBwBytes / sizeof(float), 1.0f);
  ThreadPool pool(threads);
  for (auto _ : state) ReadPass(buf, pool);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(kBwBytes));
}

void BM_MemcpyBandwidth(benchmark::State& state) {
  std::vector<char> a(kBwBytes / 2, 1), b(kBwBytes / 2, 0);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), a.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(a.size()));
}

// Reads back what Google Benchmark measured for a bandwidth benchmark (bytes per second).
class BandwidthReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      auto it = r.counters.find("bytes_per_second");
      if (it == r.counters.end()) continue;
      if (r.benchmark_name().rfind("BM_MemReadBandwidth/1/", 0) == 0) g_bw.read_bps[1] = it->second;
      if (r.benchmark_name().rfind("BM_MemReadBandwidth/2/", 0) == 0) g_bw.read_bps[2] = it->second;
      if (r.benchmark_name().rfind("BM_MemcpyBandwidth", 0) == 0) g_bw.copy_bps = it->second;
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

std::vector<std::int32_t> Tokens(int n, int vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    t[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>((i * 2654435761u) % static_cast<unsigned>(vocab));
  return t;
}

EnginePtr MakeEngine(int threads) {
  EngineConfig c;
  c.threads = threads;
  c.stages = 4;
  auto e = Engine::Create(c, SmallModel());
  if (!e.ok()) std::abort();
  return std::move(e).value();
}

// Prefill of a 512-token prompt, chunk 512, four stages.
void BM_PrefillSmall(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const auto prompt = Tokens(512, SmallModel().config.n_vocab);
  for (auto _ : state) {
    state.PauseTiming();
    auto e = MakeEngine(threads);
    state.ResumeTiming();
    if (!e->Prefill(prompt).ok()) state.SkipWithError("prefill failed");
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 512);
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * 512,
                                                      benchmark::Counter::kIsRate);
}

// Single-token decode steps after a 64-token prompt (context 64..320).
void BM_DecodeSmall(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const ModelWeights& w = SmallModel();
  const auto prompt = Tokens(64, w.config.n_vocab);
  std::vector<float> logits(static_cast<std::size_t>(w.config.n_vocab));
  EnginePtr e;
  int steps = 0;
  std::int32_t tok = 1;
  for (auto _ : state) {
    if (!e || steps == 256) {
      state.PauseTiming();
      e = MakeEngine(threads);
      if (!e->Prefill(prompt).ok()) state.SkipWithError("prefill failed");
      steps = 0;
      state.ResumeTiming();
    }
    if (!e->Verify(std::span<const std::int32_t>(&tok, 1), logits.data()).ok() ||
        !e->Commit(1).ok())
      state.SkipWithError("decode failed");
    // A hashed token stream (not the greedy output, which can cycle) keeps routing varied, so
    // the experts read per step change as they would on real text.
    tok = static_cast<std::int32_t>((static_cast<unsigned>(steps + 1) * 2654435761u) %
                                    static_cast<unsigned>(w.config.n_vocab));
    benchmark::DoNotOptimize(logits.data());
    ++steps;
  }
  const double bytes = static_cast<double>(w.ActiveBytesPerToken());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["weight_MB_per_token"] = bytes / 1e6;
  state.counters["weight_GB_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * bytes / 1e9, benchmark::Counter::kIsRate);
  // The fraction of the memory-bandwidth bound reached is printed by BoundReporter.
}

BENCHMARK(BM_MemReadBandwidth)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0)
    ->UseRealTime();
BENCHMARK(BM_MemcpyBandwidth)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_PrefillSmall)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();
BENCHMARK(BM_DecodeSmall)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0)
    ->UseRealTime();

// Prints decode speed against the memory-bandwidth bound, from counters of this same run.
class BoundReporter : public BandwidthReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    BandwidthReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.benchmark_name().rfind("BM_DecodeSmall", 0) != 0) continue;
      auto it = r.counters.find("weight_GB_per_s");
      const int threads = r.benchmark_name().rfind("BM_DecodeSmall/2/", 0) == 0 ? 2 : 1;
      const double bw = g_bw.read_bps[threads];
      if (it == r.counters.end() || bw <= 0) continue;
      const double got = it->second * 1e9;
      std::printf(
          "  -> %s: %.2f GB/s of weights = %.2f of the %d-thread read bandwidth (%.2f GB/s); "
          "%.2f of memcpy (%.2f GB/s); goal >= 0.50\n",
          r.benchmark_name().c_str(), got / 1e9, got / bw, threads, bw / 1e9, got / g_bw.copy_bps,
          g_bw.copy_bps / 1e9);
    }
  }
};

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  lockstep::BoundReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
