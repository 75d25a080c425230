// The op-digest callback's cost on llama.cpp decode (issue 38, Must show 5): greedy decode of
// one request on a `small` bf16 GGUF (`lockstep model init --preset small --dtype bf16 --format
// gguf --seed 1`), 1 thread, prompt ids 1..8, 32 new tokens, with the graph evaluation callback
// off (no op wanted: the callback answers "not wanted" to every tensor) vs on for every window
// and the prefill (every named graph tensor copied out of ggml and digested per row, as
// `generate --engine llama.cpp --op-digests all` runs it; the records are counted, not written).
//
//   build/tests/bench/llamacpp_digest_bench --benchmark_counters_tabular=true
//
// The figure is a ratio within one iteration (off and on back to back, alternating which goes
// first); 5 repetitions, the median of the per-iteration ratios. Each decode opens its own engine
// (model and context); only LlamaResult::decode_ns (llama_decode of the windows) is timed.
// Skips with the reason when the llama.cpp component is absent.
//
// env: LOCKSTEP_BENCH_GGUF  an existing GGUF to decode instead (else one is generated in /tmp)
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/llamacpp/llama_engine.h"

namespace lockstep {
namespace {

const std::string& Gguf() {
  static const std::string path = [] {
    const char* env = std::getenv("LOCKSTEP_BENCH_GGUF");  // env: LOCKSTEP_BENCH_GGUF
    if (env != nullptr && *env != '\0') return std::string(env);
    const std::string dir = "/tmp/lockstep-bench-llama-" + std::to_string(::getpid());
    const std::string cmd = std::string(LOCKSTEP_BIN_PATH) +
                            " model init --preset small --dtype bf16 --format gguf --seed 1 "
                            "--out " +
                            dir + " > /dev/null";
    if (std::system(cmd.c_str()) != 0) return std::string();
    // Removed when the process ends.
    static const struct Remove {
      std::string d;
      ~Remove() { std::filesystem::remove_all(d); }
    } remove{dir};
    return dir + "/model.gguf";
  }();
  return path;
}

// One request's decode seconds with the callback's ops on or off (0: failed); `records`: the op
// records handed out.
double DecodeOnce(bool ops, std::int64_t* records) {
  LlamaOptions o;
  o.model = Gguf();
  o.threads = 1;
  o.max_new = 32;
  auto engine = LlamaEngine::Open(o);
  if (!engine.ok()) return 0;
  std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  LlamaHooks hooks;
  std::int64_t n = 0;
  if (ops) {
    hooks.wants_ops = [](int) { return true; };
    hooks.on_op = [&n](const OpRecord& rec) {
      n += 1;
      benchmark::DoNotOptimize(rec.digest);
    };
  }
  auto r = (*engine)->Generate(prompt, hooks);
  if (!r.ok() || r->output.size() != 32) return 0;
  *records = n;
  return static_cast<double>(r->decode_ns) * 1e-9;
}

void BM_LlamaDecodeDigestsOnVsOff(benchmark::State& state) {
  const Status available = LlamaCppAvailable();
  if (!available.ok()) return state.SkipWithError(available.ToString().c_str());
  if (Gguf().empty()) return state.SkipWithError("model init failed");
  bool on_first = false;
  double ratio_sum = 0, off_sum = 0;
  int n = 0;
  std::int64_t records = 0, none = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    double off = 0, on = 0;
    if (on_first) {
      on = DecodeOnce(true, &records);
      off = DecodeOnce(false, &none);
    } else {
      off = DecodeOnce(false, &none);
      on = DecodeOnce(true, &records);
    }
    on_first = !on_first;
    if (off <= 0 || on <= 0 || records == 0 || none != 0) return state.SkipWithError("decode");
    ratio_sum += on / off;
    off_sum += off;
    ++n;
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["on_over_off"] = ratio_sum / n;             // decode time, callback on / off
  state.counters["off_ms"] = 1e3 * off_sum / n;              // decode of 32 tokens, callback off
  state.counters["records"] = static_cast<double>(records);  // op records of one request
}
BENCHMARK(BM_LlamaDecodeDigestsOnVsOff)
    ->UseManualTime()
    ->Iterations(2)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace lockstep

BENCHMARK_MAIN();
