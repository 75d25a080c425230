// Helpers of the serving tests (tests/serve, tests/engine/scheduler_test.cpp): engines of the
// tiny model with slots, random requests, running a set of requests through a Scheduler with
// one of them exported, and comparing two exports bitwise (StateDiff at NRMSE 0 / KL 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/compare/state_diff.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/scheduler.h"

namespace lockstep::test {

// A synthetic model (test_util.h's presets; default tiny) with `slots` slots, 2 threads,
// prefill chunks of `chunk`, batch_tokens 4 chunks, 4 stages.
EngineConfig ServeConfig(int slots, int chunk = 64, const std::string& preset = "tiny");

// n random token ids in [0, V) from `seed` (SplitMix64).
std::vector<std::int32_t> RandomTokens(int n, std::uint64_t seed, int V);

// Request options: greedy, spec `spec` (MTP + suffix drafts, static policy), max_new.
RequestOptions SpecOptions(int max_new, int spec = 4);

struct ServeRequest {
  RequestSpec spec;
  std::string export_path;  // non-empty: this request's windows are exported (all, every point)
};

struct ServeRun {
  std::vector<RequestResult> results;  // in submission order
  std::vector<StepRecord> steps;
  SchedulerCounters counters;
  std::vector<std::string> submit_errors;  // per request: "" or the Submit refusal
};

// Runs `reqs` on a fresh engine of `cfg` (the model of cfg.model, made by ServeConfig) until idle.
// Each export is finished with the request's tokens and output (fingerprints: config, model "tiny",
// request tokens).
// `so`: the scheduler's options (preempt_slot_dir).
ServeRun RunRequests(const EngineConfig& cfg, std::vector<ServeRequest> reqs,
                     const SchedulerOptions& so = {});
// The same on the given weights (a model that is not a preset: a GGUF file).
ServeRun RunRequestsOn(const EngineConfig& cfg, const ModelWeights& weights,
                       std::vector<ServeRequest> reqs, const SchedulerOptions& so = {});

// StateDiff of two exports at NRMSE 0 and KL 0 (every item, every window, no skips).
DiffResult DiffExact(const std::string& a, const std::string& b);
// The largest NRMSE and KL over every compared item of `d`.
struct DiffMax {
  double nrmse = 0.0, kl = 0.0;
  int failed = 0, compared = 0;
};
DiffMax MaxOf(const DiffResult& d);

}  // namespace lockstep::test
