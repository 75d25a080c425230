// Hot-path trace event cost (issue "Instrumentation", Must show 4): an enabled LOCKSTEP_TRACE
// (timestamp + ring store) and a disabled site, per event.
//
//   build/tests/bench/trace_bench
#include <benchmark/benchmark.h>

#include "lockstep/engine/trace_ring.h"

namespace lockstep {
namespace {

void BM_TraceEventEnabled(benchmark::State& state) {
  TraceRing ring(std::size_t{1} << 16);
  ring.Enable();
  std::int32_t i = 0;
  for (auto _ : state) ring.Record(TraceEventId::kLayerBegin, i++, 1);
  benchmark::DoNotOptimize(ring.recorded());
  state.counters["ns_per_event"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_TraceSiteDisabled(benchmark::State& state) {
  TraceRing ring(std::size_t{1} << 16);
  std::int32_t i = 0;
  for (auto _ : state) {
    ring.Record(TraceEventId::kLayerBegin, i++, 1);
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_event"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_TraceEventEnabled);
BENCHMARK(BM_TraceSiteDisabled);

}  // namespace
}  // namespace lockstep

BENCHMARK_MAIN();
