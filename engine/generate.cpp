#include "lockstep/engine/generate.h"

#include <algorithm>
#include <chrono>

namespace lockstep {

namespace {
std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

SamplingParams SamplingFrom(const EngineConfig& cfg) {
  SamplingParams p;
  p.temperature = cfg.temperature;
  p.top_k = cfg.top_k;
  p.top_p = cfg.top_p;
  p.seed = cfg.seed;
  return p;
}

Result<GenerateResult> Generate(Engine& engine, std::span<const std::int32_t> prompt, const GenerateHooks* hooks) {
  const EngineConfig& cfg = engine.config();
  const ModelConfig& mc = engine.weights().config;
  if (prompt.empty()) return Status::InvalidArgument("prompt", "empty (at least one token is needed)");
  if (engine.position() != 0) return Status::Runtime("generate", "the engine is not fresh");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= mc.n_vocab)
      return Status::InvalidArgument("prompt", "token " + std::to_string(i) + " = " + std::to_string(prompt[i]) +
                                                   " is outside the vocabulary (size " + std::to_string(mc.n_vocab) + ")");
  GenerateResult res;
  res.stop_reason = "length";
  const std::int64_t t0 = NowNs();
  LOCKSTEP_RETURN_IF_ERROR(engine.Prefill(prompt.first(prompt.size() - 1)));
  const std::int64_t t1 = NowNs();
  res.prefill_ns = t1 - t0;

  const SamplingParams sp = SamplingFrom(cfg);
  std::vector<float> logits(static_cast<std::size_t>(mc.n_vocab));
  std::vector<int> scratch;
  std::int32_t tok = prompt.back();
  while (static_cast<int>(res.output.size()) < cfg.max_new) {
    const int p = engine.position();
    LOCKSTEP_RETURN_IF_ERROR(engine.Verify(std::span<const std::int32_t>(&tok, 1), logits.data()));
    if (hooks && hooks->on_window) hooks->on_window(p, 1, logits.data());
    const std::int32_t next = SampleToken(logits.data(), mc.n_vocab, sp, p, &scratch);
    LOCKSTEP_RETURN_IF_ERROR(engine.Commit(1));
    ++res.n_windows;
    res.output.push_back(next);
    tok = next;
    if (!cfg.ignore_eos && std::find(mc.eos_token_ids.begin(), mc.eos_token_ids.end(), next) != mc.eos_token_ids.end()) {
      res.stop_reason = "eos";
      break;
    }
  }
  res.decode_ns = NowNs() - t1;
  return res;
}

}  // namespace lockstep
