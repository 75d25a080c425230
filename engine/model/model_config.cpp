#include "lockstep/engine/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "lockstep/engine/atomic_file.h"
#include "util/json_util.h"

namespace lockstep {

bool ModelConfig::is_moe(int il) const {
  if (n_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), il) != mlp_only_layers.end())
    return false;
  return decoder_sparse_step > 0 && (il + 1) % decoder_sparse_step == 0;
}

int ModelConfig::n_full_attention_layers() const {
  return static_cast<int>(
      std::count(layer_types.begin(), layer_types.end(), LayerType::kFullAttention));
}

namespace {

Result<int> GetPositiveInt(const JsonDoc& doc, std::string_view key) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t v, doc.GetInt(key));
  if (v <= 0 || v > (std::int64_t{1} << 30))
    return Status::InvalidArgument(
        doc.label(),
        "key '" + std::string(key) + "': expected a positive integer, got " + std::to_string(v));
  return static_cast<int>(v);
}

// Reads an int if present, else returns `fallback`.
Result<int> GetIntOr(const JsonDoc& doc, std::string_view key, int fallback) {
  if (!doc.Has(key)) return fallback;
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t v, doc.GetInt(key));
  if (v < 0 || v > (std::int64_t{1} << 30))
    return Status::InvalidArgument(
        doc.label(), "key '" + std::string(key) + "': out of range: " + std::to_string(v));
  return static_cast<int>(v);
}

// A hyperparameter outside its range: kInvalidArgument naming the key, the range and the value
// (issue 43: a negative rotary factor crashed the loader, a zero epsilon loaded silently).
Status OutOfRange(const JsonDoc& doc, std::string_view key, std::string_view range, double got) {
  return Status::InvalidArgument(doc.label(),
                                 fmt::format("key '{}': expected {}, got {}", key, range, got));
}

// The value of the first of `keys` present (the newer rope_parameters.* spelling first), checked
// to be finite and within (lo, hi] (`hi_open`: (lo, hi)); `fallback` when none is present.
Result<double> GetRangedDouble(const JsonDoc& doc, std::initializer_list<std::string_view> keys,
                               double lo, double hi, bool hi_open, std::string_view range,
                               std::optional<double> fallback) {
  for (std::string_view key : keys) {
    if (!doc.Has(key)) continue;
    LOCKSTEP_ASSIGN_OR_RETURN(double v, doc.GetDouble(key));
    if (!std::isfinite(v) || v <= lo || v > hi || (hi_open && v == hi))
      return OutOfRange(doc, key, range, v);
    return v;
  }
  if (fallback) return *fallback;
  std::string names;
  for (std::string_view key : keys)
    names += (names.empty() ? "'" : " or '") + std::string(key) + "'";
  return Status::NotFound(doc.label(), "missing key " + names);
}

}  // namespace

Result<ModelConfig> ModelConfig::FromJsonText(std::string_view text, const std::string& label) {
  LOCKSTEP_ASSIGN_OR_RETURN(JsonDoc doc, JsonDoc::Parse(text, label));
  ModelConfig c;
  if (doc.Has("model_type")) {
    LOCKSTEP_ASSIGN_OR_RETURN(c.model_type, doc.GetString("model_type"));
  }
  if (c.model_type != "qwen3_next")
    return Status::NotSupported(label, "model_type '" + c.model_type + "' (expected 'qwen3_next')");
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_vocab, GetPositiveInt(doc, "vocab_size"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_embd, GetPositiveInt(doc, "hidden_size"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_layers, GetPositiveInt(doc, "num_hidden_layers"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_heads, GetPositiveInt(doc, "num_attention_heads"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_heads_kv, GetPositiveInt(doc, "num_key_value_heads"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.head_dim, GetIntOr(doc, "head_dim", 256));
  if (c.head_dim < 1 || c.head_dim > 512)
    return OutOfRange(doc, "head_dim", "an integer in [1, 512]", c.head_dim);
  // Partial rotary factor and theta: top level (older config.json) or rope_parameters (newer).
  LOCKSTEP_ASSIGN_OR_RETURN(
      c.partial_rotary_factor,
      GetRangedDouble(doc, {"rope_parameters.partial_rotary_factor", "partial_rotary_factor"}, 0.0,
                      1.0, false, "a number in (0, 1]", c.partial_rotary_factor));
  LOCKSTEP_ASSIGN_OR_RETURN(c.rope_theta,
                            GetRangedDouble(doc, {"rope_parameters.rope_theta", "rope_theta"}, 0.0,
                                            std::numeric_limits<double>::max(), false,
                                            "a positive finite number", std::nullopt));
  if (doc.Has("rope_scaling")) {
    return Status::NotSupported(label, "rope_scaling is set; only default RoPE is implemented");
  }
  c.rotary_dim = static_cast<int>(c.head_dim * c.partial_rotary_factor);
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_k_heads, GetPositiveInt(doc, "linear_num_key_heads"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_v_heads, GetPositiveInt(doc, "linear_num_value_heads"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.k_head_dim, GetPositiveInt(doc, "linear_key_head_dim"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.v_head_dim, GetPositiveInt(doc, "linear_value_head_dim"));
  LOCKSTEP_ASSIGN_OR_RETURN(c.conv_kernel, GetIntOr(doc, "linear_conv_kernel_dim", 4));
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_experts, GetIntOr(doc, "num_experts", 0));
  LOCKSTEP_ASSIGN_OR_RETURN(c.n_experts_used, GetIntOr(doc, "num_experts_per_tok", 0));
  LOCKSTEP_ASSIGN_OR_RETURN(c.moe_ffn, GetIntOr(doc, "moe_intermediate_size", 0));
  LOCKSTEP_ASSIGN_OR_RETURN(c.shared_ffn, GetIntOr(doc, "shared_expert_intermediate_size", 0));
  LOCKSTEP_ASSIGN_OR_RETURN(c.dense_ffn, GetIntOr(doc, "intermediate_size", 0));
  if (doc.Has("norm_topk_prob")) {
    LOCKSTEP_ASSIGN_OR_RETURN(c.norm_topk_prob, doc.GetBool("norm_topk_prob"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(c.decoder_sparse_step, GetIntOr(doc, "decoder_sparse_step", 1));
  if (doc.Has("mlp_only_layers")) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto v, doc.GetIntList("mlp_only_layers"));
    for (auto x : v) c.mlp_only_layers.push_back(static_cast<int>(x));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      const double eps, GetRangedDouble(doc, {"rms_norm_eps"}, 0.0, 1.0, true, "a number in (0, 1)",
                                        double{c.rms_norm_eps}));
  c.rms_norm_eps = static_cast<float>(eps);
  if (doc.Has("tie_word_embeddings")) {
    LOCKSTEP_ASSIGN_OR_RETURN(c.tie_word_embeddings, doc.GetBool("tie_word_embeddings"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(c.bos_token_id, GetIntOr(doc, "bos_token_id", 0));
  if (doc.Has("eos_token_id")) {
    auto single = doc.GetInt("eos_token_id");
    if (single.ok()) {
      c.eos_token_ids.push_back(static_cast<int>(*single));
    } else {
      LOCKSTEP_ASSIGN_OR_RETURN(auto v, doc.GetIntList("eos_token_id"));
      for (auto x : v) c.eos_token_ids.push_back(static_cast<int>(x));
    }
  }
  // MTP count: Qwen3-Next ships one MTP layer without a config field (MODEL.md UNSURE #2).
  if (doc.Has("num_nextn_predict_layers")) {
    LOCKSTEP_ASSIGN_OR_RETURN(c.n_mtp_layers, GetIntOr(doc, "num_nextn_predict_layers", 1));
  } else if (doc.Has("mtp_num_hidden_layers")) {
    LOCKSTEP_ASSIGN_OR_RETURN(c.n_mtp_layers, GetIntOr(doc, "mtp_num_hidden_layers", 1));
  }
  // Layer layout: explicit layer_types wins over full_attention_interval.
  if (doc.Has("layer_types")) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto types, doc.GetStringList("layer_types"));
    if (static_cast<int>(types.size()) != c.n_layers)
      return Status::InvalidArgument(label, "layer_types has " + std::to_string(types.size()) +
                                                " entries, num_hidden_layers is " +
                                                std::to_string(c.n_layers));
    for (const auto& t : types) {
      if (t == "linear_attention") {
        c.layer_types.push_back(LayerType::kLinearAttention);
      } else if (t == "full_attention") {
        c.layer_types.push_back(LayerType::kFullAttention);
      } else {
        return Status::InvalidArgument(
            label,
            "layer_types: unknown entry '" + t + "' (expected linear_attention or full_attention)");
      }
    }
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(int interval, GetIntOr(doc, "full_attention_interval", 4));
    if (interval <= 0)
      return Status::InvalidArgument(label, "full_attention_interval must be positive");
    for (int il = 0; il < c.n_layers; ++il)
      c.layer_types.push_back((il + 1) % interval == 0 ? LayerType::kFullAttention
                                                       : LayerType::kLinearAttention);
  }
  LOCKSTEP_RETURN_IF_ERROR(c.Validate().WithContext(label));
  return c;
}

Result<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{16} << 20));
  return FromJsonText(text, path);
}

Status ModelConfig::Validate() const {
  // Each message names the config.json key(s) and the range (issue 43).
  auto bad = [](const std::string& m) { return Status::InvalidArgument("model config", m); };
  if (n_heads % n_heads_kv != 0)
    return bad("num_attention_heads must be a multiple of num_key_value_heads");
  if (n_v_heads % n_k_heads != 0)
    return bad("linear_num_value_heads must be a multiple of linear_num_key_heads");
  if (rotary_dim < 2 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
    return bad(fmt::format(
        "partial_rotary_factor x head_dim must be an even number of rotary dims in [2, head_dim "
        "{}], got {}",
        head_dim, rotary_dim));
  if (n_experts > 4096) return bad("num_experts above 4096 is not supported");
  if (head_dim < 1 || head_dim > 512) return bad("head_dim must be in [1, 512]");
  if (v_head_dim > 1024 || k_head_dim > 1024)
    return bad("linear_key_head_dim and linear_value_head_dim must be in [1, 1024]");
  if (conv_kernel < 1 || conv_kernel > 16) return bad("linear_conv_kernel_dim must be in [1, 16]");
  if (n_experts > 0 && decoder_sparse_step < 1)
    return bad("decoder_sparse_step must be >= 1 when num_experts > 0");
  for (int il : mlp_only_layers)
    if (il < 0 || il >= n_layers)
      return bad(fmt::format("mlp_only_layers: layer {} is not in [0, num_hidden_layers {})", il,
                             n_layers));
  if (bos_token_id >= n_vocab)
    return bad(fmt::format("bos_token_id {} is not in [0, vocab_size {})", bos_token_id, n_vocab));
  bool any_moe = false, any_dense = false;
  for (int il = 0; il < n_layers; ++il) (is_moe(il) ? any_moe : any_dense) = true;
  if (any_moe && (n_experts_used <= 0 || n_experts_used > n_experts || moe_ffn <= 0))
    return bad(
        "MoE layers need 0 < num_experts_per_tok <= num_experts and moe_intermediate_size > 0");
  if (any_dense && dense_ffn <= 0) return bad("dense layers need intermediate_size > 0");
  if (n_mtp_layers < 0 || n_mtp_layers > 1) return bad("only 0 or 1 MTP layers are supported");
  for (int e : eos_token_ids)
    if (e < 0 || e >= n_vocab)
      return bad(fmt::format("eos_token_id {} is not in [0, vocab_size {})", e, n_vocab));
  return Status::Ok();
}

std::string ModelConfig::ToJson() const {
  nlohmann::json j;
  j["architectures"] = {"Qwen3NextForCausalLM"};
  j["model_type"] = model_type;
  j["vocab_size"] = n_vocab;
  j["hidden_size"] = n_embd;
  j["num_hidden_layers"] = n_layers;
  j["num_attention_heads"] = n_heads;
  j["num_key_value_heads"] = n_heads_kv;
  j["head_dim"] = head_dim;
  j["partial_rotary_factor"] = partial_rotary_factor;
  j["rope_theta"] = rope_theta;
  j["linear_num_key_heads"] = n_k_heads;
  j["linear_num_value_heads"] = n_v_heads;
  j["linear_key_head_dim"] = k_head_dim;
  j["linear_value_head_dim"] = v_head_dim;
  j["linear_conv_kernel_dim"] = conv_kernel;
  j["num_experts"] = n_experts;
  j["num_experts_per_tok"] = n_experts_used;
  j["moe_intermediate_size"] = moe_ffn;
  j["shared_expert_intermediate_size"] = shared_ffn;
  j["intermediate_size"] = dense_ffn;
  j["norm_topk_prob"] = norm_topk_prob;
  j["decoder_sparse_step"] = decoder_sparse_step;
  j["mlp_only_layers"] = mlp_only_layers;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  j["num_nextn_predict_layers"] = n_mtp_layers;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  // Regular layout -> full_attention_interval; otherwise the explicit list.
  int interval = 0;
  for (int cand = 1; cand <= n_layers && interval == 0; ++cand) {
    bool match = true;
    for (int il = 0; il < n_layers; ++il)
      match = match && (is_full_attention(il) == ((il + 1) % cand == 0));
    if (match) interval = cand;
  }
  if (interval > 0) {
    j["full_attention_interval"] = interval;
  } else {
    std::vector<std::string> names;
    for (auto t : layer_types)
      names.push_back(t == LayerType::kFullAttention ? "full_attention" : "linear_attention");
    j["layer_types"] = names;
  }
  return j.dump(2) + "\n";
}

}  // namespace lockstep
