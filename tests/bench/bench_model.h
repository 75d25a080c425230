// The `small` synthetic model shared by the benchmark programs: loaded once per process from
// $LOCKSTEP_BENCH_MODEL, or generated into a temporary folder (seed 0) and removed after loading.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "lockstep/engine/synthetic.h"
#include "lockstep/engine/weights.h"

namespace lockstep {

inline const ModelWeights& BenchSmallModel(bool induction = false) {
  static ModelWeightsPtr w = [induction] {
    const char* env = std::getenv("LOCKSTEP_BENCH_MODEL");  // env: LOCKSTEP_BENCH_MODEL
    const bool given = env != nullptr && *env != '\0';
    const std::string dir = given ? env : "/tmp/lockstep-bench-small-" + std::to_string(::getpid());
    if (!given) {
      SyntheticOptions o;
      o.preset = "small";
      o.induction = induction;
      if (!WriteSyntheticModel(o, dir).ok()) std::abort();
    }
    auto r = ModelWeights::Load(dir);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
      std::abort();
    }
    if (!given) std::filesystem::remove_all(dir);
    return std::move(r).value();
  }();
  return *w;
}

}  // namespace lockstep
