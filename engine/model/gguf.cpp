// The qwen3next GGUF layout read as the engine's Hugging Face names (gguf_convert.cpp writes the
// same layout; the two are tested as inverses in tests/engine/gguf_test.cpp).
//
// The layout is the one llama.cpp's convert_hf_to_gguf.py writes for Qwen3NextForCausalLM:
//   token_embd / output_norm / output            model.embed_tokens / model.norm / lm_head
//   blk.N.attn_norm, blk.N.post_attention_norm   input_layernorm, post_attention_layernorm
//   blk.N.attn_q|k|v|output, attn_q_norm|k_norm  self_attn.q|k|v|o_proj, q_norm, k_norm
//   blk.N.attn_qkv + blk.N.attn_gate             linear_attn.in_proj_qkvz, regrouped: HF keeps
//                                                [q, k, v, z] per key head; GGUF all q, all k,
//                                                all v (attn_qkv), then all z (attn_gate)
//   blk.N.ssm_ba, ssm_conv1d, ssm_norm, ssm_out  in_proj_ba, conv1d (squeezed), norm, out_proj
//   blk.N.ssm_a = -exp(A_log), blk.N.ssm_dt.bias A_log, dt_bias
//   blk.N.ffn_gate_inp, ffn_{gate,up,down}_exps  mlp.gate, the routed experts stacked [E, ., .]
//   blk.N.ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp   the shared expert and its gate
//   blk.N.ffn_{gate,up,down}                     a dense layer's MLP
//   blk.{n_layer}.nextn.eh_proj|enorm|hnorm|shared_head_norm, and that block's attention and MoE
//                                                mtp.fc, mtp.pre_fc_norm_*, mtp.norm, mtp.layers.0
// Every zero-centred RMSNorm weight is stored as 1 + w (all "*norm" weights but ssm_norm). GGUF
// dimensions are innermost first: a [rows, cols] matrix has ne = [cols, rows].
//
// Derived values read back: w = stored - 1 is exact (Sterbenz) for the |w| <= 0.5 of every norm,
// so the engine's (1 + w) is bitwise the stored value. A_log is recovered as a float whose
// -exp() equals ssm_a exactly when one exists next to log(-ssm_a) (the engine only uses
// -exp(A_log)); otherwise log(-ssm_a), off by an ulp.
#include "lockstep/engine/gguf.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/quant.h"
#include "lockstep/engine/safetensors.h"
#include "model/tensor_source.h"

namespace lockstep {

namespace {

std::string Layer(int il) { return "model.layers." + std::to_string(il) + "."; }
std::string Blk(int il) { return "blk." + std::to_string(il) + "."; }

// Row bytes of a ggml type (ne0 elements), 0 if the type is unknown.
std::uint64_t RowBytes(std::uint32_t type, std::uint64_t ne0) {
  const auto wt = WeightTypeOfGgml(type);
  if (!wt) return 0;
  return ne0 / static_cast<std::uint64_t>(weight_block_elems(*wt)) * weight_block_bytes(*wt);
}

// ---- reading: the GGUF files as a TensorSource under Hugging Face names ----

class GgufSource : public TensorSource {
 public:
  Status Open(const std::string& path, ModelConfig* config);
  const SourceTensor* Find(std::string_view name) const override {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> files() const override { return paths_; }
  std::string format() const override { return "gguf"; }

 private:
  const GgufTensor* G(const std::string& name) const {
    for (const GgufFilePtr& f : files_)
      if (const GgufTensor* t = f->Find(name)) return t;
    return nullptr;
  }
  const std::string& FileOf(const GgufTensor* t) const {
    for (const GgufFilePtr& f : files_)
      if (f->Find(t->name) == t) return f->path();
    return paths_.front();
  }
  SourceTensor Describe(const GgufTensor& t) const {
    SourceTensor s;
    s.name = t.name;
    s.type = WeightTypeOfGgml(t.type);
    s.type_name = GgmlTypeName(t.type);
    for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it)
      s.shape.push_back(static_cast<std::int64_t>(*it));
    s.data = t.data;
    s.nbytes = static_cast<std::size_t>(t.nbytes);
    s.file = FileOf(&t) + ", GGUF tensor '" + t.name + "'";
    return s;
  }
  float* OwnF32(std::size_t n) {
    owned_.emplace_back(new std::byte[std::max<std::size_t>(n, 1) * sizeof(float)]());
    return reinterpret_cast<float*>(owned_.back().get());
  }
  // An f32 copy of a float tensor (F32/F16/BF16) with f applied; unusable types stay so.
  template <class F>
  void Derived(const std::string& hf, const std::string& gg, F f) {
    const GgufTensor* t = G(gg);
    if (t == nullptr) return;
    SourceTensor s = Describe(*t);
    if (s.type && weight_block_elems(*s.type) == 1) {
      const std::size_t n = s.nbytes / weight_block_bytes(*s.type);
      float* dst = OwnF32(n);
      Mat m;
      m.type = *s.type;
      m.rows = 1;
      m.cols = static_cast<int>(n);
      m.data = s.data;
      m.RowToF32(0, dst);
      for (std::size_t i = 0; i < n; ++i) dst[i] = f(dst[i]);
      s.type = WeightType::kF32;
      s.type_name = "F32";
      s.data = reinterpret_cast<const std::byte*>(dst);
      s.nbytes = n * sizeof(float);
    } else if (s.type) {
      s.type.reset();  // a quantised vector: not a type the engine reads vectors in
    }
    tensors_[hf] = std::move(s);
  }
  void Direct(const std::string& hf, const std::string& gg) {
    if (const GgufTensor* t = G(gg)) tensors_[hf] = Describe(*t);
  }
  void Norm(const std::string& hf, const std::string& gg) {
    Derived(hf, gg, [](float x) { return x - 1.0f; });
  }
  Status AddQkvz(const std::string& hf, int il, const ModelConfig& c);
  void AddExperts(const std::string& p, const std::string& g, int n_experts);
  Status AddLayer(const std::string& p, const std::string& g, int il, bool attention,
                  const ModelConfig& c);
  Status ReadConfig(const GgufFile& f, ModelConfig* c);

  std::vector<GgufFilePtr> files_;
  std::vector<std::string> paths_;
  std::map<std::string, SourceTensor, std::less<>> tensors_;
  std::vector<std::unique_ptr<std::byte[]>> owned_;
};

// A float x whose -std::exp(x) is exactly `ssm_a`, searched next to log(-ssm_a).
float ALogOf(float ssm_a) {
  const float guess = std::log(-ssm_a);
  float lo = guess, hi = guess;
  for (int i = 0; i < 4; ++i) {
    if (-std::exp(lo) == ssm_a) return lo;
    if (-std::exp(hi) == ssm_a) return hi;
    lo = std::nextafter(lo, -INFINITY);
    hi = std::nextafter(hi, INFINITY);
  }
  return guess;
}

Status GgufSource::AddQkvz(const std::string& hf, int il, const ModelConfig& c) {
  const GgufTensor* qkv = G(Blk(il) + "attn_qkv.weight");
  const GgufTensor* gate = G(Blk(il) + "attn_gate.weight");
  if (qkv == nullptr || gate == nullptr) return Status::Ok();  // reported as missing
  const std::string what = fmt::format("GGUF tensors '{}' + '{}'", qkv->name, gate->name);
  const std::uint64_t H = static_cast<std::uint64_t>(c.n_embd);
  const std::uint64_t kd = static_cast<std::uint64_t>(c.key_dim()),
                      vd = static_cast<std::uint64_t>(c.value_dim());
  if (qkv->ne.size() != 2 || gate->ne.size() != 2 || qkv->ne[0] != H || gate->ne[0] != H ||
      qkv->ne[1] != 2 * kd + vd || gate->ne[1] != vd)
    return Status::Corruption(
        what, fmt::format("expected [{}, {}] and [{}, {}] (ne)", H, 2 * kd + vd, H, vd));
  // llama.cpp's mixes give the two halves different types (Q4_K_M: attn_qkv Q5_K, attn_gate
  // Q4_K; small rows fall back to Q5_0 / Q8_0 per tensor). Same type: the rows are regrouped as
  // stored. Different types: a stacked matrix (weights.h) whose parts are the regrouped row
  // ranges, views into the mapping in their own types (no byte converted or copied).
  SourceTensor s = Describe(*qkv);
  const SourceTensor sg = Describe(*gate);
  if (!s.type || !sg.type) {  // unusable type: the loader names it
    tensors_[hf] = std::move(!s.type ? s : sg);
    return Status::Ok();
  }
  const bool mixed = qkv->type != gate->type;
  const std::uint64_t rows = 2 * kd + 2 * vd;
  const std::uint64_t Dk = static_cast<std::uint64_t>(c.k_head_dim);
  const std::uint64_t Vg = vd / static_cast<std::uint64_t>(c.n_k_heads);  // v rows per key head
  std::byte* dst = nullptr;
  if (!mixed) {
    owned_.emplace_back(new std::byte[rows * RowBytes(qkv->type, H)]);
    dst = owned_.back().get();
  }
  std::uint64_t row = 0;
  auto copy = [&](const GgufTensor* src, std::uint64_t r0, std::uint64_t n) {
    const std::uint64_t srb = RowBytes(src->type, H);
    if (!mixed) {
      std::memcpy(dst, src->data + r0 * srb, n * srb);
      dst += n * srb;
    } else {
      MatPart part;
      part.row0 = static_cast<int>(row);
      part.m.type = *WeightTypeOfGgml(src->type);
      part.m.rows = static_cast<int>(n);
      part.m.cols = static_cast<int>(H);
      part.m.data = src->data + r0 * srb;
      s.parts.push_back(part);
    }
    row += n;
  };
  for (std::uint64_t h = 0; h < static_cast<std::uint64_t>(c.n_k_heads); ++h) {
    copy(qkv, h * Dk, Dk);           // q
    copy(qkv, kd + h * Dk, Dk);      // k
    copy(qkv, 2 * kd + h * Vg, Vg);  // v
    copy(gate, h * Vg, Vg);          // z
  }
  if (mixed) s.type_name += " + " + sg.type_name;
  s.shape = {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(H)};
  s.data = mixed ? static_cast<const std::byte*>(s.parts.front().m.data) : owned_.back().get();
  s.nbytes = static_cast<std::size_t>((qkv->ne[1] * RowBytes(qkv->type, H)) +
                                      gate->ne[1] * RowBytes(gate->type, H));
  tensors_[hf] = std::move(s);
  return Status::Ok();
}

// ffn_{gate,up,down}_exps [E, rows, cols] as E matrices (views into the mapping).
void GgufSource::AddExperts(const std::string& p, const std::string& g, int n_experts) {
  for (const char* part : {"gate", "up", "down"}) {
    const GgufTensor* t = G(g + "ffn_" + part + "_exps.weight");
    if (t == nullptr || t->ne.size() != 3 || t->ne[2] != static_cast<std::uint64_t>(n_experts))
      continue;  // missing, or the wrong shape: the loader reports the expert as missing
    const std::uint64_t per = t->nbytes / t->ne[2];
    for (int e = 0; e < n_experts; ++e) {
      SourceTensor s = Describe(*t);
      s.shape = {static_cast<std::int64_t>(t->ne[1]), static_cast<std::int64_t>(t->ne[0])};
      s.data = t->data + per * static_cast<std::uint64_t>(e);
      s.nbytes = static_cast<std::size_t>(per);
      tensors_[p + "experts." + std::to_string(e) + "." + part + "_proj.weight"] = std::move(s);
    }
  }
}

Status GgufSource::AddLayer(const std::string& p, const std::string& g, int il, bool attention,
                            const ModelConfig& c) {
  Norm(p + "input_layernorm.weight", g + "attn_norm.weight");
  Norm(p + "post_attention_layernorm.weight", g + "post_attention_norm.weight");
  if (attention) {
    const std::string a = p + "self_attn.";
    Direct(a + "q_proj.weight", g + "attn_q.weight");
    Direct(a + "k_proj.weight", g + "attn_k.weight");
    Direct(a + "v_proj.weight", g + "attn_v.weight");
    Direct(a + "o_proj.weight", g + "attn_output.weight");
    Norm(a + "q_norm.weight", g + "attn_q_norm.weight");
    Norm(a + "k_norm.weight", g + "attn_k_norm.weight");
  } else {
    const std::string l = p + "linear_attn.";
    LOCKSTEP_RETURN_IF_ERROR(AddQkvz(l + "in_proj_qkvz.weight", il, c));
    Direct(l + "in_proj_ba.weight", g + "ssm_ba.weight");
    Direct(l + "conv1d.weight", g + "ssm_conv1d.weight");
    if (auto it = tensors_.find(l + "conv1d.weight");
        it != tensors_.end() && it->second.shape.size() == 2)
      it->second.shape = {it->second.shape[0], 1, it->second.shape[1]};
    Derived(l + "dt_bias", g + "ssm_dt.bias", [](float x) { return x; });
    Derived(l + "A_log", g + "ssm_a", ALogOf);
    Direct(l + "norm.weight", g + "ssm_norm.weight");
    Direct(l + "out_proj.weight", g + "ssm_out.weight");
  }
  const std::string m = p + "mlp.";
  if (G(g + "ffn_gate_inp.weight") != nullptr) {
    Direct(m + "gate.weight", g + "ffn_gate_inp.weight");
    AddExperts(m, g, c.n_experts);
    Direct(m + "shared_expert.gate_proj.weight", g + "ffn_gate_shexp.weight");
    Direct(m + "shared_expert.up_proj.weight", g + "ffn_up_shexp.weight");
    Direct(m + "shared_expert.down_proj.weight", g + "ffn_down_shexp.weight");
    Derived(m + "shared_expert_gate.weight", g + "ffn_gate_inp_shexp.weight",
            [](float x) { return x; });
  } else {
    Direct(m + "gate_proj.weight", g + "ffn_gate.weight");
    Direct(m + "up_proj.weight", g + "ffn_up.weight");
    Direct(m + "down_proj.weight", g + "ffn_down.weight");
  }
  return Status::Ok();
}

namespace {

const char* GgufTypeName(std::uint32_t t) {
  static const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                 "bool", "string", "array", "u64", "i64", "f64"};
  return t < 13 ? kNames[t] : "an unknown type";
}

}  // namespace

Status GgufSource::ReadConfig(const GgufFile& f, ModelConfig* c) {
  const std::string what = fmt::format("GGUF '{}'", f.path());
  const auto arch = f.String("general.architecture");
  if (!arch || *arch != "qwen3next")
    return Status::InvalidArgument(
        what, fmt::format("general.architecture is '{}', expected 'qwen3next'", arch.value_or("")));
  // Every hyper-parameter is type-checked against what llama.cpp's converter writes (counts as
  // integers, epsilons and thetas as floats): a value of another type (epsilon as i32 loaded
  // silently with other outputs) is refused naming the key and both types. freq_base and the
  // RMS epsilon are required (they were silently defaulted to 10000 and 1e-6).
  Status missing = Status::Ok();
  auto fail = [&](Status s) {
    if (missing.ok()) missing = std::move(s);
  };
  auto typed = [&](const std::string& key, bool want_float, bool allow_bool) {
    const auto it = f.kv().find(key);
    if (it == f.kv().end()) return false;
    const std::uint32_t t = it->second.type;
    const bool is_int = t <= 5 || t == 10 || t == 11;
    const bool ok = want_float ? (t == 6 || t == 12) : (is_int || (allow_bool && t == 7));
    if (!ok)
      fail(Status::InvalidArgument(
          what, fmt::format("{} is stored as {}, expected {}", key, GgufTypeName(t),
                            want_float ? "a float (f32 or f64)" : "an integer (u32)")));
    return ok;
  };
  auto count = [&](const char* key, std::optional<int> def, bool allow_bool = false) -> int {
    const std::string k = std::string("qwen3next.") + key;
    const bool present = typed(k, false, allow_bool);
    const auto v = present ? f.Int(k) : std::nullopt;
    if (present && v && *v >= 0 && *v <= (1 << 30)) return static_cast<int>(*v);
    if (present || !def)
      fail(Status::Corruption(what, fmt::format("{} is missing or not a count in [0, 2^30]", k)));
    return def.value_or(0);
  };
  auto need = [&](const char* key) { return count(key, std::nullopt); };
  auto opt = [&](const char* key, int def) { return count(key, def); };
  auto real = [&](const char* key) -> double {
    const std::string k = std::string("qwen3next.") + key;
    if (!typed(k, true, false)) {
      if (f.kv().find(k) == f.kv().end())
        fail(Status::InvalidArgument(what, fmt::format("{} is missing (a float is required)", k)));
      return 0;
    }
    return *f.Float(k);
  };
  const int n_mtp = opt("nextn_predict_layers", 0);
  c->n_layers = need("block_count") - n_mtp;
  c->n_mtp_layers = n_mtp;
  c->n_embd = need("embedding_length");
  c->dense_ffn = opt("feed_forward_length", 0);
  c->n_heads = need("attention.head_count");
  c->n_heads_kv = need("attention.head_count_kv");
  c->head_dim = opt("attention.key_length", c->n_heads > 0 ? c->n_embd / c->n_heads : 0);
  c->rotary_dim = need("rope.dimension_count");
  c->partial_rotary_factor =
      c->head_dim > 0 ? static_cast<double>(c->rotary_dim) / c->head_dim : 0.25;
  c->rope_theta = real("rope.freq_base");
  c->rms_norm_eps = static_cast<float>(real("attention.layer_norm_rms_epsilon"));
  c->n_k_heads = need("ssm.group_count");
  c->n_v_heads = need("ssm.time_step_rank");
  c->k_head_dim = need("ssm.state_size");
  c->v_head_dim = c->n_v_heads > 0 ? need("ssm.inner_size") / c->n_v_heads : 0;
  c->conv_kernel = need("ssm.conv_kernel");
  c->n_experts = need("expert_count");
  c->n_experts_used = need("expert_used_count");
  c->moe_ffn = need("expert_feed_forward_length");
  c->shared_ffn = opt("expert_shared_feed_forward_length", 0);
  c->norm_topk_prob = count("expert_weights_norm", 1, /*allow_bool=*/true) != 0;
  LOCKSTEP_RETURN_IF_ERROR(missing);
  const int interval = std::max(1, opt("full_attention_interval", 4));
  if (c->n_layers <= 0)
    return Status::Corruption(what, "qwen3next.block_count leaves no layers besides the MTP ones");
  c->layer_types.assign(static_cast<std::size_t>(c->n_layers), LayerType::kLinearAttention);
  for (int il = 0; il < c->n_layers; ++il)
    if ((il + 1) % interval == 0)
      c->layer_types[static_cast<std::size_t>(il)] = LayerType::kFullAttention;
  const GgufTensor* embd = G("token_embd.weight");
  c->n_vocab =
      opt("vocab_size", embd && embd->ne.size() == 2
                            ? static_cast<int>(std::min<std::uint64_t>(embd->ne[1], 1u << 30))
                            : 0);
  c->tie_word_embeddings = G("output.weight") == nullptr;
  if (auto e = f.Int("tokenizer.ggml.eos_token_id")) c->eos_token_ids = {static_cast<int>(*e)};
  if (auto b = f.Int("tokenizer.ggml.bos_token_id")) c->bos_token_id = static_cast<int>(*b);
  c->mlp_only_layers.clear();
  for (int il = 0; il < c->n_layers; ++il)
    if (G(Blk(il) + "ffn_gate_inp.weight") == nullptr && G(Blk(il) + "ffn_gate.weight") != nullptr)
      c->mlp_only_layers.push_back(il);
  return c->Validate().WithContext(what);
}

// path, or the split set path names (NAME-00001-of-0000N.gguf): every file of the set.
Result<std::vector<std::string>> SplitSet(const std::string& path) {
  static const std::regex kSplit(R"((.*)-(\d{5})-of-(\d{5})\.gguf$)");
  std::smatch m;
  if (!std::regex_match(path, m, kSplit)) return std::vector<std::string>{path};
  const int no = std::stoi(m[2].str()), n = std::stoi(m[3].str());
  if (no != 1 || n < 1)
    return Status::InvalidArgument(
        "--model '" + path + "'",
        fmt::format("a split GGUF set is named by its first file ({}-00001-of-{}.gguf)", m[1].str(),
                    m[3].str()));
  std::vector<std::string> out;
  for (int i = 1; i <= n; ++i)
    out.push_back(fmt::format("{}-{:05d}-of-{}.gguf", m[1].str(), i, m[3].str()));
  return out;
}

Status GgufSource::Open(const std::string& path, ModelConfig* config) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::string> set, SplitSet(path));
  std::map<std::string, std::string, std::less<>> seen;
  for (const std::string& p : set) {
    LOCKSTEP_ASSIGN_OR_RETURN(GgufFilePtr f, GgufFile::Open(p));
    if (set.size() > 1) {
      const auto count = f->Int("split.count");
      if (count && *count != static_cast<std::int64_t>(set.size()))
        return Status::Corruption(
            fmt::format("GGUF '{}'", p),
            fmt::format("split.count is {}, the file name says {}", *count, set.size()));
    }
    for (const GgufTensor& t : f->tensors())
      if (!seen.emplace(t.name, p).second)
        return Status::Corruption(fmt::format("GGUF '{}'", p),
                                  fmt::format("tensor '{}' is also in '{}'", t.name, seen[t.name]));
    paths_.push_back(p);
    files_.push_back(std::move(f));
  }
  ModelConfig& c = *config;
  LOCKSTEP_RETURN_IF_ERROR(ReadConfig(*files_.front(), &c));
  Direct("model.embed_tokens.weight", "token_embd.weight");
  Norm("model.norm.weight", "output_norm.weight");
  Direct("lm_head.weight", "output.weight");
  for (int il = 0; il < c.n_layers; ++il)
    LOCKSTEP_RETURN_IF_ERROR(AddLayer(Layer(il), Blk(il), il, c.is_full_attention(il), c));
  if (c.n_mtp_layers > 0) {
    const std::string g = Blk(c.n_layers);
    Direct("mtp.fc.weight", g + "nextn.eh_proj.weight");
    Norm("mtp.pre_fc_norm_embedding.weight", g + "nextn.enorm.weight");
    Norm("mtp.pre_fc_norm_hidden.weight", g + "nextn.hnorm.weight");
    Norm("mtp.norm.weight", g + "nextn.shared_head_norm.weight");
    LOCKSTEP_RETURN_IF_ERROR(AddLayer("mtp.layers.0.", g, c.n_layers, true, c));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<TensorSource>> OpenGgufSource(const std::string& path, ModelConfig* config) {
  auto src = std::make_unique<GgufSource>();
  LOCKSTEP_RETURN_IF_ERROR(src->Open(path, config));
  return std::unique_ptr<TensorSource>(std::move(src));
}

}  // namespace lockstep
