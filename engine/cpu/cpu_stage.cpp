#include "cpu/cpu_stage.h"

#include <algorithm>
#include <cstring>

#include "cpu/attention.h"
#include "cpu/gdn.h"
#include "cpu/matmul.h"
#include "cpu/moe.h"
#include "cpu/norm.h"
#include "cpu/op_report.h"
#include "cpu/rope.h"
#include "lockstep/engine/trace_ring.h"
#include "util/check.h"

namespace lockstep {

namespace {
inline std::size_t U(int x) { return static_cast<std::size_t>(x); }
cpu::MatmulKind KindOf(ForwardMode m, bool q8) {
  return cpu::WithQuantDot(
      m == ForwardMode::kPrefill ? cpu::MatmulKind::kGemm : cpu::MatmulKind::kInvariant, q8);
}
}  // namespace

CpuStageSession::CpuStageSession(const StageParams& params)
    : StageSession(params.index, params.n_stages, params.layer_begin, params.layer_end),
      w_(*params.weights),
      c_(params.weights->config),
      cfg_(*params.cfg),
      q8_(params.cfg->quant_dot == "ggml"),
      pool_(params.pool),
      rope_(std::make_unique<cpu::Rope>(c_.rotary_dim, c_.rope_theta)) {
  for (int il = params.layer_begin; il < params.layer_end; ++il) {
    const LayerWeights& lw = w_.layers[U(il)];
    if (lw.moe) {
      moe_local_.push_back(static_cast<int>(moe_layers_.size()));
      moe_layers_.push_back(il);
      expert_bytes_ = lw.ffn_moe.experts.empty() ? 0 : lw.ffn_moe.experts[0].bytes();
    } else {
      moe_local_.push_back(-1);
    }
  }
  has_mtp_ = is_last() && w_.mtp.present;
  max_slots_ = std::max(1, cfg_.slots);
  slots_.resize(U(max_slots_));
  slots_[0] = NewSlot();
  cur_ = slots_[0].get();
}

std::unique_ptr<CpuStageSession::SlotState> CpuStageSession::NewSlot() const {
  auto st = std::make_unique<SlotState>();
  for (int il = layer_begin(); il < layer_end(); ++il) {
    if (w_.layers[U(il)].type == LayerType::kFullAttention) {
      st->kv.push_back(
          std::make_unique<KvCache>(c_.n_heads_kv, c_.head_dim, cfg_.kv_dtype, cfg_.kv_page_rows));
      st->gdn.push_back(nullptr);
    } else {
      st->kv.push_back(nullptr);
      st->gdn.push_back(std::make_unique<GdnState>(c_.conv_dim(), c_.conv_kernel, c_.n_v_heads,
                                                   c_.k_head_dim, c_.v_head_dim));
    }
  }
  const int n_exp = std::max(c_.n_experts, 0);
  st->experts =
      std::make_unique<ExpertCache>(moe_layers_, n_exp, cfg_.ResidentExperts(n_exp), expert_bytes_);
  if (has_mtp_) {
    st->mtp_kv =
        std::make_unique<KvCache>(c_.n_heads_kv, c_.head_dim, cfg_.kv_dtype, cfg_.kv_page_rows);
    // The MTP layer's experts count in their own map, keyed after the main layers.
    st->mtp_experts = std::make_unique<ExpertCache>(std::vector<int>{c_.n_layers}, n_exp,
                                                    cfg_.ResidentExperts(n_exp), expert_bytes_);
  }
  return st;
}

CpuStageSession::~CpuStageSession() = default;

void CpuStageSession::UseSlot(int s) {
  LOCKSTEP_CHECK(s >= 0 && s < max_slots_) << "slot " << s << " of " << max_slots_;
  if (!slots_[U(s)]) slots_[U(s)] = NewSlot();
  cur_ = slots_[U(s)].get();
  cur_index_ = s;
}

Status CpuStageSession::ResetSlot(int s) {
  LOCKSTEP_CHECK(s >= 0 && s < max_slots_) << "slot " << s << " of " << max_slots_;
  slots_[U(s)] = NewSlot();
  if (s == cur_index_) cur_ = slots_[U(s)].get();
  return Status::Ok();
}

KvCache* CpuStageSession::kv(int il) {
  if (il < layer_begin() || il >= layer_end()) return nullptr;
  return cur_->kv[U(il - layer_begin())].get();
}

GdnState* CpuStageSession::gdn(int il) {
  if (il < layer_begin() || il >= layer_end()) return nullptr;
  return cur_->gdn[U(il - layer_begin())].get();
}

void CpuStageSession::LayerForward(const LayerWeights& lw, int local_moe, Activation& act,
                                   ForwardMode mode, KvCache* kv, GdnState* gdn) {
  ExpertCache* cache = local_moe >= 0 ? cur_->experts.get() : cur_->mtp_experts.get();
  const std::vector<LayerSeq> seq = {LayerSeq{0, act.T, act.p, mode, kv, gdn, cache}};
  LayerRows(lw, local_moe, act.hidden.data(), act.T, seq, KindOf(mode, q8_));
}

void CpuStageSession::CountProduct(const Mat& m, int rows) {
  if (m.rows <= 0 || rows <= 0) return;
  work_.weight_bytes += m.bytes();
  work_.flops += 2ull * static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(m.rows) *
                 static_cast<std::uint64_t>(m.cols);
}

StepWork CpuStageSession::TakeStepWork() {
  const StepWork w = work_;
  work_ = StepWork{};
  return w;
}

void CpuStageSession::LayerMixer(const LayerWeights& lw, float* x, int n_rows,
                                 const std::vector<LayerSeq>& seqs, cpu::MatmulKind kind, float* a,
                                 float* mix) {
  const int T = n_rows, h = c_.n_embd;
  const int n_seqs = static_cast<int>(seqs.size());
  // The per-row norms (and the residual add) split over the pool: they ran on the calling thread
  // while the others waited (~1 us a row, twice per layer). Rows are independent: same bits.
  auto rows = [&](auto&& fn) {
    auto body = [&](std::size_t b, std::size_t e) {
      for (std::size_t t = b; t < e; ++t) fn(t);
    };
    if (pool_)
      pool_->ParallelFor(U(T), body, 4);
    else
      body(0, U(T));
  };
  rows([&](std::size_t t) {
    cpu::RmsNormZc(x + t * U(h), h, lw.input_norm, c_.rms_norm_eps, a + t * U(h));
  });
  cpu::ReportOp(OpId::kAttnNorm, a, 0, T, U(h));
  if (lw.type == LayerType::kFullAttention) {
    std::vector<cpu::AttnSeq> at;
    for (const LayerSeq& sq : seqs) at.push_back(cpu::AttnSeq{sq.row0, sq.T, sq.p, sq.kv});
    cpu::AttentionForwardSeqs(lw.attn, c_, *rope_, a, T, at.data(), n_seqs, kind, pool_, arena_,
                              mix);
    for (const Mat* m : {&lw.attn.q_proj, &lw.attn.k_proj, &lw.attn.v_proj, &lw.attn.o_proj})
      CountProduct(*m, T);
  } else {
    std::vector<cpu::GdnSeq> gs;
    for (const LayerSeq& sq : seqs)
      gs.push_back(cpu::GdnSeq{
          sq.row0, sq.T, sq.gdn,
          sq.mode == ForwardMode::kPrefill ? cpu::GdnMode::kPrefill : cpu::GdnMode::kVerify});
    cpu::GdnForwardSeqs(lw.gdn, c_, a, T, gs.data(), n_seqs, kind, pool_, arena_, mix);
    for (const Mat* m : {&lw.gdn.in_proj_qkvz, &lw.gdn.in_proj_ba, &lw.gdn.out_proj})
      CountProduct(*m, T);
  }
  rows([&](std::size_t t) {
    float* xt = x + t * U(h);
    const float* mt = mix + t * U(h);
    for (int i = 0; i < h; ++i) xt[i] += mt[i];
    cpu::RmsNormZc(xt, h, lw.post_norm, c_.rms_norm_eps, a + t * U(h));
  });
  cpu::ReportOp(OpId::kAttnResidual, x, 0, T, U(h));
  cpu::ReportOp(OpId::kFfnNorm, a, 0, T, U(h));
}

void CpuStageSession::LayerParts(const LayerWeights& lw, int local_moe,
                                 const std::vector<RowsPart>& parts) {
  Arena::Scope scope(arena_);
  const std::size_t h = U(c_.n_embd);
  std::vector<float*> a(parts.size()), mix(parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const RowsPart& pt = parts[i];
    a[i] = arena_.Alloc(U(pt.n_rows) * h);
    mix[i] = arena_.Alloc(U(pt.n_rows) * h);
    cpu::SetOpRow0(pt.row0);
    LayerMixer(lw, pt.x, pt.n_rows, *pt.seqs, pt.kind, a[i], mix[i]);
  }
  if (lw.moe) {
    std::vector<std::vector<cpu::MoeSeq>> ms(parts.size());
    std::vector<cpu::MoePart> mp;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      for (const LayerSeq& sq : *parts[i].seqs)
        ms[i].push_back(cpu::MoeSeq{sq.row0, sq.T, sq.experts});
      mp.push_back(cpu::MoePart{a[i], parts[i].n_rows, ms[i].data(), static_cast<int>(ms[i].size()),
                                parts[i].kind, mix[i], parts[i].row0});
    }
    cpu::MoeWork mw;
    cpu::MoeForwardParts(lw.ffn_moe, c_, mp.data(), static_cast<int>(mp.size()), pool_, arena_,
                         local_moe >= 0 ? local_moe : 0, &mw);
    const MoeWeights& m = lw.ffn_moe;
    for (const RowsPart& pt : parts) {
      CountProduct(m.router, pt.n_rows);
      for (const Mat* f : {&m.shared.gate, &m.shared.up, &m.shared.down})
        CountProduct(*f, pt.n_rows);
      if (m.shared.gate.rows > 0) {  // the shared expert's gate vector, f32 [H]
        work_.weight_bytes += h * sizeof(float);
        work_.flops += 2ull * static_cast<std::uint64_t>(pt.n_rows) * h;
      }
    }
    if (!m.experts.empty()) {
      const FfnWeights& e0 = m.experts[0];  // every routed expert has the same shapes
      const std::uint64_t params = static_cast<std::uint64_t>(e0.gate.rows) * e0.gate.cols +
                                   static_cast<std::uint64_t>(e0.up.rows) * e0.up.cols +
                                   static_cast<std::uint64_t>(e0.down.rows) * e0.down.cols;
      work_.weight_bytes += static_cast<std::uint64_t>(mw.experts) *
                            (e0.gate.bytes() + e0.up.bytes() + e0.down.bytes());
      work_.flops += 2ull * static_cast<std::uint64_t>(mw.slots) * params;
    }
  } else {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      cpu::FfnForward(lw.ffn_dense, a[i], parts[i].n_rows, parts[i].kind, pool_, arena_, mix[i]);
      cpu::SetOpRow0(parts[i].row0);
      cpu::ReportOp(OpId::kFfnOut, mix[i], 0, parts[i].n_rows, h);
      for (const Mat* f : {&lw.ffn_dense.gate, &lw.ffn_dense.up, &lw.ffn_dense.down})
        CountProduct(*f, parts[i].n_rows);
    }
  }
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::size_t n = U(parts[i].n_rows) * h;
    for (std::size_t j = 0; j < n; ++j) parts[i].x[j] += mix[i][j];
    cpu::SetOpRow0(parts[i].row0);
    cpu::ReportOp(OpId::kResidual, parts[i].x, 0, parts[i].n_rows, h);
  }
}

void CpuStageSession::LayerRows(const LayerWeights& lw, int local_moe, float* x, int n_rows,
                                const std::vector<LayerSeq>& seqs, cpu::MatmulKind kind) {
  LayerParts(lw, local_moe, {RowsPart{x, n_rows, &seqs, kind, 0}});
}

Status CpuStageSession::Embed(const std::int32_t* tokens, int T, float* x) const {
  const int h = c_.n_embd;
  for (int t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c_.n_vocab)
      return Status::InvalidArgument("token", "id " + std::to_string(tokens[t]) +
                                                  " outside the vocabulary (size " +
                                                  std::to_string(c_.n_vocab) + ")");
    w_.embed.RowToF32(tokens[t], x + U(t) * U(h));
  }
  return Status::Ok();
}

Status CpuStageSession::Forward(ForwardMode mode, const std::int32_t* tokens, Activation& act) {
  LOCKSTEP_CHECK_EQ(act.p, cur_->position);
  const int T = act.T, h = c_.n_embd;
  cpu::OpTapScope tap(op_sink_, index());
  if (is_first()) {
    act.hidden.resize(U(T) * U(h));
    LOCKSTEP_RETURN_IF_ERROR(Embed(tokens, T, act.hidden.data()));
    cpu::ReportOp(OpId::kEmbed, act.hidden.data(), 0, T, U(h));
  }
  LOCKSTEP_CHECK_EQ(act.hidden.size(), U(T) * U(h));
  LOCKSTEP_TRACE(TraceEventId::kStageBegin, index(), static_cast<std::uint16_t>(T));
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const int l = il - layer_begin();
    LOCKSTEP_TRACE(TraceEventId::kLayerBegin, il, static_cast<std::uint16_t>(index()));
    cpu::SetOpLayer(il);
    LayerForward(w_.layers[U(il)], moe_local_[U(l)], act, mode, cur_->kv[U(l)].get(),
                 cur_->gdn[U(l)].get());
    LOCKSTEP_TRACE(TraceEventId::kLayerEnd, il, static_cast<std::uint16_t>(index()));
  }
  LOCKSTEP_TRACE(TraceEventId::kStageEnd, index(), static_cast<std::uint16_t>(T));
  if (mode == ForwardMode::kPrefill) {
    for (auto& kv : cur_->kv)
      if (kv) kv->Commit(act.p + T);
    cur_->position += T;
    cur_->pending_rows = 0;
  } else {
    cur_->pending_rows = T;
  }
  return Status::Ok();
}

void CpuStageSession::Commit(int n) {
  SlotState& st = *cur_;
  LOCKSTEP_CHECK(n >= 1 && n <= st.pending_rows) << "commit " << n << " of " << st.pending_rows;
  for (auto& kv : st.kv)
    if (kv) kv->Commit(st.position + n);
  for (auto& g : st.gdn)
    if (g) g->CommitSteps(n);
  st.position += n;
  st.pending_rows = 0;
}

void CpuStageSession::FinalNorm(const Activation& act, float* normed) {
  LOCKSTEP_CHECK(is_last());
  cpu::OpTapScope tap(op_sink_, index());
  const int h = c_.n_embd;
  for (int t = 0; t < act.T; ++t)
    cpu::RmsNormZc(act.hidden.data() + U(t) * U(h), h, w_.final_norm, c_.rms_norm_eps,
                   normed + U(t) * U(h));
  cpu::ReportOp(OpId::kFinalNorm, normed, 0, act.T, U(h));
}

void CpuStageSession::Logits(const Activation& act, float* normed, float* logits) {
  FinalNorm(act, normed);
  cpu::OpTapScope tap(op_sink_, index());
  cpu::Matmul(cpu::WithQuantDot(cpu::MatmulKind::kInvariant, q8_), normed, act.T, w_.lm_head,
              logits, pool_);
  cpu::ReportOp(OpId::kLmHead, logits, 0, act.T, U(c_.n_vocab));
  CountProduct(w_.lm_head, act.T);
}

void CpuStageSession::MtpForward(const float* hid, const std::int32_t* next_tokens, int p, int T,
                                 ForwardMode mode, float* m, float* logits, int n_logits) {
  LOCKSTEP_CHECK(has_mtp());
  Arena::Scope scope(arena_);
  cpu::OpTapScope tap(op_sink_, index());
  cpu::SetOpLayer(c_.n_layers);  // the MTP layer is keyed after the main layers
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
  cpu::ReportOp(OpId::kMtpIn, cat, 0, T, U(2 * h));
  cpu::Matmul(KindOf(mode, q8_), cat, T, mw.fc, act.hidden.data(), pool_);
  cpu::ReportOp(OpId::kMtpFc, act.hidden.data(), 0, T, U(h));
  CountProduct(mw.fc, T);
  LayerForward(mw.layer, -1, act, mode, cur_->mtp_kv.get(), nullptr);
  for (int t = 0; t < T; ++t)
    cpu::RmsNormZc(act.hidden.data() + U(t) * U(h), h, mw.norm, c_.rms_norm_eps, m + U(t) * U(h));
  cpu::ReportOp(OpId::kMtpNorm, m, 0, T, U(h));
  n_logits = std::min(n_logits, T);
  cpu::Matmul(cpu::WithQuantDot(cpu::MatmulKind::kInvariant, q8_), m + U(T - n_logits) * U(h),
              n_logits, w_.lm_head, logits, pool_);
  cpu::ReportOp(OpId::kMtpLmHead, logits, T - n_logits, n_logits, U(c_.n_vocab));
  CountProduct(w_.lm_head, n_logits);
}

void CpuStageSession::MtpCommit(int rows) { cur_->mtp_kv->Commit(rows); }

// More than one group. batch_invariant (fuse_all off): the verify groups (rows [0, verify_rows))
// share kInvariant products, so each of their rows keeps the bits it gets alone; each prefill
// chunk runs this stage's single-sequence layers on its own slot and rows, because its kGemm
// products (and the chunked GDN form) depend on the chunk's row count. fuse_all: every group in
// one pass of kGemm products over all rows, cores per group in their own mode.
Status CpuStageSession::ForwardStep(const StepPlan& plan, const std::int32_t* tokens,
                                    Activation& act) {
  if (plan.groups.size() == 1) return StageSession::ForwardStep(plan, tokens, act);
  const std::size_t h = U(c_.n_embd);
  const int rows = plan.rows();
  if (is_first()) {
    act.hidden.resize(U(rows) * h);
    LOCKSTEP_RETURN_IF_ERROR(Embed(tokens, rows, act.hidden.data()));
  }
  LOCKSTEP_CHECK_EQ(act.hidden.size(), U(rows) * h);
  cpu::OpTapScope tap(op_sink_, index());
  if (is_first()) cpu::ReportOp(OpId::kEmbed, act.hidden.data(), 0, rows, h);
  std::vector<const RowGroup*> fused, own;
  int n_fused = 0;
  for (const RowGroup& g : plan.groups) {
    if (plan.fuse_all || g.mode == ForwardMode::kVerify) {
      LOCKSTEP_CHECK_EQ(g.row0, n_fused) << "fused groups come first, rows contiguous";
      fused.push_back(&g);
      n_fused += g.T;
    } else {
      own.push_back(&g);
    }
  }
  const int prev = slot();
  LOCKSTEP_TRACE(TraceEventId::kStageBegin, index(), static_cast<std::uint16_t>(rows));
  FusedStep(
      fused, own, act.hidden.data(), n_fused,
      cpu::WithQuantDot(plan.fuse_all ? cpu::MatmulKind::kGemm : cpu::MatmulKind::kInvariant, q8_));
  LOCKSTEP_TRACE(TraceEventId::kStageEnd, index(), static_cast<std::uint16_t>(rows));
  UseSlot(prev);
  act.p = 0;
  act.T = rows;
  return Status::Ok();
}

// Layer by layer, every group's layer in one LayerParts call: the fused rows as one part, each
// own-group chunk as a part of its own (exactly the layer its single-sequence Forward runs, on
// its own rows of x). A chunk's routed experts then run right after the fused rows' use of the
// same expert, in the same work item, reading its weights from cache (a 32-row chunk beside 16
// decoding rows cost ~1.5 decode steps when it ran after the whole stage, streaming every
// expert from memory a second time).
void CpuStageSession::FusedStep(const std::vector<const RowGroup*>& groups,
                                const std::vector<const RowGroup*>& own, float* x, int n_rows,
                                cpu::MatmulKind kind) {
  std::vector<SlotState*> st, ost;
  for (const RowGroup* g : groups) {
    UseSlot(g->slot);  // builds the slot's state on first use
    LOCKSTEP_CHECK_EQ(g->p, cur_->position) << "slot " << g->slot;
    st.push_back(cur_);
  }
  for (const RowGroup* g : own) {
    UseSlot(g->slot);
    LOCKSTEP_CHECK_EQ(g->p, cur_->position) << "slot " << g->slot;
    ost.push_back(cur_);
  }
  const std::size_t h = U(c_.n_embd);
  std::vector<LayerSeq> seqs(groups.size());
  std::vector<std::vector<LayerSeq>> one(own.size());
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const std::size_t l = U(il - layer_begin());
    const LayerWeights& lw = w_.layers[U(il)];
    LOCKSTEP_TRACE(TraceEventId::kLayerBegin, il, static_cast<std::uint16_t>(index()));
    cpu::SetOpLayer(il);
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const RowGroup& g = *groups[i];
      seqs[i] = LayerSeq{
          g.row0, g.T, g.p, g.mode, st[i]->kv[l].get(), st[i]->gdn[l].get(), st[i]->experts.get()};
    }
    std::vector<RowsPart> parts;
    if (!groups.empty()) parts.push_back(RowsPart{x, n_rows, &seqs, kind, 0});
    for (std::size_t i = 0; i < own.size(); ++i) {
      const RowGroup& g = *own[i];
      SlotState& s = *ost[i];
      ExpertCache* cache = moe_local_[l] >= 0 ? s.experts.get() : s.mtp_experts.get();
      one[i] = {LayerSeq{0, g.T, g.p, g.mode, s.kv[l].get(), s.gdn[l].get(), cache}};
      parts.push_back(RowsPart{x + U(g.row0) * h, g.T, &one[i], KindOf(g.mode, q8_), g.row0});
    }
    LayerParts(lw, moe_local_[l], parts);
    LOCKSTEP_TRACE(TraceEventId::kLayerEnd, il, static_cast<std::uint16_t>(index()));
  }
  auto finish = [](const RowGroup& g, SlotState& s) {
    if (g.mode == ForwardMode::kPrefill) {
      for (auto& kv : s.kv)
        if (kv) kv->Commit(g.p + g.T);
      s.position += g.T;
      s.pending_rows = 0;
    } else {
      s.pending_rows = g.T;
    }
  };
  for (std::size_t i = 0; i < groups.size(); ++i) finish(*groups[i], *st[i]);
  for (std::size_t i = 0; i < own.size(); ++i) finish(*own[i], *ost[i]);
}

void CpuStageSession::StepLogits(const StepPlan& plan, const Activation& act, float* normed,
                                 float* logits) {
  if (plan.groups.size() == 1) return StageSession::StepLogits(plan, act, normed, logits);
  FinalNorm(act, normed);
  // Verify groups come first, so their rows are [0, verify_rows); lm_head is batch-invariant.
  const int n_verify = plan.verify_rows();
  if (n_verify > 0) {
    cpu::OpTapScope tap(op_sink_, index());
    cpu::Matmul(cpu::WithQuantDot(cpu::MatmulKind::kInvariant, q8_), normed, n_verify, w_.lm_head,
                logits, pool_);
    cpu::ReportOp(OpId::kLmHead, logits, 0, n_verify, U(c_.n_vocab));
    CountProduct(w_.lm_head, n_verify);
  }
}

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

Status CpuStageSession::Graft(const lockstep::Graft& g) {
  const bool mtp = g.item == ItemKind::kMtpK || g.item == ItemKind::kMtpV;
  if (g.item == ItemKind::kConvState || g.item == ItemKind::kSsmState) {
    GdnState* st = gdn(g.layer);
    const bool conv = g.item == ItemKind::kConvState;
    const std::size_t n = conv ? st->conv_size() : st->ssm_size();
    if (g.dtype != DType::kF32 || g.data.size() != n * sizeof(float))
      return Status::InvalidArgument("--graft '" + g.text + "'",
                                     "FROM holds " + std::to_string(g.data.size()) +
                                         " bytes, this run's item has " +
                                         std::to_string(n * sizeof(float)) + " (f32)");
    std::memcpy(conv ? st->conv() : st->ssm(), g.data.data(), g.data.size());
    return Status::Ok();
  }
  KvCache* c = mtp ? mtp_kv() : kv(g.layer);
  const int committed = c->rows_committed();
  if (g.rows != committed)
    return Status::InvalidArgument(
        "--graft '" + g.text + "'",
        "FROM holds " + std::to_string(g.rows) + " rows at window " + std::to_string(g.window) +
            " " + CheckpointPointName(g.point) + ", this run has " + std::to_string(committed) +
            " committed rows there (the runs' paths differ before this point)");
  const int which = g.item == ItemKind::kV || g.item == ItemKind::kMtpV ? 1 : 0;
  c->OverwriteRows(which, 0, committed, g.data.data(),
                   g.scales.empty() ? nullptr : g.scales.data());
  return Status::Ok();
}

Result<StageSessionPtr> CpuBackend::CreateStage(const StageParams& params) {
  return StageSessionPtr(std::make_unique<CpuStageSession>(params));
}

Result<TransportPtr> CpuBackend::CreateTransport(int n_stages) {
  return TransportPtr(std::make_unique<InProcessTransport>(n_stages));
}

std::string CpuBackend::Describe() const { return "cpu, " + std::to_string(threads_) + " threads"; }

}  // namespace lockstep
