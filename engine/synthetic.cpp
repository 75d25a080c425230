#include "lockstep/engine/synthetic.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/safetensors.h"

namespace lockstep {

namespace {

// ---- initialisation constants (see README "The synthetic model") ----
// Output projections of every block (o_proj, out_proj, down_proj) are damped by this factor
// relative to fan-in scaling: each block still moves the residual stream visibly, but the
// token embedding stays the dominant direction, which is what lets the MTP head (whose fc is
// near-identity on the embedding half) agree with the main model's next greedy token.
constexpr float kOutGain = 0.35f;
// Router logits get this gain over fan-in scaling so routing is decisive (top-k probabilities
// well separated) yet varied across tokens.
constexpr float kRouterGain = 2.0f;
// Zero-centred norm weights are drawn in [-kNormJitter, kNormJitter] (never exactly zero, so
// a `w` vs `1 + w` mix-up shows up as wrong numbers, not as a silent match).
constexpr float kNormJitter = 0.1f;
// MTP fc: identity on the embedding half times kMtpEmbedGain, plus fan-in noise times
// kMtpNoise over both halves.
constexpr float kMtpEmbedGain = 1.0f;
constexpr float kMtpNoise = 0.15f;

std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t HashName(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Counter-based uniform in [-1, 1): value i of the stream (seed, name). Independent of the
// order tensors are generated in, so adding a tensor never changes another.
class Stream {
 public:
  Stream(std::uint64_t seed, const std::string& name) : key_(Mix(seed ^ HashName(name))) {}
  float Uniform(std::uint64_t i) const {
    return static_cast<float>(static_cast<double>(Mix(key_ ^ Mix(i)) >> 40) * 0x1.0p-23 - 1.0);
  }
  // Uniform with standard deviation `std` (width sqrt(3) * std each side).
  float Sym(std::uint64_t i, float std_dev) const { return Uniform(i) * std_dev * 1.7320508f; }

 private:
  std::uint64_t key_;
};

struct Builder {
  std::uint64_t seed;
  DType mat_dtype;
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>> tensors;
  std::map<std::string, DType> dtypes;

  std::vector<float>& Add(const std::string& name, std::vector<std::int64_t> shape, DType dt) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    auto& e = tensors[name];
    e.first = std::move(shape);
    e.second.assign(n, 0.0f);
    dtypes[name] = dt;
    return e.second;
  }
  void Matrix(const std::string& name, int rows, int cols, float gain) {
    auto& v = Add(name, {rows, cols}, mat_dtype);
    Stream s(seed, name);
    const float sd = gain / std::sqrt(static_cast<float>(cols));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = s.Sym(i, sd);
  }
  void NormZc(const std::string& name, int n) {
    auto& v = Add(name, {n}, DType::kF32);
    Stream s(seed, name);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = s.Uniform(i) * kNormJitter;
  }
  void Ffn(const std::string& p, int h, int inter) {
    Matrix(p + "gate_proj.weight", inter, h, 1.0f);
    Matrix(p + "up_proj.weight", inter, h, 1.0f);
    Matrix(p + "down_proj.weight", h, inter, kOutGain);
  }
  void Attention(const std::string& p, const ModelConfig& c) {
    Matrix(p + "q_proj.weight", 2 * c.n_heads * c.head_dim, c.n_embd, 1.0f);
    Matrix(p + "k_proj.weight", c.n_heads_kv * c.head_dim, c.n_embd, 1.0f);
    Matrix(p + "v_proj.weight", c.n_heads_kv * c.head_dim, c.n_embd, 1.0f);
    Matrix(p + "o_proj.weight", c.n_embd, c.n_heads * c.head_dim, kOutGain);
    NormZc(p + "q_norm.weight", c.head_dim);
    NormZc(p + "k_norm.weight", c.head_dim);
  }
  void Gdn(const std::string& p, const ModelConfig& c) {
    Matrix(p + "in_proj_qkvz.weight", c.qkvz_dim(), c.n_embd, 1.0f);
    Matrix(p + "in_proj_ba.weight", 2 * c.n_v_heads, c.n_embd, 1.0f);
    {
      auto& v = Add(p + "conv1d.weight", {c.conv_dim(), 1, c.conv_kernel}, mat_dtype);
      Stream s(seed, p + "conv1d.weight");
      const float sd = 1.0f / std::sqrt(static_cast<float>(c.conv_kernel));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = s.Sym(i, sd);
    }
    // Decays spread between fast and slow heads, as in Mamba-style init: A in [1, 16]
    // log-uniform, dt in [1e-3, 1e-1] log-uniform, dt_bias = softplus^-1(dt).
    auto& a_log = Add(p + "A_log", {c.n_v_heads}, DType::kF32);
    auto& dt_bias = Add(p + "dt_bias", {c.n_v_heads}, DType::kF32);
    Stream sa(seed, p + "A_log"), sd(seed, p + "dt_bias");
    for (int j = 0; j < c.n_v_heads; ++j) {
      const float ua = 0.5f * (sa.Uniform(static_cast<std::uint64_t>(j)) + 1.0f);
      const float ud = 0.5f * (sd.Uniform(static_cast<std::uint64_t>(j)) + 1.0f);
      a_log[static_cast<std::size_t>(j)] = ua * std::log(16.0f);  // A = exp(A_log) in [1, 16]
      const float dt = std::exp(std::log(1e-3f) + ud * (std::log(1e-1f) - std::log(1e-3f)));
      dt_bias[static_cast<std::size_t>(j)] = dt + std::log(-std::expm1(-dt));  // softplus^-1
    }
    auto& nw = Add(p + "norm.weight", {c.v_head_dim}, DType::kF32);  // plain weight, around 1
    Stream sn(seed, p + "norm.weight");
    for (std::size_t i = 0; i < nw.size(); ++i) nw[i] = 1.0f + sn.Uniform(i) * kNormJitter;
    Matrix(p + "out_proj.weight", c.n_embd, c.value_dim(), kOutGain);
  }
  void Moe(const std::string& p, const ModelConfig& c) {
    Matrix(p + "gate.weight", c.n_experts, c.n_embd, kRouterGain);
    for (int e = 0; e < c.n_experts; ++e) Ffn(p + "experts." + std::to_string(e) + ".", c.n_embd, c.moe_ffn);
    Ffn(p + "shared_expert.", c.n_embd, c.shared_ffn);
    Matrix(p + "shared_expert_gate.weight", 1, c.n_embd, 1.0f);
  }
  void Layer(const std::string& p, const ModelConfig& c, LayerType t) {
    NormZc(p + "input_layernorm.weight", c.n_embd);
    NormZc(p + "post_attention_layernorm.weight", c.n_embd);
    if (t == LayerType::kFullAttention) {
      Attention(p + "self_attn.", c);
    } else {
      Gdn(p + "linear_attn.", c);
    }
    Moe(p + "mlp.", c);
  }
};

Status MakeDirs(const std::string& dir) {
  std::string cur;
  for (std::size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        return Status::IOError("cannot create folder '" + cur + "'", std::strerror(errno));
    }
    if (i < dir.size()) cur.push_back(dir[i]);
  }
  return Status::Ok();
}

ModelConfig Base() {
  ModelConfig c;
  c.rope_theta = 10000000.0;
  c.partial_rotary_factor = 0.25;
  c.conv_kernel = 4;
  c.norm_topk_prob = true;
  c.rms_norm_eps = 1e-6f;
  c.n_mtp_layers = 1;
  c.bos_token_id = 1;
  return c;
}

void Layout(ModelConfig& c) {
  c.rotary_dim = static_cast<int>(c.head_dim * c.partial_rotary_factor);
  c.layer_types.clear();
  for (int il = 0; il < c.n_layers; ++il)
    c.layer_types.push_back((il + 1) % 4 == 0 ? LayerType::kFullAttention : LayerType::kLinearAttention);
  c.eos_token_ids = {c.n_vocab - 1};
}

}  // namespace

std::vector<std::string> SyntheticPresets() { return {"tiny", "small", "seed48"}; }

Result<ModelConfig> SyntheticConfig(const std::string& preset) {
  ModelConfig c = Base();
  if (preset == "tiny") {
    c.n_vocab = 512, c.n_embd = 64, c.n_layers = 8;
    c.n_heads = 4, c.n_heads_kv = 2, c.head_dim = 32;
    c.n_k_heads = 2, c.n_v_heads = 4, c.k_head_dim = 16, c.v_head_dim = 16;
    c.n_experts = 8, c.n_experts_used = 2, c.moe_ffn = 32, c.shared_ffn = 32;
  } else if (preset == "small") {
    c.n_vocab = 4096, c.n_embd = 512, c.n_layers = 16;
    c.n_heads = 8, c.n_heads_kv = 2, c.head_dim = 64;
    c.n_k_heads = 4, c.n_v_heads = 8, c.k_head_dim = 64, c.v_head_dim = 64;
    c.n_experts = 32, c.n_experts_used = 4, c.moe_ffn = 128, c.shared_ffn = 256;
  } else if (preset == "seed48") {
    c.n_vocab = 2048, c.n_embd = 128, c.n_layers = 48;
    c.n_heads = 4, c.n_heads_kv = 2, c.head_dim = 32;
    c.n_k_heads = 2, c.n_v_heads = 4, c.k_head_dim = 32, c.v_head_dim = 32;
    c.n_experts = 16, c.n_experts_used = 4, c.moe_ffn = 64, c.shared_ffn = 64;
  } else {
    return Status::InvalidArgument("--preset", "unknown preset '" + preset + "' (expected tiny, small or seed48)");
  }
  Layout(c);
  LOCKSTEP_RETURN_IF_ERROR(c.Validate());
  return c;
}

Status WriteSyntheticModel(const SyntheticOptions& opts, const std::string& out_dir) {
  LOCKSTEP_ASSIGN_OR_RETURN(ModelConfig c, SyntheticConfig(opts.preset));
  DType dt = opts.dtype.value_or(opts.preset == "tiny" ? DType::kF32 : DType::kBF16);
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
    return Status::InvalidArgument("--dtype", "expected f32, bf16 or f16");
  if (!opts.with_mtp) c.n_mtp_layers = 0;
  Builder b{opts.seed, dt, {}, {}};
  {
    auto& e = b.Add("model.embed_tokens.weight", {c.n_vocab, c.n_embd}, dt);
    Stream s(opts.seed, "model.embed_tokens.weight");
    for (std::size_t i = 0; i < e.size(); ++i) e[i] = s.Sym(i, 1.0f);
  }
  b.Matrix("lm_head.weight", c.n_vocab, c.n_embd, 1.0f);
  b.NormZc("model.norm.weight", c.n_embd);
  for (int il = 0; il < c.n_layers; ++il)
    b.Layer("model.layers." + std::to_string(il) + ".", c, c.layer_types[static_cast<std::size_t>(il)]);
  if (opts.with_mtp) {
    // fc [H, 2H]: near-identity on the embedding half plus fan-in noise everywhere.
    auto& fc = b.Add("mtp.fc.weight", {c.n_embd, 2 * c.n_embd}, dt);
    Stream s(opts.seed, "mtp.fc.weight");
    const float sd = kMtpNoise / std::sqrt(static_cast<float>(2 * c.n_embd));
    const std::size_t w2 = 2 * static_cast<std::size_t>(c.n_embd);
    for (std::size_t i = 0; i < fc.size(); ++i) fc[i] = s.Sym(i, sd);
    for (int r = 0; r < c.n_embd; ++r) fc[static_cast<std::size_t>(r) * w2 + static_cast<std::size_t>(r)] += kMtpEmbedGain;
    b.NormZc("mtp.pre_fc_norm_embedding.weight", c.n_embd);
    b.NormZc("mtp.pre_fc_norm_hidden.weight", c.n_embd);
    b.NormZc("mtp.norm.weight", c.n_embd);
    b.Layer("mtp.layers.0.", c, LayerType::kFullAttention);
  }

  // Serialise each tensor in its storage dtype.
  std::vector<std::vector<std::byte>> bytes;
  std::vector<TensorToWrite> out;
  bytes.reserve(b.tensors.size());
  for (auto& [name, st] : b.tensors) {
    const DType tdt = b.dtypes[name];
    const auto& v = st.second;
    std::vector<std::byte> buf(v.size() * dtype_size(tdt));
    if (tdt == DType::kF32) {
      std::memcpy(buf.data(), v.data(), buf.size());
    } else {
      for (std::size_t i = 0; i < v.size(); ++i) {
        std::uint16_t h = tdt == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        std::memcpy(buf.data() + 2 * i, &h, 2);
      }
    }
    bytes.push_back(std::move(buf));
    out.push_back(TensorToWrite{name, tdt, st.first, bytes.back()});
    std::vector<float>().swap(st.second);
  }
  LOCKSTEP_RETURN_IF_ERROR(MakeDirs(out_dir));
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/config.json", c.ToJson()));
  std::map<std::string, std::string> meta{{"format", "pt"},
                                          {"lockstep.preset", opts.preset},
                                          {"lockstep.seed", std::to_string(opts.seed)}};
  return WriteSafetensors(out_dir + "/model.safetensors", out, meta);
}

}  // namespace lockstep
