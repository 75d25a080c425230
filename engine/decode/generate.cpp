// Generate: the one-request case of the serving scheduler (engine/serve). A scheduler over
// slot 0 only, which the fresh engine already has open with --inject's injections: every step
// carries this request's one prefill chunk or verify window, and a one-group engine step runs
// exactly Engine::Prefill's chunk or Engine::Verify, so `lockstep generate` computes what it
// computed before the scheduler existed (tests/golden_tests). The slot keeps the request's
// state afterwards for the caller (exports, tests) to read.
#include "lockstep/engine/generate.h"

#include "lockstep/engine/scheduler.h"

namespace lockstep {

SamplingParams SamplingFrom(const EngineConfig& cfg) {
  SamplingParams p;
  p.temperature = cfg.temperature;
  p.top_k = cfg.top_k;
  p.top_p = cfg.top_p;
  p.seed = cfg.seed;
  p.presence_penalty = cfg.presence_penalty;
  p.frequency_penalty = cfg.frequency_penalty;
  p.repeat_penalty = cfg.repeat_penalty;
  p.repeat_last_n = cfg.repeat_last_n;
  return p;
}

Result<GenerateResult> Generate(Engine& engine, std::span<const std::int32_t> prompt,
                                const GenerateHooks* hooks) {
  if (prompt.empty())
    return Status::InvalidArgument("prompt", "empty (at least one token is needed)");
  engine.UseSlot(0);
  if (engine.position() != 0) return Status::Runtime("generate", "the engine is not fresh");
  SchedulerOptions so;
  so.slots = 1;
  so.adopt_open_slots = true;
  so.leave_slots_open = true;
  Scheduler sched(engine, so);
  RequestSpec spec;
  spec.id = "generate";
  spec.prompt.assign(prompt.begin(), prompt.end());
  spec.options = RequestOptions::FromConfig(engine.config());
  spec.borrowed_hooks = hooks;
  spec.keep = true;  // the slot's state stays for the caller
  LOCKSTEP_ASSIGN_OR_RETURN(Ticket t, sched.Submit(std::move(spec)));
  LOCKSTEP_RETURN_IF_ERROR(sched.RunUntilIdle());
  for (RequestResult& r : sched.TakeFinished()) {
    if (r.ticket != t) continue;
    LOCKSTEP_RETURN_IF_ERROR(r.status);
    return std::move(r.result);
  }
  return Status::Runtime("generate", "the request did not finish");
}

}  // namespace lockstep
