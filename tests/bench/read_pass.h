// The benchmarks' read-bandwidth probe: one read-only streaming pass over `buf` on `pool`'s
// threads, in contiguous ranges (as the decode kernels split weight rows), 16 independent lanes
// per thread so the pass is bound by bandwidth, not by an add's latency.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <vector>

#include "lockstep/engine/thread_pool.h"

namespace lockstep {

inline void ReadPass(const std::vector<float>& buf, ThreadPool& pool) {
  const std::size_t threads = static_cast<std::size_t>(pool.size());
  std::vector<float> sink(threads * 16, 0.0f);
  pool.ParallelFor(threads, [&](std::size_t b, std::size_t e) {
    for (std::size_t w = b; w < e; ++w) {
      const std::size_t n = buf.size() / threads;
      const float* p = buf.data() + w * n;
      float acc[16] = {0};
      for (std::size_t i = 0; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += p[i + static_cast<std::size_t>(j)];
      for (int j = 0; j < 16; ++j) sink[w * 16 + static_cast<std::size_t>(j)] = acc[j];
    }
  });
  benchmark::DoNotOptimize(sink.data());
}

}  // namespace lockstep
