// The model's hyper-parameters, read from an HF Qwen3-Next `config.json` (MODEL.md section 1).
//
// Both config styles load: `full_attention_interval` or an explicit `layer_types` list;
// `rope_theta` / `partial_rotary_factor` at the top level or nested in `rope_parameters`.
// A missing required field is a clear kNotFound naming the field; inconsistent values
// (e.g. heads not dividing) are kInvalidArgument.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

enum class LayerType : std::uint8_t { kLinearAttention, kFullAttention };

struct ModelConfig {
  std::string model_type = "qwen3_next";
  int n_vocab = 0;                     // vocab_size
  int n_embd = 0;                      // hidden_size (H)
  int n_layers = 0;                    // num_hidden_layers (MTP layer not counted)
  std::vector<LayerType> layer_types;  // [n_layers]

  // ---- gated full attention ----
  int n_heads = 0;     // num_attention_heads (Hq)
  int n_heads_kv = 0;  // num_key_value_heads (Hkv)
  int head_dim = 0;    // D
  int rotary_dim = 0;  // R = int(D * partial_rotary_factor)
  double partial_rotary_factor = 0.25;
  double rope_theta = 10000.0;

  // ---- gated DeltaNet ----
  int n_k_heads = 0;    // linear_num_key_heads (Hk)
  int n_v_heads = 0;    // linear_num_value_heads (Hv)
  int k_head_dim = 0;   // linear_key_head_dim (Dk)
  int v_head_dim = 0;   // linear_value_head_dim (Dv)
  int conv_kernel = 4;  // linear_conv_kernel_dim (K)

  // ---- MoE ----
  int n_experts = 0;       // num_experts (E)
  int n_experts_used = 0;  // num_experts_per_tok (k)
  int moe_ffn = 0;         // moe_intermediate_size (I)
  int shared_ffn = 0;      // shared_expert_intermediate_size (Is)
  int dense_ffn = 0;       // intermediate_size (only for dense layers)
  bool norm_topk_prob = true;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;

  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  int n_mtp_layers = 1;  // num_nextn_predict_layers / mtp_num_hidden_layers; 0 = no MTP

  // ---- derived ----
  int key_dim() const { return n_k_heads * k_head_dim; }    // Hk*Dk
  int value_dim() const { return n_v_heads * v_head_dim; }  // Hv*Dv
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
  int qkvz_dim() const { return 2 * key_dim() + 2 * value_dim(); }
  bool is_full_attention(int il) const {
    return layer_types[static_cast<std::size_t>(il)] == LayerType::kFullAttention;
  }
  // Layer il has a sparse MoE FFN (otherwise a dense SwiGLU of width dense_ffn).
  bool is_moe(int il) const;
  int n_full_attention_layers() const;

  // Parses config.json text. `label` names the source in messages.
  static Result<ModelConfig> FromJsonText(std::string_view text, const std::string& label);
  static Result<ModelConfig> FromFile(const std::string& path);
  // Canonical HF-style config.json (full_attention_interval style when the layout is regular,
  // else layer_types), keys sorted.
  std::string ToJson() const;
  // Checks internal consistency (divisibility, positive sizes). kInvalidArgument on failure.
  Status Validate() const;
};

}  // namespace lockstep
