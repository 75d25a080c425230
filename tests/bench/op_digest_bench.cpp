// Op digest benchmarks (issue 37, Must show 7): decode on `small` (2 threads) with op digests off
// vs on for every window, as `lockstep generate --export F --op-digests none|all` runs it (an
// exporter; its records are written at Finish, outside the decode time), and `localize` of two
// exports with digests for 3 windows (both files opened as `lockstep localize` opens them:
// isolated, then the walk).
//
//   build/tests/bench/op_digest_bench --benchmark_counters_tabular=true
//
// The decode figure is a ratio within one iteration (off and on back to back, alternating which
// goes first); 5 repetitions, and the median of the per-iteration ratios is the figure.
//
// env: LOCKSTEP_BENCH_DIR    folder for the files (default /tmp)
// env: LOCKSTEP_BENCH_MODEL  folder of an existing `small` model (else one is generated)
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_model.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/localize.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/instrument/export_writer.h"

namespace lockstep {
namespace {

std::string Path(const std::string& name) {
  const char* d = std::getenv("LOCKSTEP_BENCH_DIR");  // env: LOCKSTEP_BENCH_DIR
  return std::string(d && *d ? d : "/tmp") + "/lockstep-bench-ops-" + std::to_string(::getpid()) +
         "-" + name + ".h5";
}

// One request of 32 prompt tokens and `max_new` new ones, exported to `path` with op digests for
// `windows` ("none": a trace-only export). Returns the decode seconds (0: failed).
double DecodeOnce(const std::string& path, const std::string& windows, int max_new) {
  EngineConfig c;
  c.threads = 2;
  c.max_new = max_new;
  c.ignore_eos = true;
  std::vector<std::int32_t> prompt(32);
  for (int i = 0; i < 32; ++i) prompt[static_cast<std::size_t>(i)] = (i * 37) % 4000;
  auto e = Engine::Create(c, BenchSmallModel());
  ExportOptions o;
  o.path = path;
  auto ow = OpWindows::Parse(windows);
  if (!e.ok() || !ow.ok()) return 0;
  o.op_digests = *ow;
  auto ex = H5Exporter::Create(o);
  if (!ex.ok()) return 0;
  GenerateHooks hooks;
  hooks.observer = ex->get();
  auto r = Generate(**e, prompt, &hooks);
  if (!r.ok()) return 0;
  ExportRunInfo meta;  // what the reader requires besides the trace
  meta.config_json = "{}";
  meta.request_tokens = prompt;
  meta.output_tokens = r->output;
  meta.max_new = max_new;
  meta.stop_reason = r->stop_reason;
  AppendStageInfo(**e, r->n_windows, &meta.residency, &meta.counters);
  if (!(*ex)->Finish(meta).ok()) return 0;
  return static_cast<double>(r->decode_ns) * 1e-9;
}

void BM_DecodeDigestsOnVsOff(benchmark::State& state) {
  bool on_first = false;
  double ratio_sum = 0;
  int n = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    double off = 0, on = 0;
    if (on_first) {
      on = DecodeOnce(Path("on"), "all", 32);
      off = DecodeOnce(Path("off"), "none", 32);
    } else {
      off = DecodeOnce(Path("off"), "none", 32);
      on = DecodeOnce(Path("on"), "all", 32);
    }
    on_first = !on_first;
    if (off <= 0 || on <= 0) return state.SkipWithError("generate");
    ratio_sum += on / off;
    ++n;
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["on_over_off"] = ratio_sum / n;  // decode time, digests on / off
  std::filesystem::remove(Path("on"));
  std::filesystem::remove(Path("off"));
}
BENCHMARK(BM_DecodeDigestsOnVsOff)
    ->UseManualTime()
    ->Iterations(2)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->Unit(benchmark::kSecond);

void BM_Localize3Windows(benchmark::State& state) {
  const std::string a = Path("la"), b = Path("lb");
  if (DecodeOnce(a, "0-2", 3) <= 0 || DecodeOnce(b, "0-2", 3) <= 0)
    return state.SkipWithError("generate");
  std::int64_t compared = 0;
  for (auto _ : state) {
    auto ra = ExportReader::Open(a);
    auto rb = ExportReader::Open(b);
    if (!ra.ok() || !rb.ok()) return state.SkipWithError("open");
    const LocalizeResult r = Localize((*ra)->meta(), (*rb)->meta());
    compared = r.compared;
    benchmark::DoNotOptimize(compared);
  }
  state.counters["records_compared"] = static_cast<double>(compared);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}
BENCHMARK(BM_Localize3Windows)->Iterations(5)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lockstep

BENCHMARK_MAIN();
