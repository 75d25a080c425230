// The scheduler's private parts (lockstep/engine/scheduler.h is the contract): one request's
// entry and one step's plan, shared by scheduler.cpp (queue, admission, endings) and
// scheduler_step.cpp (planning and finishing a step, conversations).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "decode/sequence.h"
#include "lockstep/engine/scheduler.h"

namespace lockstep {

struct Scheduler::Entry {
  RequestSpec spec;
  const GenerateHooks* hooks = nullptr;  // spec.borrowed_hooks or &spec.hooks
  std::unique_ptr<Sequence> seq;
  std::vector<Injection> injections;
  std::uint64_t reserved = 0;  // bytes charged while it holds a slot
  std::int64_t admit_order = -1;
  bool kept = false;  // a finished keep = true request holding its slot as a conversation
  RequestResult res;
  // ---- preemption (engine/serve/preempt.cpp) ----
  std::int64_t queue_order = -1;  // first enqueue: FIFO within a priority, kept when preempted
  bool resume = false;            // preempted: its next admission resumes it
  std::string slot_file;          // its state at preemption (SchedulerOptions::preempt_slot_dir)
  int chunks_run = 0;             // prefill chunks it ran, recompute not counted (preempt_at)
};

struct Scheduler::Plan {
  StepPlan plan;
  std::vector<std::int32_t> tokens;
  std::vector<Entry*> entries;  // parallel to plan.groups
};

}  // namespace lockstep
