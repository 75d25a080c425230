#include "lockstep/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace lockstep {

std::uint64_t CounterHash(std::uint64_t seed, std::uint64_t position, std::uint64_t stream) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ position) ^ (stream * 0xd1b54a32d192ed03ull));
}

double CounterUniform(std::uint64_t seed, std::uint64_t position, std::uint64_t stream) {
  return static_cast<double>(CounterHash(seed, position, stream) >> 11) * 0x1.0p-53;
}

int Argmax(const float* logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best] || std::isnan(logits[best])) best = i;
  return best;
}

int SampleToken(const float* logits, int n_vocab, const SamplingParams& params,
                std::int64_t position, std::vector<int>* scratch) {
  if (params.greedy()) return Argmax(logits, n_vocab);
  std::vector<int>& order = *scratch;
  order.resize(static_cast<std::size_t>(n_vocab));
  std::iota(order.begin(), order.end(), 0);
  auto desc = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::size_t n = order.size();
  if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < n) {
    n = static_cast<std::size_t>(params.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                      desc);
  } else if (params.top_p < 1.0) {
    std::sort(order.begin(), order.end(), desc);
  }  // else: plain sampling over all ids in id order
  double mx = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[order[i]]));
  std::vector<double> p(n);
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    total += (p[i] = std::exp((static_cast<double>(logits[order[i]]) - mx) / params.temperature));
  if (params.top_p < 1.0) {
    double cum = 0.0;
    std::size_t keep = n;
    for (std::size_t i = 0; i < n; ++i) {
      cum += p[i];
      if (cum >= params.top_p * total) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    total = cum;
  }
  const double target = CounterUniform(params.seed, static_cast<std::uint64_t>(position)) * total;
  double cum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    cum += p[i];
    if (cum > target) return order[i];
  }
  return order[n - 1];
}

}  // namespace lockstep
