// Weights kept in their file type (issue 26, Must show 2): decode and prefill of `wide --layers 8`
// (bf16 file) with the weights as stored vs widened to f32 at load (WeightResidency::kWidenF32,
// the engine's behaviour before), 2 threads, in the same run (these machines are shared and
// noisy: only ratios within one run mean much), with the 2-thread read bandwidth measured first,
// and the prefill GEMM alone on the prefill's shapes (own kernel vs Eigen, one thread).
//
//   build/tests/bench/weights_bench --benchmark_counters_tabular=true
//
// env: LOCKSTEP_BENCH_WIDE_MODEL  folder of an existing `wide --layers 8` bf16 model (else one is
//      generated in /tmp, ~2.7 GB, and removed at exit)
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cpu/gemm.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/synthetic.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/weights.h"
#include "read_pass.h"

namespace lockstep {
namespace {

constexpr int kThreads = 2;
constexpr int kPrefillTokens = 512;

std::string ModelDir() {
  static const std::string dir = [] {
    const char* env = std::getenv("LOCKSTEP_BENCH_WIDE_MODEL");  // env: LOCKSTEP_BENCH_WIDE_MODEL
    if (env != nullptr && *env != '\0') return std::string(env);
    const std::string d = "/tmp/lockstep-bench-wide8-" + std::to_string(::getpid());
    SyntheticOptions o;
    o.preset = "wide";
    o.n_layers = 8;
    if (!WriteSyntheticModel(o, d).ok()) std::abort();
    std::atexit([] {
      std::filesystem::remove_all("/tmp/lockstep-bench-wide8-" + std::to_string(::getpid()));
    });
    return d;
  }();
  return dir;
}

// One model in memory at a time (the widened copy alone is ~5.4 GB).
const ModelWeights& Model(WeightResidency r) {
  static ModelWeightsPtr w;
  static WeightResidency loaded = WeightResidency::kFileType;
  if (!w || loaded != r) {
    w.reset();
    auto got = ModelWeights::Load(ModelDir(), true, r);
    if (!got.ok()) {
      std::fprintf(stderr, "%s\n", got.status().ToString().c_str());
      std::abort();
    }
    w = std::move(got).value();
    loaded = r;
  }
  return *w;
}

EnginePtr MakeEngine(const ModelWeights& w) {
  EngineConfig c;
  c.threads = kThreads;
  c.stages = 4;
  c.prefill_chunk = kPrefillTokens;
  auto e = Engine::Create(c, w);
  if (!e.ok()) std::abort();
  return std::move(e).value();
}

std::vector<std::int32_t> Tokens(int n, int vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(
        (static_cast<unsigned>(i) * 2654435761u) % static_cast<unsigned>(vocab));
  return t;
}

double g_read_bps = 0;  // 2-thread streaming read bandwidth, this run

// CPU time of every thread of the process (the pool's workers and this one), seconds.
double ProcessCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Read-only streaming over 512 MiB, split in contiguous ranges like the decode kernels.
void BM_MemReadBandwidth(benchmark::State& state) {
  std::vector<float> buf((std::size_t{512} << 20) / sizeof(float), 1.0f);
  ThreadPool pool(kThreads);
  for (auto _ : state) ReadPass(buf, pool);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(buf.size() * sizeof(float)));
}

// Arg 0: 0 = widened to f32 at load, 1 = as the file stores it (bf16). Arg 1: 0 = decode
// (single-token steps after a 64-token prompt), 1 = prefill of 512 tokens in one chunk. Arg 2:
// the prefill GEMM, 0 = Eigen's product (cpu::GemmImpl::kEigen, the engine before 2026-12-01),
// 1 = the own kernel (engine/cpu/gemm.h; the same bits). "Today's" engine of issue 26 is
// file_type 0 with gemm 0.
void BM_Wide(benchmark::State& state) {
  const auto res = state.range(0) == 0 ? WeightResidency::kWidenF32 : WeightResidency::kFileType;
  cpu::SetGemmImpl(state.range(2) == 0 ? cpu::GemmImpl::kEigen : cpu::GemmImpl::kOwn);
  const ModelWeights& w = Model(res);
  const int vocab = w.config.n_vocab;
  if (state.range(1) == 1) {
    const auto prompt = Tokens(kPrefillTokens + 1, vocab);  // prefill covers n - 1 rows
    for (auto _ : state) {
      state.PauseTiming();
      auto e = MakeEngine(w);
      state.ResumeTiming();
      if (!e->Prefill(prompt).ok()) state.SkipWithError("prefill failed");
    }
    state.counters["tokens_per_s"] = benchmark::Counter(
        static_cast<double>(state.iterations()) * kPrefillTokens, benchmark::Counter::kIsRate);
    return;
  }
  std::vector<float> logits(static_cast<std::size_t>(vocab));
  auto e = MakeEngine(w);
  if (!e->Prefill(Tokens(64, vocab)).ok()) state.SkipWithError("prefill failed");
  int steps = 0;
  std::int32_t tok = 1;
  const double cpu0 = ProcessCpuSeconds();
  for (auto _ : state) {
    if (!e->Verify(std::span<const std::int32_t>(&tok, 1), logits.data()).ok() ||
        !e->Commit(1).ok())
      state.SkipWithError("decode failed");
    ++steps;
    tok = static_cast<std::int32_t>((static_cast<unsigned>(steps) * 2654435761u) %
                                    static_cast<unsigned>(vocab));
    benchmark::DoNotOptimize(logits.data());
  }
  const double cpu = ProcessCpuSeconds() - cpu0;
  const double bytes = static_cast<double>(w.ActiveBytesPerToken());
  // CPU time per token (all threads): what a loaded machine's wall time cannot show. A step that
  // waits on memory still burns CPU, so this is the kernel cost, bandwidth stalls included.
  state.counters["cpu_ms_per_token"] = cpu * 1e3 / static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["weight_MB_per_token"] = bytes / 1e6;
  state.counters["weight_GB_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * bytes / 1e9, benchmark::Counter::kIsRate);
}

// The prefill GEMM alone (engine/cpu/gemm.h), one thread, bf16 weights of the prefill's shapes on
// `wide` (per thread of two: GDN projection, output projections, routed experts at ~160 rows,
// shared expert) and 16- / 32-row chunks, and `small`'s shapes a 16-row chunk gives its routed
// experts (1-2 rows of 128 x 512 and 512 x 128) and its last token's head (1 row of 4096 x 512):
// arg 3 = 0 Eigen's product on widened blocks (the engine before 2026-12-01), 1 the own kernel
// (same bits).
void BM_PrefillGemm(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0)), N = static_cast<int>(state.range(1));
  const int K = static_cast<int>(state.range(2));
  std::vector<std::uint16_t> w(static_cast<std::size_t>(N) * K);
  std::vector<float> x(static_cast<std::size_t>(T) * K), y(static_cast<std::size_t>(T) * N);
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = static_cast<std::uint16_t>(0x3c00u + (i * 2654435761u >> 20) % 0x0300u);  // [0.0078, 1)
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>((i * 40503u) % 2001u) / 1000.0f - 1.0f;
  Mat m;
  m.data = w.data();
  m.rows = N;
  m.cols = K;
  m.type = WeightType::kBF16;
  cpu::SetGemmImpl(state.range(3) == 0 ? cpu::GemmImpl::kEigen : cpu::GemmImpl::kOwn);
  for (auto _ : state) {
    cpu::GemmRows(x.data(), T, m, 0, N, y.data(), N);
    benchmark::DoNotOptimize(y.data());
  }
  cpu::SetGemmImpl(cpu::GemmImpl::kOwn);
  state.counters["GFLOP_per_s"] = benchmark::Counter(
      2.0 * T * N * K * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

BENCHMARK(BM_MemReadBandwidth)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_PrefillGemm)
    ->ArgNames({"T", "N", "K", "own"})
    ->ArgsProduct({{512}, {6176}, {2048}, {0, 1}})
    ->ArgsProduct({{512}, {1024}, {4096}, {0, 1}})
    ->ArgsProduct({{160}, {1024}, {2048}, {0, 1}})
    ->ArgsProduct({{160}, {1024}, {512}, {0, 1}})
    ->ArgsProduct({{32}, {6176}, {2048}, {0, 1}})
    ->ArgsProduct({{16}, {6176}, {2048}, {0, 1}})
    ->ArgsProduct({{1, 2}, {128}, {512}, {0, 1}})
    ->ArgsProduct({{1, 2}, {512}, {128}, {0, 1}})
    ->ArgsProduct({{1}, {4096}, {512}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5)
    ->UseRealTime();
BENCHMARK(BM_Wide)
    ->ArgNames({"file_type", "prefill", "gemm"})
    ->Args({0, 0, 0})
    ->Args({0, 1, 0})
    ->Args({1, 0, 1})
    ->Args({1, 1, 1})
    ->Args({1, 1, 0})
    ->Args({0, 1, 1})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(8.0)
    ->UseRealTime();

// Prints the stored-type / widened ratios of this run and decode's share of the read bandwidth.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      const std::string n = r.benchmark_name();
      const auto c = r.counters.find("bytes_per_second");
      if (n.rfind("BM_MemReadBandwidth", 0) == 0 && c != r.counters.end()) g_read_bps = c->second;
      if (const auto g = r.counters.find("GFLOP_per_s"); g != r.counters.end()) {
        const std::string shape = n.substr(0, n.find("/own:"));
        gemm_[{shape, n.find("/own:1") != std::string::npos}] = g->second;
        auto e = gemm_.find({shape, false}), o = gemm_.find({shape, true});
        if (e != gemm_.end() && o != gemm_.end())
          std::printf("  -> %s: own kernel / Eigen %.2fx (%.0f vs %.0f GFLOP/s)\n", shape.c_str(),
                      o->second / e->second, static_cast<double>(o->second),
                      static_cast<double>(e->second));
      }
      const auto t = r.counters.find("tokens_per_s");
      if (t == r.counters.end()) continue;
      const bool file = n.find("file_type:1") != std::string::npos;
      const bool prefill = n.find("prefill:1") != std::string::npos;
      const bool own = n.find("gemm:1") != std::string::npos;
      if (!prefill || file == own) rate_[{file, prefill}] = t->second;
      if (prefill) prefill_[{file, own}] = t->second;
      if (const auto cpu = r.counters.find("cpu_ms_per_token"); cpu != r.counters.end()) {
        cpu_[file] = cpu->second;
        if (file && cpu_.count(false))
          std::printf(
              "  -> decode CPU ms per token, widened to f32 / bf16 as stored: %.2fx (%.1f "
              "vs %.1f ms, all threads)\n",
              cpu_[false] / cpu_[true], cpu_[false], cpu_[true]);
      }
      const auto g = r.counters.find("weight_GB_per_s");
      if (g != r.counters.end() && g_read_bps > 0)
        std::printf(
            "  -> %s: %.2f GB/s of weights = %.2f of the %d-thread read bandwidth (%.2f "
            "GB/s); goal >= 0.8\n",
            n.c_str(), static_cast<double>(g->second),
            static_cast<double>(g->second) * 1e9 / g_read_bps, kThreads, g_read_bps / 1e9);
      auto a = rate_.find({false, prefill}), b = rate_.find({true, prefill});
      if (a != rate_.end() && b != rate_.end() && file && (!prefill || own))
        std::printf(
            "  -> %s, bf16 as stored%s / today's (widened to f32%s): %.2fx (%.2f vs %.2f tok/s)\n",
            prefill ? "prefill 512" : "decode", prefill ? " + own GEMM" : "",
            prefill ? " + Eigen's GEMM" : "", b->second / a->second, b->second, a->second);
      if (prefill && prefill_.size() == 4 && rate_.count({false, true}))
        std::printf(
            "  -> prefill 512 tok/s: widened + Eigen %.2f, widened + own %.2f, bf16 + Eigen %.2f, "
            "bf16 + own %.2f\n",
            prefill_[{false, false}], prefill_[{false, true}], prefill_[{true, false}],
            prefill_[{true, true}]);
    }
  }

 private:
  std::map<std::pair<bool, bool>, double> rate_;         // (file type, prefill) -> tokens/s
  std::map<std::pair<bool, bool>, double> prefill_;      // (file type, own GEMM) -> tokens/s
  std::map<std::pair<std::string, bool>, double> gemm_;  // (shape, own) -> GFLOP/s
  std::map<bool, double> cpu_;                           // decode CPU ms per token, by file_type
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
