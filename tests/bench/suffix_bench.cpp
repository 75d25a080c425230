// Suffix index benchmarks: amortised SuffixAutomaton::Append cost (items_per_second = appends/s)
// on random, periodic and all-identical text, 100k tokens each, and Propose on a built index.
// The all-identical case is the one the kCountDepth cap exists for: its suffix-link paths grow
// with the sequence, and a per-append rate close to the random case shows the cap keeps Append
// O(1) amortised.
//
//   build/tests/bench/suffix_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "decode/suffix_index.h"

namespace lockstep {
namespace {

constexpr int kTokens = 100000;
constexpr std::int32_t kVocab = 4096;  // a small tokenizer's vocabulary
constexpr int kPeriod = 37;            // prime, so the period never aligns with anything else

enum Text : int { kRandom = 0, kPeriodic = 1, kIdentical = 2 };

const std::vector<std::int32_t>& Sequence(int text) {
  static const std::vector<std::vector<std::int32_t>> seqs = [] {
    std::vector<std::vector<std::int32_t>> out(3, std::vector<std::int32_t>(kTokens));
    std::mt19937 rng(1234);
    std::uniform_int_distribution<std::int32_t> dist(0, kVocab - 1);
    for (int i = 0; i < kTokens; ++i) {
      const auto k = static_cast<std::size_t>(i);
      out[kRandom][k] = dist(rng);
      out[kPeriodic][k] = i % kPeriod;
      out[kIdentical][k] = 7;
    }
    return out;
  }();
  return seqs[static_cast<std::size_t>(text)];
}

// One iteration builds a fresh automaton over the whole sequence (construction and the final
// destruction are inside the timing, as they are once per request in the engine).
void BM_SuffixAppend(benchmark::State& state) {
  const auto& seq = Sequence(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    SuffixAutomaton sam;
    for (std::int32_t t : seq) sam.Append(t);
    benchmark::DoNotOptimize(sam.size());
  }
  state.SetItemsProcessed(state.iterations() * kTokens);
  state.SetLabel(state.range(0) == kRandom     ? "random vocab 4096"
                 : state.range(0) == kPeriodic ? "periodic 37"
                                               : "identical");
}
BENCHMARK(BM_SuffixAppend)
    ->Arg(kRandom)
    ->Arg(kPeriodic)
    ->Arg(kIdentical)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Propose(max_len=8, min_match=1) after 100k tokens: one suffix-link lookup plus the copy.
void BM_SuffixPropose(benchmark::State& state) {
  const auto& seq = Sequence(static_cast<int>(state.range(0)));
  SuffixAutomaton sam;
  for (std::int32_t t : seq) sam.Append(t);
  for (auto _ : state) {
    SuffixProposal p = sam.Propose(8, 1);
    benchmark::DoNotOptimize(p.tokens.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SuffixPropose)->Arg(kRandom)->Arg(kPeriodic)->Arg(kIdentical)->UseRealTime();

// Append + Propose per token through a kSync SuffixIndex, the drafter's per-step pattern
// (lock, one append, one proposal).
void BM_SuffixIndexStep(benchmark::State& state) {
  const auto& seq = Sequence(kRandom);
  for (auto _ : state) {
    SuffixIndex index(SuffixIndex::Mode::kSync);
    std::vector<std::int32_t> one(1);
    for (std::int32_t t : seq) {
      one[0] = t;
      index.Append(one);
      SuffixProposal p = index.Propose(8, 1);
      benchmark::DoNotOptimize(p.tokens.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * kTokens);
}
BENCHMARK(BM_SuffixIndexStep)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace lockstep

BENCHMARK_MAIN();
