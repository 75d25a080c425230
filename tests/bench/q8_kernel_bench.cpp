// The 8-bit products of quant_dot = ggml (engine/cpu/matmul_q8.h) alone, one x row (decode):
// per weight type, a matrix that fits the L2 (the kernel's compute rate) and one of 256 MiB
// streamed from memory (its share of the read bandwidth), on 1 and 2 threads, beside the read
// bandwidth of the same threads in the same run. Random block bytes with sane f16 scales.
//
//   build/tests/bench/q8_kernel_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/thread_pool.h"
#include "lockstep/engine/weights.h"
#include "read_pass.h"

namespace lockstep {
namespace {

constexpr WeightType kTypes[] = {WeightType::kQ8_0, WeightType::kQ4_K, WeightType::kQ5_K,
                                 WeightType::kQ6_K, WeightType::kIQ4_XS};

// The f16 scales' byte offsets in a block of each type.
std::vector<int> ScaleOffsets(WeightType t) {
  switch (t) {
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
      return {0, 2};
    case WeightType::kQ6_K:
      return {208};
    default:
      return {0};
  }
}

struct Weights {
  std::vector<std::byte> bytes;
  Mat m;
};

Weights Random(WeightType t, int rows, int cols) {
  Weights w;
  w.m.type = t;
  w.m.rows = rows;
  w.m.cols = cols;
  w.bytes.resize(w.m.bytes());
  std::mt19937_64 rng(7);
  for (std::byte& b : w.bytes) b = static_cast<std::byte>(rng());
  const std::size_t bb = weight_block_bytes(t);
  for (std::size_t b0 = 0; b0 < w.bytes.size(); b0 += bb)
    for (int o : ScaleOffsets(t)) {
      const std::uint16_t h = f32_to_f16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
      std::memcpy(w.bytes.data() + b0 + static_cast<std::size_t>(o), &h, 2);
    }
  w.m.data = w.bytes.data();
  return w;
}

// Arg 0: the type's index in kTypes; arg 1: 0 = L2-resident (~0.5 MiB), 1 = 256 MiB; arg 2:
// threads; arg 3: columns (2048: Qwen3-Next's hidden width; 512: an expert's down product, whose
// 2 super-blocks per row make the row's start and end cost as much as its blocks).
void BM_Q8Rows(benchmark::State& state) {
  const WeightType t = kTypes[state.range(0)];
  const int cols = static_cast<int>(state.range(3));
  const std::size_t row_bytes =
      cols / static_cast<std::size_t>(weight_block_elems(t)) * weight_block_bytes(t);
  const std::size_t target =
      state.range(1) == 0 ? (std::size_t{1} << 19) : (std::size_t{256} << 20);
  const int rows = static_cast<int>(target / row_bytes / 64 * 64);
  const Weights w = Random(t, rows, cols);
  std::vector<float> x(cols), y(static_cast<std::size_t>(rows));
  std::mt19937 rng(3);
  for (float& v : x) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  ThreadPool pool(static_cast<int>(state.range(2)));
  for (auto _ : state) {
    cpu::Matmul(cpu::MatmulKind::kInvariantQ8, x.data(), 1, w.m, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(weight_type_name(t)));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(w.bytes.size()));
  state.counters["ns_per_weight"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * rows * cols * 1e-9,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// The read bandwidth of the same threads over 512 MiB, split in contiguous ranges.
void BM_ReadBandwidth(benchmark::State& state) {
  std::vector<float> buf((std::size_t{512} << 20) / sizeof(float), 1.0f);
  ThreadPool pool(static_cast<int>(state.range(0)));
  for (auto _ : state) ReadPass(buf, pool);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(buf.size() * sizeof(float)));
}

BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Q8Rows)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1}, {1, 2}, {2048, 512}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace lockstep

BENCHMARK_MAIN();
