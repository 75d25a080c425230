#include "lockstep/engine/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/quant.h"
#include "lockstep/engine/safetensors.h"
#include "model/tensor_source.h"
#include "util/check.h"

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

// ---- Mat ----

const float* Mat::row(int r) const {
  LOCKSTEP_CHECK(type == WeightType::kF32)
      << "Mat::row on a " << weight_type_name(type) << " matrix";
  return static_cast<const float*>(data) +
         static_cast<std::size_t>(r) * static_cast<std::size_t>(cols);
}

void Mat::RowToF32(int r, float* out) const {
  if (parts != nullptr) {
    int i = n_parts - 1;
    while (i > 0 && parts[i].row0 > r) --i;
    return parts[i].m.RowToF32(r - parts[i].row0, out);
  }
  const std::byte* p = row_ptr(r);
  const std::size_t n = static_cast<std::size_t>(cols);
  switch (type) {
    case WeightType::kF32:
      std::memcpy(out, p, n * sizeof(float));
      return;
    case WeightType::kBF16:
      convert_to_f32(DType::kBF16, p, n, out);
      return;
    case WeightType::kF16:
      convert_to_f32(DType::kF16, p, n, out);
      return;
    default:
      break;
  }
  const std::size_t be = static_cast<std::size_t>(weight_block_elems(type));
  const std::size_t bb = weight_block_bytes(type);
  for (std::size_t b = 0; b < n / be; ++b) DequantizeBlock(type, p + b * bb, out + b * be);
}

// One pass over the layout: each tensor is checked, then kept as the file stores it (matrices)
// or widened to f32 (vectors). Views stay valid: every buffer is allocated separately and owned
// by ModelWeights, mappings by the TensorSource it keeps.
class WeightLoader {
 public:
  WeightLoader(const TensorSource& src, ModelWeights& w, WeightResidency residency)
      : src_(src), w_(w), residency_(residency) {}

  Status Run(bool load_mtp) { return Walk(load_mtp); }

 private:
  const char* Hint() const {
    return src_.format() == "gguf"
               ? "(hint: the GGUF file is not a complete qwen3next model in llama.cpp's layout)"
               : kHint;
  }

  // Checks `name` against `shape`; returns the tensor.
  Status Check(const std::string& name, const std::vector<std::int64_t>& shape,
               const SourceTensor** out) {
    const SourceTensor* t = src_.Find(name);
    if (t == nullptr)
      return Status::NotFound("tensor '" + name + "'",
                              std::string("missing from the checkpoint ") + Hint());
    if (!t->type)
      return Status::Corruption(
          "tensor '" + name + "'",
          fmt::format("expected {}, got {} ({})",
                      src_.format() == "gguf"
                          ? "a type lockstep reads (F32, F16, BF16, Q4_0, Q4_1, "
                            "Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, IQ3_S, "
                            "IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ1_0, "
                            "TQ2_0)"
                          : "f32, bf16 or f16",
                      t->type_name, t->file));
    // [1, H] and [H] are interchangeable for vectors stored either way.
    const std::vector<std::int64_t>& got = t->shape;
    if (got != shape &&
        !(got.size() == 2 && got[0] == 1 && shape.size() == 1 && got[1] == shape[0]) &&
        !(shape.size() == 2 && shape[1] == 1 && got.size() == 1 && got[0] == shape[0]) &&
        !(shape.size() == 2 && got.size() == 3 && got[1] == 1 && got[0] == shape[0] &&
          got[2] == shape[1]))
      return Status::Corruption(
          "tensor '" + name + "'",
          fmt::format("expected shape {}, got {} {}", ShapeStr(shape), ShapeStr(got), Hint()));
    *out = t;
    return Status::Ok();
  }

  // A vector (or the small conv1d matrix), widened to f32 into the arena.
  Status Take(const std::string& name, std::vector<std::int64_t> shape, const float** out) {
    const SourceTensor* t = nullptr;
    LOCKSTEP_RETURN_IF_ERROR(Check(name, shape, &t));
    const Mat m = ViewOf(*t, static_cast<int>(shape[0]),
                         static_cast<int>(t->nbytes / RowBytesOf(*t, static_cast<int>(shape[0]))));
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    float* dst = w_.AllocF32(n);
    const std::size_t per_row = n / static_cast<std::size_t>(m.rows);
    for (int r = 0; r < m.rows; ++r) m.RowToF32(r, dst + static_cast<std::size_t>(r) * per_row);
    *out = dst;
    return Status::Ok();
  }

  static std::size_t RowBytesOf(const SourceTensor& t, int rows) {
    return rows > 0 ? t.nbytes / static_cast<std::size_t>(rows) : 1;
  }

  // A view of t's bytes as `rows` rows of `cols` elements (no copy).
  Mat ViewOf(const SourceTensor& t, int rows, int cols) {
    Mat m;
    m.type = *t.type;
    m.rows = rows;
    if (!t.parts.empty()) {  // stacked: the parts are views into the source's mapping
      std::vector<MatPart> parts = t.parts;
      for (MatPart& p : parts) {  // copied as stored where misaligned for the element type
        const std::size_t align = p.m.type == WeightType::kF32 ? 4 : 2;
        if (reinterpret_cast<std::uintptr_t>(p.m.data) % align == 0) continue;
        std::byte* dst = w_.AllocBytes(p.m.bytes());
        std::memcpy(dst, p.m.data, p.m.bytes());
        p.m.data = dst;
      }
      m.cols = cols;
      m.data = parts.front().m.data;
      m.n_parts = static_cast<int>(parts.size());
      m.parts = w_.KeepParts(std::move(parts));
      return m;
    }
    const std::size_t rb = RowBytesOf(t, rows);
    m.cols = static_cast<int>(rb / weight_block_bytes(m.type) *
                              static_cast<std::size_t>(weight_block_elems(m.type)));
    m.data = t.data;
    return m;
  }

  // A matrix: mapped when aligned to its element type (kFileType), else copied as stored; or an
  // f32 copy (kWidenF32).
  Status TakeMat(const std::string& name, int rows, int cols, Mat* m) {
    const SourceTensor* t = nullptr;
    LOCKSTEP_RETURN_IF_ERROR(Check(name, {rows, cols}, &t));
    Mat v = ViewOf(*t, rows, cols);
    if (residency_ == WeightResidency::kWidenF32) {
      float* dst = w_.AllocF32(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
      for (int r = 0; r < rows; ++r)
        v.RowToF32(r, dst + static_cast<std::size_t>(r) * static_cast<std::size_t>(cols));
      v.data = dst;
      v.type = WeightType::kF32;
      v.parts = nullptr;
      v.n_parts = 0;
    } else if (v.parts == nullptr) {
      const std::size_t align = v.type == WeightType::kF32 ? 4 : 2;
      if (reinterpret_cast<std::uintptr_t>(t->data) % align != 0) {
        std::byte* dst = w_.AllocBytes(t->nbytes);
        std::memcpy(dst, t->data, t->nbytes);
        v.data = dst;
      }
    }
    *m = v;
    return Status::Ok();
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
    w_.mtp.present = load_mtp && c.n_mtp_layers > 0 && src_.Find("mtp.fc.weight") != nullptr;
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

  const TensorSource& src_;
  ModelWeights& w_;
  WeightResidency residency_;
};

namespace {

constexpr std::size_t kF = sizeof(float);

std::size_t FfnBytes(const FfnWeights& f) { return f.bytes(); }

// Every weight of one layer (all experts), as held in memory.
std::size_t LayerBytes(const LayerWeights& l, const ModelConfig& c) {
  const std::size_t h = static_cast<std::size_t>(c.n_embd) * kF;
  std::size_t b = 2 * h;  // input / post-attention norms
  if (l.type == LayerType::kFullAttention) {
    b += l.attn.q_proj.bytes() + l.attn.k_proj.bytes() + l.attn.v_proj.bytes() +
         l.attn.o_proj.bytes() + 2 * static_cast<std::size_t>(c.head_dim) * kF;
  } else {
    b += l.gdn.in_proj_qkvz.bytes() + l.gdn.in_proj_ba.bytes() + l.gdn.out_proj.bytes();
    b += (static_cast<std::size_t>(c.conv_dim()) * static_cast<std::size_t>(c.conv_kernel) +
          2 * static_cast<std::size_t>(c.n_v_heads) + static_cast<std::size_t>(c.v_head_dim)) *
         kF;
  }
  if (l.moe) {
    b += l.ffn_moe.router.bytes() + FfnBytes(l.ffn_moe.shared) + (l.ffn_moe.shared_gate ? h : 0);
    for (const FfnWeights& e : l.ffn_moe.experts) b += FfnBytes(e);
  } else {
    b += FfnBytes(l.ffn_dense);
  }
  return b;
}

}  // namespace

std::size_t ModelWeights::ResidentBytes(int layer_begin, int layer_end) const {
  const ModelConfig& c = config;
  const std::size_t h = static_cast<std::size_t>(c.n_embd) * kF;
  std::size_t b = 0;
  for (int il = std::max(0, layer_begin); il < std::min(layer_end, c.n_layers); ++il)
    b += LayerBytes(layers[static_cast<std::size_t>(il)], c);
  const bool first = layer_begin == 0, last = layer_end == c.n_layers;
  if (first) b += embed.bytes();
  if (last) {
    b += h;  // final norm
    if (lm_head.data != embed.data || !first) b += lm_head.bytes();
    if (mtp.present) b += mtp.fc.bytes() + 3 * h + LayerBytes(mtp.layer, c);
  }
  return b;
}

std::size_t ModelWeights::ActiveBytesPerToken() const {
  const ModelConfig& c = config;
  const std::size_t h = static_cast<std::size_t>(c.n_embd) * kF;
  std::size_t b = embed.row_bytes() /* embedding row */ + h /* final norm */ + lm_head.bytes();
  for (const auto& l : layers) {
    b += 2 * h;  // input / post-attention norms
    if (l.type == LayerType::kFullAttention) {
      b += l.attn.q_proj.bytes() + l.attn.k_proj.bytes() + l.attn.v_proj.bytes() +
           l.attn.o_proj.bytes();
      b += 2 * static_cast<std::size_t>(c.head_dim) * kF;
    } else {
      b += l.gdn.in_proj_qkvz.bytes() + l.gdn.in_proj_ba.bytes() + l.gdn.out_proj.bytes();
      b += static_cast<std::size_t>(c.conv_dim()) * static_cast<std::size_t>(c.conv_kernel) * kF;
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

ModelWeights::ModelWeights() = default;
ModelWeights::~ModelWeights() = default;

std::size_t ModelWeights::arena_bytes() const { return owned_bytes_total_; }

float* ModelWeights::AllocF32(std::size_t n) {
  owned_f32_.emplace_back(new float[std::max<std::size_t>(n, 1)]());
  owned_bytes_total_ += n * sizeof(float);
  return owned_f32_.back().get();
}

std::byte* ModelWeights::AllocBytes(std::size_t n) {
  // new[] of std::byte is aligned to __STDCPP_DEFAULT_NEW_ALIGNMENT__ (16): enough for f32.
  owned_bytes_.emplace_back(new std::byte[std::max<std::size_t>(n, 1)]());
  owned_bytes_total_ += n;
  return owned_bytes_.back().get();
}

const MatPart* ModelWeights::KeepParts(std::vector<MatPart> parts) {
  owned_parts_.push_back(std::make_unique<std::vector<MatPart>>(std::move(parts)));
  return owned_parts_.back()->data();
}

void ModelWeights::KeepSource(std::unique_ptr<TensorSource> src) {
  sources_.push_back(std::move(src));
}

Status LoadWeightsFrom(const TensorSource& src, bool load_mtp, WeightResidency residency,
                       ModelWeights& w) {
  w.files = src.files();
  w.format = src.format();
  WeightLoader loader(src, w, residency);
  return loader.Run(load_mtp);
}

namespace {

// A safetensors folder as a TensorSource: names one to one, dtypes f32/bf16/f16 usable.
class SafetensorsSource : public TensorSource {
 public:
  explicit SafetensorsSource(TensorStorePtr store) : store_(std::move(store)) {
    for (const std::string& name : store_->Names()) {
      const TensorInfo* t = store_->Find(name);
      SourceTensor s;
      s.name = t->name;
      s.type_name = std::string(dtype_name(t->dtype));
      if (t->dtype == DType::kF32) s.type = WeightType::kF32;
      if (t->dtype == DType::kBF16) s.type = WeightType::kBF16;
      if (t->dtype == DType::kF16) s.type = WeightType::kF16;
      s.shape = t->shape;
      // Rows = the outermost dimension (1 for a scalar); an empty tensor has no bytes.
      s.data = t->data;
      s.nbytes = t->nbytes;
      s.file = t->file;
      tensors_.emplace(name, std::move(s));
    }
  }
  const SourceTensor* Find(std::string_view name) const override {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> files() const override { return store_->files(); }
  std::string format() const override { return "safetensors"; }

 private:
  TensorStorePtr store_;
  std::map<std::string, SourceTensor, std::less<>> tensors_;
};

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& path, bool load_mtp,
                                                         WeightResidency residency) {
  auto w = std::make_unique<ModelWeights>();
  if (EndsWith(path, ".gguf")) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> src, OpenGgufSource(path, &w->config));
    LOCKSTEP_RETURN_IF_ERROR(
        LoadWeightsFrom(*src, load_mtp, residency, *w).WithContext("loading '" + path + "'"));
    w->KeepSource(std::move(src));
    return w;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(w->config, ModelConfig::FromFile(path + "/config.json"));
  LOCKSTEP_ASSIGN_OR_RETURN(TensorStorePtr store, TensorStore::OpenDir(path));
  auto src = std::make_unique<SafetensorsSource>(std::move(store));
  LOCKSTEP_RETURN_IF_ERROR(
      LoadWeightsFrom(*src, load_mtp, residency, *w).WithContext("loading '" + path + "'"));
  w->KeepSource(std::move(src));
  return w;
}

}  // namespace lockstep
