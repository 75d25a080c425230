// `lockstep diff` end to end (issue "comparator"): two exports of the same request, both in the
// page cache, compared by ExportReader::Open + DiffExports, against a raw read() of the same bytes
// and against HDF5's own differ h5diff on the same pair, all in one run. Goal: lockstep diff at
// least 20 x h5diff on the same files (measured elsewhere: h5diff ~0.1 GB/s, a raw page-cache read
// ~8 GB/s). Every figure is bytes_per_second over the bytes of both files, so the ratios printed
// after the table compare like with like even though the three read different subsets of them.
//
//   build/tests/bench/diff_bench --benchmark_counters_tabular=true
//
// Two shapes of export pair (the benchmark argument), made once and outside any timing from a
// `small` model, each as two separate `lockstep generate` runs (identical state), then read once to
// warm the page cache:
//   /0 many windows: a 512-byte prompt, --max-new 40 --export-windows all: ~4,300 small items,
//      ~0.5 GB per file (~10 s each on 2 cores). HDF5's per-object metadata work in Open dominates.
//   /1 long context: an 8,192-byte prompt, --max-new 8 --export-windows 0-2 (the seed's shape:
//   early
//      windows of a long request): ~340 items of up to 8k rows, ~0.4 GB per file (~40 s each).
// Isolation (issue 21), in the same run: BM_DiffCommand runs `lockstep diff --quiet A B` (each
// file's HDF5 metadata parsed in a child process, the default) and BM_DiffCommandNoIsolate the
// same with --no-isolate, a fresh process per iteration (goal: isolated <= 1.05 x); BM_OpenTiny /
// BM_OpenTinyInProcess open a tiny export again and again (the fixed cost per file: fork, the
// child's HDF5 start-up, the pipe; goal <= 20 ms more), registered first, while this process is
// still small. BM_LockstepDiff (isolated) against BM_LockstepDiffInProcess is the library call
// in this benchmark process, which by then holds ~1 GB of freed-but-resident diff buffers: a fork
// costs ~7 ms per GiB resident, and the parent's next writes to those pages fault once each.
// The wall clock is measured (UseRealTime): the diff runs on several threads and h5diff is a
// child process, neither of which the benchmark thread's CPU time would see.
//
// env: LOCKSTEP_BENCH_DIR    folder for the files (default /tmp); they are removed at exit
// env: LOCKSTEP_BENCH_MODEL  folder of an existing `small` model (else one is generated)
// env: LOCKSTEP_BIN          the `lockstep` binary (default: the one built with this benchmark)
// env: LOCKSTEP_H5DIFF       the h5diff binary (default: h5diff on PATH)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/state_diff.h"

namespace lockstep {
namespace {

std::map<std::string, double> g_bps;     // benchmark name (up to the first '/') -> bytes_per_second
std::map<std::string, double> g_open_s;  // the same names -> counter open_s (seconds per iteration)
std::map<std::string, double> g_cpu_ms;  // the same names -> counter cpu_ms (median)
std::map<std::string, double> g_real_ms;  // the same names -> real ms per iteration (median)
std::string g_dir;                        // the scratch folder, removed by main()

std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// std::system's status as an exit code (-1 if the child did not exit normally).
int ExitCode(int status) { return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

// Runs a shell command with its output discarded; false (and a message) when it does not exit 0.
bool Run(const std::string& cmd) {
  const int rc = ExitCode(std::system((cmd + " >/dev/null 2>&1").c_str()));
  if (rc != 0) std::fprintf(stderr, "diff_bench: `%s` exited %d\n", cmd.c_str(), rc);
  return rc == 0;
}

struct Exports {
  std::string a, b;
  std::int64_t bytes = 0;  // both files together
  bool ok = false;
};

// Reads the whole file with read() into `buf`; the bytes read, or -1.
std::int64_t ReadAll(const std::string& path, std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::int64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      total = -1;
      break;
    }
    if (n == 0) break;
    total += n;
  }
  ::close(fd);
  return total;
}

std::string g_model;

// The pair of exports of one shape (see the top comment), made on first use. A deterministic prompt
// of plain words: byte-level tokens, so its N bytes are N K/V rows before the first window, and the
// K/V items (which grow with the position) outweigh the fixed-size GDN state.
const Exports& Pair(int shape) {
  static Exports pairs[2];
  static bool made[2] = {false, false};
  Exports& r = pairs[shape];
  if (made[shape]) return r;
  made[shape] = true;
  {
    if (g_dir.empty()) {
      g_dir =
          Env("LOCKSTEP_BENCH_DIR", "/tmp") + "/lockstep-diff-bench-" + std::to_string(::getpid());
      std::filesystem::create_directories(g_dir);
    }
    const std::string bin = Env("LOCKSTEP_BIN", LOCKSTEP_BIN_PATH);  // env: LOCKSTEP_BIN
    if (g_model.empty()) {
      g_model = Env("LOCKSTEP_BENCH_MODEL", "");  // env: LOCKSTEP_BENCH_MODEL
      if (g_model.empty()) {
        g_model = g_dir + "/model";
        if (!Run("'" + bin + "' model init --preset small --seed 0 --out '" + g_model + "'"))
          return r;
      }
    }
    const std::string& model = g_model;
    const std::size_t prompt_bytes = shape == 0 ? 512 : 8192;
    const std::string flags = shape == 0
                                  ? "--max-new 40 --spec 4 --export-windows all"
                                  : "--max-new 8 --spec 4 --prefill 2048 --export-windows 0-2";
    static const char* const kWords[] = {"the",    "cat", "sat",   "on",   "mat",     "and",
                                         "a",      "dog", "ran",   "over", "hills",   "while",
                                         "rivers", "of",  "light", "fell", "through", "quiet"};
    std::string prompt;
    for (std::uint64_t x = 1; prompt.size() < prompt_bytes;
         x = x * 6364136223846793005ULL + 1442695040888963407ULL)
      prompt += std::string(kWords[(x >> 33) % (sizeof kWords / sizeof kWords[0])]) + " ";
    prompt.resize(prompt_bytes);
    const std::string tag = std::to_string(shape);
    const std::string prompt_file = g_dir + "/prompt" + tag + ".txt";
    if (FILE* f = std::fopen(prompt_file.c_str(), "wb")) {
      std::fwrite(prompt.data(), 1, prompt.size(), f);
      std::fclose(f);
    }
    r.a = g_dir + "/A" + tag + ".h5";
    r.b = g_dir + "/B" + tag + ".h5";
    for (const auto& [path, arm] : {std::pair{r.a, "A"}, std::pair{r.b, "B"}}) {
      if (!Run("'" + bin + "' generate --model '" + model + "' --prompt-file '" + prompt_file +
               "' " + flags + " --arm " + arm + " --export '" + path + "'"))
        return r;
    }
    // One read of each into the page cache: every benchmark then measures a warm cache.
    std::vector<char> buf(std::size_t{4} << 20);
    for (const auto& path : {r.a, r.b}) {
      const std::int64_t n = ReadAll(path, buf);
      if (n <= 0) return r;
      r.bytes += n;
    }
    std::fprintf(stderr, "diff_bench: shape %d: two exports of %.1f MB each in %s\n", shape,
                 static_cast<double>(r.bytes) / 2e6, g_dir.c_str());
    r.ok = true;
  }
  return r;
}

void SetBytes(benchmark::State& state, const Exports& e) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * e.bytes);
  state.counters["file_MB"] = static_cast<double>(e.bytes) / 2e6;
}

// The ceiling: both files read start to end with read() into one reused 4 MiB buffer.
void BM_RawRead(benchmark::State& state) {
  const Exports& e = Pair(static_cast<int>(state.range(0)));
  if (!e.ok) {
    state.SkipWithError("setup failed (see stderr)");
    return;
  }
  std::vector<char> buf(std::size_t{4} << 20);
  for (auto _ : state) {
    std::int64_t n = 0;
    for (const auto& path : {e.a, e.b}) n += ReadAll(path, buf);
    if (n != e.bytes) state.SkipWithError("short read");
    benchmark::DoNotOptimize(buf.data());
  }
  SetBytes(state, e);
}

// What `lockstep diff A B` does before the report: open (validate) both files, then diff every
// item. Counters: items compared, and the seconds per iteration spent in Open and in DiffExports.
void LockstepDiff(benchmark::State& state, int threads, bool isolate) {
  const Exports& e = Pair(static_cast<int>(state.range(0)));
  if (!e.ok) {
    state.SkipWithError("setup failed (see stderr)");
    return;
  }
  DiffOptions opts;
  opts.threads = threads;
  double open_s = 0.0, diff_s = 0.0, compared = 0.0, data_bytes = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    ReaderLimits limits;
    limits.isolate = isolate;
    auto ra = ExportReader::Open(e.a, limits);
    auto rb = ExportReader::Open(e.b, limits);
    if (!ra.ok() || !rb.ok()) {
      state.SkipWithError("open failed");
      break;
    }
    const auto t1 = std::chrono::steady_clock::now();
    auto d = DiffExports(**ra, **rb, opts);
    if (!d.ok() || !d->Passed() || d->compared == 0) {
      state.SkipWithError(d.ok() ? "the diff of two identical runs did not pass" : "diff failed");
      break;
    }
    open_s += std::chrono::duration<double>(t1 - t0).count();
    diff_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    compared = d->compared;
    data_bytes = static_cast<double>(d->bytes_read);
  }
  SetBytes(state, e);
  const double iters =
      static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["items"] = compared;
  state.counters["data_MB"] =
      data_bytes / 1e6;  // item bytes read, both sides (the rest is HDF5 metadata)
  state.counters["open_s"] = open_s / iters;
  state.counters["diff_s"] = diff_s / iters;
}
// DiffOptions::threads 0: hardware threads.
void BM_LockstepDiff(benchmark::State& s) { LockstepDiff(s, 0, true); }
void BM_LockstepDiffInProcess(benchmark::State& s) { LockstepDiff(s, 0, false); }
void BM_LockstepDiffOneThread(benchmark::State& s) { LockstepDiff(s, 1, true); }

// CPU seconds (user + sys) of this process (RUSAGE_SELF) or of its reaped descendants
// (RUSAGE_CHILDREN). main() makes this process a subreaper, so the isolated readers that a
// `lockstep diff` leaves exiting behind it are reparented here, and DrainChildren() reaps them:
// their CPU counts too. On a shared, loaded machine CPU time is the stable figure; wall time
// swings by 20-30% between repetitions.
double Cpu(int who) {
  rusage ru{};
  ::getrusage(who, &ru);
  auto s = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return s(ru.ru_utime) + s(ru.ru_stime);
}
void DrainChildren() {
  int status = 0;
  while (::waitpid(-1, &status, 0) > 0) {
  }
}
double PerIteration(double total, const benchmark::State& state) {
  return total / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
}

// The fixed cost of an isolated open: a tiny export (one window, commit only), opened again and
// again, isolated and in process; counter open_s per file.
const std::string& TinyExport() {
  static std::string path;
  if (!path.empty()) return path;
  const std::string bin = Env("LOCKSTEP_BIN", LOCKSTEP_BIN_PATH);
  if (g_dir.empty()) {
    g_dir =
        Env("LOCKSTEP_BENCH_DIR", "/tmp") + "/lockstep-diff-bench-" + std::to_string(::getpid());
    std::filesystem::create_directories(g_dir);
  }
  const std::string model = g_dir + "/tiny", out = g_dir + "/tiny.h5";
  if (Run("'" + bin + "' model init --preset tiny --seed 0 --out '" + model + "'") &&
      Run("'" + bin + "' generate --model '" + model + "' --prompt 'the cat sat' --max-new 4" +
          " --export-windows 0 --export-points commit --export '" + out + "'"))
    path = out;
  return path;
}
void OpenTiny(benchmark::State& state, bool isolate) {
  const std::string& path = TinyExport();
  if (path.empty()) {
    state.SkipWithError("setup failed (see stderr)");
    return;
  }
  ReaderLimits limits;
  limits.isolate = isolate;
  DrainChildren();
  const double cpu0 = Cpu(RUSAGE_SELF) + Cpu(RUSAGE_CHILDREN);
  for (auto _ : state) {
    auto r = ExportReader::Open(path, limits);
    if (!r.ok()) {
      state.SkipWithError("open failed");
      break;
    }
    benchmark::DoNotOptimize(r->get());
  }
  DrainChildren();
  state.counters["cpu_ms"] =
      1e3 * PerIteration(Cpu(RUSAGE_SELF) + Cpu(RUSAGE_CHILDREN) - cpu0, state);
}
// `lockstep diff A B --quiet` itself, a fresh process per iteration, isolated (the default) and
// with --no-isolate: what a user waits for.
void DiffCommand(benchmark::State& state, bool isolate) {
  const Exports& e = Pair(static_cast<int>(state.range(0)));
  if (!e.ok) {
    state.SkipWithError("setup failed (see stderr)");
    return;
  }
  const std::string cmd = "'" + Env("LOCKSTEP_BIN", LOCKSTEP_BIN_PATH) + "' diff --quiet '" + e.a +
                          "' '" + e.b + "'" + (isolate ? "" : " --no-isolate") + " >/dev/null";
  DrainChildren();
  const double cpu0 = Cpu(RUSAGE_CHILDREN);
  for (auto _ : state)
    if (ExitCode(std::system(cmd.c_str())) != 0) {
      state.SkipWithError("lockstep diff did not pass");
      break;
    }
  DrainChildren();
  SetBytes(state, e);
  state.counters["cpu_ms"] = 1e3 * PerIteration(Cpu(RUSAGE_CHILDREN) - cpu0, state);
}
void BM_DiffCommand(benchmark::State& s) { DiffCommand(s, true); }
void BM_DiffCommandNoIsolate(benchmark::State& s) { DiffCommand(s, false); }

void BM_OpenTiny(benchmark::State& s) { OpenTiny(s, true); }
void BM_OpenTinyInProcess(benchmark::State& s) { OpenTiny(s, false); }

// HDF5's own differ over /checkpoints, recursively: every state dataset, element by element. Not
// the whole file: the root attributes (run_id, arm, created_utc) and the trace differ between any
// two runs, and h5diff would count those. Exit 0 = no differences, 1 = differences, 2 = error.
void BM_H5diff(benchmark::State& state) {
  const Exports& e = Pair(static_cast<int>(state.range(0)));
  if (!e.ok) {
    state.SkipWithError("setup failed (see stderr)");
    return;
  }
  const std::string h5diff = Env("LOCKSTEP_H5DIFF", "h5diff");  // env: LOCKSTEP_H5DIFF
  const std::string cmd =
      "'" + h5diff + "' -q '" + e.a + "' '" + e.b + "' /checkpoints /checkpoints >/dev/null 2>&1";
  for (auto _ : state) {
    const int rc = ExitCode(std::system(cmd.c_str()));
    if (rc != 0) {
      state.SkipWithError(rc == 127 ? "h5diff not found"
                                    : "h5diff did not report the checkpoints identical");
      break;
    }
  }
  SetBytes(state, e);
}

// First, while this process is small (as `lockstep diff` is when it opens its files): the fork's
// cost grows with the caller's resident memory (~7 ms per GiB; see tests/bench/README.md).
BENCHMARK(BM_OpenTiny)
    ->Arg(0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.3)
    ->Repetitions(5);
BENCHMARK(BM_OpenTinyInProcess)
    ->Arg(0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.3)
    ->Repetitions(5);
BENCHMARK(BM_RawRead)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_LockstepDiff)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK(BM_DiffCommand)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2)
    ->Repetitions(6);
BENCHMARK(BM_DiffCommandNoIsolate)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2)
    ->Repetitions(6);
BENCHMARK(BM_LockstepDiffInProcess)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK(BM_LockstepDiffOneThread)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
// Seconds per run, and the goal is a ratio of 20: one run is enough.
BENCHMARK(BM_H5diff)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

class Reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      // With --benchmark_repetitions the mean is the figure (the median for the time per
      // iteration, reported after the mean: the isolation ratios on a noisy machine); other
      // aggregates and errors are skipped.
      const std::string name = r.benchmark_name();  // "BM_X/<shape>/..."
      const std::string key = name.substr(0, name.find('/', name.find('/') + 1));
      if (!r.error_occurred && r.aggregate_name == "median") {
        g_real_ms[key] = r.GetAdjustedRealTime();
        if (auto c = r.counters.find("cpu_ms"); c != r.counters.end()) g_cpu_ms[key] = c->second;
      }
      if (r.error_occurred || (!r.aggregate_name.empty() && r.aggregate_name != "mean")) continue;
      auto it = r.counters.find("bytes_per_second");
      if (it != r.counters.end()) g_bps[key] = it->second;
      if (auto o = r.counters.find("open_s"); o != r.counters.end()) g_open_s[key] = o->second;
      g_real_ms[key] = r.GetAdjustedRealTime();  // every benchmark here is in ms
    }
  }
};

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // see Cpu()
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  lockstep::Reporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  if (!lockstep::g_dir.empty()) std::filesystem::remove_all(lockstep::g_dir);
  auto& b = lockstep::g_bps;
  for (const char* shape : {"/0", "/1"}) {
    auto get = [&](const std::string& n) { return b.count(n + shape) ? b[n + shape] : 0.0; };
    const double raw = get("BM_RawRead"), h5 = get("BM_H5diff");
    std::printf("shape %s (%s)\n", shape + 1, shape[1] == '0' ? "many windows" : "long context");
    if (raw > 0.0) std::printf("  raw read       %7.2f GB/s\n", raw / 1e9);
    if (h5 > 0.0) std::printf("  h5diff         %7.2f GB/s\n", h5 / 1e9);
    for (const char* name : {"BM_LockstepDiff", "BM_LockstepDiffOneThread"}) {
      const double x = get(name);
      if (x <= 0.0) continue;
      std::printf("  %s: %.2f GB/s", name, x / 1e9);
      if (h5 > 0.0) std::printf(" = %.1f x h5diff (goal >= 20)", x / h5);
      if (raw > 0.0) std::printf(" = %.3f x raw read", x / raw);
      std::printf("\n");
    }
    // Isolation (issue 21): the same diff with each file parsed in a child vs in this process.
    const std::string iso = std::string("BM_LockstepDiff") + shape,
                      inproc = std::string("BM_LockstepDiffInProcess") + shape;
    auto& o = lockstep::g_open_s;
    auto& t = lockstep::g_real_ms;
    const std::string cmd = std::string("BM_DiffCommand") + shape,
                      cmd_no = std::string("BM_DiffCommandNoIsolate") + shape;
    auto& c = lockstep::g_cpu_ms;
    if (t.count(cmd) && t.count(cmd_no) && t[cmd_no] > 0.0 && c[cmd_no] > 0.0)
      std::printf(
          "  isolation: `lockstep diff` CPU %.1f ms vs %.1f ms --no-isolate = %.3f x "
          "(goal <= 1.05); wall %.1f vs %.1f ms = %.3f x\n",
          c[cmd], c[cmd_no], c[cmd] / c[cmd_no], t[cmd], t[cmd_no], t[cmd] / t[cmd_no]);
    if (t.count(iso) && t.count(inproc) && t[inproc] > 0.0)
      std::printf(
          "  isolation in this (large) process: Open + DiffExports %.3f x in-process; "
          "open +%.1f ms per file\n",
          t[iso] / t[inproc], 1e3 * (o[iso] - o[inproc]) / 2.0);
  }
  auto& t = lockstep::g_real_ms;
  auto& c = lockstep::g_cpu_ms;
  if (c.count("BM_OpenTiny/0") && c.count("BM_OpenTinyInProcess/0"))
    std::printf(
        "tiny export: open CPU %.2f ms isolated (both processes), %.2f ms in process: "
        "+%.2f ms per file (goal <= 20)\n",
        c["BM_OpenTiny/0"], c["BM_OpenTinyInProcess/0"],
        c["BM_OpenTiny/0"] - c["BM_OpenTinyInProcess/0"]);
  if (t.count("BM_OpenTiny/0") && t.count("BM_OpenTinyInProcess/0"))
    std::printf(
        "tiny export: open wall %.2f ms isolated, %.2f ms in process: +%.2f ms per file "
        "(goal <= 20)\n",
        t["BM_OpenTiny/0"], t["BM_OpenTinyInProcess/0"],
        t["BM_OpenTiny/0"] - t["BM_OpenTinyInProcess/0"]);
  return 0;
}
