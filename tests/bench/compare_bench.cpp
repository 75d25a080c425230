// Comparator metric benchmarks (issue "comparator", Must show 5), one core:
//
//   NRMSE  over two f32 arrays in memory at >= 0.70 of the single-core read-only streaming
//   bandwidth
//          measured in the same run (BM_Nrmse bytes_per_second / BM_ReadBandwidth bytes_per_second,
//          both over the same 2 x 64 MiB, far beyond the caches), relative error <= 1e-6 against a
//          long-double reference (counter rel_error). BM_NrmseNaiveF32 is there to show why the
//          accumulation is f64: one f32 accumulator is both slower (a serial dependency chain)
//          and far off.
//   KL     >= 2,000 rows/s (items_per_second) for 151,936-wide logits, relative error <= 1e-4
//          against a long-double reference (counter rel_error, the worst row). Arg 0: b = a plus
//          noise of 1e-3 (the A/A case, KL ~ 5e-7); arg 1: unrelated rows (KL ~ 10).
//
// The ratios are printed after the table from counters of this same run: these machines are shared
// and noisy, so only ratios within one run mean anything. Every benchmark here is one thread and
// is timed in CPU time (the default), not real time: "per core" is work per CPU-second, and time
// spent descheduled by other tenants would otherwise count as ours (memory stalls still count).
//
//   build/tests/bench/compare_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "compare/reference_metrics.h"
#include "lockstep/compare/metrics.h"

namespace lockstep {
namespace {

constexpr std::size_t kFloats = std::size_t{16} << 20;  // 64 MiB per array
constexpr std::size_t kVocab = 151936;
constexpr std::size_t kKlRows = 16;  // 2 x 9.7 MB of logits per pass

struct Arrays {
  std::vector<float> a, b;
  double nrmse_ref = 0.0;  // long double evaluation
};

std::vector<float> Normal(std::size_t n, float sigma, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

const Arrays& F32Arrays() {
  static const Arrays arrays = [] {
    Arrays r;
    r.a = Normal(kFloats, 1.0f, 1);
    r.b = Normal(kFloats, 1e-3f, 2);
    for (std::size_t i = 0; i < kFloats; ++i) r.b[i] += r.a[i];
    long double num = 0.0L, den = 0.0L;
    for (std::size_t i = 0; i < kFloats; ++i) {
      const long double d = static_cast<long double>(r.a[i]) - static_cast<long double>(r.b[i]);
      num += d * d;
      den += static_cast<long double>(r.a[i]) * static_cast<long double>(r.a[i]);
    }
    r.nrmse_ref = static_cast<double>(std::sqrt(num / den));
    return r;
  }();
  return arrays;
}

double RelError(double got, double ref) { return std::fabs(got - ref) / std::fabs(ref); }

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(2 * kFloats * sizeof(float)));
}

// Read-only streaming over both arrays: per 128 bytes four 64-byte loads and four independent
// adds into vector registers (GCC/Clang vector extensions; a float[16] accumulator array is neither
// vectorised nor kept in registers by g++ 12 once its address escapes), so the loop is bound by
// memory, and is the fastest way one core reads these arrays.
void BM_ReadBandwidth(benchmark::State& state) {
  using F32x16 = float __attribute__((vector_size(64)));
  const Arrays& d = F32Arrays();
  const float* a = d.a.data();
  const float* b = d.b.data();
  for (auto _ : state) {
    F32x16 sa0 = {}, sa1 = {}, sb0 = {}, sb1 = {};
    for (std::size_t i = 0; i < kFloats; i += 32) {
      F32x16 va0, va1, vb0, vb1;
      std::memcpy(&va0, a + i, sizeof va0);
      std::memcpy(&va1, a + i + 16, sizeof va1);
      std::memcpy(&vb0, b + i, sizeof vb0);
      std::memcpy(&vb1, b + i + 16, sizeof vb1);
      sa0 += va0;
      sa1 += va1;
      sb0 += vb0;
      sb1 += vb1;
    }
    const F32x16 sum = (sa0 + sa1) + (sb0 + sb1);
    float total = 0.0f;
    for (int k = 0; k < 16; ++k) total += sum[k];
    benchmark::DoNotOptimize(total);
  }
  SetBytes(state);
}

void BM_Nrmse(benchmark::State& state) {
  const Arrays& d = F32Arrays();
  DiffStats s;
  for (auto _ : state) {
    F32Accumulator acc;
    acc.Add(d.a.data(), d.b.data(), kFloats);
    s = acc.Finish();
    benchmark::DoNotOptimize(s);
  }
  SetBytes(state);
  state.counters["rel_error"] = RelError(s.nrmse, d.nrmse_ref);
  state.counters["n_diff"] = static_cast<double>(s.n_diff);
}

// One f32 accumulator per sum: a serial chain the compiler may not reorder (no -ffast-math).
void BM_NrmseNaiveF32(benchmark::State& state) {
  const Arrays& d = F32Arrays();
  double nrmse = 0.0;
  for (auto _ : state) {
    float num = 0.0f, den = 0.0f;
    for (std::size_t i = 0; i < kFloats; ++i) {
      const float x = d.a[i] - d.b[i];
      num += x * x;
      den += d.a[i] * d.a[i];
    }
    nrmse = std::sqrt(static_cast<double>(num) / static_cast<double>(den));
    benchmark::DoNotOptimize(nrmse);
  }
  SetBytes(state);
  state.counters["rel_error"] = RelError(nrmse, d.nrmse_ref);
}

using test::ReferenceKl;

void BM_KlRows(benchmark::State& state) {
  const bool unrelated = state.range(0) == 1;
  const std::vector<float> a = Normal(kKlRows * kVocab, 3.0f, 3);
  std::vector<float> b = Normal(kKlRows * kVocab, unrelated ? 3.0f : 1e-3f, 4);
  if (!unrelated)
    for (std::size_t i = 0; i < b.size(); ++i) b[i] += a[i];
  // Worst relative error over the rows, outside the timed loop.
  double rel = 0.0;
  for (std::size_t r = 0; r < kKlRows; ++r) {
    const float* x = a.data() + r * kVocab;
    const float* y = b.data() + r * kVocab;
    rel = std::max(rel, RelError(CompareLogits(x, y, 1, kVocab).kl_max, ReferenceKl(x, y, kVocab)));
  }
  KlStats k;
  for (auto _ : state) {
    KlAccumulator acc;
    acc.AddRows(a.data(), b.data(), kKlRows, kVocab);
    k = acc.Finish();
    benchmark::DoNotOptimize(k);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(kKlRows));
  state.counters["rel_error"] = rel;
  state.counters["kl_mean"] = k.kl_mean;
}

BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_Nrmse)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_NrmseNaiveF32)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_KlRows)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// Prints NRMSE throughput against the read bandwidth, and KL rows/s, from this same run.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.run_type != Run::RT_Iteration) continue;
      const std::string name = r.benchmark_name();
      auto counter = [&](const char* key) {
        auto it = r.counters.find(key);
        return it == r.counters.end() ? 0.0 : it->second.value;
      };
      // The best repetition: the ratio below is then the pessimistic one.
      if (name.rfind("BM_ReadBandwidth", 0) == 0)
        read_bps_ = std::max(read_bps_, counter("bytes_per_second"));
      if (name.rfind("BM_Nrmse", 0) == 0 && read_bps_ > 0) {
        const double bps = counter("bytes_per_second");
        std::printf(
            "  -> %s: %.2f GB/s = %.2f of the read bandwidth (%.2f GB/s), rel_error %.1e; "
            "goal >= 0.70, <= 1e-6\n",
            name.c_str(), bps / 1e9, bps / read_bps_, read_bps_ / 1e9, counter("rel_error"));
      }
      if (name.rfind("BM_KlRows", 0) == 0) {
        std::printf("  -> %s: %.0f rows/s of %zu logits, rel_error %.1e; goal >= 2000, <= 1e-4\n",
                    name.c_str(), counter("items_per_second"), kVocab, counter("rel_error"));
      }
    }
  }

 private:
  double read_bps_ = 0.0;
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
