// Quantised decode, lockstep vs llama.cpp on the same file (issue 39, Must show 3): `wide --layers
// 8` (`lockstep model init --preset wide --layers 8 --dtype bf16 --format gguf --seed 1`) as bf16
// and as llama.cpp's own Q8_0, Q4_K_M and IQ4_XS quantisations of it (llama_model_quantize from
// the prebuilt libllama, as llama-quantize makes them), 2 threads, single-token decode steps
// after an 8-token prompt. Each iteration decodes 16 tokens on each engine back to back
// (alternating which goes first), so both see the same machine; the 2-thread read bandwidth is
// measured once before the run and again by a 512 MiB read pass before and after every arm, and
// the report prints, per file, lockstep / llama.cpp and the share of the read bandwidth lockstep's
// decode streams (the file's bytes of the active weights per token,
// ModelWeights::ActiveBytesPerToken, per second over the mean of the passes either side of the
// arm; the median over the iterations).
//
//   build/tests/bench/quant_decode_bench --benchmark_counters_tabular=true
//
// llama.cpp runs with the adapter's defaults (engine/llamacpp: f16 K/V, flash attention off,
// n_batch = n_ubatch = 512); lockstep with 4 stages, spec off, batch invariance on (its default).
// lockstep runs twice, with quant_dot = exact (its default) and = ggml (8-bit x, integer dots:
// cpu/matmul_q8.h). Only llama_decode of the 16 windows is timed on llama.cpp
// (LlamaResult::decode_ns) and only the 16 Verify + Commit calls on lockstep. Skips with the reason
// without the llama.cpp component.
//
// env: LOCKSTEP_BENCH_QUANT_DIR  a folder for bf16.gguf, q8_0.gguf, q4_k_m.gguf and iq4_xs.gguf:
//      those missing are made there and kept (else all four are made in /tmp, ~5.8 GB, and
//      removed at exit)
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/ggml_lib.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/weights.h"
#include "lockstep/llamacpp/llama_engine.h"
#include "read_pass.h"

namespace lockstep {
namespace {

constexpr int kThreads = 2;
constexpr int kSteps = 16;

struct File {
  const char* name;
  int ftype;  // llama_ftype; 0: the bf16 file itself
};
#if defined(LOCKSTEP_TEST_GGML_DIR)
const File kFiles[] = {{"bf16", 0},
                       {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
                       {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
                       {"iq4_xs", LLAMA_FTYPE_MOSTLY_IQ4_XS}};
#else
const File kFiles[] = {{"bf16", 0}, {"q8_0", 0}, {"q4_k_m", 0}, {"iq4_xs", 0}};
#endif

// The folder of the four files, made on first use where missing ("" when they could not be).
const std::string& Dir() {
  static const std::string dir = []() -> std::string {
    const char* env = std::getenv("LOCKSTEP_BENCH_QUANT_DIR");  // env: LOCKSTEP_BENCH_QUANT_DIR
    const bool keep = env != nullptr && *env != '\0';
    const std::string d =
        keep ? std::string(env) : "/tmp/lockstep-bench-quant-" + std::to_string(::getpid());
    if (!keep) {
      static const struct Remove {
        std::string d;
        ~Remove() { std::filesystem::remove_all(d); }
      } remove{d};
    }
    namespace fs = std::filesystem;
    if (!fs::exists(d + "/bf16.gguf")) {
      const std::string cmd = std::string(LOCKSTEP_BIN_PATH) +
                              " model init --preset wide --layers 8 --dtype bf16 --format gguf "
                              "--seed 1 --out " +
                              d + "/init > /dev/null";
      if (std::system(cmd.c_str()) != 0) return "";
      fs::rename(d + "/init/model.gguf", d + "/bf16.gguf");
    }
#if defined(LOCKSTEP_TEST_GGML_DIR)
    const auto& lib = test::GgmlLib::Get();
    if (!lib.error.empty()) return "";
    for (const File& f : kFiles) {
      const std::string out = d + "/" + f.name + ".gguf";
      if (f.ftype == 0 || fs::exists(out)) continue;
      llama_model_quantize_params p = lib.quantize_default_params();
      p.nthread = kThreads;
      p.ftype = static_cast<llama_ftype>(f.ftype);
      if (lib.model_quantize((d + "/bf16.gguf").c_str(), (out + ".tmp").c_str(), &p) != 0)
        return "";
      fs::rename(out + ".tmp", out);
    }
    return d;
#else
    return "";
#endif
  }();
  return dir;
}

std::string PathOf(int file) { return Dir() + "/" + kFiles[file].name + ".gguf"; }

double g_read_bps = 0;  // 2-thread streaming read bandwidth, this run

constexpr std::size_t kProbeBytes = std::size_t{512} << 20;

void BM_MemReadBandwidth(benchmark::State& state) {
  std::vector<float> buf(kProbeBytes / sizeof(float), 1.0f);
  ThreadPool pool(kThreads);
  for (auto _ : state) ReadPass(buf, pool);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(kProbeBytes));
}

// Seconds of one read pass now, beside the decode arms (the mean of kProbePasses back to back):
// the VM's bandwidth moves with its neighbours' load (29-44 GB/s within an hour) and from one
// 13 ms pass to the next (24-46 GB/s in 40 passes a second apart), so each iteration measures
// its own, over ~50 ms rather than one pass, against arms of ~0.2-0.6 s.
constexpr int kProbePasses = 4;
double ReadProbe() {
  static std::vector<float> buf(kProbeBytes / sizeof(float), 1.0f);
  static ThreadPool pool(kThreads);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kProbePasses; ++i) ReadPass(buf, pool);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
         kProbePasses;
}

// kSteps decode steps on lockstep: seconds (0: failed).
double LockstepDecode(const ModelWeights& w, const char* quant_dot) {
  EngineConfig c;
  c.threads = kThreads;
  c.stages = 4;
  c.quant_dot = quant_dot;
  auto e = Engine::Create(c, w);
  if (!e.ok()) return 0;
  std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  if (!(*e)->Prefill(prompt).ok()) return 0;
  std::vector<float> logits(static_cast<std::size_t>(w.config.n_vocab));
  std::int32_t tok = 9;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < kSteps; ++s) {
    if (!(*e)->Verify(std::span<const std::int32_t>(&tok, 1), logits.data()).ok() ||
        !(*e)->Commit(1).ok())
      return 0;
    tok = static_cast<std::int32_t>((static_cast<unsigned>(s + 10) * 2654435761u) %
                                    static_cast<unsigned>(w.config.n_vocab));
    benchmark::DoNotOptimize(logits.data());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// kSteps decode windows on llama.cpp (prompt 1..8, greedy): seconds per window x kSteps.
double LlamaDecode(int file) {
  LlamaOptions o;
  o.model = PathOf(file);
  o.threads = kThreads;
  o.max_new = kSteps + 1;
  auto engine = LlamaEngine::Open(o);
  if (!engine.ok()) return 0;
  std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  auto r = (*engine)->Generate(prompt, LlamaHooks{});
  if (!r.ok() || r->n_windows <= 0) return 0;
  return static_cast<double>(r->decode_ns) * 1e-9 / r->n_windows * kSteps;
}

// Arg: the file (0 bf16, 1 Q8_0, 2 Q4_K_M, 3 IQ4_XS).
void BM_Decode(benchmark::State& state) {
  const Status available = LlamaCppAvailable();
  if (!available.ok()) return state.SkipWithError(available.ToString().c_str());
  if (Dir().empty()) return state.SkipWithError("the model files could not be made");
  const int file = static_cast<int>(state.range(0));
  auto w = ModelWeights::Load(PathOf(file), false);
  if (!w.ok()) return state.SkipWithError(w.status().ToString().c_str());
  // Three arms per iteration, the order rotating: lockstep exact, lockstep quant_dot = ggml,
  // llama.cpp; a read pass before the first and after each. An arm's share of the bandwidth is
  // its bytes per second over the mean of the passes either side of it; the report gives each
  // arm's median share over the iterations (the VM's bandwidth moves within seconds).
  const double bytes = static_cast<double>((*w)->ActiveBytesPerToken());
  double sum[3] = {0, 0, 0}, probe = 0;
  std::vector<double> share[2];
  int it = 0, probes = 0;
  for (auto _ : state) {
    double t[3] = {0, 0, 0}, around[3] = {0, 0, 0};
    double before = ReadProbe();
    for (int k = 0; k < 3; ++k) {
      const int arm = (it + k) % 3;
      t[arm] = arm == 2 ? LlamaDecode(file) : LockstepDecode(**w, arm == 0 ? "exact" : "ggml");
      const double after = ReadProbe();
      around[arm] = 0.5 * (before + after);
      probe += after;
      ++probes;
      before = after;
    }
    ++it;
    if (t[0] <= 0 || t[1] <= 0 || t[2] <= 0) return state.SkipWithError("decode failed");
    for (int k = 0; k < 3; ++k) sum[k] += t[k];
    for (int k = 0; k < 2; ++k)  // (bytes x steps / t) / (probe bytes / probe seconds)
      share[k].push_back(bytes * kSteps / t[k] / (static_cast<double>(kProbeBytes) / around[k]));
    state.SetIterationTime(t[0] + t[1] + t[2]);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size() / 2;
    return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
  };
  const double n = static_cast<double>(state.iterations()) * kSteps;
  state.counters["lockstep_tok_s"] = n / sum[0];
  state.counters["ggml_dot_tok_s"] = n / sum[1];
  state.counters["llama_tok_s"] = n / sum[2];
  state.counters["ratio"] = sum[2] / sum[0];  // lockstep's tokens/s over llama.cpp's
  state.counters["ratio_ggml_dot"] = sum[2] / sum[1];
  state.counters["weight_MB_per_token"] = bytes / 1e6;
  state.counters["lockstep_share"] = median(share[0]);
  state.counters["ggml_dot_share"] = median(share[1]);
  state.counters["read_GB_s"] = static_cast<double>(probes) * kProbeBytes / probe / 1e9;
}

BENCHMARK(BM_MemReadBandwidth)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_Decode)->ArgName("file")->DenseRange(0, 3)->UseManualTime()->Iterations(6)->Unit(
    benchmark::kSecond);

// Prints, per file, lockstep / llama.cpp and lockstep's share of this run's read bandwidth.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      const std::string n = r.benchmark_name();
      if (const auto c = r.counters.find("bytes_per_second"); c != r.counters.end())
        g_read_bps = c->second;
      const auto ratio = r.counters.find("ratio");
      if (ratio == r.counters.end() || r.error_occurred) continue;
      const int file = std::atoi(n.substr(n.find("file:") + 5).c_str());
      const auto at = [&](const char* k) { return static_cast<double>(r.counters.at(k)); };
      std::printf(
          "  -> %s: llama.cpp %.2f tok/s; lockstep exact %.2f tok/s (%.2fx, %.2f of the %d-thread "
          "read bandwidth), quant_dot = ggml %.2f tok/s (%.2fx, %.2f); read bandwidth %.2f GB/s "
          "beside the arms (%.2f GB/s before the run); goals >= 1.1x and >= 0.8\n",
          kFiles[file].name, at("llama_tok_s"), at("lockstep_tok_s"), at("ratio"),
          at("lockstep_share"), kThreads, at("ggml_dot_tok_s"), at("ratio_ggml_dot"),
          at("ggml_dot_share"), at("read_GB_s"), g_read_bps / 1e9);
    }
  }
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
