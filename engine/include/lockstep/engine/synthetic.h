// Synthetic Qwen3-Next models: seeded random weights written in exactly the HF layout and names
// (config.json + model.safetensors), so the real loader path is the one under test.
//
// Presets:
//   tiny    8 layers, hidden 64, 8 experts top-2, vocab 512     (unit tests; f32 weights)
//   small   16 layers, hidden 512, 32 experts top-4, vocab 4096 (demo, benchmarks; bf16)
//   seed48  48 layers, hidden 128, 16 experts top-4, vocab 2048 (layout of the seed; bf16)
// The same (preset, seed, dtype) gives byte-identical files. How the weights are initialised
// (and why) is described in docs/engine.md, "The synthetic model".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/status.h"

namespace lockstep {

struct SyntheticOptions {
  std::string preset = "tiny";
  std::uint64_t seed = 0;
  // Storage dtype of the matrices: kF32, kBF16 or kF16 (default: f32 for tiny, bf16 otherwise).
  // A_log, dt_bias and the norm weights are always stored f32, as in Qwen's bf16 releases.
  std::optional<DType> dtype;
  bool with_mtp = true;
  // Wire a previous-token head and induction heads so the model continues repeated text
  // (in-context copying), as trained models do; see docs/engine.md, "The synthetic model". Off by
  // default: it makes greedy output loop and the MTP head much less accurate.
  bool induction = false;
  // Layers with a dense SwiGLU FFN (intermediate_size = 2 x moe_intermediate_size) instead of the
  // MoE block: Qwen's mlp_only_layers. Empty in every preset; the tests use it for the dense path.
  std::vector<int> mlp_only_layers;
  // A preset cut in depth and breadth with its widths kept (hidden size, heads, head and expert
  // widths), e.g. `wide` in 4 layers for an emulated test of the kernels at its widths: layers,
  // routed experts, experts per token, vocabulary. 0 keeps the preset's value. The layer pattern
  // (full attention every 4th layer) follows n_layers.
  int n_layers = 0;
  int n_experts = 0;
  int n_experts_used = 0;
  int n_vocab = 0;
};

std::vector<std::string> SyntheticPresets();
// The config of a preset. kInvalidArgument for an unknown name (the message lists the presets).
Result<ModelConfig> SyntheticConfig(const std::string& preset);
// Writes `out_dir`/config.json and `out_dir`/model.safetensors (creating out_dir).
Status WriteSyntheticModel(const SyntheticOptions& opts, const std::string& out_dir);

}  // namespace lockstep
