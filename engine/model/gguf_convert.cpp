// ConvertToGguf (gguf.h): a safetensors checkpoint in the HF Qwen3-Next layout written as the
// qwen3next GGUF layout that llama.cpp's converter produces (the table is in gguf.cpp, the reader
// of the same layout).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/gguf.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/quant.h"
#include "lockstep/engine/safetensors.h"
#include "model/bpe_model.h"

namespace lockstep {

namespace {

GgufValue U32(std::uint64_t v) { return {v, 4}; }
GgufValue F32(double v) { return {v, 6}; }
GgufValue Str(std::string s) { return {std::move(s), 8}; }

class Converter {
 public:
  Converter(const TensorStore& st, const ModelConfig& c, std::optional<WeightType> quant)
      : st_(st), c_(c), quant_(quant) {}

  Status Run(std::vector<GgufTensorToWrite>* out);

 private:
  Result<const TensorInfo*> Get(const std::string& name) const {
    const TensorInfo* t = st_.Find(name);
    if (t == nullptr)
      return Status::NotFound("tensor '" + name + "'", "missing from the checkpoint");
    if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16)
      return Status::InvalidArgument("tensor '" + name + "'", "expected f32, bf16 or f16");
    return t;
  }
  static std::vector<float> Widen(const TensorInfo& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    convert_to_f32(t.dtype, t.data, v.size(), v.data());
    return v;
  }
  // Rows `rows` of matrix t ([n, cols]) appended to dst in the output type of the matrix.
  void AppendRows(const TensorInfo& t, std::int64_t cols, std::int64_t r0, std::int64_t n,
                  GgmlType type, std::vector<std::byte>* dst) const {
    const std::size_t es = dtype_size(t.dtype);
    const std::byte* src = t.data + static_cast<std::size_t>(r0 * cols) * es;
    if (type != GgmlType::kQ8_0 && type != GgmlType::kQ4_K && type != GgmlType::kQ6_K) {
      dst->insert(dst->end(), src, src + static_cast<std::size_t>(n * cols) * es);
      return;
    }
    const WeightType wt = *WeightTypeOfGgml(static_cast<std::uint32_t>(type));
    Mat m;
    m.type = wt;
    m.rows = 1;
    m.cols = static_cast<int>(cols);
    std::vector<float> row(static_cast<std::size_t>(cols));
    for (std::int64_t r = 0; r < n; ++r) {
      convert_to_f32(t.dtype, src + static_cast<std::size_t>(r * cols) * es, row.size(),
                     row.data());
      const std::size_t at = dst->size();
      dst->resize(at + m.row_bytes());
      QuantizeRow(wt, row.data(), row.size(), dst->data() + at);
    }
  }
  GgmlType TypeFor(const TensorInfo& t, std::int64_t cols) const {
    if (quant_ && cols % weight_block_elems(*quant_) == 0) return GgmlOfWeightType(*quant_);
    return t.dtype == DType::kF32    ? GgmlType::kF32
           : t.dtype == DType::kBF16 ? GgmlType::kBF16
                                     : GgmlType::kF16;
  }
  Status Matrix(const std::string& hf, const std::string& gg, bool quantise = true) {
    LOCKSTEP_ASSIGN_OR_RETURN(const TensorInfo* t, Get(hf));
    const std::int64_t cols = t->shape.back(), rows = t->numel() / cols;
    GgufTensorToWrite w{gg, quantise ? TypeFor(*t, cols) : TypeFor(*t, 0 * cols + 1), {}, {}};
    if (!quantise && quant_)
      w.type = t->dtype == DType::kF32    ? GgmlType::kF32
               : t->dtype == DType::kBF16 ? GgmlType::kBF16
                                          : GgmlType::kF16;
    w.ne = {static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows)};
    AppendRows(*t, cols, 0, rows, w.type, &w.data);
    out_->push_back(std::move(w));
    return Status::Ok();
  }
  // An F32 vector (shape as ne), each value through f.
  template <class F>
  Status Vector(const std::string& hf, const std::string& gg, std::vector<std::uint64_t> ne, F f) {
    LOCKSTEP_ASSIGN_OR_RETURN(const TensorInfo* t, Get(hf));
    std::vector<float> v = Widen(*t);
    for (float& x : v) x = f(x);
    GgufTensorToWrite w{gg, GgmlType::kF32, std::move(ne), {}};
    w.data.resize(v.size() * sizeof(float));
    std::memcpy(w.data.data(), v.data(), w.data.size());
    out_->push_back(std::move(w));
    return Status::Ok();
  }
  Status Norm(const std::string& hf, const std::string& gg) {
    return Vector(hf, gg, {static_cast<std::uint64_t>(c_.n_embd)},
                  [](float x) { return x + 1.0f; });
  }
  Status Qkvz(const std::string& p, const std::string& g);
  Status Experts(const std::string& p, const std::string& g);
  Status Layer(const std::string& p, const std::string& g, bool attention, bool moe);

  const TensorStore& st_;
  const ModelConfig& c_;
  std::optional<WeightType> quant_;
  std::vector<GgufTensorToWrite>* out_ = nullptr;
};

// in_proj_qkvz ([q, k, v, z] per key head) -> attn_qkv (all q, all k, all v) + attn_gate (all z).
Status Converter::Qkvz(const std::string& p, const std::string& g) {
  LOCKSTEP_ASSIGN_OR_RETURN(const TensorInfo* t, Get(p + "in_proj_qkvz.weight"));
  const std::int64_t H = c_.n_embd, Dk = c_.k_head_dim, Vg = c_.value_dim() / c_.n_k_heads;
  const std::int64_t per = 2 * Dk + 2 * Vg;
  GgufTensorToWrite qkv{g + "attn_qkv.weight",
                        TypeFor(*t, H),
                        {static_cast<std::uint64_t>(H),
                         static_cast<std::uint64_t>(2 * c_.key_dim() + c_.value_dim())},
                        {}};
  GgufTensorToWrite gate{
      g + "attn_gate.weight",
      qkv.type,
      {static_cast<std::uint64_t>(H), static_cast<std::uint64_t>(c_.value_dim())},
      {}};
  for (int part = 0; part < 3; ++part)
    for (std::int64_t h = 0; h < c_.n_k_heads; ++h) {
      const std::int64_t off = part == 0 ? 0 : part == 1 ? Dk : 2 * Dk;
      AppendRows(*t, H, h * per + off, part == 2 ? Vg : Dk, qkv.type, &qkv.data);
    }
  for (std::int64_t h = 0; h < c_.n_k_heads; ++h)
    AppendRows(*t, H, h * per + 2 * Dk + Vg, Vg, gate.type, &gate.data);
  out_->push_back(std::move(qkv));
  out_->push_back(std::move(gate));
  return Status::Ok();
}

Status Converter::Experts(const std::string& p, const std::string& g) {
  for (const char* part : {"gate", "up", "down"}) {
    GgufTensorToWrite w{g + "ffn_" + part + "_exps.weight", GgmlType::kF32, {}, {}};
    for (int e = 0; e < c_.n_experts; ++e) {
      LOCKSTEP_ASSIGN_OR_RETURN(const TensorInfo* t, Get(p + "experts." + std::to_string(e) + "." +
                                                         part + "_proj.weight"));
      const std::int64_t cols = t->shape.back(), rows = t->numel() / cols;
      if (e == 0) {
        w.type = TypeFor(*t, cols);
        w.ne = {static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows),
                static_cast<std::uint64_t>(c_.n_experts)};
      }
      AppendRows(*t, cols, 0, rows, w.type, &w.data);
    }
    out_->push_back(std::move(w));
  }
  return Status::Ok();
}

Status Converter::Layer(const std::string& p, const std::string& g, bool attention, bool moe) {
  LOCKSTEP_RETURN_IF_ERROR(Norm(p + "input_layernorm.weight", g + "attn_norm.weight"));
  LOCKSTEP_RETURN_IF_ERROR(
      Norm(p + "post_attention_layernorm.weight", g + "post_attention_norm.weight"));
  if (attention) {
    const std::string a = p + "self_attn.";
    LOCKSTEP_RETURN_IF_ERROR(Matrix(a + "q_proj.weight", g + "attn_q.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Matrix(a + "k_proj.weight", g + "attn_k.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Matrix(a + "v_proj.weight", g + "attn_v.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Matrix(a + "o_proj.weight", g + "attn_output.weight"));
    const auto D = static_cast<std::uint64_t>(c_.head_dim);
    LOCKSTEP_RETURN_IF_ERROR(Vector(a + "q_norm.weight", g + "attn_q_norm.weight", {D},
                                    [](float x) { return x + 1.0f; }));
    LOCKSTEP_RETURN_IF_ERROR(Vector(a + "k_norm.weight", g + "attn_k_norm.weight", {D},
                                    [](float x) { return x + 1.0f; }));
  } else {
    const std::string l = p + "linear_attn.";
    LOCKSTEP_RETURN_IF_ERROR(Qkvz(l, g));
    LOCKSTEP_RETURN_IF_ERROR(Matrix(l + "in_proj_ba.weight", g + "ssm_ba.weight"));
    const auto hv = static_cast<std::uint64_t>(c_.n_v_heads);
    LOCKSTEP_RETURN_IF_ERROR(Vector(
        l + "conv1d.weight", g + "ssm_conv1d.weight",
        {static_cast<std::uint64_t>(c_.conv_kernel), static_cast<std::uint64_t>(c_.conv_dim())},
        [](float x) { return x; }));
    LOCKSTEP_RETURN_IF_ERROR(
        Vector(l + "dt_bias", g + "ssm_dt.bias", {hv}, [](float x) { return x; }));
    LOCKSTEP_RETURN_IF_ERROR(
        Vector(l + "A_log", g + "ssm_a", {hv}, [](float x) { return -std::exp(x); }));
    LOCKSTEP_RETURN_IF_ERROR(Vector(l + "norm.weight", g + "ssm_norm.weight",
                                    {static_cast<std::uint64_t>(c_.v_head_dim)},
                                    [](float x) { return x; }));
    LOCKSTEP_RETURN_IF_ERROR(Matrix(l + "out_proj.weight", g + "ssm_out.weight"));
  }
  const std::string m = p + "mlp.";
  if (!moe) {
    LOCKSTEP_RETURN_IF_ERROR(Matrix(m + "gate_proj.weight", g + "ffn_gate.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Matrix(m + "up_proj.weight", g + "ffn_up.weight"));
    return Matrix(m + "down_proj.weight", g + "ffn_down.weight");
  }
  // The router stays in its float type (llama.cpp's quantiser keeps ffn_gate_inp unquantised).
  LOCKSTEP_RETURN_IF_ERROR(Matrix(m + "gate.weight", g + "ffn_gate_inp.weight", false));
  LOCKSTEP_RETURN_IF_ERROR(Experts(m, g));
  if (c_.shared_ffn > 0) {
    LOCKSTEP_RETURN_IF_ERROR(
        Matrix(m + "shared_expert.gate_proj.weight", g + "ffn_gate_shexp.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Matrix(m + "shared_expert.up_proj.weight", g + "ffn_up_shexp.weight"));
    LOCKSTEP_RETURN_IF_ERROR(
        Matrix(m + "shared_expert.down_proj.weight", g + "ffn_down_shexp.weight"));
    LOCKSTEP_RETURN_IF_ERROR(
        Vector(m + "shared_expert_gate.weight", g + "ffn_gate_inp_shexp.weight",
               {static_cast<std::uint64_t>(c_.n_embd)}, [](float x) { return x; }));
  }
  return Status::Ok();
}

Status Converter::Run(std::vector<GgufTensorToWrite>* out) {
  out_ = out;
  LOCKSTEP_RETURN_IF_ERROR(Matrix("model.embed_tokens.weight", "token_embd.weight"));
  LOCKSTEP_RETURN_IF_ERROR(Norm("model.norm.weight", "output_norm.weight"));
  if (!c_.tie_word_embeddings) LOCKSTEP_RETURN_IF_ERROR(Matrix("lm_head.weight", "output.weight"));
  for (int il = 0; il < c_.n_layers; ++il)
    LOCKSTEP_RETURN_IF_ERROR(Layer("model.layers." + std::to_string(il) + ".",
                                   "blk." + std::to_string(il) + ".", c_.is_full_attention(il),
                                   c_.is_moe(il)));
  if (c_.n_mtp_layers > 0 && st_.Find("mtp.fc.weight") != nullptr) {
    const std::string g = "blk." + std::to_string(c_.n_layers) + ".";
    LOCKSTEP_RETURN_IF_ERROR(Matrix("mtp.fc.weight", g + "nextn.eh_proj.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Norm("mtp.pre_fc_norm_embedding.weight", g + "nextn.enorm.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Norm("mtp.pre_fc_norm_hidden.weight", g + "nextn.hnorm.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Norm("mtp.norm.weight", g + "nextn.shared_head_norm.weight"));
    LOCKSTEP_RETURN_IF_ERROR(Layer("mtp.layers.0.", g, true, c_.n_experts > 0));
  }
  return Status::Ok();
}

}  // namespace

Status ConvertToGguf(const std::string& dir, const std::string& out_path,
                     std::optional<WeightType> quant) {
  LOCKSTEP_ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::FromFile(dir + "/config.json"));
  LOCKSTEP_ASSIGN_OR_RETURN(TensorStorePtr store, TensorStore::OpenDir(dir));
  std::vector<GgufTensorToWrite> ts;
  Converter conv(*store, c, quant);
  LOCKSTEP_RETURN_IF_ERROR(conv.Run(&ts));
  if (quant) {
    // A matrix whose rows are not a whole number of blocks stays in its float type (as
    // llama.cpp's quantiser falls back per tensor); a file where that is every matrix would be
    // an unquantised file under a quantised name, so it is refused.
    const GgmlType want = GgmlOfWeightType(*quant);
    if (std::none_of(ts.begin(), ts.end(), [&](const auto& t) { return t.type == want; }))
      return Status::InvalidArgument("--quant " + std::string(weight_type_name(*quant)) +
                                     ": no matrix of this model has rows of a multiple of " +
                                     std::to_string(weight_block_elems(*quant)) +
                                     " elements (the block size), so nothing would be quantised; "
                                     "use a wider preset or another --quant");
  }
  const bool mtp = c.n_mtp_layers > 0 && store->Find("mtp.fc.weight") != nullptr;
  std::map<std::string, GgufValue> kv;
  const std::string a = "qwen3next.";
  kv["general.architecture"] = Str("qwen3next");
  kv["general.name"] = Str("lockstep synthetic");
  kv[a + "block_count"] = U32(static_cast<std::uint64_t>(c.n_layers + (mtp ? 1 : 0)));
  if (mtp) kv[a + "nextn_predict_layers"] = U32(1);
  kv[a + "context_length"] = U32(262144);
  kv[a + "embedding_length"] = U32(static_cast<std::uint64_t>(c.n_embd));
  kv[a + "feed_forward_length"] = U32(static_cast<std::uint64_t>(c.dense_ffn));
  kv[a + "attention.head_count"] = U32(static_cast<std::uint64_t>(c.n_heads));
  kv[a + "attention.head_count_kv"] = U32(static_cast<std::uint64_t>(c.n_heads_kv));
  kv[a + "attention.key_length"] = U32(static_cast<std::uint64_t>(c.head_dim));
  kv[a + "attention.value_length"] = U32(static_cast<std::uint64_t>(c.head_dim));
  kv[a + "rope.dimension_count"] = U32(static_cast<std::uint64_t>(c.rotary_dim));
  kv[a + "rope.freq_base"] = F32(c.rope_theta);
  kv[a + "attention.layer_norm_rms_epsilon"] = F32(c.rms_norm_eps);
  kv[a + "ssm.conv_kernel"] = U32(static_cast<std::uint64_t>(c.conv_kernel));
  kv[a + "ssm.state_size"] = U32(static_cast<std::uint64_t>(c.k_head_dim));
  kv[a + "ssm.group_count"] = U32(static_cast<std::uint64_t>(c.n_k_heads));
  kv[a + "ssm.time_step_rank"] = U32(static_cast<std::uint64_t>(c.n_v_heads));
  kv[a + "ssm.inner_size"] = U32(static_cast<std::uint64_t>(c.value_dim()));
  kv[a + "full_attention_interval"] = U32(4);
  kv[a + "expert_count"] = U32(static_cast<std::uint64_t>(c.n_experts));
  kv[a + "expert_used_count"] = U32(static_cast<std::uint64_t>(c.n_experts_used));
  kv[a + "expert_feed_forward_length"] = U32(static_cast<std::uint64_t>(c.moe_ffn));
  kv[a + "expert_shared_feed_forward_length"] = U32(static_cast<std::uint64_t>(c.shared_ffn));
  kv[a + "expert_weights_norm"] = {c.norm_topk_prob, 7};
  kv[a + "vocab_size"] = U32(static_cast<std::uint64_t>(c.n_vocab));
  if (!c.eos_token_ids.empty())
    kv["tokenizer.ggml.eos_token_id"] = U32(static_cast<std::uint64_t>(c.eos_token_ids[0]));
  if (c.bos_token_id >= 0)
    kv["tokenizer.ggml.bos_token_id"] = U32(static_cast<std::uint64_t>(c.bos_token_id));
  if (const std::string tj = dir + "/tokenizer.json"; std::filesystem::exists(tj)) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(tj, std::size_t{256} << 20));
    LOCKSTEP_RETURN_IF_ERROR(GgufVocabulary(text, tj, c.n_vocab, &kv));
  } else {
    // No tokenizer: say so. llama.cpp refuses a file without the key ("key not found in model:
    // tokenizer.ggml.model"); "none" loads there with no vocabulary, and here as no tokenizer.
    kv["tokenizer.ggml.model"] = Str("none");
  }
  return WriteGguf(out_path, kv, ts);
}

}  // namespace lockstep
