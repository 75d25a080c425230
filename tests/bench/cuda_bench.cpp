// CUDA backend benchmarks (issue "CUDA backend", Must show 3), on a lent GPU:
//   BM_CopyBandwidth      device-to-device cudaMemcpy of 1 GiB: the measured memory bandwidth
//                         (bytes read + written per second) that bounds decode
//   BM_CudaDecode/<m>     plain decode tokens/s (one-row verify windows + commit) for seed48,
//                         `small` and `wide` (80B widths, ~1.2 GB per token: the one whose bound is
//                         not a few microseconds of launches); counter bound_ratio = (time per
//                         token) / (active weight bytes per token / measured bandwidth). Goal:
//                         bound_ratio <= 3. The bytes are the device's: half the f32 figure when
//                         the stages hold bf16 matrices (bf16 model files; counter bf16 = 1), which
//                         also halves the small vectors (a conservative bound: it only makes the
//                         ratio larger). The stages replay CUDA graphs (counter graphs/token: graph
//                         launches per token over all stages, 4 when every stage replays); the
//                         `_eager` runs are the same with --cuda-graphs off, and the graph speed-up
//                         is printed at the end.
//   BM_CudaVerify/<T>     one verify window of T rows on `small` (T = 1..9); the T=9 / T=1 ratio is
//                         printed at the end. Goal: <= 1.3.
//   BM_CudaLongDecode/<split>  plain decode on `small` after an 8192-token prompt, with the
//                         attention's context split (--cuda-attn-split) at 512 (the default) and
//                         0 (one block per row and head: 8 blocks for a decode step); the
//                         speed-up of the split is printed at the end.
//   BM_GdnVerify/<held>   the GDN recurrence alone (cuda::GdnRecurrent) for a T=9 verify window at
//                         Qwen3-Next's GDN widths (16 key / 32 value heads of 128): state columns
//                         held in registers (1, the default) or one block per head re-reading the
//                         state each step (0); the speed-up is printed at the end.
//   BM_GdnPrefill/<sliced>  the chunked GDN prefill (cuda::GdnChunked) of a 2048-row chunk at the
//                         same widths: value columns in blocks of 32 (1, the default) or one block
//                         per head (0); the speed-up is printed at the end.
// Without a device every benchmark reports "no CUDA device" and skips.
//
//   build/tests/bench/cuda_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_stage.h"
#include "cuda/ops.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/synthetic.h"
#include "lockstep/engine_cuda/register.h"

namespace lockstep {
namespace {

bool HaveDevice() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

const ModelWeights& Model(const std::string& preset) {
  static std::map<std::string, ModelWeightsPtr> cache;
  auto it = cache.find(preset);
  if (it != cache.end()) return *it->second;
  const std::string dir = "/tmp/lockstep-cuda-bench-" + preset + "-" + std::to_string(::getpid());
  SyntheticOptions o;
  o.preset = preset;  // the preset's own dtype: bf16 files for seed48, small and wide
  if (!WriteSyntheticModel(o, dir).ok()) std::abort();
  auto r = ModelWeights::Load(dir);
  std::filesystem::remove_all(dir);
  if (!r.ok()) std::abort();
  return *(cache[preset] = std::move(r).value());
}

double g_bandwidth = 0;                    // bytes/s, from BM_CopyBandwidth
std::map<int, double> g_verify_s;          // T -> seconds per window
std::map<std::string, double> g_gdn_s;     // "BM_GdnVerify/1" ... -> seconds per launch
std::map<std::string, double> g_decode_s;  // "BM_CudaDecode/<preset>[_eager]" -> seconds per token
std::map<int, double> g_long_decode_s;     // split -> seconds per token (BM_CudaLongDecode)

void BM_CopyBandwidth(benchmark::State& state) {
  if (!HaveDevice()) return state.SkipWithError("no CUDA device");
  const std::size_t bytes = std::size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess)
    return state.SkipWithError("cudaMalloc failed");
  cudaMemset(a, 1, bytes);
  cudaDeviceSynchronize();
  for (auto _ : state) {
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
  }
  const double per_s = 2.0 * static_cast<double>(bytes) * static_cast<double>(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(per_s / 1e9, benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(per_s));
  cudaFree(a);
  cudaFree(b);
}
BENCHMARK(BM_CopyBandwidth)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(20);

std::unique_ptr<Engine> MakeEngine(const ModelWeights& w, const std::string& preset,
                                   bool graphs = true,
                                   int attn_split = EngineConfig{}.cuda_attn_split) {
  cuda::RegisterCudaBackend();
  EngineConfig c;
  c.model = preset;
  c.backend = "cuda";
  c.stages = 4;
  c.threads = 1;
  c.cuda_graphs = graphs;
  c.cuda_attn_split = attn_split;
  auto e = Engine::Create(c, w);
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", e.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*e);
}

// n prompt tokens that vary (7, 20, 33, ... modulo the vocabulary).
std::vector<std::int32_t> VariedPrompt(std::size_t n, int n_vocab) {
  std::vector<std::int32_t> prompt(n);
  for (std::size_t i = 0; i < n; ++i) prompt[i] = static_cast<std::int32_t>(7 + 13 * i) % n_vocab;
  return prompt;
}

// Greedy plain decode (one-row verify window + commit per token) after 8 warm-up steps, whose
// first calls pay initialisation; sets tok/s. Returns the timed tokens, -1 after an error.
std::int64_t DecodeLoop(benchmark::State& state, Engine& e) {
  std::vector<float> logits(static_cast<std::size_t>(e.weights().config.n_vocab));
  std::int32_t tok = 1;
  for (int i = 0; i < 8; ++i) {
    (void)e.Verify(std::span<const std::int32_t>(&tok, 1), logits.data());
    (void)e.Commit(1);
  }
  std::int64_t n = 0;
  for (auto _ : state) {
    if (!e.Verify(std::span<const std::int32_t>(&tok, 1), logits.data()).ok() ||
        !e.Commit(1).ok()) {
      state.SkipWithError("verify");
      return -1;
    }
    tok =
        static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ++n;
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
  return n;
}

void BM_CudaDecode(benchmark::State& state, const std::string& preset, bool graphs) {
  if (!HaveDevice()) return state.SkipWithError("no CUDA device");
  const ModelWeights& w = Model(preset);
  auto e = MakeEngine(w, preset, graphs);
  if (!e) return state.SkipWithError("engine");
  if (!e->Prefill(VariedPrompt(64, w.config.n_vocab)).ok()) return state.SkipWithError("prefill");
  const std::int64_t n = DecodeLoop(state, *e);
  if (n < 0) return;
  double launches = 0;
  for (int is = 0; is < e->n_stages(); ++is)
    launches += static_cast<double>(e->stage(is).init_counters().graph_launches);
  state.counters["graphs/token"] = launches / static_cast<double>(n + 8);
  bool bf16 = true;
  for (int is = 0; is < e->n_stages(); ++is)
    if (auto* st = dynamic_cast<cuda::CudaStageSession*>(&e->stage(is));
        st == nullptr || !st->weights_bf16())
      bf16 = false;
  state.counters["bf16"] = bf16 ? 1 : 0;
  const double bytes = static_cast<double>(w.ActiveBytesPerToken()) / (bf16 ? 2.0 : 1.0);
  state.counters["MB/token"] = bytes / 1e6;
  if (g_bandwidth > 0) {
    const double bound_s = bytes / g_bandwidth;
    state.counters["bound_us"] = bound_s * 1e6;
    // Filled after the loop: seconds per token over the bound (lower is better; goal <= 3).
    state.counters["bound_ratio"] =
        benchmark::Counter(static_cast<double>(n) * bound_s,
                           benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  }
}
BENCHMARK_CAPTURE(BM_CudaDecode, seed48, std::string("seed48"), true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_CudaDecode, seed48_eager, std::string("seed48"), false)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_CudaDecode, small, std::string("small"), true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_CudaDecode, wide, std::string("wide"), true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_CudaDecode, wide_eager, std::string("wide"), false)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(2.0);

void BM_CudaVerify(benchmark::State& state) {
  if (!HaveDevice()) return state.SkipWithError("no CUDA device");
  const int T = static_cast<int>(state.range(0));
  const ModelWeights& w = Model("small");
  auto e = MakeEngine(w, "small");
  if (!e) return state.SkipWithError("engine");
  std::vector<std::int32_t> prompt(64, 5);
  if (!e->Prefill(prompt).ok()) return state.SkipWithError("prefill");
  std::vector<std::int32_t> window(static_cast<std::size_t>(T), 9);
  std::vector<float> logits(static_cast<std::size_t>(T) *
                            static_cast<std::size_t>(w.config.n_vocab));
  for (int i = 0; i < 4; ++i) {
    (void)e->Verify(window, logits.data());
    (void)e->Commit(1);
  }
  for (auto _ : state) {
    if (!e->Verify(window, logits.data()).ok() || !e->Commit(1).ok())
      return state.SkipWithError("verify");
  }
}
BENCHMARK(BM_CudaVerify)
    ->DenseRange(1, 9)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(1.0);

void BM_CudaLongDecode(benchmark::State& state) {
  if (!HaveDevice()) return state.SkipWithError("no CUDA device");
  const int split = static_cast<int>(state.range(0)), n_prompt = 8192;
  const ModelWeights& w = Model("small");
  auto e = MakeEngine(w, "small", true, split);
  if (!e) return state.SkipWithError("engine");
  if (!e->Prefill(VariedPrompt(n_prompt, w.config.n_vocab)).ok())
    return state.SkipWithError("prefill");
  if (DecodeLoop(state, *e) < 0) return;
  state.counters["context"] = n_prompt + 8;
}
BENCHMARK(BM_CudaLongDecode)
    ->Arg(512)
    ->Arg(0)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(1.0);

// Device inputs of a GDN layer at Qwen3-Next's widths for T rows: q / k rows of norm 1 (as
// GdnQkNorm leaves them), small values, decays in (-1, 0]; the state S0, the outputs, the step
// states of a verify window (T <= 16) and the chunked form's scratch.
struct GdnBenchInputs {
  static constexpr int hk = 16, hv = 32, dk = 128, dv = 128, conv_dim = 2 * hk * dk + hv * dv;
  int T;
  float *qh = nullptr, *kh = nullptr, *U = nullptr, *g = nullptr, *beta = nullptr, *S0 = nullptr,
        *O = nullptr;
  float *steps = nullptr, *scratch = nullptr;
  bool ok = true;

  explicit GdnBenchInputs(int rows) : T(rows) {
    const std::size_t t = static_cast<std::size_t>(T), s_all = std::size_t{hv} * dk * dv;
    std::vector<float> qk(t * hk * dk, 1.0f / std::sqrt(static_cast<float>(dk)));
    ok = Up(&qh, qk) && Up(&kh, qk) && Up(&U, std::vector<float>(t * conv_dim, 0.01f)) &&
         Up(&g, std::vector<float>(t * hv, -0.05f)) &&
         Up(&beta, std::vector<float>(t * hv, 0.5f)) &&
         Up(&S0, std::vector<float>(s_all, 0.001f)) &&
         Up(&O, std::vector<float>(t * hv * dv, 0.0f)) &&
         (T > 16 || Up(&steps, std::vector<float>(t * s_all, 0.0f))) &&  // verify windows only
         Up(&scratch, std::vector<float>(
                          cuda::GdnChunkedScratchFloats(hv, dk, dv, cuda::kGdnPrefillChunk), 0.0f));
  }
  ~GdnBenchInputs() {
    for (float* p : {qh, kh, U, g, beta, S0, O, steps, scratch}) cudaFree(p);
  }
  GdnBenchInputs(const GdnBenchInputs&) = delete;
  GdnBenchInputs& operator=(const GdnBenchInputs&) = delete;

  static bool Up(float** p, const std::vector<float>& h) {
    return cudaMalloc(reinterpret_cast<void**>(p), h.size() * sizeof(float)) == cudaSuccess &&
           cudaMemcpy(*p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice) ==
               cudaSuccess;
  }
};

// Times `launch` (one kernel launch on the default stream) per iteration, synchronising each.
template <class F>
void TimeLaunches(benchmark::State& state, F launch) {
  launch();  // first call: module load
  if (cudaDeviceSynchronize() != cudaSuccess) return state.SkipWithError("launch");
  for (auto _ : state) {
    launch();
    if (cudaDeviceSynchronize() != cudaSuccess) return state.SkipWithError("launch");
  }
}

void BM_GdnVerify(benchmark::State& state) {
  if (!HaveDevice()) return state.SkipWithError("no CUDA device");
  const auto blocks = state.range(0) ? cuda::GdnBlocks::kAuto : cuda::GdnBlocks::kOnePerHead;
  GdnBenchInputs in(9);
  if (!in.ok) return state.SkipWithError("cudaMalloc");
  using I = GdnBenchInputs;
  TimeLaunches(state, [&] {
    cuda::GdnRecurrent(in.S0, in.steps, in.qh, in.kh, in.U, in.g, in.beta, in.T, I::hk, I::hv,
                       I::dk, I::dv, I::conv_dim, in.O, nullptr, blocks);
  });
}
BENCHMARK(BM_GdnVerify)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);

void BM_GdnPrefill(benchmark::State& state) {
  if (!HaveDevice()) return state.SkipWithError("no CUDA device");
  const auto blocks = state.range(0) ? cuda::GdnBlocks::kAuto : cuda::GdnBlocks::kOnePerHead;
  GdnBenchInputs in(2048);
  if (!in.ok) return state.SkipWithError("cudaMalloc");
  using I = GdnBenchInputs;
  TimeLaunches(state, [&] {
    cuda::GdnChunked(in.S0, in.qh, in.kh, in.U, in.g, in.beta, in.T, I::hk, I::hv, I::dk, I::dv,
                     I::conv_dim, cuda::kGdnPrefillChunk, in.scratch, in.O, nullptr, blocks);
  });
}
BENCHMARK(BM_GdnPrefill)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.5);

// Keeps the measured bandwidth and window times for the summary lines.
class Reporter : public benchmark::ConsoleReporter {
 public:
  // A reporter passed to RunSpecifiedBenchmarks ignores --benchmark_color: colour only on a
  // terminal, so logs (tests/gpu/check.sh's bench.log, summary.md) carry no escape codes.
  Reporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      const std::string name = r.benchmark_name();
      if (name.rfind("BM_CopyBandwidth", 0) == 0) {
        auto it = r.counters.find("GB/s");
        if (it != r.counters.end()) g_bandwidth = it->second.value * 1e9;
      }
      // function_name: "BM_CudaDecode/<preset>[_eager]" without the min_time / real_time suffixes.
      if (name.rfind("BM_CudaDecode/", 0) == 0)
        g_decode_s[r.run_name.function_name] = r.GetAdjustedRealTime() * 1e-6;
      if (name.rfind("BM_CudaLongDecode/", 0) == 0)
        g_long_decode_s[std::stoi(name.substr(std::string("BM_CudaLongDecode/").size()))] =
            r.GetAdjustedRealTime() * 1e-6;
      if (name.rfind("BM_Gdn", 0) == 0)
        g_gdn_s[r.run_name.function_name + "/" + r.run_name.args] = r.GetAdjustedRealTime() * 1e-6;
      if (name.rfind("BM_CudaVerify/", 0) == 0) {
        const int T = std::stoi(name.substr(std::string("BM_CudaVerify/").size()));
        g_verify_s[T] = r.GetAdjustedRealTime() * 1e-6;  // microseconds -> s
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  lockstep::Reporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  auto& v = lockstep::g_verify_s;
  if (v.count(1) && v.count(9) && v[1] > 0)
    std::printf("verify T=9 / T=1 window time: %.3f (goal <= 1.3)\n", v[9] / v[1]);
  for (const char* m : {"seed48", "wide"}) {
    auto& d = lockstep::g_decode_s;
    const std::string on = std::string("BM_CudaDecode/") + m, off = on + "_eager";
    if (d.count(on) && d.count(off) && d[on] > 0)
      std::printf("decode %s: CUDA graphs %.2fx the tokens/s of launching each kernel\n", m,
                  d[off] / d[on]);
  }
  auto& l = lockstep::g_long_decode_s;
  if (l.count(512) && l.count(0) && l[512] > 0)
    std::printf(
        "decode small at 8192 positions: attention split 512 %.2fx the tokens/s of one block per "
        "head\n",
        l[0] / l[512]);
  auto& gd = lockstep::g_gdn_s;
  if (gd.count("BM_GdnVerify/1") && gd.count("BM_GdnVerify/0") && gd["BM_GdnVerify/1"] > 0)
    std::printf(
        "GDN verify T=9 (32 heads of 128): state columns in registers %.2fx the speed of one block "
        "per head\n",
        gd["BM_GdnVerify/0"] / gd["BM_GdnVerify/1"]);
  if (gd.count("BM_GdnPrefill/1") && gd.count("BM_GdnPrefill/0") && gd["BM_GdnPrefill/1"] > 0)
    std::printf(
        "GDN prefill of 2048 rows (32 heads of 128): column slices %.2fx the speed of one block "
        "per head\n",
        gd["BM_GdnPrefill/0"] / gd["BM_GdnPrefill/1"]);
  if (lockstep::g_bandwidth > 0)
    std::printf("measured copy bandwidth: %.1f GB/s\n", lockstep::g_bandwidth / 1e9);
  benchmark::Shutdown();
  return 0;
}
