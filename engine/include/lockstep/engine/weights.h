// Model weights in memory: every tensor converted once to f32 into one arena; layers hold views.
//
// Loading checks every tensor for presence, dtype (f32/bf16/f16 accepted) and shape against the
// ModelConfig, and names the tensor in every error: e.g.
//   tensor 'model.layers.3.mlp.gate.weight': expected shape [8, 64], got [8, 32]
//   (hint: config.json and the safetensors files disagree; regenerate with 'lockstep model init')
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/engine/model_config.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// A row-major weight matrix view: f32 [rows=out, cols=in]; acts as y = x . W^T.
struct Mat {
  const float* data = nullptr;
  int rows = 0;
  int cols = 0;
  const float* row(int r) const {
    return data + static_cast<std::size_t>(r) * static_cast<std::size_t>(cols);
  }
  std::size_t bytes() const {
    return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * sizeof(float);
  }
};

struct AttentionWeights {
  Mat q_proj;  // f32 [2*Hq*D, H]: per head h rows [2hD, 2hD+D) query, [2hD+D, 2hD+2D) gate
  Mat k_proj;  // f32 [Hkv*D, H]
  Mat v_proj;  // f32 [Hkv*D, H]
  Mat o_proj;  // f32 [H, Hq*D]
  const float* q_norm = nullptr;  // f32 [D], zero-centred
  const float* k_norm = nullptr;  // f32 [D], zero-centred
};

struct GdnWeights {
  Mat in_proj_qkvz;                // f32 [2*Hk*Dk + 2*Hv*Dv, H], grouped per key head
  Mat in_proj_ba;                  // f32 [2*Hv, H], grouped per key head
  const float* conv1d = nullptr;   // f32 [conv_dim, K]
  const float* dt_bias = nullptr;  // f32 [Hv]
  const float* a_log = nullptr;    // f32 [Hv]
  const float* norm = nullptr;     // f32 [Dv], plain weight (not 1+w)
  Mat out_proj;                    // f32 [H, Hv*Dv]
};

struct FfnWeights {  // one SwiGLU expert (or the shared expert, or a dense MLP)
  Mat gate;          // f32 [I, H]
  Mat up;            // f32 [I, H]
  Mat down;          // f32 [H, I]
  std::size_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

struct MoeWeights {
  Mat router;                          // f32 [E, H]
  std::vector<FfnWeights> experts;     // [E]
  FfnWeights shared;                   // shared expert (Is wide); rows == 0 when absent
  const float* shared_gate = nullptr;  // f32 [H] (shared_expert_gate.weight [1, H])
};

struct LayerWeights {
  LayerType type = LayerType::kLinearAttention;
  bool moe = true;
  const float* input_norm = nullptr;  // f32 [H], zero-centred
  const float* post_norm = nullptr;   // f32 [H], zero-centred
  AttentionWeights attn;              // full-attention layers
  GdnWeights gdn;                     // linear-attention layers
  MoeWeights ffn_moe;                 // moe == true
  FfnWeights ffn_dense;               // moe == false
};

struct MtpWeights {
  bool present = false;
  Mat fc;                                        // f32 [H, 2H]: cols [0,H) embedding, [H,2H) hidden
  const float* pre_fc_norm_embedding = nullptr;  // f32 [H]
  const float* pre_fc_norm_hidden = nullptr;     // f32 [H]
  const float* norm = nullptr;                   // f32 [H]
  LayerWeights layer;                            // full attention + MoE
};

class ModelWeights {
 public:
  ModelConfig config;
  Mat embed;                          // f32 [V, H]
  Mat lm_head;                        // f32 [V, H] (== embed when tied)
  const float* final_norm = nullptr;  // f32 [H]
  std::vector<LayerWeights> layers;   // [n_layers]
  MtpWeights mtp;
  std::vector<std::string> files;  // checkpoint files the weights came from

  std::size_t arena_bytes() const { return arena_.size() * sizeof(float); }
  // Weight bytes one decode token must read (f32 in memory): every mixer and norm weight, the
  // router, the top-k routed experts and the shared expert of every layer, one embedding row,
  // the final norm and lm_head. MTP excluded. The memory-bandwidth bound of decode is this
  // divided by the read bandwidth.
  std::size_t ActiveBytesPerToken() const;

  // Loads config.json + safetensors from `dir`. `load_mtp` = false skips mtp.* tensors.
  static Result<std::unique_ptr<ModelWeights>> Load(const std::string& dir, bool load_mtp = true);

 private:
  friend class WeightLoader;
  std::vector<float> arena_;
};
using ModelWeightsPtr = std::unique_ptr<ModelWeights>;

}  // namespace lockstep
