#include "lockstep/engine/synthetic.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/safetensors.h"
#include "lockstep/engine/splitmix.h"

namespace lockstep {

namespace {

// ---- initialisation constants (see docs/engine.md, "The synthetic model") ----
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

// ---- in-context copying (see WireInduction) ----
// Every embedding carries exactly this much of one shared unit direction `dc` (the random part is
// made orthogonal to dc): a constant input that projections can read to hold a gate open (no
// biases exist in this architecture). Without the projection the random part adds N(0, 1) to
// it, and the ~1% of tokens near -kDcGain closed the previous-token head's gates (beta, z)
// and flipped its output: those tokens were never copied.
constexpr float kDcGain = 3.0f;
// Gains of the rows that read `dc`: GDN beta (sigmoid(~8): write fully), GDN output gate
// z (silu(~3)), attention output gate (sigmoid(~8)).
constexpr float kBetaGain = 3.0f;
constexpr float kZGain = 1.2f;
constexpr float kGateGain = 3.0f;
// Size of the previous-token features written into the residual stream, relative to a token
// embedding (|y| ~ kPrevGain * |e|).
constexpr float kPrevGain = 2.0f;
// GDN value rows of the previous-token head are small so silu stays in its near-linear range.
constexpr float kPrevValueGain = 0.2f;
// q_norm / k_norm weights on the non-rotary dims of the induction head (zero-centred: 1 + w).
constexpr float kInductionNormW = 3.0f;
// Strength of the copied token's direction written by each induction head. The copies land in
// coordinates no induction reader looks at (see WireInduction), so a strong copy does not disturb
// later induction layers: measured on `small` (teacher-forced, 48-token block repeated, seeds
// 0-7), 48/48 continuations with a top-1 margin >= 3.5 logits at 16, against 43/48 for the
// earlier shared-coordinate wiring at 4 (where larger gains made copying worse).
constexpr float kCopyGain = 16.0f;

std::uint64_t HashName(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Counter-based uniform in [-1, 1): value i of the stream (seed, name). Independent of the
// order tensors are generated in, so adding a tensor never changes another.
class Stream {
 public:
  Stream(std::uint64_t seed, const std::string& name) : key_(SplitMix64(seed ^ HashName(name))) {}
  float Uniform(std::uint64_t i) const {
    return static_cast<float>(
        static_cast<double>(SplitMix64(key_ ^ SplitMix64(i)) >> 40) * 0x1.0p-23 - 1.0);
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
    for (int e = 0; e < c.n_experts; ++e)
      Ffn(p + "experts." + std::to_string(e) + ".", c.n_embd, c.moe_ffn);
    Ffn(p + "shared_expert.", c.n_embd, c.shared_ffn);
    Matrix(p + "shared_expert_gate.weight", 1, c.n_embd, 1.0f);
  }
  // Random dense [rows, cols] block with the given std (for wiring, not stored).
  std::vector<float> Block(const std::string& name, int rows, int cols, float std_dev) const {
    std::vector<float> m(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
    Stream s(seed, name);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = s.Sym(i, std_dev);
    return m;
  }
  std::vector<float>& T(const std::string& name) { return tensors.at(name).second; }

  void Layer(const std::string& p, const ModelConfig& c, LayerType t, bool moe) {
    NormZc(p + "input_layernorm.weight", c.n_embd);
    NormZc(p + "post_attention_layernorm.weight", c.n_embd);
    if (t == LayerType::kFullAttention) {
      Attention(p + "self_attn.", c);
    } else {
      Gdn(p + "linear_attn.", c);
    }
    if (moe) {
      Moe(p + "mlp.", c);
    } else {
      Ffn(p + "mlp.", c.n_embd, c.dense_ffn);
    }
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
    c.layer_types.push_back((il + 1) % 4 == 0 ? LayerType::kFullAttention
                                              : LayerType::kLinearAttention);
  c.eos_token_ids = {c.n_vocab - 1};
}

std::vector<float> UnitVector(std::uint64_t seed, std::size_t n) {
  Stream s(seed, "lockstep.dc");
  std::vector<float> v(n);
  double ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += static_cast<double>(v[i] = s.Sym(i, 1.0f)) * v[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss));
  for (auto& x : v) x *= inv;
  return v;
}

// Subtracts from v [n] its components along the orthonormal vectors in `basis`.
void OrthogonalizeTo(float* v, std::size_t n, const std::vector<std::vector<float>>& basis) {
  for (const auto& bv : basis) {
    double dot = 0;
    for (std::size_t h = 0; h < n; ++h) dot += static_cast<double>(v[h]) * bv[h];
    for (std::size_t h = 0; h < n; ++h) v[h] -= static_cast<float>(dot) * bv[h];
  }
}

// Scales v [n] to unit length; false (v unchanged) for a zero vector.
bool NormalizeVec(float* v, std::size_t n) {
  double nn = 0;
  for (std::size_t h = 0; h < n; ++h) nn += static_cast<double>(v[h]) * v[h];
  if (nn <= 0) return false;
  const float inv = static_cast<float>(1.0 / std::sqrt(nn));
  for (std::size_t h = 0; h < n; ++h) v[h] *= inv;
  return true;
}

// In-context copying, the way trained models do it: a previous-token head followed by induction
// heads. Without it a random model never continues repeated text, so suffix drafts would never be
// accepted and speculative decoding could not be exercised on repetitive input.
//
// The residual coordinates are split in two halves, S_in and S_out, and the lm_head's signed
// permutation A maps S_in onto S_out (lm_head row u = A r_u). Everything the circuit reads
// (previous-token features, queries, values) is read from S_in; the induction heads' copies are
// written to S_out. A copy therefore never feeds a later induction head's query, key or value
// (with shared coordinates it did, which capped the useful copy gain), and the lm_head still
// reads it: A maps the S_in half of r_u, which the values carry, into S_out.
//
// 1. Previous-token head: GDN layer (first attention layer - 1), key head 0 / value head 0.
//    q and k share their projection rows and read the current conv tap, v reads the previous
//    tap; decay ~0 (A = 64, dt_bias = 3) and beta ~1 (reads dc). The delta rule then returns
//    o_t = v_t = silu(V0 a_{t-1}): features of the previous token. z reads dc (gate open);
//    out_proj's block G (columns in S_in, orthogonal to dc) writes them into the residual
//    stream as y_t.
// 2. Induction head: in every full-attention layer, query head 0 over kv head 0, non-rotary dims
//    only (position-independent). k = M G^T a_s picks y_s (previous token at s); q = M V0 a_t picks
//    the current token in the same feature space (V0 reads S_in orthogonally to span(G)), so
//    position s wins when x_{s-1} == x_t. The value B a_s (rows in S_in, orthogonal to span(G))
//    carries x_s; o_proj block kCopyGain * A B^T (in S_out, then orthogonal to dc) maps it onto
//    lm_head row A r_{x_s}, raising the token that followed the earlier occurrence. The head's
//    output gate reads dc.
// The geometry both halves of the wiring share: the widths, the S_in restriction, dc's halves and
// the directions that queries and values must not read.
struct InductionSpace {
  const ModelConfig& c;
  const std::vector<float>& dc;
  const std::vector<char>& in_s;
  std::size_t uH;
  float inv_sqrt_h;
  std::vector<float> dc_in, dc_out;  // the S_in and S_out parts of dc, as unit vectors
  // Orthonormal directions of S_in that queries and values must not read: dc (a constant would
  // add a common offset to every match score) and span(G) (the previous-token features).
  std::vector<std::vector<float>> no_read;

  InductionSpace(const ModelConfig& cfg, const std::vector<float>& d, const std::vector<char>& in)
      : c(cfg),
        dc(d),
        in_s(in),
        uH(static_cast<std::size_t>(cfg.n_embd)),
        inv_sqrt_h(1.0f / std::sqrt(static_cast<float>(cfg.n_embd))),
        dc_in(uH, 0.0f),
        dc_out(uH, 0.0f) {
    // A vector supported on one half is made orthogonal to dc by removing its component along
    // that half's part.
    for (std::size_t h = 0; h < uH; ++h) (in_s[h] ? dc_in : dc_out)[h] = dc[h];
    NormalizeVec(dc_in.data(), uH);
    NormalizeVec(dc_out.data(), uH);
    no_read.push_back(dc_in);
  }
  // Readers keep their row norms when restricted to S_in (half of the coordinates).
  void RestrictIn(float* v) const {
    const float in_scale = std::sqrt(2.0f);
    for (std::size_t h = 0; h < uH; ++h) v[h] = in_s[h] ? v[h] * in_scale : 0.0f;
  }
};

// What the previous-token head leaves for the induction heads: G^T [Dv, H] (its features in the
// residual stream) and V0 [Dv, H] (the current token's features in the same space).
struct PrevTokenHead {
  std::vector<float> gt, v0;
};

// 1. The previous-token head in GDN layer `gp` (value head 0); extends s.no_read with span(G).
PrevTokenHead WirePrevTokenHead(Builder& b, InductionSpace& s, const std::string& gp) {
  const ModelConfig& c = s.c;
  const std::vector<float>& dc = s.dc;
  const int H = c.n_embd, Dk = c.k_head_dim, Dv = c.v_head_dim, r = c.n_v_heads / c.n_k_heads;
  const int key_dim = c.key_dim(), K = c.conv_kernel;
  const std::size_t uH = s.uH, uDv = static_cast<std::size_t>(Dv);
  auto& qkvz = b.T(gp + "in_proj_qkvz.weight");
  // out_proj block G [H, Dv] for value head 0: |y| ~ kPrevGain * |e| given |o_hat| ~ silu(z)
  // sqrt(Dv).
  const float z_act = 3.0f;  // ~ silu(kZGain * kDcGain * ...) at the input scale (measured)
  const float g_sd = kPrevGain / (z_act * std::sqrt(static_cast<float>(Dv)));
  const std::vector<float> G = b.Block(gp + "induction.G", H, Dv, g_sd);
  PrevTokenHead prev;
  std::vector<float>& gt = prev.gt;  // G^T [Dv, H]: G's columns in S_in, orthogonal to dc
  gt.resize(uDv * uH);
  for (std::size_t i = 0; i < uDv; ++i) {
    float* col = gt.data() + i * uH;
    for (std::size_t h = 0; h < uH; ++h) col[h] = G[h * uDv + i];
    s.RestrictIn(col);
    OrthogonalizeTo(col, uH, {s.dc_in});
  }
  for (std::size_t i = 0; i < uDv; ++i) {  // Gram-Schmidt: an orthonormal basis of span(G)
    std::vector<float> u(gt.begin() + static_cast<std::ptrdiff_t>(i * uH),
                         gt.begin() + static_cast<std::ptrdiff_t>((i + 1) * uH));
    OrthogonalizeTo(u.data(), uH, s.no_read);
    if (NormalizeVec(u.data(), uH)) s.no_read.push_back(std::move(u));
  }
  // q and k of the head share rows (orthogonal to dc); with decay ~0 any direction works.
  std::vector<float> qk = b.Block(gp + "induction.qk", Dk, H, s.inv_sqrt_h);
  for (int i = 0; i < Dk; ++i)
    OrthogonalizeTo(qk.data() + static_cast<std::size_t>(i) * uH, uH, {dc});
  // V0: the token's features, read from S_in away from dc and span(G).
  prev.v0 = b.Block(gp + "induction.v", Dv, H, kPrevValueGain * s.inv_sqrt_h);
  std::vector<float>& v0 = prev.v0;
  for (std::size_t i = 0; i < uDv; ++i) {
    s.RestrictIn(v0.data() + i * uH);
    OrthogonalizeTo(v0.data() + i * uH, uH, s.no_read);
  }
  for (std::size_t i = 0; i < static_cast<std::size_t>(Dk); ++i)
    for (std::size_t h = 0; h < uH; ++h) {
      qkvz[i * uH + h] = qk[i * uH + h];                                   // q row i
      qkvz[(static_cast<std::size_t>(Dk) + i) * uH + h] = qk[i * uH + h];  // k row i
    }
  for (std::size_t i = 0; i < uDv; ++i)
    for (std::size_t h = 0; h < uH; ++h) {
      qkvz[(static_cast<std::size_t>(2 * Dk) + i) * uH + h] = v0[i * uH + h];
      qkvz[(static_cast<std::size_t>(2 * Dk + r * Dv) + i) * uH + h] = kZGain * dc[h];
    }
  auto& ba = b.T(gp + "in_proj_ba.weight");  // group 0: rows [0, r) = b, [r, 2r) = a
  for (std::size_t h = 0; h < uH; ++h) {
    ba[h] = kBetaGain * dc[h];
    ba[static_cast<std::size_t>(r) * uH + h] = 0.0f;
  }
  b.T(gp + "A_log")[0] = std::log(64.0f);
  b.T(gp + "dt_bias")[0] = 3.0f;
  auto& conv = b.T(gp + "conv1d.weight");  // [conv_dim, 1, K]
  auto taps = [&](int ch, int tap) {
    for (int j = 0; j < K; ++j)
      conv[static_cast<std::size_t>(ch) * static_cast<std::size_t>(K) +
           static_cast<std::size_t>(j)] = j == tap ? 1.0f : 0.0f;
  };
  for (int i = 0; i < Dk; ++i) taps(i, K - 1), taps(key_dim + i, K - 1);
  for (int i = 0; i < Dv; ++i) taps(2 * key_dim + i, K - 2);
  auto& out = b.T(gp + "out_proj.weight");  // [H, Hv*Dv]
  const std::size_t out_w = static_cast<std::size_t>(c.value_dim());
  for (std::size_t h = 0; h < uH; ++h)
    for (std::size_t i = 0; i < uDv; ++i) out[h * out_w + i] = gt[i * uH + h];
  return prev;
}

// 2. The induction heads of every full-attention layer from `first_attn` on.
void WireInductionHeads(Builder& b, const InductionSpace& s, const PrevTokenHead& prev,
                        int first_attn, const std::vector<std::size_t>& perm,
                        const std::vector<float>& sign) {
  const ModelConfig& c = s.c;
  const std::vector<float>& dc = s.dc;
  const std::vector<float>& gt = prev.gt;
  const std::vector<float>& v0 = prev.v0;
  const int H = c.n_embd, Dv = c.v_head_dim;
  const int D = c.head_dim, R = c.rotary_dim, Dn = D - R;
  const std::size_t uH = s.uH, uD = static_cast<std::size_t>(D), uDv = static_cast<std::size_t>(Dv);
  const int group = c.n_heads / c.n_heads_kv;
  const std::size_t o_w = static_cast<std::size_t>(c.n_heads) * uD;
  std::vector<float> col(uH);
  for (int il = first_attn; il < c.n_layers; ++il) {
    if (!c.is_full_attention(il)) continue;
    const std::string ap = "model.layers." + std::to_string(il) + ".self_attn.";
    auto& q =
        b.T(ap + "q_proj.weight");  // per query head h: rows [2hD, 2hD+D) query, then its gate
    auto& k = b.T(ap + "k_proj.weight");  // rows [jD, (j+1)D) kv head j
    auto& v = b.T(ap + "v_proj.weight");
    auto& o = b.T(ap + "o_proj.weight");      // [H, Hq*D], columns [hD, (h+1)D) query head h
    for (int j = 0; j < c.n_heads_kv; ++j) {  // one induction head per kv head: query head j*group
      const std::size_t hq = static_cast<std::size_t>(j * group);
      const std::string tag = ap + "induction." + std::to_string(j);
      const std::vector<float> M =
          b.Block(tag + ".M", Dn, Dv, 1.0f / std::sqrt(static_cast<float>(Dv)));
      std::vector<float> B = b.Block(tag + ".B", D, H, s.inv_sqrt_h);
      for (std::size_t d = 0; d < uD; ++d) {  // value rows: S_in, orthogonal to dc and span(G)
        s.RestrictIn(B.data() + d * uH);
        OrthogonalizeTo(B.data() + d * uH, uH, s.no_read);
      }
      for (std::size_t d = 0; d < uD; ++d)
        for (std::size_t h = 0; h < uH; ++h) {
          float qv = 0, kv = 0;
          if (d >= static_cast<std::size_t>(R)) {
            const std::size_t m = d - static_cast<std::size_t>(R);
            for (std::size_t i = 0; i < uDv; ++i) {
              const float mm = M[m * uDv + i];
              qv += mm * v0[i * uH + h];  // M V0
              kv += mm * gt[i * uH + h];  // M G^T
            }
          }
          const std::size_t qrow = 2 * hq * uD + d, krow = static_cast<std::size_t>(j) * uD + d;
          q[qrow * uH + h] = qv;
          q[(qrow + uD) * uH + h] = kGateGain * dc[h];
          k[krow * uH + h] = kv;
          v[krow * uH + h] = B[d * uH + h];
        }
      // o_proj block of head hq = kCopyGain * A B^T: row perm[i], column hq*D + d = sign[i] B[d][i]
      // (perm maps S_in, where B lives, onto S_out), then orthogonal to dc: the gates read dc.
      for (std::size_t d = 0; d < uD; ++d) {
        std::fill(col.begin(), col.end(), 0.0f);
        for (std::size_t i = 0; i < uH; ++i) col[perm[i]] = kCopyGain * sign[i] * B[d * uH + i];
        OrthogonalizeTo(col.data(), uH, {s.dc_out});
        for (std::size_t h = 0; h < uH; ++h) o[h * o_w + hq * uD + d] = col[h];
      }
    }
    auto& qn = b.T(ap + "q_norm.weight");
    auto& kn = b.T(ap + "k_norm.weight");
    for (int d = R; d < D; ++d)
      qn[static_cast<std::size_t>(d)] = kn[static_cast<std::size_t>(d)] = kInductionNormW;
  }
}

// Wires the induction circuit into the model (the two parts above). Needs a GDN layer just before
// the first full-attention layer and non-rotary head dimensions; otherwise leaves the model as is.
void WireInduction(Builder& b, const ModelConfig& c, const std::vector<float>& dc,
                   const std::vector<std::size_t>& perm, const std::vector<float>& sign,
                   const std::vector<char>& in_s) {
  int first_attn = -1;
  for (int il = 0; il < c.n_layers && first_attn < 0; ++il)
    if (c.is_full_attention(il)) first_attn = il;
  if (first_attn < 1 || c.is_full_attention(first_attn - 1) || c.head_dim - c.rotary_dim <= 0)
    return;
  const std::string gp = "model.layers." + std::to_string(first_attn - 1) + ".linear_attn.";
  InductionSpace space(c, dc, in_s);
  const PrevTokenHead prev = WirePrevTokenHead(b, space, gp);
  WireInductionHeads(b, space, prev, first_attn, perm, sign);
}

}  // namespace

std::vector<std::string> SyntheticPresets() { return {"tiny", "small", "seed48", "wide"}; }

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
  } else if (preset == "wide") {
    // Bandwidth-bound decode (cuda_bench): Qwen3-Next-80B's widths (hidden 2048, GDN 16 key / 32
    // value heads of 128, attention 16 / 2 heads of 256, experts 512 wide, top-10 + shared) in 8
    // layers with 32 experts: ~1.2 GB of bf16 weights read per token, ~2.7 GB of files.
    c.n_vocab = 32768, c.n_embd = 2048, c.n_layers = 8;
    c.n_heads = 16, c.n_heads_kv = 2, c.head_dim = 256;
    c.n_k_heads = 16, c.n_v_heads = 32, c.k_head_dim = 128, c.v_head_dim = 128;
    c.n_experts = 32, c.n_experts_used = 10, c.moe_ffn = 512, c.shared_ffn = 512;
  } else {
    return Status::InvalidArgument(
        "--preset", "unknown preset '" + preset + "' (expected tiny, small, seed48 or wide)");
  }
  Layout(c);
  LOCKSTEP_RETURN_IF_ERROR(c.Validate());
  return c;
}

namespace {

// The preset's config `c` cut as the options ask (MTP, layers, experts, vocabulary, dense layers).
Status CutConfig(const SyntheticOptions& opts, ModelConfig& c) {
  if (!opts.with_mtp) c.n_mtp_layers = 0;
  if (opts.n_layers < 0 || opts.n_experts < 0 || opts.n_experts_used < 0 || opts.n_vocab < 0)
    return Status::InvalidArgument(
        "synthetic model",
        "layer, expert and vocabulary counts must be positive (0: the preset's)");
  if (opts.n_layers > 0 || opts.n_experts > 0 || opts.n_experts_used > 0 || opts.n_vocab > 0) {
    if (opts.n_layers > 0) c.n_layers = opts.n_layers;
    if (opts.n_experts > 0) c.n_experts = opts.n_experts;
    if (opts.n_experts_used > 0) c.n_experts_used = opts.n_experts_used;
    if (opts.n_vocab > 0) c.n_vocab = opts.n_vocab;
    Layout(c);
    LOCKSTEP_RETURN_IF_ERROR(c.Validate());
  }
  if (!opts.mlp_only_layers.empty()) {
    for (int il : opts.mlp_only_layers)
      if (il < 0 || il >= c.n_layers)
        return Status::InvalidArgument(
            "mlp_only_layers",
            "layer " + std::to_string(il) + " is not in [0, " + std::to_string(c.n_layers) + ")");
    c.mlp_only_layers = opts.mlp_only_layers;
    c.dense_ffn = 2 * c.moe_ffn;
    LOCKSTEP_RETURN_IF_ERROR(c.Validate());
  }
  return Status::Ok();
}

// Writes config.json and model.safetensors (each tensor in its storage dtype) into out_dir; frees
// the builder's f32 values as it goes.
Status WriteModelFiles(Builder& b, const ModelConfig& c, const SyntheticOptions& opts,
                       const std::string& out_dir) {
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
                                          {"lockstep.seed", std::to_string(opts.seed)},
                                          {"lockstep.induction", opts.induction ? "1" : "0"}};
  return WriteSafetensors(out_dir + "/model.safetensors", out, meta);
}

}  // namespace

Status WriteSyntheticModel(const SyntheticOptions& opts, const std::string& out_dir) {
  LOCKSTEP_ASSIGN_OR_RETURN(ModelConfig c, SyntheticConfig(opts.preset));
  DType dt = opts.dtype.value_or(opts.preset == "tiny" ? DType::kF32 : DType::kBF16);
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
    return Status::InvalidArgument("--dtype", "expected f32, bf16 or f16");
  LOCKSTEP_RETURN_IF_ERROR(CutConfig(opts, c));
  Builder b{opts.seed, dt, {}, {}};
  const std::size_t H = static_cast<std::size_t>(c.n_embd);
  const std::vector<float> dc =
      opts.induction ? UnitVector(opts.seed, H) : std::vector<float>(H, 0.0f);
  std::vector<std::size_t> perm(H);
  std::vector<float> sign(H, 1.0f);
  std::vector<char> in_s(H, 0);  // S_in membership (induction only)
  if (!opts.induction) {
    auto& e = b.Add("model.embed_tokens.weight", {c.n_vocab, c.n_embd}, dt);
    Stream s(opts.seed, "model.embed_tokens.weight");
    for (std::size_t i = 0; i < e.size(); ++i) e[i] = s.Sym(i, 1.0f);
    b.Matrix("lm_head.weight", c.n_vocab, c.n_embd, 1.0f);
  } else {
    // lm_head row u = A r_u, A a seeded signed permutation (orthogonal), r_u the random part of
    // embedding u: a direction the induction heads can write to raise exactly token u, while
    // lm_head stays unrelated to the token's own embedding (no built-in "repeat me" bias).
    // A also swaps two seeded halves of the coordinates, S_in and S_out (see WireInduction).
    Stream sp(opts.seed, "lockstep.lm_head.perm");
    std::vector<std::size_t> order(H);
    for (std::size_t i = 0; i < H; ++i) order[i] = i;
    for (std::size_t i = H - 1; i > 0; --i)
      std::swap(order[i], order[static_cast<std::size_t>((sp.Uniform(i) + 1.0f) * 0.5f *
                                                         static_cast<float>(i + 1)) %
                                (i + 1)]);
    for (std::size_t j = 0; j < H / 2; ++j) {
      in_s[order[j]] = 1;
      perm[order[j]] = order[H / 2 + j];
      perm[order[H / 2 + j]] = order[j];
    }
    for (std::size_t i = 0; i < H; ++i) sign[i] = sp.Uniform(H + i) < 0 ? -1.0f : 1.0f;
    auto& e = b.Add("model.embed_tokens.weight", {c.n_vocab, c.n_embd}, dt);
    auto& lm = b.Add("lm_head.weight", {c.n_vocab, c.n_embd}, dt);
    Stream s(opts.seed, "model.embed_tokens.weight");
    const float lm_sd = 1.0f / std::sqrt(static_cast<float>(H));
    std::vector<float> ru(H);
    for (std::size_t u = 0; u < static_cast<std::size_t>(c.n_vocab); ++u) {
      double along_dc = 0;
      for (std::size_t i = 0; i < H; ++i)
        along_dc += static_cast<double>(ru[i] = s.Sym(u * H + i, 1.0f)) * dc[i];
      for (std::size_t i = 0; i < H; ++i) {
        const float r = ru[i] - static_cast<float>(along_dc) * dc[i];  // r_u orthogonal to dc
        e[u * H + i] = r + kDcGain * dc[i];
        lm[u * H + perm[i]] = sign[i] * r * lm_sd;
      }
    }
  }
  b.NormZc("model.norm.weight", c.n_embd);
  for (int il = 0; il < c.n_layers; ++il)
    b.Layer("model.layers." + std::to_string(il) + ".", c,
            c.layer_types[static_cast<std::size_t>(il)], c.is_moe(il));
  if (opts.induction) WireInduction(b, c, dc, perm, sign, in_s);
  if (opts.with_mtp) {
    // fc [H, 2H]: near-identity on the embedding half plus fan-in noise everywhere.
    auto& fc = b.Add("mtp.fc.weight", {c.n_embd, 2 * c.n_embd}, dt);
    Stream s(opts.seed, "mtp.fc.weight");
    const float sd = kMtpNoise / std::sqrt(static_cast<float>(2 * c.n_embd));
    const std::size_t w2 = 2 * static_cast<std::size_t>(c.n_embd);
    for (std::size_t i = 0; i < fc.size(); ++i) fc[i] = s.Sym(i, sd);
    for (int r = 0; r < c.n_embd; ++r)
      fc[static_cast<std::size_t>(r) * w2 + static_cast<std::size_t>(r)] += kMtpEmbedGain;
    b.NormZc("mtp.pre_fc_norm_embedding.weight", c.n_embd);
    b.NormZc("mtp.pre_fc_norm_hidden.weight", c.n_embd);
    b.NormZc("mtp.norm.weight", c.n_embd);
    b.Layer("mtp.layers.0.", c, LayerType::kFullAttention, true);
  }

  return WriteModelFiles(b, c, opts, out_dir);
}

}  // namespace lockstep
