// A state-digest run of the engine for tests that compare two ways of loading the same weights:
// tokens and an FNV-1a digest of every exported item (all windows, all checkpoints).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/observer.h"
#include "test_util.h"

namespace lockstep::test {

// FNV-1a digest of every item's bytes (rows and int8 scales), keyed by window, point, stage,
// kind and layer.
class DigestObserver : public Observer {
 public:
  std::map<std::string, std::uint64_t> items;
  bool WantsCheckpoint(int, CheckpointPoint) const override { return true; }
  void OnCheckpointBegin(const CheckpointInfo&) override {}
  void OnCheckpointEnd(const CheckpointInfo&) override {}
  void OnState(const CheckpointInfo& info, const StateView& v) override {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](const std::byte* p, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i)
        h = (h ^ static_cast<std::uint8_t>(p[i])) * 1099511628211ull;
    };
    for (int r = 0; r < v.rows; ++r) {
      mix(v.row(r), v.row_bytes);
      if (v.scales) mix(reinterpret_cast<const std::byte*>(v.scales(r)), sizeof(float));
    }
    items[std::to_string(info.window) + "/" + CheckpointPointName(info.point) + "/" +
          std::to_string(v.stage) + "/" + ItemKindName(v.kind) + "/" + std::to_string(v.layer)] = h;
  }
};

struct DigestRun {
  std::vector<std::int32_t> tokens;
  std::map<std::string, std::uint64_t> items;
};

// 41-token prompt in 16-token prefill chunks (kGemm), then 10 tokens with MTP drafts (verify
// windows of up to 4 rows) on 2 threads.
inline DigestRun GenerateDigests(const ModelWeights& w, const std::string& dir) {
  EngineConfig c;
  c.model = dir;
  c.threads = 2;
  c.max_new = 10;
  c.ignore_eos = true;
  c.prefill_chunk = 16;  // three kGemm chunks (the last one short)
  c.spec = 3;            // verify windows of up to 4 rows (MTP drafts)
  auto e = Engine::Create(c, w);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  DigestObserver obs;
  GenerateHooks hooks;
  hooks.observer = &obs;
  const std::vector<std::int32_t> prompt = test::Tokens(41, 5);
  auto res = lockstep::Generate(**e, prompt, &hooks);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return {res->output, obs.items};
}

}  // namespace lockstep::test
