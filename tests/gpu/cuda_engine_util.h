// Set-up shared by the engine-level CUDA tests (cuda_engine_test.cpp, cuda_engine_extra_test.cpp):
// the `tiny` model on four stages with small prefill chunks, on either backend.
#pragma once

#include <memory>
#include <string>

#include "lockstep/engine/engine.h"
#include "lockstep/engine_cuda/register.h"
#include "test_util.h"

namespace lockstep::test {

inline EngineConfig TinyConfig(const std::string& backend, DType kv = DType::kF32) {
  cuda::RegisterCudaBackend();
  EngineConfig c;
  c.model = ModelDir("tiny");
  c.backend = backend;
  c.threads = 2;
  c.stages = 4;
  c.prefill_chunk = 8;
  c.kv_dtype = kv;
  return c;
}

inline std::unique_ptr<Engine> MakeTiny(const EngineConfig& c) {
  auto e = Engine::Create(c, Model("tiny"));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

// Two engines of config c: *graphed with CUDA graphs as c has them (on by default) and *eager with
// every kernel launched from the host (--cuda-graphs off), for the graphs-vs-eager tests.
inline void MakeGraphedAndEager(EngineConfig c, std::unique_ptr<Engine>* graphed,
                                std::unique_ptr<Engine>* eager) {
  *graphed = MakeTiny(c);
  c.cuda_graphs = false;
  *eager = MakeTiny(c);
}

}  // namespace lockstep::test
