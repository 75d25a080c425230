#include "lockstep/engine/weights.h"

#include <fmt/format.h>

#include "lockstep/engine/safetensors.h"

namespace lockstep {

namespace {

std::string ShapeStr(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

constexpr const char* kHint =
    "(hint: config.json and the safetensors files disagree; regenerate with 'lockstep model init')";

}  // namespace

// Two passes over the same layout description: the first only sizes the arena, the second
// converts tensors into it. Views handed out during the second pass stay valid because the arena
// never reallocates after sizing.
class WeightLoader {
 public:
  WeightLoader(const TensorStore& store, ModelWeights& w) : store_(store), w_(w) {}

  Status Run(bool load_mtp) {
    sizing_ = true;
    LOCKSTEP_RETURN_IF_ERROR(Walk(load_mtp));
    w_.arena_.assign(total_, 0.0f);
    sizing_ = false;
    offset_ = 0;
    return Walk(load_mtp);
  }

 private:
  // Checks `name` against `shape` and (second pass) converts it; returns the f32 view.
  Status Take(const std::string& name, std::vector<std::int64_t> shape, const float** out) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    if (sizing_) {
      const TensorInfo* t = store_.Find(name);
      if (t == nullptr)
        return Status::NotFound("tensor '" + name + "'",
                                std::string("missing from the checkpoint ") + kHint);
      if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16)
        return Status::Corruption(
            "tensor '" + name + "'",
            fmt::format("expected f32, bf16 or f16, got {} ({})", dtype_name(t->dtype), t->file));
      // [1, H] and [H] are interchangeable for vectors stored either way.
      std::vector<std::int64_t> got = t->shape;
      if (got != shape &&
          !(got.size() == 2 && got[0] == 1 && shape.size() == 1 && got[1] == shape[0]) &&
          !(shape.size() == 2 && shape[1] == 1 && got.size() == 1 && got[0] == shape[0]) &&
          !(shape.size() == 2 && got.size() == 3 && got[1] == 1 && got[0] == shape[0] &&
            got[2] == shape[1]))
        return Status::Corruption(
            "tensor '" + name + "'",
            fmt::format("expected shape {}, got {} {}", ShapeStr(shape), ShapeStr(got), kHint));
      total_ += n;
      *out = nullptr;
      return Status::Ok();
    }
    const TensorInfo* t = store_.Find(name);
    float* dst = w_.arena_.data() + offset_;
    if (!convert_to_f32(t->dtype, t->data, n, dst))
      return Status::Corruption("tensor '" + name + "'", "unsupported dtype");
    offset_ += n;
    *out = dst;
    return Status::Ok();
  }

  Status TakeMat(const std::string& name, int rows, int cols, Mat* m) {
    m->rows = rows;
    m->cols = cols;
    return Take(name, {rows, cols}, &m->data);
  }
  Status TakeVec(const std::string& name, int n, const float** v) { return Take(name, {n}, v); }

  Status TakeFfn(const std::string& prefix, int inter, FfnWeights* f) {
    const int h = w_.config.n_embd;
    LOCKSTEP_RETURN_IF_ERROR(TakeMat(prefix + "gate_proj.weight", inter, h, &f->gate));
    LOCKSTEP_RETURN_IF_ERROR(TakeMat(prefix + "up_proj.weight", inter, h, &f->up));
    return TakeMat(prefix + "down_proj.weight", h, inter, &f->down);
  }

  Status TakeAttention(const std::string& p, AttentionWeights* a) {
    const ModelConfig& c = w_.config;
    LOCKSTEP_RETURN_IF_ERROR(
        TakeMat(p + "q_proj.weight", 2 * c.n_heads * c.head_dim, c.n_embd, &a->q_proj));
    LOCKSTEP_RETURN_IF_ERROR(
        TakeMat(p + "k_proj.weight", c.n_heads_kv * c.head_dim, c.n_embd, &a->k_proj));
    LOCKSTEP_RETURN_IF_ERROR(
        TakeMat(p + "v_proj.weight", c.n_heads_kv * c.head_dim, c.n_embd, &a->v_proj));
    LOCKSTEP_RETURN_IF_ERROR(
        TakeMat(p + "o_proj.weight", c.n_embd, c.n_heads * c.head_dim, &a->o_proj));
    LOCKSTEP_RETURN_IF_ERROR(TakeVec(p + "q_norm.weight", c.head_dim, &a->q_norm));
    return TakeVec(p + "k_norm.weight", c.head_dim, &a->k_norm);
  }

  Status TakeGdn(const std::string& p, GdnWeights* g) {
    const ModelConfig& c = w_.config;
    LOCKSTEP_RETURN_IF_ERROR(
        TakeMat(p + "in_proj_qkvz.weight", c.qkvz_dim(), c.n_embd, &g->in_proj_qkvz));
    LOCKSTEP_RETURN_IF_ERROR(
        TakeMat(p + "in_proj_ba.weight", 2 * c.n_v_heads, c.n_embd, &g->in_proj_ba));
    LOCKSTEP_RETURN_IF_ERROR(
        Take(p + "conv1d.weight", {c.conv_dim(), 1, c.conv_kernel}, &g->conv1d));
    LOCKSTEP_RETURN_IF_ERROR(TakeVec(p + "dt_bias", c.n_v_heads, &g->dt_bias));
    LOCKSTEP_RETURN_IF_ERROR(TakeVec(p + "A_log", c.n_v_heads, &g->a_log));
    LOCKSTEP_RETURN_IF_ERROR(TakeVec(p + "norm.weight", c.v_head_dim, &g->norm));
    return TakeMat(p + "out_proj.weight", c.n_embd, c.value_dim(), &g->out_proj);
  }

  Status TakeMoe(const std::string& p, MoeWeights* m) {
    const ModelConfig& c = w_.config;
    LOCKSTEP_RETURN_IF_ERROR(TakeMat(p + "gate.weight", c.n_experts, c.n_embd, &m->router));
    m->experts.resize(static_cast<std::size_t>(c.n_experts));
    for (int e = 0; e < c.n_experts; ++e)
      LOCKSTEP_RETURN_IF_ERROR(TakeFfn(p + "experts." + std::to_string(e) + ".", c.moe_ffn,
                                       &m->experts[static_cast<std::size_t>(e)]));
    if (c.shared_ffn > 0) {
      LOCKSTEP_RETURN_IF_ERROR(TakeFfn(p + "shared_expert.", c.shared_ffn, &m->shared));
      LOCKSTEP_RETURN_IF_ERROR(TakeVec(p + "shared_expert_gate.weight", c.n_embd, &m->shared_gate));
    }
    return Status::Ok();
  }

  Status TakeLayer(const std::string& p, LayerType type, bool moe, LayerWeights* l) {
    const ModelConfig& c = w_.config;
    l->type = type;
    l->moe = moe;
    LOCKSTEP_RETURN_IF_ERROR(TakeVec(p + "input_layernorm.weight", c.n_embd, &l->input_norm));
    LOCKSTEP_RETURN_IF_ERROR(
        TakeVec(p + "post_attention_layernorm.weight", c.n_embd, &l->post_norm));
    if (type == LayerType::kFullAttention) {
      LOCKSTEP_RETURN_IF_ERROR(TakeAttention(p + "self_attn.", &l->attn));
    } else {
      LOCKSTEP_RETURN_IF_ERROR(TakeGdn(p + "linear_attn.", &l->gdn));
    }
    if (moe) return TakeMoe(p + "mlp.", &l->ffn_moe);
    return TakeFfn(p + "mlp.", c.dense_ffn, &l->ffn_dense);
  }

  Status Walk(bool load_mtp) {
    const ModelConfig& c = w_.config;
    LOCKSTEP_RETURN_IF_ERROR(TakeMat("model.embed_tokens.weight", c.n_vocab, c.n_embd, &w_.embed));
    LOCKSTEP_RETURN_IF_ERROR(TakeVec("model.norm.weight", c.n_embd, &w_.final_norm));
    if (c.tie_word_embeddings) {
      w_.lm_head = w_.embed;
    } else {
      LOCKSTEP_RETURN_IF_ERROR(TakeMat("lm_head.weight", c.n_vocab, c.n_embd, &w_.lm_head));
    }
    w_.layers.resize(static_cast<std::size_t>(c.n_layers));
    for (int il = 0; il < c.n_layers; ++il) {
      LOCKSTEP_RETURN_IF_ERROR(TakeLayer("model.layers." + std::to_string(il) + ".",
                                         c.layer_types[static_cast<std::size_t>(il)], c.is_moe(il),
                                         &w_.layers[static_cast<std::size_t>(il)]));
    }
    // MTP: loaded when the config declares it and the checkpoint ships it (Qwen3-Coder-Next
    // ships none: then the engine runs without MTP drafts).
    w_.mtp.present = load_mtp && c.n_mtp_layers > 0 && store_.Find("mtp.fc.weight") != nullptr;
    if (w_.mtp.present) {
      MtpWeights& m = w_.mtp;
      LOCKSTEP_RETURN_IF_ERROR(TakeMat("mtp.fc.weight", c.n_embd, 2 * c.n_embd, &m.fc));
      LOCKSTEP_RETURN_IF_ERROR(
          TakeVec("mtp.pre_fc_norm_embedding.weight", c.n_embd, &m.pre_fc_norm_embedding));
      LOCKSTEP_RETURN_IF_ERROR(
          TakeVec("mtp.pre_fc_norm_hidden.weight", c.n_embd, &m.pre_fc_norm_hidden));
      LOCKSTEP_RETURN_IF_ERROR(TakeVec("mtp.norm.weight", c.n_embd, &m.norm));
      LOCKSTEP_RETURN_IF_ERROR(
          TakeLayer("mtp.layers.0.", LayerType::kFullAttention, c.n_experts > 0, &m.layer));
    }
    return Status::Ok();
  }

  const TensorStore& store_;
  ModelWeights& w_;
  bool sizing_ = true;
  std::size_t total_ = 0;
  std::size_t offset_ = 0;
};

std::size_t ModelWeights::ActiveBytesPerToken() const {
  const ModelConfig& c = config;
  const std::size_t h = static_cast<std::size_t>(c.n_embd) * sizeof(float);
  std::size_t b = h /* embedding row */ + h /* final norm */ + lm_head.bytes();
  for (const auto& l : layers) {
    b += 2 * h;  // input / post-attention norms
    if (l.type == LayerType::kFullAttention) {
      b += l.attn.q_proj.bytes() + l.attn.k_proj.bytes() + l.attn.v_proj.bytes() +
           l.attn.o_proj.bytes();
      b += 2 * static_cast<std::size_t>(c.head_dim) * sizeof(float);
    } else {
      b += l.gdn.in_proj_qkvz.bytes() + l.gdn.in_proj_ba.bytes() + l.gdn.out_proj.bytes();
      b += static_cast<std::size_t>(c.conv_dim()) * static_cast<std::size_t>(c.conv_kernel) *
           sizeof(float);
    }
    if (l.moe) {
      b += l.ffn_moe.router.bytes() + l.ffn_moe.shared.bytes() + (l.ffn_moe.shared_gate ? h : 0);
      if (!l.ffn_moe.experts.empty())
        b += static_cast<std::size_t>(c.n_experts_used) * l.ffn_moe.experts[0].bytes();
    } else {
      b += l.ffn_dense.bytes();
    }
  }
  return b;
}

Result<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& dir, bool load_mtp) {
  auto w = std::make_unique<ModelWeights>();
  LOCKSTEP_ASSIGN_OR_RETURN(w->config, ModelConfig::FromFile(dir + "/config.json"));
  LOCKSTEP_ASSIGN_OR_RETURN(TensorStorePtr store, TensorStore::OpenDir(dir));
  w->files = store->files();
  WeightLoader loader(*store, *w);
  LOCKSTEP_RETURN_IF_ERROR(loader.Run(load_mtp).WithContext("loading '" + dir + "'"));
  return w;
}

}  // namespace lockstep
