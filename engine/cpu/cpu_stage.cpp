#include "cpu/cpu_stage.h"

#include <algorithm>
#include <cstring>

#include "cpu/attention.h"
#include "cpu/gdn.h"
#include "cpu/matmul.h"
#include "cpu/moe.h"
#include "cpu/norm.h"
#include "cpu/rope.h"
#include "lockstep/engine/trace_ring.h"
#include "util/check.h"

namespace lockstep {

namespace {
inline std::size_t U(int x) { return static_cast<std::size_t>(x); }
cpu::MatmulKind KindOf(ForwardMode m) {
  return m == ForwardMode::kPrefill ? cpu::MatmulKind::kGemm : cpu::MatmulKind::kInvariant;
}
}  // namespace

CpuStageSession::CpuStageSession(const StageParams& params)
    : StageSession(params.index, params.n_stages, params.layer_begin, params.layer_end),
      w_(*params.weights),
      c_(params.weights->config),
      pool_(params.pool),
      rope_(std::make_unique<cpu::Rope>(c_.rotary_dim, c_.rope_theta)) {
  const EngineConfig& cfg = *params.cfg;
  const int layer_begin = params.layer_begin, layer_end = params.layer_end;
  std::vector<int> moe_layers;
  std::uint64_t expert_bytes = 0;
  for (int il = layer_begin; il < layer_end; ++il) {
    const LayerWeights& lw = w_.layers[U(il)];
    if (lw.type == LayerType::kFullAttention) {
      kv_.push_back(
          std::make_unique<KvCache>(c_.n_heads_kv, c_.head_dim, cfg.kv_dtype, cfg.kv_page_rows));
      gdn_.push_back(nullptr);
    } else {
      kv_.push_back(nullptr);
      gdn_.push_back(std::make_unique<GdnState>(c_.conv_dim(), c_.conv_kernel, c_.n_v_heads,
                                                c_.k_head_dim, c_.v_head_dim));
    }
    if (lw.moe) {
      moe_local_.push_back(static_cast<int>(moe_layers.size()));
      moe_layers.push_back(il);
      expert_bytes = lw.ffn_moe.experts.empty() ? 0 : lw.ffn_moe.experts[0].bytes();
    } else {
      moe_local_.push_back(-1);
    }
  }
  const int n_exp = std::max(c_.n_experts, 0);
  experts_ =
      std::make_unique<ExpertCache>(moe_layers, n_exp, cfg.ResidentExperts(n_exp), expert_bytes);
  if (is_last() && w_.mtp.present) {
    mtp_kv_ = std::make_unique<KvCache>(c_.n_heads_kv, c_.head_dim, cfg.kv_dtype, cfg.kv_page_rows);
    // The MTP layer's experts count in their own map, keyed after the main layers.
    mtp_experts_ = std::make_unique<ExpertCache>(std::vector<int>{c_.n_layers}, n_exp,
                                                 cfg.ResidentExperts(n_exp), expert_bytes);
  }
}

CpuStageSession::~CpuStageSession() = default;

KvCache* CpuStageSession::kv(int il) {
  if (il < layer_begin() || il >= layer_end()) return nullptr;
  return kv_[U(il - layer_begin())].get();
}

GdnState* CpuStageSession::gdn(int il) {
  if (il < layer_begin() || il >= layer_end()) return nullptr;
  return gdn_[U(il - layer_begin())].get();
}

void CpuStageSession::LayerForward(const LayerWeights& lw, int local_moe, Activation& act,
                                   ForwardMode mode, KvCache* kv, GdnState* gdn) {
  Arena::Scope scope(arena_);
  const int T = act.T, h = c_.n_embd;
  const std::size_t n = U(T) * U(h);
  float* x = act.hidden.data();
  float* a = arena_.Alloc(n);
  float* mix = arena_.Alloc(n);
  for (int t = 0; t < T; ++t)
    cpu::RmsNormZc(x + U(t) * U(h), h, lw.input_norm, c_.rms_norm_eps, a + U(t) * U(h));
  const auto kind = KindOf(mode);
  if (lw.type == LayerType::kFullAttention) {
    cpu::AttentionForward(lw.attn, c_, *rope_, a, T, act.p, *kv, kind, pool_, arena_, mix);
  } else {
    cpu::GdnForward(lw.gdn, c_, a, T, *gdn,
                    mode == ForwardMode::kPrefill ? cpu::GdnMode::kPrefill : cpu::GdnMode::kVerify,
                    kind, pool_, arena_, mix);
  }
  for (std::size_t i = 0; i < n; ++i) x[i] += mix[i];
  for (int t = 0; t < T; ++t)
    cpu::RmsNormZc(x + U(t) * U(h), h, lw.post_norm, c_.rms_norm_eps, a + U(t) * U(h));
  if (lw.moe) {
    ExpertCache* cache = local_moe >= 0 ? experts_.get() : mtp_experts_.get();
    cpu::MoeForward(lw.ffn_moe, c_, a, T, kind, pool_, arena_, cache,
                    local_moe >= 0 ? local_moe : 0, mix);
  } else {
    cpu::FfnForward(lw.ffn_dense, a, T, kind, pool_, arena_, mix);
  }
  for (std::size_t i = 0; i < n; ++i) x[i] += mix[i];
}

Status CpuStageSession::Forward(ForwardMode mode, const std::int32_t* tokens, Activation& act) {
  LOCKSTEP_CHECK_EQ(act.p, position_);
  const int T = act.T, h = c_.n_embd;
  if (is_first()) {
    act.hidden.resize(U(T) * U(h));
    for (int t = 0; t < T; ++t) {
      if (tokens[t] < 0 || tokens[t] >= c_.n_vocab)
        return Status::InvalidArgument("token", "id " + std::to_string(tokens[t]) +
                                                    " outside the vocabulary (size " +
                                                    std::to_string(c_.n_vocab) + ")");
      w_.embed.RowToF32(tokens[t], act.hidden.data() + U(t) * U(h));
    }
  }
  LOCKSTEP_CHECK_EQ(act.hidden.size(), U(T) * U(h));
  LOCKSTEP_TRACE(TraceEventId::kStageBegin, index(), static_cast<std::uint16_t>(T));
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const int l = il - layer_begin();
    LOCKSTEP_TRACE(TraceEventId::kLayerBegin, il, static_cast<std::uint16_t>(index()));
    LayerForward(w_.layers[U(il)], moe_local_[U(l)], act, mode, kv_[U(l)].get(), gdn_[U(l)].get());
    LOCKSTEP_TRACE(TraceEventId::kLayerEnd, il, static_cast<std::uint16_t>(index()));
  }
  LOCKSTEP_TRACE(TraceEventId::kStageEnd, index(), static_cast<std::uint16_t>(T));
  if (mode == ForwardMode::kPrefill) {
    for (auto& kv : kv_)
      if (kv) kv->Commit(act.p + T);
    position_ += T;
    pending_rows_ = 0;
  } else {
    pending_rows_ = T;
  }
  return Status::Ok();
}

void CpuStageSession::Commit(int n) {
  LOCKSTEP_CHECK(n >= 1 && n <= pending_rows_) << "commit " << n << " of " << pending_rows_;
  for (auto& kv : kv_)
    if (kv) kv->Commit(position_ + n);
  for (auto& g : gdn_)
    if (g) g->CommitSteps(n);
  position_ += n;
  pending_rows_ = 0;
}

void CpuStageSession::FinalNorm(const Activation& act, float* normed) {
  LOCKSTEP_CHECK(is_last());
  const int h = c_.n_embd;
  for (int t = 0; t < act.T; ++t)
    cpu::RmsNormZc(act.hidden.data() + U(t) * U(h), h, w_.final_norm, c_.rms_norm_eps,
                   normed + U(t) * U(h));
}

void CpuStageSession::Logits(const Activation& act, float* normed, float* logits) {
  FinalNorm(act, normed);
  cpu::Matmul(cpu::MatmulKind::kInvariant, normed, act.T, w_.lm_head, logits, pool_);
}

void CpuStageSession::MtpForward(const float* hid, const std::int32_t* next_tokens, int p, int T,
                                 ForwardMode mode, float* m, float* logits, int n_logits) {
  LOCKSTEP_CHECK(has_mtp());
  Arena::Scope scope(arena_);
  const int h = c_.n_embd;
  const MtpWeights& mw = w_.mtp;
  float* cat = arena_.Alloc(U(T) * U(2 * h));
  for (int t = 0; t < T; ++t) {
    float* row = cat + U(t) * U(2 * h);
    w_.embed.RowToF32(next_tokens[t], row);
    cpu::RmsNormZc(row, h, mw.pre_fc_norm_embedding, c_.rms_norm_eps, row);
    cpu::RmsNormZc(hid + U(t) * U(h), h, mw.pre_fc_norm_hidden, c_.rms_norm_eps, row + h);
  }
  Activation act;
  act.p = p;
  act.T = T;
  act.hidden.resize(U(T) * U(h));
  cpu::Matmul(KindOf(mode), cat, T, mw.fc, act.hidden.data(), pool_);
  LayerForward(mw.layer, -1, act, mode, mtp_kv_.get(), nullptr);
  for (int t = 0; t < T; ++t)
    cpu::RmsNormZc(act.hidden.data() + U(t) * U(h), h, mw.norm, c_.rms_norm_eps, m + U(t) * U(h));
  n_logits = std::min(n_logits, T);
  cpu::Matmul(cpu::MatmulKind::kInvariant, m + U(T - n_logits) * U(h), n_logits, w_.lm_head, logits,
              pool_);
}

void CpuStageSession::MtpCommit(int rows) { mtp_kv_->Commit(rows); }

void CpuStageSession::Perturb(ItemKind item, int layer, float factor, Activation& act) {
  if (item == ItemKind::kK || item == ItemKind::kV) {
    kv(layer)->ScaleRows(item == ItemKind::kK ? 0 : 1, act.p, act.T, factor);
  } else if (item == ItemKind::kConvState || item == ItemKind::kSsmState) {
    GdnState* g = gdn(layer);
    const bool conv = item == ItemKind::kConvState;
    const std::size_t n = conv ? g->conv_size() : g->ssm_size();
    for (int t = 0; t < g->n_steps(); ++t) {
      float* x = conv ? g->step_conv(t) : g->step_ssm(t);
      for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
    }
  } else if (item == ItemKind::kHiddenOut) {
    for (float& x : act.hidden) x *= factor;
  }
}

Result<StageSessionPtr> CpuBackend::CreateStage(const StageParams& params) {
  return StageSessionPtr(std::make_unique<CpuStageSession>(params));
}

Result<TransportPtr> CpuBackend::CreateTransport(int n_stages) {
  return TransportPtr(std::make_unique<InProcessTransport>(n_stages));
}

std::string CpuBackend::Describe() const { return "cpu, " + std::to_string(threads_) + " threads"; }

}  // namespace lockstep
