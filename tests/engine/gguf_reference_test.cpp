// Quantised GGUF models against the float64 reference (issue 26, Must show 3, second half):
// Q8_0 / Q4_K / Q6_K files of a synthetic preset, run by the engine and by the f64 reference
// forward of reference_model.h on the file's dequantised weights, give the same greedy tokens and
// logits, final-normed hidden states and MTP outputs within NRMSE 1e-5.
//
// The reference reads the file here, independently of the engine's loader: GgufFile (the header
// parser, tested by gguf_malformed_test.cpp) gives each tensor's bytes, its blocks are dequantised
// below in double from ggml's block layouts (ggml-common.h: block_q8_0, block_q4_K, block_q6_K;
// not through quant.h), and llama.cpp's qwen3next layout is mapped back to the Hugging Face
// names here (not through gguf.cpp): attn_qkv + attn_gate regrouped per key head, ssm_a as
// log(-ssm_a), the 1 + w norms minus 1, stacked experts sliced. A wrong scale, nibble or row
// order in the engine's dequantiser or in its layout reader is therefore a large error here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "engine/reference_model.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/gguf.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/stage.h"
#include "lockstep/engine/weights.h"
#include "test_util.h"

namespace lockstep {
namespace {

using cpu::ref::RefModel;
using cpu::ref::RefTensor;
using cpu::ref::Vec;

// Issue 26's bound for a quantised model against the f64 reference on its dequantised weights.
constexpr double kNrmseBound = 1e-5;

std::size_t Z(std::int64_t x) { return static_cast<std::size_t>(x); }

// ---- ggml's blocks, dequantised in double (every value below is exact in double) ----

double Half(const std::uint8_t* p) {
  const unsigned h = p[0] | (p[1] << 8);
  const int e = static_cast<int>((h >> 10) & 31), m = static_cast<int>(h & 1023);
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  EXPECT_NE(e, 31) << "an f16 scale is Inf or NaN";
  return (h & 0x8000) ? -mag : mag;
}

// block_q8_0: f16 d, int8 q[32]; w = d * q.
void Q8_0(const std::uint8_t* b, double* y) {
  const double d = Half(b);
  for (int l = 0; l < 32; ++l) y[l] = d * static_cast<std::int8_t>(b[2 + l]);
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j of a Q4_K block.
void ScaleMinK4(int j, const std::uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// block_q4_K: f16 d, f16 dmin, scales[12], qs[128]; 64 elements per 32 bytes of qs (low nibbles
// first); w = d * sc * q - dmin * m.
void Q4_K(const std::uint8_t* b, double* y) {
  const double d = Half(b), dmin = Half(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    int sc0, m0, sc1, m1;
    ScaleMinK4(is, scales, &sc0, &m0);
    ScaleMinK4(is + 1, scales, &sc1, &m1);
    for (int l = 0; l < 32; ++l) y[j + l] = d * sc0 * (q[l] & 0xF) - dmin * m0;
    for (int l = 0; l < 32; ++l) y[j + 32 + l] = d * sc1 * (q[l] >> 4) - dmin * m1;
  }
}

// block_q6_K: ql[128], qh[64], int8 scales[16], f16 d; w = d * scale * (q - 32).
void Q6_K(const std::uint8_t* b, double* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const double d = Half(b + 208);
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[n + l] = d * sc[is] * q1;
      y[n + l + 32] = d * sc[is + 2] * q2;
      y[n + l + 64] = d * sc[is + 4] * q3;
      y[n + l + 96] = d * sc[is + 6] * q4;
    }
}

// Every element of a GGUF tensor in double, in the file's order.
Vec Dequantise(const GgufTensor& t) {
  std::size_t n = 1;
  for (auto d : t.ne) n *= Z(static_cast<std::int64_t>(d));
  Vec y(n);
  const auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
  auto blocks = [&](std::size_t elems, std::size_t bytes, void (*f)(const std::uint8_t*, double*)) {
    EXPECT_EQ(t.nbytes, n / elems * bytes) << t.name;
    for (std::size_t i = 0; i < n / elems; ++i) f(p + i * bytes, y.data() + i * elems);
  };
  switch (static_cast<GgmlType>(t.type)) {
    case GgmlType::kF32:
      for (std::size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        y[i] = f;
      }
      break;
    case GgmlType::kBF16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t u = static_cast<std::uint32_t>(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        y[i] = f;
      }
      break;
    case GgmlType::kF16:
      for (std::size_t i = 0; i < n; ++i) y[i] = Half(p + 2 * i);
      break;
    case GgmlType::kQ8_0:
      blocks(32, 34, Q8_0);
      break;
    case GgmlType::kQ4_K:
      blocks(256, 144, Q4_K);
      break;
    case GgmlType::kQ6_K:
      blocks(256, 210, Q6_K);
      break;
    default:
      ADD_FAILURE() << t.name << ": type " << GgmlTypeName(t.type) << " in a synthetic GGUF";
  }
  return y;
}

// ---- llama.cpp's qwen3next layout read back as Hugging Face tensors ----

class GgufAsHf {
 public:
  GgufAsHf(const GgufFile& f, const ModelConfig& c) : f_(f), c_(c) {}

  std::optional<RefTensor> operator()(const std::string& name) const {
    if (name == "model.embed_tokens.weight") return Plain("token_embd.weight");
    if (name == "lm_head.weight") return Plain("output.weight");
    if (name == "model.norm.weight") return Norm("output_norm.weight");
    const std::string nx = Blk(c_.n_layers) + "nextn.";
    if (name == "mtp.fc.weight") return Plain(nx + "eh_proj.weight");
    if (name == "mtp.pre_fc_norm_embedding.weight") return Norm(nx + "enorm.weight");
    if (name == "mtp.pre_fc_norm_hidden.weight") return Norm(nx + "hnorm.weight");
    if (name == "mtp.norm.weight") return Norm(nx + "shared_head_norm.weight");
    const std::string mtp = "mtp.layers.0.";
    if (name.rfind(mtp, 0) == 0) return InLayer(name.substr(mtp.size()), c_.n_layers);
    int il = -1, used = 0;
    if (std::sscanf(name.c_str(), "model.layers.%d.%n", &il, &used) == 1 && used > 0)
      return InLayer(name.substr(Z(used)), il);
    return std::nullopt;
  }

 private:
  static std::string Blk(int il) { return "blk." + std::to_string(il) + "."; }

  const GgufTensor& T(const std::string& name) const {
    const GgufTensor* t = f_.Find(name);
    EXPECT_NE(t, nullptr) << "GGUF tensor '" << name << "' missing";
    static const GgufTensor kNone;
    return t ? *t : kNone;
  }
  std::optional<RefTensor> Plain(const std::string& gg) const {
    const GgufTensor& t = T(gg);
    RefTensor r;
    for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it)
      r.shape.push_back(static_cast<std::int64_t>(*it));
    r.values = Dequantise(t);
    return r;
  }
  std::optional<RefTensor> Norm(const std::string& gg) const {  // stored as 1 + w
    auto r = Plain(gg);
    for (double& x : r->values) x -= 1.0;
    return r;
  }
  std::optional<RefTensor> InLayer(const std::string& s, int il) const;
  std::optional<RefTensor> Qkvz(int il) const;
  std::optional<RefTensor> Expert(const std::string& part, int e, int il) const;

  const GgufFile& f_;
  const ModelConfig& c_;
};

// GGUF: attn_qkv = [all q; all k; all v], attn_gate = all z. HF: [q_h; k_h; v_h; z_h] per key head.
std::optional<RefTensor> GgufAsHf::Qkvz(int il) const {
  const RefTensor qkv = *Plain(Blk(il) + "attn_qkv.weight");
  const RefTensor gate = *Plain(Blk(il) + "attn_gate.weight");
  const int H = c_.n_embd, Dk = c_.k_head_dim, Hk = c_.n_k_heads;
  const int Vg = c_.n_v_heads * c_.v_head_dim / Hk, kd = Hk * Dk;
  RefTensor r{{Hk * (2 * Dk + 2 * Vg), H}, {}};
  auto rows = [&](const RefTensor& src, int r0, int n) {
    r.values.insert(r.values.end(), src.values.begin() + static_cast<std::ptrdiff_t>(Z(r0) * Z(H)),
                    src.values.begin() + static_cast<std::ptrdiff_t>(Z(r0 + n) * Z(H)));
  };
  for (int h = 0; h < Hk; ++h) {
    rows(qkv, h * Dk, Dk);
    rows(qkv, kd + h * Dk, Dk);
    rows(qkv, 2 * kd + h * Vg, Vg);
    rows(gate, h * Vg, Vg);
  }
  return r;
}

// ffn_{part}_exps [E, rows, cols]: expert e's [rows, cols].
std::optional<RefTensor> GgufAsHf::Expert(const std::string& part, int e, int il) const {
  RefTensor all = *Plain(Blk(il) + "ffn_" + part + "_exps.weight");
  const std::size_t per = all.values.size() / Z(all.shape[0]);
  RefTensor r{{all.shape[1], all.shape[2]}, {}};
  r.values.assign(all.values.begin() + static_cast<std::ptrdiff_t>(per * Z(e)),
                  all.values.begin() + static_cast<std::ptrdiff_t>(per * Z(e + 1)));
  return r;
}

std::optional<RefTensor> GgufAsHf::InLayer(const std::string& s, int il) const {
  const std::string g = Blk(il);
  static const std::map<std::string, std::string> kPlain = {
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"linear_attn.in_proj_ba.weight", "ssm_ba.weight"},
      {"linear_attn.dt_bias", "ssm_dt.bias"},
      {"linear_attn.norm.weight", "ssm_norm.weight"},  // plain weight: not 1 + w
      {"linear_attn.out_proj.weight", "ssm_out.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"}};
  static const std::map<std::string, std::string> kNorm = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"}};
  if (auto it = kPlain.find(s); it != kPlain.end()) return Plain(g + it->second);
  if (auto it = kNorm.find(s); it != kNorm.end()) return Norm(g + it->second);
  if (s == "linear_attn.in_proj_qkvz.weight") return Qkvz(il);
  if (s == "linear_attn.conv1d.weight") {  // GGUF squeezes [conv_dim, 1, K] to ne [K, conv_dim]
    auto r = Plain(g + "ssm_conv1d.weight");
    r->shape = {r->shape[0], 1, r->shape[1]};
    return r;
  }
  if (s == "linear_attn.A_log") {  // ssm_a = -exp(A_log)
    auto r = Plain(g + "ssm_a");
    for (double& x : r->values) x = std::log(-x);
    return r;
  }
  if (s == "mlp.shared_expert_gate.weight") {  // HF [1, H], GGUF ne [H]
    auto r = Plain(g + "ffn_gate_inp_shexp.weight");
    r->shape = {1, r->shape[0]};
    return r;
  }
  int e = -1, used = 0;
  char part[8] = {};
  if (std::sscanf(s.c_str(), "mlp.experts.%d.%4[a-z]_proj.weight%n", &e, part, &used) == 2 &&
      Z(used) == s.size())
    return Expert(part, e, il);
  return std::nullopt;
}

// ---- the comparison ----

std::string Init(const std::string& args, const std::string& name) {
  const std::string dir = test::NewDir(name);
  auto r = test::RunLockstep("model init " + args + " --out " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return dir;
}

double Nrmse(const std::string& what, const Vec& ref, const std::vector<float>& got) {
  std::vector<float> r(ref.begin(), ref.end());
  const double e = test::Nrmse(r, got);
  std::printf("[ nrmse    ] %-48s %.2e  (limit %.0e)\n", what.c_str(), e, kNrmseBound);
  EXPECT_LE(e, kNrmseBound) << what;
  return e;
}

int Argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }
int Argmax(const double* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// A preset cut whose widths are whole 256-blocks (hidden 512) in 4 layers (the 4th full attention)
// with 8 experts, so the f64 reference stays small. Routed experts' down_proj (128 wide) are not
// whole K-quant blocks and stay bf16 in Q4_K / Q6_K files (as the converter does); Q8_0 takes all.
constexpr const char* kBase = "--preset small --seed 11 --layers 4 --experts 8 --vocab 1024";
constexpr int kPromptLen = 12, kNew = 10;

void CheckAgainstReference(const std::string& quant) {
  SCOPED_TRACE(quant);
  const std::string st = Init(kBase, "gguf-ref-st");
  const std::string gg = Init(std::string(kBase) + " --format gguf --quant " + quant, "gguf-ref");
  auto cfg = ModelConfig::FromFile(st + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const ModelConfig& c = *cfg;
  auto file = GgufFile::Open(gg + "/model.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ(GgmlTypeName((*file)->Find("blk.0.ffn_up_exps.weight")->type), quant == "q8_0" ? "Q8_0"
                                                                           : quant == "q4_k"
                                                                               ? "Q4_K"
                                                                               : "Q6_K");
  auto w = ModelWeights::Load(gg + "/model.gguf");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const int H = c.n_embd, V = c.n_vocab;

  // The f64 reference: the prompt, then its own greedy tokens.
  RefModel ref(GgufAsHf(**file, c), c);
  std::vector<std::int32_t> seq = test::Tokens(kPromptLen, 21);
  for (auto& t : seq) t %= V;
  Vec ref_logits, ref_normed;
  for (int t = 0; t < kPromptLen + kNew - 1; ++t) {
    Vec h, lg;
    ref.Token(seq[Z(t)], &h, &lg);
    ref_normed.insert(ref_normed.end(), h.begin(), h.end());
    ref_logits.insert(ref_logits.end(), lg.begin(), lg.end());
    if (t >= kPromptLen - 1) seq.push_back(Argmax(lg.data(), V));
  }
  ASSERT_GT(ref.min_route_gap(), 1e-5) << "a routing decision is too close to a tie";
  const std::vector<std::int32_t> ref_new(seq.begin() + kPromptLen, seq.end());
  EXPECT_GE(std::set<std::int32_t>(ref_new.begin(), ref_new.end()).size(), 4u)
      << "the greedy continuation is degenerate: it would not test the tokens";
  const int n = static_cast<int>(ref_normed.size()) / H;

  // 1) The engine token by token (decode kernels) on the same tokens.
  EngineConfig ec;
  ec.model = gg + "/model.gguf";
  ec.stages = 2;
  ec.threads = 2;
  {
    auto eng = Engine::Create(ec, **w);
    ASSERT_TRUE(eng.ok()) << eng.status().ToString();
    std::vector<float> logits(Z(n) * Z(V)), normed(Z(n) * Z(H));
    std::vector<std::int32_t> greedy;
    for (int t = 0; t < n; ++t) {
      ASSERT_TRUE((*eng)
                      ->Verify(std::span<const std::int32_t>(&seq[Z(t)], 1),
                               logits.data() + Z(t) * Z(V), normed.data() + Z(t) * Z(H))
                      .ok());
      ASSERT_TRUE((*eng)->Commit(1).ok());
      if (t >= kPromptLen - 1) greedy.push_back(Argmax(logits.data() + Z(t) * Z(V), V));
    }
    EXPECT_EQ(greedy, ref_new) << "greedy tokens (token by token)";
    Nrmse(quant + " logits, " + std::to_string(n) + " positions", ref_logits, logits);
    Nrmse(quant + " final-normed hidden", ref_normed, normed);

    // The MTP module on the engine's hidden states (rows 0..5, verify kernels).
    StageSession& last = (*eng)->stage((*eng)->n_stages() - 1);
    ASSERT_TRUE(last.has_mtp());
    const int m_rows = 6;
    std::vector<float> m(Z(m_rows) * Z(H)), mlog(Z(m_rows) * Z(V));
    last.MtpForward(normed.data(), seq.data() + 1, 0, m_rows, ForwardMode::kVerify, m.data(),
                    mlog.data(), m_rows);
    Vec m_ref, mlog_ref;
    for (int p = 0; p < m_rows; ++p) {
      const Vec hd(normed.begin() + static_cast<std::ptrdiff_t>(Z(p) * Z(H)),
                   normed.begin() + static_cast<std::ptrdiff_t>(Z(p + 1) * Z(H)));
      Vec mr, lr;
      ref.Mtp(hd.data(), seq[Z(p) + 1], &mr, &lr);
      m_ref.insert(m_ref.end(), mr.begin(), mr.end());
      mlog_ref.insert(mlog_ref.end(), lr.begin(), lr.end());
    }
    Nrmse(quant + " MTP m (post mtp.norm)", m_ref, m);
    Nrmse(quant + " MTP logits", mlog_ref, mlog);
  }
  // 2) Generate: chunked prefill (GEMM kernels), then verify windows with MTP drafts.
  ec.prefill_chunk = 5;
  ec.spec = 3;
  ec.max_new = kNew;
  ec.ignore_eos = true;
  auto eng = Engine::Create(ec, **w);
  ASSERT_TRUE(eng.ok()) << eng.status().ToString();
  auto res = Generate(**eng, std::vector<std::int32_t>(seq.begin(), seq.begin() + kPromptLen));
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->output, ref_new) << "greedy tokens (generate: prefill chunks, MTP drafts)";
}

TEST(GgufReference, Q8_0MatchesFloat64Reference) { CheckAgainstReference("q8_0"); }
TEST(GgufReference, Q4_KMatchesFloat64Reference) { CheckAgainstReference("q4_k"); }
TEST(GgufReference, Q6_KMatchesFloat64Reference) { CheckAgainstReference("q6_k"); }

}  // namespace
}  // namespace lockstep
