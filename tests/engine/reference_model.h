// The float64 reference forward of a Qwen3-Next checkpoint, written from MODEL.md (sections 3 and
// 4) and sharing nothing with the engine but the document: every op naively in double (ref::), and
// RefModel, the whole model and its MTP module one token at a time, reading the tensors by their
// Hugging Face names through a RefTensors lookup (a safetensors folder: RefTensorsOf; a GGUF file's
// dequantised blocks: gguf_reference_test.cpp). Used by ops_reference_test.cpp (the engine's ops
// and the tiny model against it) and gguf_reference_test.cpp (quantised GGUF models).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/safetensors.h"

namespace lockstep::cpu::ref {

using Vec = std::vector<double>;

inline std::size_t Z(int x) { return static_cast<std::size_t>(x); }

inline double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double Silu(double x) { return x * Sigmoid(x); }
// PyTorch softplus: beta 1, threshold 20.
inline double Softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
inline double Dot(const double* a, const double* b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y = x . W^T for a checkpoint weight W [out, in] (row-major): y[o] = sum_i x[i] W[o][i].
inline Vec Linear(const double* x, const Vec& W, int out, int in) {
  EXPECT_EQ(W.size(), Z(out) * Z(in));
  Vec y(Z(out));
  for (int o = 0; o < out; ++o) y[Z(o)] = Dot(x, W.data() + Z(o) * Z(in), in);
  return y;
}

// 3.1: y = x * rsqrt(mean(x^2) + eps) * (1 + w).
inline Vec RmsNormZc(const double* x, int n, const double* w, double eps) {
  const double r = 1.0 / std::sqrt(Dot(x, x, n) / n + eps);
  Vec y(Z(n));
  for (int i = 0; i < n; ++i) y[Z(i)] = x[i] * r * (1.0 + w[i]);
  return y;
}
// 3.2: y = x * rsqrt(mean(x^2) + eps) * w * silu(z) (plain weight, norm before gate).
inline Vec GatedRmsNorm(const double* x, const double* z, int n, const double* w, double eps) {
  const double r = 1.0 / std::sqrt(Dot(x, x, n) / n + eps);
  Vec y(Z(n));
  for (int i = 0; i < n; ++i) y[Z(i)] = x[i] * r * w[i] * Silu(z[i]);
  return y;
}
// 3.3: x * rsqrt(sum(x^2) + 1e-6).
inline Vec L2Norm(const double* x, int n) {
  const double r = 1.0 / std::sqrt(Dot(x, x, n) + 1e-6);
  Vec y(Z(n));
  for (int i = 0; i < n; ++i) y[Z(i)] = x[i] * r;
  return y;
}

// 3.5 step 3: NeoX partial RoPE of x [n_heads, D] at position `pos` on dims [0, R).
// hf_f32_angles: inv_freq and the angle are rounded to f32 the way MODEL.md says HF computes
// them (inv_freq = 1 / (base ** (2i/R)) in f32, angle = inv_freq * p in f32); cos, sin and the
// rotation stay f64. Otherwise everything is f64.
inline void Rope(double* x, int n_heads, int D, int R, double theta, int pos, bool hf_f32_angles) {
  const int half = R / 2;
  for (int i = 0; i < half; ++i) {
    double phi;
    if (hf_f32_angles) {
      const float expo = static_cast<float>(2 * i) / static_cast<float>(R);
      const float inv = 1.0f / std::pow(static_cast<float>(theta), expo);
      phi = static_cast<double>(
          static_cast<float>(static_cast<double>(pos) * static_cast<double>(inv)));
    } else {
      phi = static_cast<double>(pos) / std::pow(theta, static_cast<double>(2 * i) / R);
    }
    const double c = std::cos(phi), s = std::sin(phi);
    for (int h = 0; h < n_heads; ++h) {
      double* v = x + Z(h) * Z(D);
      const double a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

// ---- 3.5 gated full attention ----

struct AttnW {  // checkpoint layout (MODEL.md section 2)
  Vec q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
};
struct KvRef {  // per position: [Hkv * D]; K after k_norm + RoPE, V raw (section 4.1)
  std::vector<Vec> k, v;
};

// T rows at positions p..p+T-1; kv holds positions [0, p) and gets the T new rows appended.
inline Vec Attention(const AttnW& w, const ModelConfig& c, const double* a, int T, int p,
                     KvRef& kv) {
  const int H = c.n_embd, Hq = c.n_heads, Hkv = c.n_heads_kv, D = c.head_dim, R = c.rotary_dim;
  const int G = Hq / Hkv;
  const double eps = static_cast<double>(c.rms_norm_eps);
  EXPECT_EQ(kv.k.size(), Z(p));
  std::vector<Vec> q(Z(T)), gate(Z(T));
  for (int t = 0; t < T; ++t) {
    const double* at = a + Z(t) * Z(H);
    Vec qg = Linear(at, w.q_proj, 2 * Hq * D, H);  // viewed [Hq, 2D]: per head [query | gate]
    Vec qt(Z(Hq) * Z(D)), gt(Z(Hq) * Z(D));
    for (int h = 0; h < Hq; ++h) {
      const double* src = qg.data() + Z(2 * h) * Z(D);
      Vec qn = RmsNormZc(src, D, w.q_norm.data(), eps);
      std::copy(qn.begin(), qn.end(), qt.begin() + static_cast<std::ptrdiff_t>(h * D));
      std::copy(src + D, src + 2 * D, gt.begin() + static_cast<std::ptrdiff_t>(h * D));
    }
    Rope(qt.data(), Hq, D, R, c.rope_theta, p + t, false);
    Vec k = Linear(at, w.k_proj, Hkv * D, H);
    Vec v = Linear(at, w.v_proj, Hkv * D, H);
    for (int j = 0; j < Hkv; ++j) {
      Vec kn = RmsNormZc(k.data() + Z(j) * Z(D), D, w.k_norm.data(), eps);
      std::copy(kn.begin(), kn.end(), k.begin() + static_cast<std::ptrdiff_t>(j * D));
    }
    Rope(k.data(), Hkv, D, R, c.rope_theta, p + t, false);
    kv.k.push_back(k);
    kv.v.push_back(v);
    q[Z(t)] = std::move(qt);
    gate[Z(t)] = std::move(gt);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Vec out(Z(T) * Z(H));
  for (int t = 0; t < T; ++t) {
    Vec og(Z(Hq) * Z(D));
    const int n_ctx = p + t + 1;  // causal: positions <= p + t
    for (int h = 0; h < Hq; ++h) {
      const int j = h / G;  // repeat_kv: each kv head serves G consecutive query heads
      const double* qh = q[Z(t)].data() + Z(h) * Z(D);
      Vec sc(Z(n_ctx));
      double mx = -std::numeric_limits<double>::infinity();
      for (int u = 0; u < n_ctx; ++u) {
        sc[Z(u)] = scale * Dot(qh, kv.k[Z(u)].data() + Z(j) * Z(D), D);
        mx = std::max(mx, sc[Z(u)]);
      }
      double sum = 0.0;
      for (double& s : sc) sum += (s = std::exp(s - mx));
      for (int i = 0; i < D; ++i) {
        double o = 0.0;
        for (int u = 0; u < n_ctx; ++u) o += sc[Z(u)] / sum * kv.v[Z(u)][Z(j) * Z(D) + Z(i)];
        og[Z(h) * Z(D) + Z(i)] = o * Sigmoid(gate[Z(t)][Z(h) * Z(D) + Z(i)]);
      }
    }
    Vec y = Linear(og.data(), w.o_proj, H, Hq * D);
    std::copy(y.begin(), y.end(), out.begin() + static_cast<std::ptrdiff_t>(t * H));
  }
  return out;
}

// ---- 3.6 Gated DeltaNet ----

struct GdnW {
  Vec qkvz;     // [Hk * (2Dk + 2rDv), H], grouped per key head
  Vec ba;       // [2Hv, H], grouped per key head
  Vec conv;     // conv1d.weight [conv_dim, 1, K]
  Vec dt_bias;  // [Hv]
  Vec a_log;    // [Hv]
  Vec norm;     // [Dv], plain
  Vec out;      // [H, Hv * Dv]
};
struct GdnSt {
  Vec conv;  // [K-1, conv_dim], previous pre-conv inputs X, oldest first
  Vec S;     // [Hv, Dk, Dv]
};

// One token through the layer (recurrent form, 3.6 steps 1-8); updates st, returns y [H].
inline Vec GdnToken(const GdnW& w, const ModelConfig& c, const double* a, GdnSt& st) {
  const int H = c.n_embd, Hk = c.n_k_heads, Hv = c.n_v_heads, Dk = c.k_head_dim, Dv = c.v_head_dim;
  const int r = Hv / Hk, Wg = 2 * Dk + 2 * r * Dv, K = c.conv_kernel;
  const int key_dim = Hk * Dk, conv_dim = 2 * key_dim + Hv * Dv;
  const double eps = static_cast<double>(c.rms_norm_eps);
  // 1. Projection split, per key head group g.
  Vec P = Linear(a, w.qkvz, Hk * Wg, H);
  Vec B = Linear(a, w.ba, 2 * Hv, H);
  Vec X(Z(conv_dim)), z(Z(Hv) * Z(Dv)), b(Z(Hv)), av(Z(Hv));
  for (int g = 0; g < Hk; ++g) {
    const double* grp = P.data() + Z(g) * Z(Wg);
    for (int e = 0; e < Dk; ++e) {
      X[Z(g * Dk + e)] = grp[e];                 // q_g
      X[Z(key_dim + g * Dk + e)] = grp[Dk + e];  // k_g
    }
    for (int i = 0; i < r; ++i) {
      const int j = g * r + i;
      for (int e = 0; e < Dv; ++e) {
        X[Z(2 * key_dim + j * Dv + e)] = grp[2 * Dk + i * Dv + e];  // v_j
        z[Z(j * Dv + e)] = grp[2 * Dk + r * Dv + i * Dv + e];       // z_j
      }
      b[Z(j)] = B[Z(g * 2 * r + i)];
      av[Z(j)] = B[Z(g * 2 * r + r + i)];
    }
  }
  // 3. Causal depthwise conv + SiLU over [state ; X]; state := last K-1 rows.
  Vec U(Z(conv_dim));
  for (int ch = 0; ch < conv_dim; ++ch) {
    double s = 0.0;
    for (int jj = 0; jj < K; ++jj) {
      const double xin = jj < K - 1 ? st.conv[Z(jj) * Z(conv_dim) + Z(ch)] : X[Z(ch)];
      s += w.conv[Z(ch) * Z(K) + Z(jj)] * xin;
    }
    U[Z(ch)] = Silu(s);
  }
  for (int row = 0; row + 1 < K - 1; ++row)
    for (int ch = 0; ch < conv_dim; ++ch)
      st.conv[Z(row) * Z(conv_dim) + Z(ch)] = st.conv[Z(row + 1) * Z(conv_dim) + Z(ch)];
  for (int ch = 0; ch < conv_dim; ++ch) st.conv[Z(K - 2) * Z(conv_dim) + Z(ch)] = X[Z(ch)];
  // 4-8 per value head j (key head j / r).
  Vec ocat(Z(Hv) * Z(Dv));
  for (int j = 0; j < Hv; ++j) {
    const double beta = Sigmoid(b[Z(j)]);
    const double g = -std::exp(w.a_log[Z(j)]) * Softplus(av[Z(j)] + w.dt_bias[Z(j)]);
    const double alpha = std::exp(g);
    const int kh = j / r;
    Vec q = L2Norm(U.data() + Z(kh) * Z(Dk), Dk);
    for (double& x : q) x /= std::sqrt(static_cast<double>(Dk));
    Vec k = L2Norm(U.data() + Z(key_dim) + Z(kh) * Z(Dk), Dk);
    const double* v = U.data() + Z(2 * key_dim) + Z(j) * Z(Dv);
    double* S = st.S.data() + Z(j) * Z(Dk) * Z(Dv);
    for (int i = 0; i < Dk * Dv; ++i) S[i] *= alpha;
    Vec delta(Z(Dv));
    for (int e = 0; e < Dv; ++e) {
      double m = 0.0;
      for (int kk = 0; kk < Dk; ++kk) m += S[kk * Dv + e] * k[Z(kk)];
      delta[Z(e)] = beta * (v[e] - m);
    }
    for (int kk = 0; kk < Dk; ++kk)
      for (int e = 0; e < Dv; ++e) S[kk * Dv + e] += k[Z(kk)] * delta[Z(e)];
    Vec o(Z(Dv));
    for (int e = 0; e < Dv; ++e) {
      double s = 0.0;
      for (int kk = 0; kk < Dk; ++kk) s += S[kk * Dv + e] * q[Z(kk)];
      o[Z(e)] = s;
    }
    Vec on = GatedRmsNorm(o.data(), z.data() + Z(j) * Z(Dv), Dv, w.norm.data(), eps);
    std::copy(on.begin(), on.end(), ocat.begin() + static_cast<std::ptrdiff_t>(j * Dv));
  }
  return Linear(ocat.data(), w.out, H, Hv * Dv);
}

// One delta-rule step for one head on S [Dk, Dv] (3.6 step 7); returns o [Dv].
inline Vec DeltaStep(double* S, const double* q, const double* k, const double* v, double alpha,
                     double beta, int dk, int dv) {
  for (int i = 0; i < dk * dv; ++i) S[i] *= alpha;
  Vec delta(Z(dv));
  for (int e = 0; e < dv; ++e) {
    double m = 0.0;
    for (int kk = 0; kk < dk; ++kk) m += S[kk * dv + e] * k[kk];
    delta[Z(e)] = beta * (v[e] - m);
  }
  for (int kk = 0; kk < dk; ++kk)
    for (int e = 0; e < dv; ++e) S[kk * dv + e] += k[kk] * delta[Z(e)];
  Vec o(Z(dv));
  for (int e = 0; e < dv; ++e) {
    double s = 0.0;
    for (int kk = 0; kk < dk; ++kk) s += S[kk * dv + e] * q[kk];
    o[Z(e)] = s;
  }
  return o;
}

// ---- 3.8 MoE ----

struct FfnW {
  Vec gate, up, down;  // [I, H], [I, H], [H, I]
  int inter = 0;
};
struct MoeW {
  Vec router;  // [E, H]
  std::vector<FfnW> experts;
  FfnW shared;      // inter == 0 when absent
  Vec shared_gate;  // [H]
};

inline Vec Ffn(const FfnW& f, const double* x, int H) {
  Vec g = Linear(x, f.gate, f.inter, H), u = Linear(x, f.up, f.inter, H);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = Silu(g[i]) * u[i];
  return Linear(g.data(), f.down, H, f.inter);
}

// Routing per 3.8: full softmax, top-k by descending probability (lower id first on ties),
// renormalised when `norm`. `gap` (optional) receives p_(k) - p_(k+1), the margin that keeps
// an f32 implementation's selection identical to this one.
inline void Route(const double* logits, int E, int k, bool norm, std::vector<int>* idx, Vec* wts,
                  double* gap) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int e = 0; e < E; ++e) mx = std::max(mx, logits[e]);
  Vec pr(Z(E));
  double sum = 0.0;
  for (int e = 0; e < E; ++e) sum += (pr[Z(e)] = std::exp(logits[e] - mx));
  for (double& p : pr) p /= sum;
  std::vector<int> order(Z(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return pr[Z(x)] > pr[Z(y)]; });
  idx->assign(order.begin(), order.begin() + k);
  wts->assign(Z(k), 0.0);
  double sel = 0.0;
  for (int r = 0; r < k; ++r) sel += ((*wts)[Z(r)] = pr[Z((*idx)[Z(r)])]);
  if (norm)
    for (double& x : *wts) x /= sel;
  if (gap) *gap = k < E ? pr[Z(order[Z(k - 1)])] - pr[Z(order[Z(k)])] : 1.0;
}

inline Vec Moe(const MoeW& w, const double* x, int H, int E, int k, bool norm, double* gap) {
  Vec logits = Linear(x, w.router, E, H);
  std::vector<int> idx;
  Vec wts;
  Route(logits.data(), E, k, norm, &idx, &wts, gap);
  Vec out(Z(H), 0.0);
  for (int r = 0; r < k; ++r) {
    Vec y = Ffn(w.experts[Z(idx[Z(r)])], x, H);
    for (int i = 0; i < H; ++i) out[Z(i)] += wts[Z(r)] * y[Z(i)];
  }
  if (w.shared.inter > 0) {
    const double sg = Sigmoid(Dot(x, w.shared_gate.data(), H));
    Vec s = Ffn(w.shared, x, H);
    for (int i = 0; i < H; ++i) out[Z(i)] += sg * s[Z(i)];
  }
  return out;
}

// ---- the whole model ----

// A checkpoint tensor in double: its shape (outermost first) and values, row-major.
struct RefTensor {
  std::vector<std::int64_t> shape;
  Vec values;
};
// The tensor with a Hugging Face name, or nullopt when the checkpoint has none.
using RefTensors = std::function<std::optional<RefTensor>(const std::string& hf_name)>;

// The tensors of a safetensors checkpoint (any float dtype, widened exactly).
inline RefTensors RefTensorsOf(const TensorStore& st) {
  return [&st](const std::string& name) -> std::optional<RefTensor> {
    const TensorInfo* ti = st.Find(name);
    if (ti == nullptr) return std::nullopt;
    const auto n = static_cast<std::size_t>(ti->numel());
    std::vector<float> f(n);
    EXPECT_TRUE(convert_to_f32(ti->dtype, ti->data, n, f.data())) << name;
    return RefTensor{ti->shape, Vec(f.begin(), f.end())};
  };
}

// An f64 forward of a Qwen3-Next checkpoint (MODEL.md 3.4-3.9) reading the tensors by their
// Hugging Face names, one token at a time, with its own K/V caches and GDN states.
class RefModel {
 public:
  RefModel(RefTensors tensors, const ModelConfig& c) : tensors_(std::move(tensors)), c_(c) {
    const int H = c.n_embd, V = c.n_vocab;
    embed_ = Load("model.embed_tokens.weight", {V, H});
    lm_head_ = Load("lm_head.weight", {V, H});
    final_norm_ = Load("model.norm.weight", {H});
    for (int il = 0; il < c.n_layers; ++il) {
      // 1: layer i is full attention iff (i + 1) % full_attention_interval == 0 (interval 4).
      const bool full = (il + 1) % 4 == 0;
      EXPECT_EQ(c.is_full_attention(il), full) << "layer " << il;
      layers_.push_back(LoadLayer("model.layers." + std::to_string(il) + ".", full));
    }
    mtp_fc_ = Load("mtp.fc.weight", {H, 2 * H});
    mtp_norm_emb_ = Load("mtp.pre_fc_norm_embedding.weight", {H});
    mtp_norm_hid_ = Load("mtp.pre_fc_norm_hidden.weight", {H});
    mtp_norm_ = Load("mtp.norm.weight", {H});
    mtp_layer_ = LoadLayer("mtp.layers.0.", true);
  }

  // The next position: returns the final-normed hidden [H] (the MTP input) and logits [V].
  void Token(int token, Vec* normed, Vec* logits) {
    const int H = c_.n_embd;
    Vec x(embed_.begin() + static_cast<std::ptrdiff_t>(Z(token) * Z(H)),
          embed_.begin() + static_cast<std::ptrdiff_t>(Z(token + 1) * Z(H)));
    for (Layer& L : layers_) LayerForward(L, x, pos_);
    ++pos_;
    *normed = RmsNormZc(x.data(), H, final_norm_.data(), Eps());
    *logits = Linear(normed->data(), lm_head_, c_.n_vocab, H);
  }

  // One MTP row at the next MTP position from the main model's final-normed hidden h_p and the
  // token t_{p+1} (3.9); returns m (post mtp.norm) and logits.
  void Mtp(const double* h, int next_token, Vec* m, Vec* logits) {
    const int H = c_.n_embd;
    Vec cat = RmsNormZc(embed_.data() + Z(next_token) * Z(H), H, mtp_norm_emb_.data(), Eps());
    Vec hn = RmsNormZc(h, H, mtp_norm_hid_.data(), Eps());
    cat.insert(cat.end(), hn.begin(), hn.end());  // [normed embedding ; normed hidden]
    Vec x = Linear(cat.data(), mtp_fc_, H, 2 * H);
    LayerForward(mtp_layer_, x, mtp_pos_);
    ++mtp_pos_;
    *m = RmsNormZc(x.data(), H, mtp_norm_.data(), Eps());
    *logits = Linear(m->data(), lm_head_, c_.n_vocab, H);
  }

  double min_route_gap() const { return min_gap_; }

 private:
  struct Layer {
    bool full = false;
    Vec in_norm, post_norm;
    AttnW attn;
    GdnW gdn;
    MoeW moe;
    KvRef kv;
    GdnSt state;
  };

  double Eps() const { return static_cast<double>(c_.rms_norm_eps); }

  Vec Load(const std::string& name, std::vector<std::int64_t> shape) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    std::optional<RefTensor> t = tensors_(name);
    EXPECT_TRUE(t.has_value()) << "tensor '" << name << "' missing from the checkpoint";
    if (!t) return Vec(n, 0.0);
    EXPECT_EQ(t->shape, shape) << "tensor '" << name << "' shape";
    if (t->shape != shape || t->values.size() != n) return Vec(n, 0.0);
    return std::move(t->values);
  }

  FfnW LoadFfn(const std::string& p, int inter) {
    const int H = c_.n_embd;
    return {Load(p + "gate_proj.weight", {inter, H}), Load(p + "up_proj.weight", {inter, H}),
            Load(p + "down_proj.weight", {H, inter}), inter};
  }

  Layer LoadLayer(const std::string& p, bool full) {
    const int H = c_.n_embd, Hq = c_.n_heads, Hkv = c_.n_heads_kv, D = c_.head_dim;
    const int Hk = c_.n_k_heads, Hv = c_.n_v_heads, Dk = c_.k_head_dim, Dv = c_.v_head_dim,
              K = c_.conv_kernel;
    const int conv_dim = 2 * Hk * Dk + Hv * Dv;
    Layer L;
    L.full = full;
    L.in_norm = Load(p + "input_layernorm.weight", {H});
    L.post_norm = Load(p + "post_attention_layernorm.weight", {H});
    if (full) {
      const std::string a = p + "self_attn.";
      L.attn = {Load(a + "q_proj.weight", {2 * Hq * D, H}),
                Load(a + "k_proj.weight", {Hkv * D, H}),
                Load(a + "v_proj.weight", {Hkv * D, H}),
                Load(a + "o_proj.weight", {H, Hq * D}),
                Load(a + "q_norm.weight", {D}),
                Load(a + "k_norm.weight", {D})};
    } else {
      const std::string g = p + "linear_attn.";
      L.gdn = {Load(g + "in_proj_qkvz.weight", {2 * Hk * Dk + 2 * Hv * Dv, H}),
               Load(g + "in_proj_ba.weight", {2 * Hv, H}),
               Load(g + "conv1d.weight", {conv_dim, 1, K}),
               Load(g + "dt_bias", {Hv}),
               Load(g + "A_log", {Hv}),
               Load(g + "norm.weight", {Dv}),
               Load(g + "out_proj.weight", {H, Hv * Dv})};
      L.state.conv.assign(Z(K - 1) * Z(conv_dim), 0.0);  // zeros at sequence start
      L.state.S.assign(Z(Hv) * Z(Dk) * Z(Dv), 0.0);
    }
    const std::string m = p + "mlp.";
    L.moe.router = Load(m + "gate.weight", {c_.n_experts, H});
    for (int e = 0; e < c_.n_experts; ++e)
      L.moe.experts.push_back(LoadFfn(m + "experts." + std::to_string(e) + ".", c_.moe_ffn));
    L.moe.shared = LoadFfn(m + "shared_expert.", c_.shared_ffn);
    L.moe.shared_gate = Load(m + "shared_expert_gate.weight", {1, H});
    return L;
  }

  // 3.4: h = x + Mixer(RMSNorm1(x)); x' = h + MoE(RMSNorm2(h)).
  void LayerForward(Layer& L, Vec& x, int pos) {
    const int H = c_.n_embd;
    Vec a = RmsNormZc(x.data(), H, L.in_norm.data(), Eps());
    Vec mix = L.full ? Attention(L.attn, c_, a.data(), 1, pos, L.kv)
                     : GdnToken(L.gdn, c_, a.data(), L.state);
    for (int i = 0; i < H; ++i) x[Z(i)] += mix[Z(i)];
    Vec b = RmsNormZc(x.data(), H, L.post_norm.data(), Eps());
    double gap = 0.0;
    Vec f = Moe(L.moe, b.data(), H, c_.n_experts, c_.n_experts_used, c_.norm_topk_prob, &gap);
    min_gap_ = std::min(min_gap_, gap);
    for (int i = 0; i < H; ++i) x[Z(i)] += f[Z(i)];
  }

  RefTensors tensors_;
  const ModelConfig& c_;
  Vec embed_, lm_head_, final_norm_;
  std::vector<Layer> layers_;
  Vec mtp_fc_, mtp_norm_emb_, mtp_norm_hid_, mtp_norm_;
  Layer mtp_layer_;
  int pos_ = 0, mtp_pos_ = 0;
  double min_gap_ = 1.0;
};

}  // namespace lockstep::cpu::ref
