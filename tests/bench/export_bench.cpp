// Export benchmarks (issue "Instrumentation", Must show 4 and 5): HDF5 export throughput against a
// raw write()+fsync of the same bytes to the same folder, and decode speed with no export vs a
// trace-only export.
//
//   build/tests/bench/export_bench --benchmark_counters_tabular=true
//
// Every figure is a ratio within one iteration: the variants run back to back in rotating order
// and the benchmark reports the median of the per-iteration ratios. Two benchmarks run one after
// the other on a shared VM drift apart (measured: a first raw-write benchmark at 0.34 GB/s, the
// same write 1.4 GB/s a minute later), so separate benchmarks are not compared.
//
// env: LOCKSTEP_BENCH_DIR    folder for the files (default /tmp)
// env: LOCKSTEP_BENCH_MODEL  folder of an existing `small` model (else one is generated)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/resource.h>
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
#include "lockstep/engine/trace_ring.h"
#include "lockstep/instrument/export_writer.h"

namespace lockstep {
namespace {

constexpr std::size_t kItemBytes = std::size_t{4}
                                   << 20;  // 4 MiB per item: [1024 rows, 1024 floats]
constexpr int kItems = 64;                 // 256 MiB per iteration

std::string Dir() {
  const char* d = std::getenv("LOCKSTEP_BENCH_DIR");  // env: LOCKSTEP_BENCH_DIR
  return d && *d ? d : "/tmp";
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
    v.row = [&data](int r) {
      return reinterpret_cast<const std::byte*>(data.data() + static_cast<std::size_t>(r) * 1024);
    };
    e.OnState(info, v);
  }
  e.OnCheckpointEnd(info);
}

const ModelWeights& SmallModel() { return BenchSmallModel(false); }

// Forwards every observer call to the exporter and adds up the time the engine thread spends in
// them: the direct cost of a trace-only export, which a tokens/s ratio on a shared machine can
// only bound to a few percent.
class TimedObserver final : public Observer {
 public:
  explicit TimedObserver(Observer& inner) : inner_(inner) {}
  bool WantsCheckpoint(int window, CheckpointPoint point) const override {
    const auto t0 = std::chrono::steady_clock::now();
    const bool w = inner_.WantsCheckpoint(window, point);
    ns_ += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    return w;
  }
  void OnCheckpointBegin(const CheckpointInfo& info) override {
    Timed([&] { inner_.OnCheckpointBegin(info); });
  }
  void OnState(const CheckpointInfo& info, const StateView& view) override {
    Timed([&] { inner_.OnState(info, view); });
  }
  void OnCheckpointEnd(const CheckpointInfo& info) override {
    Timed([&] { inner_.OnCheckpointEnd(info); });
  }
  void OnWindow(const WindowRecord& rec) override {
    Timed([&] { inner_.OnWindow(rec); });
  }
  double ns() const { return ns_; }

 private:
  template <typename F>
  void Timed(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ns_ += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  Observer& inner_;
  mutable double ns_ = 0;
};

// Decode of 64 tokens: no observer vs what `generate --export F --export-windows none` does (an
// exporter that writes the trace only, and the layer/stage event ring enabled).
struct DecodeRun {
  double tokens = 0;       // generated tokens (0: the run failed)
  double secs = 0;         // decode time
  double observer_ns = 0;  // engine-thread time inside observer calls
  double events = 0;       // trace-ring events recorded
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
  std::unique_ptr<TimedObserver> timed;
  GenerateHooks hooks;
  TraceRing& ring = TraceRing::Global();
  if (trace_only) {
    ExportOptions o;
    o.path = path;
    ex = std::move(H5Exporter::Create(o)).value();
    timed = std::make_unique<TimedObserver>(*ex);
    hooks.observer = timed.get();
    ring.Clear();
    ring.Enable();
  }
  auto r = Generate(**e, prompt, &hooks);
  ring.Disable();
  if (!r.ok() || (ex && !ex->Finish(ExportRunInfo{}).ok())) return {};
  std::filesystem::remove(path);
  DecodeRun d{static_cast<double>(r->output.size()), static_cast<double>(r->decode_ns) * 1e-9};
  if (trace_only) d.observer_ns = timed->ns(), d.events = static_cast<double>(ring.recorded());
  return d;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
std::map<std::string, double> g_paired;  // name -> figure printed after the run

// Each iteration decodes with no export and with a trace-only export back to back (alternating
// which goes first) and keeps the tokens/s ratio; it also adds up the direct cost.
void BM_DecodeTraceOnlyVsNone(benchmark::State& state) {
  std::vector<double> ratios;
  double observer_ns = 0, traced_secs = 0, events = 0, tokens = 0;
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
    observer_ns += b.observer_ns;
    traced_secs += b.secs;
    events += b.events;
    tokens += b.tokens;
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["median_ratio"] = g_paired["decode"] = Median(ratios);
  state.counters["min_ratio"] = *std::min_element(ratios.begin(), ratios.end());
  state.counters["max_ratio"] = *std::max_element(ratios.begin(), ratios.end());
  // The direct cost: observer calls, and the trace-ring events priced by timing a burst of them
  // here.
  TraceRing& ring = TraceRing::Global();
  ring.Enable();
  constexpr int kBurst = 1 << 16;
  const auto e0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kBurst; ++i) ring.Record(TraceEventId::kLayerBegin, i, 0);
  const double event_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - e0).count() /
      kBurst;
  ring.Disable();
  ring.Clear();
  state.counters["events_per_token"] = events / tokens;
  state.counters["event_ns"] = event_ns;
  state.counters["observer_pct"] = g_paired["observer_pct"] =
      100.0 * observer_ns * 1e-9 / traced_secs;
  state.counters["direct_pct"] = g_paired["direct_pct"] =
      100.0 * (observer_ns + events * event_ns) * 1e-9 / traced_secs;
}

// The three ways of writing the same kItems x 4 MiB (256 MiB) to a fresh file in the same folder.
enum class Writer { kRaw, kExport, kExportLz4 };
constexpr const char* kWriterName[] = {"raw", "export", "lz4"};

// Raw: write() in 1 MiB calls + fsync. Export: the exporter fed like the engine feeds it (one
// checkpoint of row views: engine-side copies, writer thread, HDF5) + Finish (close, fsync,
// rename). Returns bytes/s, 0 on failure (for lz4: the filter plugin is missing).
double WriteOnce(Writer w, const std::vector<float>& data) {
  const auto t0 = std::chrono::steady_clock::now();
  if (w == Writer::kRaw) {
    const std::string path = Dir() + "/lockstep-bench-raw-" + std::to_string(::getpid());
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
  const std::string path = Dir() + "/lockstep-bench-export-" + std::to_string(::getpid()) + ".h5";
  ExportOptions o;
  o.path = path;
  o.windows = *WindowSelection::Parse("all");
  o.compress = w == Writer::kExportLz4 ? "lz4" : "";
  auto e = H5Exporter::Create(o);
  if (!e.ok()) return 0.0;
  struct rusage ru0 {
  }, ru1{};
  ::getrusage(RUSAGE_SELF, &ru0);
  const auto t1 = std::chrono::steady_clock::now();
  FeedCheckpoint(**e, 0, data);
  const auto t2 = std::chrono::steady_clock::now();
  if (!(*e)->Finish(ExportRunInfo{}).ok()) return 0.0;
  const auto t3 = std::chrono::steady_clock::now();
  ::getrusage(RUSAGE_SELF, &ru1);
  if (std::getenv("LOCKSTEP_BENCH_VERBOSE")) {  // env: LOCKSTEP_BENCH_VERBOSE  where each export's
                                                // time went
    auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    std::fprintf(stderr, "  %s: create %.0f ms, feed %.0f ms, finish %.0f ms, %ld minor faults\n",
                 kWriterName[static_cast<int>(w)], ms(t1 - t0), ms(t2 - t1), ms(t3 - t2),
                 ru1.ru_minflt - ru0.ru_minflt);
  }
  std::filesystem::remove(path);
  return static_cast<double>(kItemBytes * kItems) / std::chrono::duration<double>(t3 - t0).count();
}

// Each iteration writes raw, export and lz4 (when the plugin is installed) back to back, the
// order rotating, and keeps export/raw and lz4/raw.
void BM_ExportVsRaw(benchmark::State& state) {
  const std::vector<float> data = StateLikeData();
  const bool lz4 = WriteOnce(Writer::kExportLz4, data) > 0;
  // One round before the measured ones: the first touch of fresh memory (page cache, the
  // exporter's buffers) is slow on a VM whose freed pages go back to the host.
  WriteOnce(Writer::kRaw, data);
  WriteOnce(Writer::kExport, data);
  std::vector<Writer> order{Writer::kRaw, Writer::kExport};
  if (lz4) order.push_back(Writer::kExportLz4);
  std::map<Writer, std::vector<double>> bps;
  std::vector<double> ratio, ratio_lz4;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    std::map<Writer, double> got;
    for (Writer w : order) got[w] = WriteOnce(w, data);
    std::rotate(order.begin(), order.begin() + 1, order.end());
    for (auto& [w, v] : got) {
      if (v <= 0) return state.SkipWithError("a write failed");
      bps[w].push_back(v);
    }
    ratio.push_back(got[Writer::kExport] / got[Writer::kRaw]);
    if (lz4) ratio_lz4.push_back(got[Writer::kExportLz4] / got[Writer::kRaw]);
    if (std::getenv("LOCKSTEP_BENCH_VERBOSE"))
      std::fprintf(stderr, "round %zu: raw %.0f MB/s, export %.0f MB/s, lz4 %.0f MB/s\n",
                   ratio.size(), got[Writer::kRaw] * 1e-6, got[Writer::kExport] * 1e-6,
                   lz4 ? got[Writer::kExportLz4] * 1e-6 : 0.0);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["raw_MBps"] = Median(bps[Writer::kRaw]) * 1e-6;
  state.counters["export_MBps"] = Median(bps[Writer::kExport]) * 1e-6;
  state.counters["export_ratio"] = g_paired["export"] = Median(ratio);
  state.counters["export_ratio_min"] = *std::min_element(ratio.begin(), ratio.end());
  if (lz4) {
    state.counters["lz4_MBps"] = Median(bps[Writer::kExportLz4]) * 1e-6;
    state.counters["lz4_ratio"] = g_paired["lz4"] = Median(ratio_lz4);
  }
}

BENCHMARK(BM_ExportVsRaw)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(12);
BENCHMARK(BM_DecodeTraceOnlyVsNone)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(20);

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  auto& p = lockstep::g_paired;
  if (p.count("export"))
    std::printf("export = %.2f x raw write()+fsync, median of 12 rounds (goal >= 0.80)\n",
                p["export"]);
  if (p.count("lz4"))
    std::printf("lz4 export = %.2f x raw write()+fsync, median of 12 rounds (goal >= 0.45)\n",
                p["lz4"]);
  if (p.count("decode"))
    std::printf(
        "decode with trace-only export = %.3f x no export, median of 20 pairs (goal: within 1%%)\n",
        p["decode"]);
  if (p.count("direct_pct"))
    std::printf(
        "trace-only export, direct cost: %.4f%% of decode time (observer calls %.4f%%, the rest "
        "trace events)\n",
        p["direct_pct"], p["observer_pct"]);
  return 0;
}
