#include "lockstep/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

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

void ApplyPenalties(const float* logits, int n_vocab, const SamplingParams& params,
                    const PenaltyContext& history, std::vector<float>* out) {
  out->assign(logits, logits + n_vocab);
  const std::size_t n_context = history.base.size() + history.more.size();
  auto at = [&](std::size_t i) {
    return i < history.base.size() ? history.base[i] : history.more[i - history.base.size()];
  };
  struct Seen {
    bool in_window = false;  // among the last repeat_last_n context tokens
    int count = 0;           // occurrences in the output so far
  };
  std::unordered_map<std::int32_t, Seen> seen;  // only the tokens the history holds
  auto note = [&](std::size_t begin, auto&& mark) {
    for (std::size_t i = begin; i < n_context; ++i)
      if (at(i) >= 0 && at(i) < n_vocab) mark(seen[at(i)]);
  };
  if (params.repeat_penalty != 1.0 && params.repeat_last_n != 0) {
    const std::size_t n = params.repeat_last_n < 0
                              ? n_context
                              : std::min(n_context, static_cast<std::size_t>(params.repeat_last_n));
    note(n_context - n, [](Seen& e) { e.in_window = true; });  // once per distinct token
  }
  if (params.presence_penalty != 0.0 || params.frequency_penalty != 0.0)
    note(n_context - std::min(history.n_output, n_context), [](Seen& e) { ++e.count; });
  for (const auto& [t, e] : seen) {
    double l = static_cast<double>(logits[t]);
    if (e.in_window) l = l > 0 ? l / params.repeat_penalty : l * params.repeat_penalty;
    l -= params.frequency_penalty * e.count + (e.count > 0 ? params.presence_penalty : 0.0);
    (*out)[static_cast<std::size_t>(t)] = static_cast<float>(l);
  }
}

}  // namespace lockstep
