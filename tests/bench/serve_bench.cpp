// Serving benchmark (issue 22, Must show 5): the scheduler (engine/serve) on the `small` synthetic
// model, 2 threads, 4 stages, spec 0, ignore_eos, batch_invariant on; every ratio from one run.
//
//   BM_ServeThroughput  rounds (3) of, back to back: prefill tokens/s of a 512-token prompt
//                       alone (chunk 512, one step; its engine warmed by one prefill first), then
//                       aggregate decode tokens/s of N = 1, 4, 16 concurrent requests on one
//                       16-slot engine (64-token prompts, max_new 64), counted over the steps where
//                       all N decode, after two such steps of warm-up; per step: rows, weight
//                       bytes and flops (the StepRecord's, below), GB/s and GFLOP/s, pool
//                       utilisation (process CPU time / (threads x step wall)) and the serial
//                       driver share (the step's wall time outside Engine::RunStep: planning,
//                       sampling, commit, hooks). Ratios are taken within each round; the summary
//                       gives each round and the medians
//   BM_PipelineBound    pipelined steps, measured before building them: 16 decoding requests
//                       (64-token prompts, max_new 32) with 1 and 2 threads, interleaved rounds:
//                       pool utilisation (process CPU / (threads x step wall), a spinning
//                       worker counted as busy), the serial driver share (wall outside
//                       Engine::RunStep: planning, sampling, commit, hooks) and the most any
//                       overlap of steps could gain on 2 cores (1 - (1 thread's step / 2) / 2
//                       threads' step)
//   BM_ServeLatency     per-token latency (mean and p90 of the gap between one request's
//                       emitted tokens) and process CPU per step of 16 decoding requests over 40
//                       steps without (20 before, 20 after) and 40 steps with a 4,000-token prompt
//                       prefilled beside them, for (prefill_chunk, batch_tokens) = (32, 48) and
//                       (16, 32): each step carries the 16 verify rows and one chunk
//   BM_ServeSlots       the cost of the sweep's limits (issue 40, item 5): aggregate decode
//   tokens/s
//                       and resident memory at N = 1, 16, 64 and 256 (the maximum --slots) on an
//                       engine of N slots, N requests (32-token prompts, max_new 24; batch_tokens
//                       33 N at least, so all are admitted in the first step), counted over
//                       the steps where all N decode after two of warm-up; RSS (VmRSS) during
//                       those steps, and its growth over the RSS before the engine was made.
//                       Rounds of N = 1, 16, 64, 256 back to back; ratios within a round
//
// The summary after the table prints ratio16_vs_1 (goal >= 2), ratio16_vs_prefill (goal >= 0.6),
// the latency ratios (goal <= 2) and the slots table (tokens/s and RSS per N, ratios to N = 1).
//
//   build/tests/bench/serve_bench --benchmark_counters_tabular=true
//
// Weight bytes and flops of a step are the scheduler's StepRecord fields (stage.h StepWork: each
// product's matrix once per product call, each routed expert once per MoE call that uses it,
// flops 2 x the products' multiply-adds; attention scores and recurrences left out).
//
// env: LOCKSTEP_BENCH_MODEL  folder of an existing `small` model (else one is generated in /tmp)
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_model.h"
#include "lockstep/engine/clock.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/scheduler.h"

namespace lockstep {
namespace {

constexpr int kThreads = 2;

const ModelWeights& SmallModel() { return BenchSmallModel(false); }

std::int64_t ProcessCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A hashed token stream (varied routing), different per seed.
std::vector<std::int32_t> Prompt(int n, unsigned seed) {
  const unsigned v = static_cast<unsigned>(SmallModel().config.n_vocab);
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(
        (static_cast<unsigned>(i + 1) * 2654435761u + seed * 40503u) % (v - 8) + 4);
  return t;
}

EnginePtr MakeEngine(int slots, int prefill_chunk, int batch_tokens, int threads = kThreads) {
  EngineConfig c;
  c.threads = threads;
  c.stages = 4;
  c.spec = 0;
  c.ignore_eos = true;
  c.batch_invariant = true;
  c.slots = slots;
  c.prefill_chunk = prefill_chunk;
  c.batch_tokens = batch_tokens;
  auto e = Engine::Create(c, SmallModel());
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", e.status().ToString().c_str());
    std::abort();
  }
  return std::move(e).value();
}

RequestSpec Request(const Engine& e, const std::string& id, std::vector<std::int32_t> prompt,
                    int max_new) {
  RequestSpec s;
  s.id = id;
  s.prompt = std::move(prompt);
  s.options = RequestOptions::FromConfig(e.config());
  s.options.max_new = max_new;
  s.options.ignore_eos = true;
  s.options.spec = 0;
  s.options.mtp = false;
  return s;
}

Ticket MustSubmit(Scheduler& s, RequestSpec spec) {
  auto t = s.Submit(std::move(spec));
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    std::abort();
  }
  return *t;
}

// One Scheduler::Step with its wall and process CPU time; `ran` when it ran an engine step.
struct StepSample {
  bool ran = false;
  StepRecord rec;
  std::int64_t wall_ns = 0, cpu_ns = 0;
  std::int64_t forward_ns() const { return rec.end_ns - rec.begin_ns; }
};

StepSample TimedStep(Scheduler& s, bool* more = nullptr) {
  const std::size_t before = s.step_records().size();
  StepSample x;
  const std::int64_t c0 = ProcessCpuNs(), t0 = MonotonicNs();
  auto r = s.Step();
  x.wall_ns = MonotonicNs() - t0;
  x.cpu_ns = ProcessCpuNs() - c0;
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    std::abort();
  }
  if (more != nullptr) *more = *r;
  x.ran = s.step_records().size() > before;
  if (x.ran) x.rec = s.step_records().back();
  return x;
}

// ---- results shared with the summary ----
struct DecodeFigures {
  double tokens_per_s = 0;
  double step_ms = 0, rows = 0, weight_mb = 0, gflop = 0, gb_s = 0, gflop_s = 0;
  double utilisation = 0, serial_share = 0;
  int steps = 0;
};
// One round: the prefill and the three decode runs back to back, so that each ratio is taken
// between measurements a few seconds apart (this machine is shared: load drifts over minutes).
struct Round {
  double prefill_tokens_per_s = 0, prefill_util = 0;
  std::map<int, DecodeFigures> decode;  // N -> figures
};
std::vector<Round> g_rounds;
struct LatencyFigures {
  double mean_ms[2] = {0, 0}, p90_ms[2] = {0, 0};
  double step_rows[2] = {0, 0};
  double cpu_ms[2] = {0, 0};  // process CPU per step (less sensitive to other load than wall)
  bool valid = false;
};
std::map<std::pair<int, int>, LatencyFigures> g_latency;  // (prefill_chunk, batch_tokens) ->

// Averages over the counted steps of one decode run.
DecodeFigures Summarise(const std::vector<StepSample>& xs, int n) {
  DecodeFigures f;
  f.steps = static_cast<int>(xs.size());
  if (xs.empty()) return f;
  double wall = 0, cpu = 0, fwd = 0, rows = 0, bytes = 0, flops = 0;
  for (const StepSample& x : xs) {
    wall += static_cast<double>(x.wall_ns);
    cpu += static_cast<double>(x.cpu_ns);
    fwd += static_cast<double>(x.forward_ns());
    rows += x.rec.rows;
    bytes += static_cast<double>(x.rec.weight_bytes);
    flops += static_cast<double>(x.rec.flops);
  }
  const double k = static_cast<double>(xs.size());
  f.tokens_per_s = n * k / (wall / 1e9);
  f.step_ms = wall / k / 1e6;
  f.rows = rows / k;
  f.weight_mb = bytes / k / 1e6;
  f.gflop = flops / k / 1e9;
  f.gb_s = bytes / (wall / 1e9) / 1e9;
  f.gflop_s = flops / (wall / 1e9) / 1e9;
  f.utilisation = cpu / (kThreads * wall);
  f.serial_share = (wall - fwd) / wall;
  return f;
}

// A 512-token prefill (513-token prompt, max_new 1) on `e`: tokens/s over its prefill steps.
double PrefillOnce(Engine& e, unsigned seed, double* util) {
  Scheduler s(e);
  MustSubmit(s, Request(e, "prefill", Prompt(513, seed), 1));
  double tokens = 0, ns = 0, cpu = 0;
  for (bool more = true; more;) {
    const StepSample x = TimedStep(s, &more);
    if (!x.ran || x.rec.prefill_rows == 0) continue;
    tokens += x.rec.prefill_rows;
    ns += static_cast<double>(x.wall_ns);
    cpu += static_cast<double>(x.cpu_ns);
  }
  *util = ns > 0 ? cpu / (kThreads * ns) : 0;
  return ns > 0 ? tokens / (ns / 1e9) : 0;
}

// N requests of 64-token prompts and max_new 64 on `e`, counted over the steps where all N decode
// (after two such steps of warm-up: the first windows of this composition).
DecodeFigures DecodeOnce(Engine& e, int n, unsigned seed) {
  Scheduler s(e);
  for (int i = 0; i < n; ++i)
    MustSubmit(s, Request(e, "r" + std::to_string(i), Prompt(64, seed + i), 64));
  std::vector<StepSample> counted;
  int all_decode = 0;
  for (bool more = true; more;) {
    const StepSample x = TimedStep(s, &more);
    if (!x.ran || x.rec.prefill_rows != 0 || x.rec.verify_rows != n) continue;
    if (++all_decode > 2) counted.push_back(x);
  }
  return Summarise(counted, n);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Rounds of [prefill, decode N = 1, 4, 16] on two engines made once (the prefill engine is warmed
// by one prefill first, so arena growth is not counted).
void BM_ServeThroughput(benchmark::State& state) {
  EnginePtr pe = MakeEngine(1, 512, 512), de = MakeEngine(16, 512, 512);
  double util = 0;
  PrefillOnce(*pe, 1, &util);
  for (auto _ : state) {
    Round r;
    const std::int64_t t0 = MonotonicNs();
    // The median of three prefills (one step each: a single step is at the mercy of the load).
    std::vector<std::pair<double, double>> pf;
    for (unsigned k = 0; k < 3; ++k) {
      const double tps =
          PrefillOnce(*pe, 2 + k + 3 * static_cast<unsigned>(g_rounds.size()), &util);
      pf.emplace_back(tps, util);
    }
    std::sort(pf.begin(), pf.end());
    r.prefill_tokens_per_s = pf[1].first;
    r.prefill_util = pf[1].second;
    for (int n : {1, 4, 16})
      r.decode[n] = DecodeOnce(*de, n, 10 + 100 * static_cast<unsigned>(g_rounds.size()));
    state.SetIterationTime(static_cast<double>(MonotonicNs() - t0) / 1e9);
    g_rounds.push_back(r);
  }
  std::vector<double> pf, d1, d16, r1, rp;
  for (const Round& r : g_rounds) {
    pf.push_back(r.prefill_tokens_per_s);
    d1.push_back(r.decode.at(1).tokens_per_s);
    d16.push_back(r.decode.at(16).tokens_per_s);
    r1.push_back(r.decode.at(16).tokens_per_s / r.decode.at(1).tokens_per_s);
    rp.push_back(r.decode.at(16).tokens_per_s / r.prefill_tokens_per_s);
  }
  state.counters["prefill_tok_s"] = Median(pf);
  state.counters["decode1_tok_s"] = Median(d1);
  state.counters["decode16_tok_s"] = Median(d16);
  state.counters["ratio16_vs_1"] = Median(r1);
  state.counters["ratio16_vs_prefill"] = Median(rp);
}

// Pipelined steps, measured before anyone builds them: 16 decoding requests through the
// scheduler with 1 and with 2 threads, interleaved in rounds. Per step: wall time, the forward's
// wall time (Engine::RunStep, the StepRecord's span), process CPU and the driver thread's CPU.
// Overlapping stages of consecutive steps adds no core on this machine; it can at best fill the
// time a core idles (the serial driver share, the forward's serial parts, a spinning worker). The
// most any overlap could give is the step at perfect use of both cores: 1 thread's step / 2.
struct PipeFigures {
  double step_ms = 0, forward_ms = 0, cpu_ms = 0, driver_cpu_ms = 0;
  int steps = 0;
};
std::map<int, std::vector<PipeFigures>> g_pipe;  // threads -> one per round

PipeFigures PipeOnce(int threads, unsigned seed) {
  EnginePtr e = MakeEngine(16, 512, 512, threads);
  Scheduler s(*e);
  for (int i = 0; i < 16; ++i)
    MustSubmit(s, Request(*e, "p" + std::to_string(i), Prompt(64, seed + i), 32));
  PipeFigures f;
  int all_decode = 0;
  for (bool more = true; more;) {
    const std::int64_t u0 = ThreadCpuNs();
    const StepSample x = TimedStep(s, &more);
    const std::int64_t du = ThreadCpuNs() - u0;
    if (!x.ran || x.rec.prefill_rows != 0 || x.rec.verify_rows != 16) continue;
    if (++all_decode <= 2) continue;
    ++f.steps;
    f.step_ms += static_cast<double>(x.wall_ns) / 1e6;
    f.forward_ms += static_cast<double>(x.forward_ns()) / 1e6;
    f.cpu_ms += static_cast<double>(x.cpu_ns) / 1e6;
    f.driver_cpu_ms += static_cast<double>(du) / 1e6;
  }
  if (f.steps > 0)
    for (double* v : {&f.step_ms, &f.forward_ms, &f.cpu_ms, &f.driver_cpu_ms}) *v /= f.steps;
  return f;
}

void BM_PipelineBound(benchmark::State& state) {
  for (auto _ : state) {
    const std::int64_t t0 = MonotonicNs();
    const unsigned seed = 500 + 50 * static_cast<unsigned>(g_pipe[2].size());
    for (int threads : {1, 2}) g_pipe[threads].push_back(PipeOnce(threads, seed));
    state.SetIterationTime(static_cast<double>(MonotonicNs() - t0) / 1e9);
  }
  std::vector<double> gain, util, serial, serial1, overhead;
  for (std::size_t r = 0; r < g_pipe[2].size(); ++r) {
    const PipeFigures &one = g_pipe[1][r], &two = g_pipe[2][r];
    gain.push_back(1.0 - one.step_ms / 2 / two.step_ms);
    util.push_back(two.cpu_ms / (2 * two.step_ms));
    serial.push_back((two.step_ms - two.forward_ms) / two.step_ms);
    serial1.push_back((one.step_ms - one.forward_ms) / one.step_ms);
    overhead.push_back(two.cpu_ms / one.cpu_ms - 1.0);
  }
  state.counters["pool_util"] = Median(util);
  state.counters["serial_share"] = Median(serial);
  state.counters["serial_share_1t"] = Median(serial1);
  state.counters["cpu_overhead_2t"] = Median(overhead);
  state.counters["max_gain_wall"] = Median(gain);
}

// Mean and p90 of the gaps between successive token times of every request, in every segment.
void GapStats(const std::vector<const std::vector<std::vector<std::int64_t>>*>& segments,
              double* mean_ms, double* p90_ms) {
  std::vector<double> gaps;
  for (const auto* times : segments)
    for (const auto& t : *times)
      for (std::size_t i = 1; i < t.size(); ++i)
        gaps.push_back(static_cast<double>(t[i] - t[i - 1]));
  if (gaps.empty()) return;
  double sum = 0;
  for (double g : gaps) sum += g;
  *mean_ms = sum / static_cast<double>(gaps.size()) / 1e6;
  std::sort(gaps.begin(), gaps.end());
  *p90_ms = gaps[static_cast<std::size_t>(0.9 * static_cast<double>(gaps.size() - 1))] / 1e6;
}

// 16 decoders; segments of steps: 20 alone, 40 beside the 4,000-token prompt's prefill (admitted
// at the segment's start, cancelled at its end), 20 alone again (so that drift in the machine's
// load falls on both sides).
void BM_ServeLatency(benchmark::State& state) {
  constexpr int kDecoders = 16;
  constexpr int kSteps[3] = {20, 40, 20};
  const int chunk = static_cast<int>(state.range(0)), budget = static_cast<int>(state.range(1));
  LatencyFigures& lat = g_latency[{chunk, budget}];
  for (auto _ : state) {
    EnginePtr e = MakeEngine(kDecoders + 1, chunk, budget);
    Scheduler s(*e);
    // Token times of each decoder per segment, filled by its on_record hook.
    std::vector<std::vector<std::int64_t>> times[3];
    for (auto& t : times) t.resize(kDecoders);
    int seg = -1;
    for (int i = 0; i < kDecoders; ++i) {
      RequestSpec r = Request(*e, "d" + std::to_string(i), Prompt(64, 100 + i), 200);
      r.hooks.on_record = [&times, &seg, i](const WindowRecord&) {
        if (seg >= 0) times[seg][static_cast<std::size_t>(i)].push_back(MonotonicNs());
        return Status::Ok();
      };
      MustSubmit(s, std::move(r));
    }
    // Until all 16 decode in one step (their prompts are prefilled), plus one warm-up step.
    for (int warm = 0; warm < 2;) {
      const StepSample x = TimedStep(s);
      if (x.ran && x.rec.prefill_rows == 0 && x.rec.verify_rows == kDecoders) ++warm;
    }
    double rows[3] = {0, 0, 0}, cpu[3] = {0, 0, 0};
    const std::int64_t t0 = MonotonicNs();
    for (seg = 0; seg < 3; ++seg) {
      const Ticket big = seg == 1 ? MustSubmit(s, Request(*e, "long", Prompt(4000, 7), 1)) : 0;
      for (int k = 0; k < kSteps[seg]; ++k) {
        const StepSample x = TimedStep(s);
        rows[seg] += x.rec.rows;
        cpu[seg] += static_cast<double>(x.cpu_ns) / 1e6;
      }
      if (big != 0 && !s.Cancel(big).ok()) state.SkipWithError("cancel failed");
    }
    seg = -1;
    state.SetIterationTime(static_cast<double>(MonotonicNs() - t0) / 1e9);
    GapStats({&times[0], &times[2]}, &lat.mean_ms[0], &lat.p90_ms[0]);
    GapStats({&times[1]}, &lat.mean_ms[1], &lat.p90_ms[1]);
    lat.step_rows[0] = (rows[0] + rows[2]) / (kSteps[0] + kSteps[2]);
    lat.step_rows[1] = rows[1] / kSteps[1];
    lat.cpu_ms[0] = (cpu[0] + cpu[2]) / (kSteps[0] + kSteps[2]);
    lat.cpu_ms[1] = cpu[1] / kSteps[1];
    lat.valid = true;
    for (auto& r : s.TakeFinished()) benchmark::DoNotOptimize(r.result.output.data());
  }
  state.counters["mean_ms_alone"] = lat.mean_ms[0];
  state.counters["p90_ms_alone"] = lat.p90_ms[0];
  state.counters["mean_ms_prefill"] = lat.mean_ms[1];
  state.counters["p90_ms_prefill"] = lat.p90_ms[1];
  state.counters["rows_alone"] = lat.step_rows[0];
  state.counters["rows_prefill"] = lat.step_rows[1];
  state.counters["cpu_ratio"] = lat.cpu_ms[0] > 0 ? lat.cpu_ms[1] / lat.cpu_ms[0] : 0;
}

// Resident set size now (VmRSS of /proc/self/status), MB; 0 when unreadable.
double RssMb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr)
    if (std::sscanf(line, "VmRSS: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb / 1024.0;
}

struct SlotsFigures {
  double tokens_per_s = 0, step_ms = 0, rss_mb = 0, rss_growth_mb = 0;
  int steps = 0;
};
std::vector<std::map<int, SlotsFigures>> g_slots;  // one map N -> figures per round
constexpr int kSlotsN[] = {1, 16, 64, 256};

// N requests on a fresh engine of N slots: decode tokens/s over the all-decoding steps (after
// two), RSS sampled on each of those steps (the largest), and its growth over the RSS before.
SlotsFigures SlotsOnce(int n, unsigned seed) {
  const double rss0 = RssMb();
  // batch_tokens fits every prompt in the first step: all N decode from the second on.
  EnginePtr e = MakeEngine(n, 512, std::max(512, 33 * n));
  Scheduler s(*e);
  for (int i = 0; i < n; ++i)
    MustSubmit(s, Request(*e, "s" + std::to_string(i), Prompt(32, seed + i), 24));
  std::vector<StepSample> counted;
  SlotsFigures f;
  int all_decode = 0;
  for (bool more = true; more;) {
    const StepSample x = TimedStep(s, &more);
    if (!x.ran || x.rec.prefill_rows != 0 || x.rec.verify_rows != n) continue;
    if (++all_decode <= 2) continue;
    counted.push_back(x);
    f.rss_mb = std::max(f.rss_mb, RssMb());
  }
  const DecodeFigures d = Summarise(counted, n);
  f.tokens_per_s = d.tokens_per_s;
  f.step_ms = d.step_ms;
  f.steps = d.steps;
  f.rss_growth_mb = f.rss_mb - rss0;
  return f;
}

void BM_ServeSlots(benchmark::State& state) {
  SmallModel();  // loaded before the first RSS baseline
  for (auto _ : state) {
    const std::int64_t t0 = MonotonicNs();
    std::map<int, SlotsFigures> round;
    for (int n : kSlotsN)
      round[n] = SlotsOnce(n, 3000 + 1000 * static_cast<unsigned>(g_slots.size()));
    state.SetIterationTime(static_cast<double>(MonotonicNs() - t0) / 1e9);
    g_slots.push_back(round);
  }
  for (int n : kSlotsN) {
    std::vector<double> tps, ratio, rss;
    for (const auto& r : g_slots) {
      tps.push_back(r.at(n).tokens_per_s);
      ratio.push_back(r.at(n).tokens_per_s / r.at(1).tokens_per_s);
      rss.push_back(r.at(n).rss_mb);
    }
    state.counters["decode" + std::to_string(n) + "_tok_s"] = Median(tps);
    state.counters["ratio" + std::to_string(n) + "_vs_1"] = Median(ratio);
    state.counters["rss" + std::to_string(n) + "_mb"] = Median(rss);
  }
}

BENCHMARK(BM_ServeThroughput)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PipelineBound)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
// (prefill_chunk, batch_tokens): a 32-row chunk beside the 16 verify rows, and a 16-row one.
BENCHMARK(BM_ServeLatency)
    ->ArgNames({"chunk", "batch_tokens"})
    ->Args({32, 48})
    ->Args({16, 32})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ServeSlots)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);

// The ratios of this run, after the table.
void PrintRound(std::size_t i, const Round& r) {
  std::printf("  round %zu: prefill (512-token prompt alone) %.0f tokens/s, pool_util %.2f\n", i,
              r.prefill_tokens_per_s, r.prefill_util);
  std::printf("  %4s %9s %8s %6s %10s %7s %7s %9s %9s %8s\n", "N", "tok/s", "step_ms", "rows",
              "weight_MB", "GFLOP", "GB/s", "GFLOP/s", "pool_util", "serial");
  for (const auto& [n, f] : r.decode)
    std::printf("  %4d %9.1f %8.2f %6.1f %10.1f %7.3f %7.2f %9.2f %9.2f %8.3f\n", n, f.tokens_per_s,
                f.step_ms, f.rows, f.weight_mb, f.gflop, f.gb_s, f.gflop_s, f.utilisation,
                f.serial_share);
  std::printf("  ratio16_vs_1 = %.2f, ratio16_vs_prefill = %.2f\n",
              r.decode.at(16).tokens_per_s / r.decode.at(1).tokens_per_s,
              r.decode.at(16).tokens_per_s / r.prefill_tokens_per_s);
  // Per CPU-second of the process (tokens/s / (threads x pool_util)): what the run did with the
  // CPU it got, less sensitive to other load than wall time (a spinning worker counts as busy).
  auto per_cpu = [](double tps, double util) { return tps / (kThreads * util); };
  const double p = per_cpu(r.prefill_tokens_per_s, r.prefill_util);
  const double d1 = per_cpu(r.decode.at(1).tokens_per_s, r.decode.at(1).utilisation);
  const double d16 = per_cpu(r.decode.at(16).tokens_per_s, r.decode.at(16).utilisation);
  std::printf(
      "  per CPU-second: prefill %.0f, decode 1 %.1f, decode 16 %.1f tokens; ratio16_vs_1 %.2f, "
      "ratio16_vs_prefill %.2f\n",
      p, d1, d16, d16 / d1, d16 / p);
}

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\nserve_bench summary (small, %d threads, 4 stages, spec 0, batch_invariant on)\n",
                kThreads);
    for (std::size_t i = 0; i < g_rounds.size(); ++i) PrintRound(i, g_rounds[i]);
    std::vector<double> r1, rp;
    for (const Round& r : g_rounds) {
      r1.push_back(r.decode.at(16).tokens_per_s / r.decode.at(1).tokens_per_s);
      rp.push_back(r.decode.at(16).tokens_per_s / r.prefill_tokens_per_s);
    }
    if (!g_rounds.empty())
      std::printf(
          "  median over %zu rounds: ratio16_vs_1 = %.2f (goal >= 2), ratio16_vs_prefill = "
          "%.2f (goal >= 0.6)\n",
          g_rounds.size(), Median(r1), Median(rp));
    for (std::size_t r = 0; r < g_pipe[2].size(); ++r)
      for (int threads : {1, 2}) {
        const PipeFigures& f = g_pipe[threads][r];
        std::printf(
            "  pipelining, round %zu, %d thread(s), 16 decoding: step %.2f ms, forward %.2f ms, "
            "serial %.2f ms (%.3f), process CPU %.2f ms (pool_util %.2f), driver CPU %.2f ms\n",
            r, threads, f.step_ms, f.forward_ms, f.step_ms - f.forward_ms,
            (f.step_ms - f.forward_ms) / f.step_ms, f.cpu_ms, f.cpu_ms / (threads * f.step_ms),
            f.driver_cpu_ms);
      }
    for (std::size_t r = 0; r < g_pipe[2].size(); ++r)
      std::printf(
          "  pipelining bound, round %zu: 2 threads' step %.2f ms vs perfect use of both cores "
          "%.2f ms (1 thread's / 2): at most %.1f%% to gain by any overlap (wall: meaningful on "
          "an idle machine only); CPU: 1 thread %.2f ms of work, 2 threads %.2f ms (driver %.2f, "
          "workers %.2f: +%.1f%% spin and dispatch)\n",
          r, g_pipe[2][r].step_ms, g_pipe[1][r].step_ms / 2,
          100 * (1 - g_pipe[1][r].step_ms / 2 / g_pipe[2][r].step_ms), g_pipe[1][r].cpu_ms,
          g_pipe[2][r].cpu_ms, g_pipe[2][r].driver_cpu_ms,
          g_pipe[2][r].cpu_ms - g_pipe[2][r].driver_cpu_ms,
          100 * (g_pipe[2][r].cpu_ms / g_pipe[1][r].cpu_ms - 1));
    for (const auto& [cfg, lat] : g_latency)
      if (lat.valid && lat.mean_ms[0] > 0)
        std::printf(
            "  per-token latency of 16 decoders, prefill_chunk %d, batch_tokens %d: alone mean "
            "%.2f ms p90 %.2f ms (%.0f rows/step, CPU %.2f ms/step); beside a 4,000-token "
            "prefill mean %.2f ms p90 %.2f ms (%.0f rows/step, CPU %.2f ms/step); ratio mean "
            "%.2f p90 %.2f, CPU per step %.2f (goal <= 2)\n",
            cfg.first, cfg.second, lat.mean_ms[0], lat.p90_ms[0], lat.step_rows[0], lat.cpu_ms[0],
            lat.mean_ms[1], lat.p90_ms[1], lat.step_rows[1], lat.cpu_ms[1],
            lat.mean_ms[1] / lat.mean_ms[0], lat.p90_ms[1] / lat.p90_ms[0],
            lat.cpu_ms[1] / lat.cpu_ms[0]);
    for (std::size_t r = 0; r < g_slots.size(); ++r) {
      std::printf("  slots, round %zu (N requests on an engine of N slots, 32-token prompts):\n",
                  r);
      std::printf("  %5s %10s %9s %11s %8s %9s %14s\n", "N", "tok/s", "step_ms", "vs_N=1", "steps",
                  "RSS_MB", "RSS_growth_MB");
      for (const auto& [n, f] : g_slots[r])
        std::printf("  %5d %10.1f %9.2f %11.2f %8d %9.0f %14.0f\n", n, f.tokens_per_s, f.step_ms,
                    f.tokens_per_s / g_slots[r].at(1).tokens_per_s, f.steps, f.rss_mb,
                    f.rss_growth_mb);
    }
  }
};

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  lockstep::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
