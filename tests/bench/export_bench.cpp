// Export benchmarks (issue "Instrumentation", Must show 4 and 5): HDF5 export throughput against a
// raw write()+fsync of the same bytes to the same folder, and decode speed with no export vs a
// trace-only export, all in one run.
//
//   build/tests/bench/export_bench --benchmark_counters_tabular=true
//
// env: LOCKSTEP_BENCH_DIR    folder for the files (default /tmp)
// env: LOCKSTEP_BENCH_MODEL  folder of an existing `small` model (else one is generated)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench_model.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/synthetic.h"
#include "lockstep/instrument/export_writer.h"

namespace lockstep {
namespace {

constexpr std::size_t kItemBytes = std::size_t{4} << 20;  // 4 MiB per item: [1024 rows, 1024 floats]
constexpr int kItems = 64;                                 // 256 MiB per iteration
std::map<std::string, double> g_bps;

std::string Dir() {
  const char* d = std::getenv("LOCKSTEP_BENCH_DIR");  // env: LOCKSTEP_BENCH_DIR
  return d && *d ? d : "/tmp";
}

// Both benchmarks write one file across all iterations (kItems x 4 MiB per iteration) and end with
// fsync (raw) or Finish (export: close, fsync, rename), whose time is added to the last
// iteration: steady-state throughput of one long run, durability included.
void BM_RawWriteFsync(benchmark::State& state) {
  const std::string path = Dir() + "/lockstep-bench-raw-" + std::to_string(::getpid());
  std::vector<char> buf(std::size_t{1} << 20, 1);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::int64_t left = state.max_iterations;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t done = 0; done < kItemBytes * kItems; done += buf.size())
      if (::write(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size())) state.SkipWithError("write");
    if (--left == 0) ::fsync(fd);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  ::close(fd);
  std::filesystem::remove(path);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kItemBytes * kItems));
}

// One item's worth of state-like floats: a hashed pattern, not a constant a compressor would erase.
std::vector<float> StateLikeData() {
  std::vector<float> data(kItemBytes / sizeof(float));
  std::uint32_t x = 12345;
  for (float& v : data) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(x >> 8) * 0x1p-24f - 0.5f;
  }
  return data;
}

// One commit checkpoint of kItems [1024, 1024] f32 items, handed over as row views the way the
// engine hands them (data: one item's floats, reused for every item).
void FeedCheckpoint(H5Exporter& e, int window, const std::vector<float>& data) {
  CheckpointInfo info;
  info.window = window;
  info.point = CheckpointPoint::kCommit;
  e.OnCheckpointBegin(info);
  for (int i = 0; i < kItems; ++i) {
    StateView v;
    v.kind = ItemKind::kSsmState;
    v.stage = 0;
    v.layer = i;
    v.shape = {1024, 1024};
    v.rows = 1024;
    v.rows_capacity = 1024;
    v.row_bytes = 1024 * sizeof(float);
    v.row = [&data](int r) { return reinterpret_cast<const std::byte*>(data.data() + static_cast<std::size_t>(r) * 1024); };
    e.OnState(info, v);
  }
  e.OnCheckpointEnd(info);
}

// The exporter fed like the engine feeds it: one checkpoint of row views per iteration, then
// Finish. Time includes the engine-side copies and the writer thread's HDF5 work.
// The data are state-like floats (a hashed pattern, not a constant a compressor would erase), so
// the LZ4 variant measures the cost of compressing what an engine writes.
void H5Export(benchmark::State& state, const std::string& compress) {
  const std::string path = Dir() + "/lockstep-bench-export-" + std::to_string(::getpid()) + ".h5";
  const std::vector<float> data = StateLikeData();
  ExportOptions o;
  o.path = path;
  o.windows = *WindowSelection::Parse("all");
  o.compress = compress;
  auto e = H5Exporter::Create(o);
  if (!e.ok()) {
    state.SkipWithError(e.status().message().c_str());
    return;
  }
  std::int64_t left = state.max_iterations;
  int window = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    FeedCheckpoint(**e, window++, data);
    if (--left == 0 && !(*e)->Finish(ExportRunInfo{}).ok()) state.SkipWithError("finish");
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::filesystem::remove(path);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kItemBytes * kItems));
}
void BM_H5Export(benchmark::State& s) { H5Export(s, ""); }
// --export-compress lz4 (needs the LZ4 HDF5 filter plugin; the benchmark reports an error without it).
void BM_H5ExportLz4(benchmark::State& s) { H5Export(s, "lz4"); }

class Reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      // With --benchmark_repetitions the mean (reported last) is the figure; other aggregates skip.
      if (!r.aggregate_name.empty() && r.aggregate_name != "mean") continue;
      auto it = r.counters.find("bytes_per_second");
      if (it != r.counters.end()) g_bps[r.benchmark_name().substr(0, r.benchmark_name().find('/'))] = it->second;
      auto tps = r.counters.find("tokens_per_s");
      if (tps != r.counters.end()) g_bps[r.benchmark_name().substr(0, r.benchmark_name().find('/'))] = tps->second;
    }
  }
};

const ModelWeights& SmallModel() { return BenchSmallModel(false); }

// Decode of 64 tokens: no observer vs an exporter with --export-windows none (trace only).
struct DecodeRun {
  double tokens = 0;  // generated tokens (0: the run failed)
  double secs = 0;    // decode time
};
DecodeRun DecodeOnce(bool trace_only) {
  EngineConfig c;
  c.threads = 2;
  c.max_new = 64;
  c.ignore_eos = true;
  std::vector<std::int32_t> prompt(64);
  for (int i = 0; i < 64; ++i) prompt[static_cast<std::size_t>(i)] = (i * 37) % 4000;
  const std::string path = Dir() + "/lockstep-bench-trace-" + std::to_string(::getpid()) + ".h5";
  auto e = Engine::Create(c, SmallModel());
  std::unique_ptr<H5Exporter> ex;
  GenerateHooks hooks;
  if (trace_only) {
    ExportOptions o;
    o.path = path;
    ex = std::move(H5Exporter::Create(o)).value();
    hooks.observer = ex.get();
  }
  auto r = Generate(**e, prompt, &hooks);
  if (!r.ok() || (ex && !ex->Finish(ExportRunInfo{}).ok())) return {};
  std::filesystem::remove(path);
  return {static_cast<double>(r->output.size()), static_cast<double>(r->decode_ns) * 1e-9};
}

void BM_Decode(benchmark::State& state, bool trace_only) {
  double tokens = 0, secs = 0;
  for (auto _ : state) {
    const DecodeRun d = DecodeOnce(trace_only);
    if (d.tokens <= 0) return state.SkipWithError("generate");
    tokens += d.tokens;
    secs += d.secs;
    state.SetIterationTime(d.secs);
  }
  state.counters["tokens_per_s"] = tokens / secs;
}
void BM_DecodeNoExport(benchmark::State& s) { BM_Decode(s, false); }
void BM_DecodeTraceOnly(benchmark::State& s) { BM_Decode(s, true); }

// ---- paired measurements: on a shared, noisy machine the load drifts between two benchmarks
// run one after the other. Here every iteration runs both variants back to back (alternating
// which goes first) and keeps their ratio; the figure is the median ratio, so a drift that
// touches both halves of a pair cancels. ----

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
std::map<std::string, double> g_paired;  // name -> median ratio

void BM_PairedDecodeTraceOnly(benchmark::State& state) {
  std::vector<double> ratios;
  bool trace_first = false;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    DecodeRun a, b;  // a: no export, b: trace only
    if (trace_first) {
      b = DecodeOnce(true);
      a = DecodeOnce(false);
    } else {
      a = DecodeOnce(false);
      b = DecodeOnce(true);
    }
    trace_first = !trace_first;
    if (a.tokens <= 0 || b.tokens <= 0) return state.SkipWithError("generate");
    ratios.push_back((b.tokens / b.secs) / (a.tokens / a.secs));  // tokens/s, trace-only over none
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["median_ratio"] = g_paired["decode"] = Median(ratios);
  state.counters["min_ratio"] = *std::min_element(ratios.begin(), ratios.end());
  state.counters["max_ratio"] = *std::max_element(ratios.begin(), ratios.end());
}

// Writes kItems x 4 MiB (256 MiB) raw with write()+fsync, or through the exporter + Finish;
// returns bytes/s. A fresh file each time.
double WriteOnce(bool exporter, const std::vector<float>& data) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!exporter) {
    const std::string path = Dir() + "/lockstep-bench-praw-" + std::to_string(::getpid());
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const char* p = reinterpret_cast<const char*>(data.data());
    for (int i = 0; i < kItems; ++i)
      for (std::size_t done = 0; done < kItemBytes; done += std::size_t{1} << 20)
        if (::write(fd, p + done, std::size_t{1} << 20) != (1 << 20)) return 0.0;
    ::fsync(fd);
    ::close(fd);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::filesystem::remove(path);
    return static_cast<double>(kItemBytes * kItems) / s;
  }
  const std::string path = Dir() + "/lockstep-bench-pexport-" + std::to_string(::getpid()) + ".h5";
  ExportOptions o;
  o.path = path;
  o.windows = *WindowSelection::Parse("all");
  auto e = H5Exporter::Create(o);
  if (!e.ok()) return 0.0;
  FeedCheckpoint(**e, 0, data);
  if (!(*e)->Finish(ExportRunInfo{}).ok()) return 0.0;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::remove(path);
  return static_cast<double>(kItemBytes * kItems) / s;
}

void BM_PairedExportVsRaw(benchmark::State& state) {
  const std::vector<float> data = StateLikeData();
  std::vector<double> ratios;
  bool export_first = false;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    double raw, ex;
    if (export_first) {
      ex = WriteOnce(true, data);
      raw = WriteOnce(false, data);
    } else {
      raw = WriteOnce(false, data);
      ex = WriteOnce(true, data);
    }
    export_first = !export_first;
    if (raw <= 0 || ex <= 0) return state.SkipWithError("write");
    ratios.push_back(ex / raw);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["median_ratio"] = g_paired["export"] = Median(ratios);
  state.counters["min_ratio"] = *std::min_element(ratios.begin(), ratios.end());
  state.counters["max_ratio"] = *std::max_element(ratios.begin(), ratios.end());
}

// A fixed iteration count: the last iteration carries the fsync / Finish.
BENCHMARK(BM_RawWriteFsync)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(8);
BENCHMARK(BM_H5Export)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(8);
BENCHMARK(BM_H5ExportLz4)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(8);
BENCHMARK(BM_DecodeNoExport)->Unit(benchmark::kMillisecond)->UseManualTime()->MinTime(3.0);
BENCHMARK(BM_DecodeTraceOnly)->Unit(benchmark::kMillisecond)->UseManualTime()->MinTime(3.0);
BENCHMARK(BM_PairedExportVsRaw)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(8);
BENCHMARK(BM_PairedDecodeTraceOnly)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(12);

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  lockstep::Reporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  auto& b = lockstep::g_bps;
  if (b.count("BM_RawWriteFsync") && b.count("BM_H5Export"))
    std::printf("export throughput = %.2f x raw write()+fsync (goal >= 0.80)\n", b["BM_H5Export"] / b["BM_RawWriteFsync"]);
  if (b.count("BM_RawWriteFsync") && b.count("BM_H5ExportLz4"))
    std::printf("lz4 export throughput = %.2f x raw write()+fsync (goal >= 0.45)\n",
                b["BM_H5ExportLz4"] / b["BM_RawWriteFsync"]);
  if (b.count("BM_DecodeNoExport") && b.count("BM_DecodeTraceOnly"))
    std::printf("decode with trace-only export = %.3f x no export (goal: within 1%%)\n",
                b["BM_DecodeTraceOnly"] / b["BM_DecodeNoExport"]);
  auto& p = lockstep::g_paired;
  if (p.count("export"))
    std::printf("paired: export = %.2f x raw write()+fsync, median of 8 pairs (goal >= 0.80)\n", p["export"]);
  if (p.count("decode"))
    std::printf("paired: decode with trace-only export = %.3f x no export, median of 12 pairs (goal: within 1%%)\n",
                p["decode"]);
  return 0;
}
