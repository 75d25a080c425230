#include "cuda/cuda_stage.h"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/cuda_stage_impl.h"
#include "cuda/ops.h"
#include "util/check.h"

namespace lockstep::cuda {

using namespace detail;  // NOLINT: this file and the other cuda_*.cpp are one component

CudaStageSession::CudaStageSession(const StageParams& params, CudaBackend* backend, int device)
    : StageSession(params.index, params.n_stages, params.layer_begin, params.layer_end),
      w_(*params.weights),
      c_(params.weights->config),
      cfg_(*params.cfg),
      backend_(backend),
      device_(device),
      d_(std::make_unique<DeviceStageImpl>()) {}

CudaStageSession::~CudaStageSession() {
  if (d_ && d_->stream) {
    DeviceScope scope(device_);
    cudaStreamSynchronize(d_->s());
  }
}

Result<StageSessionPtr> CudaStageSession::Create(const StageParams& params, CudaBackend* backend,
                                                 int device) {
  std::unique_ptr<CudaStageSession> st(new CudaStageSession(params, backend, device));
  LOCKSTEP_RETURN_IF_ERROR(st->Init().WithContext("cuda stage " + std::to_string(params.index) +
                                                  " on device " + std::to_string(device)));
  return StageSessionPtr(std::move(st));
}

bool CudaStageSession::has_mtp() const { return d_->mtp_kv != nullptr; }
bool CudaStageSession::weights_bf16() const { return d_->weights_bf16; }

// ---- set-up (the weights are packed in cuda_weights.cpp) ----

namespace {

// The stage's stream, its timing events and the device position the kernels read (ops.h Pos).
Status MakeStreamAndEvents(DeviceStageImpl& d) {
  LOCKSTEP_ASSIGN_OR_RETURN(d.stream, MakeStream());
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_begin, MakeEvent(true));
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_in, MakeEvent(true));
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_start, MakeEvent(true));
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_done, MakeEvent(true));
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_up0, MakeEvent(true));
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_up1, MakeEvent(true));
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_copy0, MakeEvent(true));
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_copy1, MakeEvent(true));
  LOCKSTEP_ASSIGN_OR_RETURN(d.ev_consumed, MakeEvent(false));
  LOCKSTEP_ASSIGN_OR_RETURN(d.pos, DeviceBuffer::Alloc(sizeof(int), "position"));
  LOCKSTEP_CUDA_CHECK(cudaMemset(d.pos.get(), 0, sizeof(int)));
  return Status::Ok();
}

// RoPE inverse frequencies, exactly as cpu::Rope computes them.
Status UploadRopeFrequencies(const ModelConfig& c, DeviceStageImpl& d) {
  const int half = c.rotary_dim / 2;
  std::vector<float> inv(U(std::max(half, 1)), 0.0f);
  for (int i = 0; i < half; ++i)
    inv[U(i)] = 1.0f / std::pow(static_cast<float>(c.rope_theta),
                                static_cast<float>(2 * i) / static_cast<float>(c.rotary_dim));
  LOCKSTEP_ASSIGN_OR_RETURN(d.inv_freq,
                            DeviceBuffer::Alloc(inv.size() * sizeof(float), "RoPE frequencies"));
  LOCKSTEP_CUDA_CHECK(
      cudaMemcpy(d.inv_freq.get(), inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice));
  return Status::Ok();
}

// State: K/V caches and GDN checkpoints (zeros, like the CPU's).
Status AllocState(const ModelWeights& w, const EngineConfig& cfg, const StageWeightsSpec& spec,
                  DeviceStageImpl& d) {
  const ModelConfig& c = w.config;
  auto make_kv = [&]() {
    auto kv = std::make_unique<DKv>();
    kv->elem = dtype_size(cfg.kv_dtype);
    kv->mirror =
        std::make_unique<KvCache>(c.n_heads_kv, c.head_dim, cfg.kv_dtype, cfg.kv_page_rows);
    return kv;
  };
  for (int il = spec.layer_begin; il < spec.layer_end; ++il) {
    if (w.layers[U(il)].type == LayerType::kFullAttention) {
      d.kv.push_back(make_kv());
      d.gdn.push_back(nullptr);
    } else {
      d.kv.push_back(nullptr);
      auto g = std::make_unique<DGdn>();
      g->mirror = std::make_unique<GdnState>(c.conv_dim(), c.conv_kernel, c.n_v_heads, c.k_head_dim,
                                             c.v_head_dim);
      LOCKSTEP_ASSIGN_OR_RETURN(
          g->conv, DeviceBuffer::Alloc(g->mirror->conv_size() * sizeof(float), "GDN conv state"));
      LOCKSTEP_ASSIGN_OR_RETURN(g->ssm, DeviceBuffer::Alloc(g->mirror->ssm_size() * sizeof(float),
                                                            "GDN recurrent state"));
      LOCKSTEP_CUDA_CHECK(cudaMemset(g->conv.get(), 0, g->conv.bytes()));
      LOCKSTEP_CUDA_CHECK(cudaMemset(g->ssm.get(), 0, g->ssm.bytes()));
      d.gdn.push_back(std::move(g));
    }
  }
  if (spec.mtp) d.mtp_kv = make_kv();
  return Status::Ok();
}

}  // namespace

Status CudaStageSession::Init() {
  DeviceScope scope(device_);
  LOCKSTEP_CUDA_CHECK(cudaSetDevice(device_));
  DeviceStageImpl& d = *d_;
  LOCKSTEP_RETURN_IF_ERROR(MakeStreamAndEvents(d));
  StageWeightsSpec spec;
  spec.layer_begin = layer_begin();
  spec.layer_end = layer_end();
  spec.first = is_first();
  spec.last = is_last();
  spec.mtp = is_last() && w_.mtp.present;
  LOCKSTEP_RETURN_IF_ERROR(UploadWeights(w_, cfg_, spec, d));
  LOCKSTEP_RETURN_IF_ERROR(UploadRopeFrequencies(c_, d));
  LOCKSTEP_RETURN_IF_ERROR(AllocState(w_, cfg_, spec, d));
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

StageInitCounters CudaStageSession::init_counters() const {
  return {first_calls_, first_call_ns_, d_->graph_captures, d_->graph_launches};
}

// ---- the StageSession calls (the layers are in cuda_layers.cpp) ----

namespace {

// Rows the request can still add after its prompt: max_new tokens plus the overhang of the
// largest verify window. A K/V cache that grows during prefill grows past them too, so the
// request's decode never reallocates a cache (no copy, no graph re-capture, no allocation that
// can fail mid-run); past them (an engine driven beyond max_new) the caches still double.
int KvHeadroom(const EngineConfig& cfg) {
  const int window = cfg.spec > 0 ? std::max(cfg.spec, cfg.spec_max_suffix) + 1 : 1;
  return std::max(cfg.max_new, 0) + window;
}

// What the layer kernels of one forward of `mode` read: the model, the stage's device state, the
// backend's arithmetic choices, and the K/V headroom a prefill reserves.
Ctx LayerCtx(const ModelConfig& c, DeviceStageImpl& d, ForwardMode mode, const CudaBackend& backend,
             const EngineConfig& cfg) {
  return Ctx{c,
             d,
             mode,
             backend.deterministic(),
             backend.attn_split(),
             mode == ForwardMode::kPrefill ? KvHeadroom(cfg) : 0,
             d.s(),
             &d.init_ns};
}

}  // namespace

Status CudaStageSession::Forward(ForwardMode mode, const std::int32_t* tokens, Activation& act) {
  if (!error_.ok()) return error_;
  LOCKSTEP_CHECK_EQ(act.p, position_);
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  const int T = act.T, h = c_.n_embd;
  nvtxRangePushA(mode == ForwardMode::kVerify ? "lockstep verify stage" : "lockstep prefill stage");
  d.init_ns = 0;
  d.up_timed = false;
  d.copy_timed = false;
  auto run = [&]() -> Status {
    // One-time set-up on first use: the cuBLAS handle and its fixed workspace (counted as init).
    if (!d.cublas) {
      const std::int64_t t0 = MonotonicNs();
      cublasHandle_t hnd = nullptr;
      LOCKSTEP_CUBLAS_CHECK(cublasCreate(&hnd));
      d.cublas.reset(hnd);
      LOCKSTEP_CUBLAS_CHECK(cublasSetStream(hnd, d.s()));
      LOCKSTEP_ASSIGN_OR_RETURN(d.cublas_ws,
                                DeviceBuffer::Alloc(std::size_t{32} << 20, "cuBLAS workspace"));
      LOCKSTEP_CUBLAS_CHECK(cublasSetWorkspace(hnd, d.cublas_ws.get(), d.cublas_ws.bytes()));
      LOCKSTEP_CUBLAS_CHECK(cublasSetMathMode(
          hnd, backend_->deterministic() ? CUBLAS_PEDANTIC_MATH : CUBLAS_TF32_TENSOR_OP_MATH));
      d.init_ns += MonotonicNs() - t0;
    }
    // Routing of the previous call is final once its work is done; our stream is in order, so
    // syncing on the previous done event is enough (normally long finished).
    if (!d.pending_routes.empty()) {
      LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(d.ev_done.get()));
      FlushRoutes(d);
    }
    // Do not overwrite the residual buffer before the next stage has taken its copy.
    LOCKSTEP_CUDA_CHECK(cudaStreamWaitEvent(d.s(), d.ev_consumed.get(), 0));
    LOCKSTEP_RETURN_IF_ERROR(EnsureRows(d.hidden, &d.hidden_rows, T, h, &d.init_ns, d.s()));
    d.arena.Reset();
    if (is_first()) {
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_begin.get(), d.s()));
      for (int t = 0; t < T; ++t)
        if (tokens[t] < 0 || tokens[t] >= c_.n_vocab)
          return Status::InvalidArgument("token", "id " + std::to_string(tokens[t]) +
                                                      " outside the vocabulary (size " +
                                                      std::to_string(c_.n_vocab) + ")");
      if (T > d.token_cap) {
        LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));
        d.token_cap = std::max(T, 1024);
        LOCKSTEP_ASSIGN_OR_RETURN(d.tokens,
                                  DeviceBuffer::Alloc(U(d.token_cap) * sizeof(int), "token ids"));
      }
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_up0.get(), d.s()));
      LOCKSTEP_RETURN_IF_ERROR(Upload(d, d.tokens.get(), tokens, U(T) * sizeof(int)));
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_up1.get(), d.s()));
      d.up_timed = true;
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_in.get(), d.s()));
      EmbedRows(d.embed.f32(), d.tokens.as<int>(), T, h, d.hidden.as<float>(), d.s());
    } else {
      const auto* in = dynamic_cast<const CudaActivation*>(act.device.get());
      if (in == nullptr)
        return Status::Runtime("cuda stage", "input activations are not on a CUDA device");
      // Start of the hand-off: the time between this and ev_in is the synchronisation.
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_begin.get(), d.s()));
      LOCKSTEP_RETURN_IF_ERROR(backend_->HandOff(*in, device_, d.s(), d.hidden.as<float>()));
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_in.get(), d.s()));
    }
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_start.get(), d.s()));
    Ctx x = LayerCtx(c_, d, mode, *backend_, cfg_);
    LOCKSTEP_RETURN_IF_ERROR(RunLayers(x, T, act.p));
    LOCKSTEP_CUDA_CHECK(cudaGetLastError());
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_done.get(), d.s()));
    auto out = std::make_shared<CudaActivation>();
    out->data = d.hidden.as<float>();
    out->device = device_;
    out->rows = T;
    out->cols = h;
    out->stream = d.s();
    out->ready = d.ev_done.get();
    out->consumed = d.ev_consumed.get();
    out->rank = backend_->rank_of_device(device_);
    act.device = std::move(out);
    act.hidden.clear();
    if (mode == ForwardMode::kPrefill) {
      for (auto& kv : d.kv)
        if (kv) kv->committed = kv->written = act.p + T;
      position_ += T;
      pending_rows_ = 0;
    } else {
      pending_rows_ = T;
    }
    return Status::Ok();
  };
  Status st = run();
  nvtxRangePop();
  if (d.init_ns > 0) {
    ++first_calls_;
    first_call_ns_ += d.init_ns;
  }
  Keep(st);
  return error_;  // st, with the stage named
}

void CudaStageSession::Commit(int n) {
  LOCKSTEP_CHECK(n >= 1 && n <= pending_rows_) << "commit " << n << " of " << pending_rows_;
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  auto run = [&]() -> Status {
    for (auto& kv : d.kv)
      if (kv) kv->committed = kv->written = position_ + n;
    const std::size_t conv_floats = U(c_.conv_kernel - 1) * U(c_.conv_dim());
    const std::size_t ssm_floats = U(c_.n_v_heads) * U(c_.k_head_dim) * U(c_.v_head_dim);
    for (auto& g : d.gdn) {
      if (!g) continue;
      LOCKSTEP_CUDA_CHECK(
          cudaMemcpyAsync(g->conv.get(), g->steps_conv.as<float>() + U(n - 1) * conv_floats,
                          conv_floats * sizeof(float), cudaMemcpyDeviceToDevice, d.s()));
      LOCKSTEP_CUDA_CHECK(
          cudaMemcpyAsync(g->ssm.get(), g->steps_ssm.as<float>() + U(n - 1) * ssm_floats,
                          ssm_floats * sizeof(float), cudaMemcpyDeviceToDevice, d.s()));
      g->position += n;
      g->n_steps = 0;
    }
    return Status::Ok();
  };
  Keep(run());
  position_ += n;
  pending_rows_ = 0;
}

void CudaStageSession::FinalNorm(const Activation& act, float* normed) {
  LOCKSTEP_CHECK(is_last());
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  auto run = [&]() -> Status {
    const int T = act.T, h = c_.n_embd;
    LOCKSTEP_ASSIGN_OR_RETURN(float* nd, d.arena.Alloc(U(T) * U(h), &d.init_ns));
    RmsNormZc(d.hidden.as<float>(), h, T, h, d.final_norm, c_.rms_norm_eps, nd, h, d.s());
    return Download(d, normed, nd, U(T) * U(h) * sizeof(float));
  };
  Keep(run());
}

void CudaStageSession::Logits(const Activation& act, float* normed, float* logits) {
  LOCKSTEP_CHECK(is_last());
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  auto run = [&]() -> Status {
    const int T = act.T, h = c_.n_embd, V = c_.n_vocab;
    LOCKSTEP_ASSIGN_OR_RETURN(float* nd, d.arena.Alloc(U(T) * U(h), &d.init_ns));
    LOCKSTEP_ASSIGN_OR_RETURN(float* ld, d.arena.Alloc(U(T) * U(V), &d.init_ns));
    RmsNormZc(d.hidden.as<float>(), h, T, h, d.final_norm, c_.rms_norm_eps, nd, h, d.s());
    RowsMm(nd, T, d.lm_head, ld, V, d.s());  // always batch-invariant, as on the CPU
    LOCKSTEP_CUDA_CHECK(cudaGetLastError());
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_done.get(), d.s()));
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_copy0.get(), d.s()));
    LOCKSTEP_RETURN_IF_ERROR(Download(d, normed, nd, U(T) * U(h) * sizeof(float)));
    LOCKSTEP_RETURN_IF_ERROR(Download(d, logits, ld, U(T) * U(V) * sizeof(float)));
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_copy1.get(), d.s()));
    LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(d.ev_copy1.get()));
    d.copy_timed = true;
    return Status::Ok();
  };
  Keep(run());
}

void CudaStageSession::HiddenToHost(const Activation& act, std::vector<float>* out) {
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  const auto* in = dynamic_cast<const CudaActivation*>(act.device.get());
  if (in == nullptr) {
    *out = act.hidden;
    return;
  }
  out->resize(U(in->rows) * U(in->cols));
  Keep(Download(*d_, out->data(), in->data, out->size() * sizeof(float)));
}

void CudaStageSession::Perturb(ItemKind item, int layer, float factor, Activation& act) {
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  if (item == ItemKind::kK || item == ItemKind::kV) {
    DKv& kv = *d.kv[U(layer - layer_begin())];
    const bool int8 = kv.mirror->dtype() == DType::kI8;
    KvScaleRows(item == ItemKind::kK ? 0 : 1, act.p, act.T, c_.n_heads_kv, c_.head_dim,
                KvDtypeCode(kv.mirror->dtype()), kv.k.get(), kv.v.get(),
                int8 ? kv.ks.as<float>() : nullptr, int8 ? kv.vs.as<float>() : nullptr, factor,
                d.s());
  } else if (item == ItemKind::kConvState || item == ItemKind::kSsmState) {
    DGdn& g = *d.gdn[U(layer - layer_begin())];
    const bool conv = item == ItemKind::kConvState;
    const std::size_t per = conv ? g.mirror->conv_size() : g.mirror->ssm_size();
    Scale(conv ? g.steps_conv.as<float>() : g.steps_ssm.as<float>(),
          static_cast<std::int64_t>(per * U(g.n_steps)), factor, d.s());
  } else if (item == ItemKind::kHiddenOut) {
    Scale(d.hidden.as<float>(), static_cast<std::int64_t>(act.T) * c_.n_embd, factor, d.s());
  }
  const cudaError_t e = cudaGetLastError();
  Keep(e == cudaSuccess ? Status::Ok()
                        : Status::Runtime(std::string("cuda perturb ") + ItemKindName(item),
                                          cudaGetErrorString(e)));
}

void CudaStageSession::FillDeviceTiming(StageTiming* t) {
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  auto ms_to_ns = [](float ms) { return static_cast<std::int64_t>(static_cast<double>(ms) * 1e6); };
  float ms = 0;
  if (cudaEventElapsedTime(&ms, d.ev_start.get(), d.ev_done.get()) == cudaSuccess)
    t->dev_compute_ns = ms_to_ns(ms);
  if (cudaEventElapsedTime(&ms, d.ev_begin.get(), d.ev_in.get()) == cudaSuccess)
    t->dev_wait_ns = ms_to_ns(ms);
  std::int64_t copy = 0;  // measured: 0 when this stage copied nothing to or from the host
  if (d.up_timed && cudaEventElapsedTime(&ms, d.ev_up0.get(), d.ev_up1.get()) == cudaSuccess)
    copy += ms_to_ns(ms);
  if (d.copy_timed && cudaEventElapsedTime(&ms, d.ev_copy0.get(), d.ev_copy1.get()) == cudaSuccess)
    copy += ms_to_ns(ms);
  t->dev_copy_ns = copy;
  t->init_ns = d.init_ns;
  t->graph = d.last_graph_use;
  cudaGetLastError();  // a failed elapsed-time query (event not recorded) is not an error of the
                       // run
}

void CudaStageSession::MtpForward(const float* hid, const std::int32_t* next_tokens, int p, int T,
                                  ForwardMode mode, float* m, float* logits, int n_logits) {
  LOCKSTEP_CHECK(has_mtp());
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  auto run = [&]() -> Status {
    const int h = c_.n_embd, V = c_.n_vocab;
    d.arena.Reset();
    if (!d.pending_routes.empty()) {
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));
      FlushRoutes(d);
    }
    Ctx x = LayerCtx(c_, d, mode, *backend_, cfg_);
    LOCKSTEP_RETURN_IF_ERROR(EnsureRows(d.mtp_hidden, &d.mtp_rows, T, h, &d.init_ns, d.s()));
    const int nl = std::min(n_logits, T);
    // In: hidden rows then token ids, one upload. Out: m rows then logits, one download.
    LOCKSTEP_ASSIGN_OR_RETURN(float* in, x.Alloc(U(T) * U(h) + U(T)));
    LOCKSTEP_ASSIGN_OR_RETURN(float* emb, x.Alloc(U(T) * U(h)));
    LOCKSTEP_ASSIGN_OR_RETURN(float* cat, x.Alloc(U(T) * U(2 * h)));
    LOCKSTEP_ASSIGN_OR_RETURN(float* out, x.Alloc(U(T) * U(h) + U(std::max(nl, 1)) * U(V)));
    float* hd = in;
    const int* tok = reinterpret_cast<const int*>(in + U(T) * U(h));
    float* md = out;
    float* ld = out + U(T) * U(h);
    LOCKSTEP_RETURN_IF_ERROR(UploadParts(
        d, in, {{hid, U(T) * U(h) * sizeof(float)}, {next_tokens, U(T) * sizeof(int)}}));
    x.SetPosition(p);
    float* mh = d.mtp_hidden.as<float>();
    auto body = [&]() -> Status {
      EmbedRows(d.embed.f32(), tok, T, h, emb, d.s());
      RmsNormZc(emb, h, T, h, d.mtp_pre_emb, c_.rms_norm_eps, cat, 2 * h, d.s());
      RmsNormZc(hd, h, T, h, d.mtp_pre_hid, c_.rms_norm_eps, cat + h, 2 * h, d.s());
      LOCKSTEP_RETURN_IF_ERROR(x.Mm(cat, T, d.mtp_fc, mh));
      LOCKSTEP_RETURN_IF_ERROR(
          LayerForward(x, d.mtp_layer, d.mtp_experts.get(), mh, T, p, d.mtp_kv.get(), nullptr));
      RmsNormZc(mh, h, T, h, d.mtp_norm, c_.rms_norm_eps, md, h, d.s());
      if (nl > 0) RowsMm(md + U(T - nl) * U(h), nl, d.lm_head, ld, V, d.s());
      LOCKSTEP_CUDA_CHECK(cudaGetLastError());
      return Status::Ok();
    };
    // Draft steps (verify mode) replay a graph per (T, logit rows) like the verify layers do; the
    // MTP's K/V cache must already hold the rows (growing it syncs, which a capture cannot).
    if (backend_->graphs() && mode == ForwardMode::kVerify && d.graphs_off.empty() &&
        p + T <= d.mtp_kv->capacity) {
      GraphUse use = GraphUse::kNone;  // not reported: window records describe the verify forward
      LOCKSTEP_RETURN_IF_ERROR(Graphed(
          d.mtp_graphs[{T, nl}], [&d] { return MtpLayoutKey(d); }, body,
          [&] { d.mtp_kv->written = p + T; }, &use));
    } else {
      LOCKSTEP_RETURN_IF_ERROR(body());
    }
    const std::size_t m_bytes = U(T) * U(h) * sizeof(float), l_bytes = U(nl) * U(V) * sizeof(float);
    LOCKSTEP_RETURN_IF_ERROR(DownloadParts(d, out, {{m, m_bytes}, {logits, l_bytes}}));
    FlushRoutes(d);
    return Status::Ok();
  };
  // Set-up paid here (allocations, graph capture) counts in the stage's first-call counters like a
  // Forward's; it falls inside the window's draft time, so the verify's init_ns is left as it was.
  const std::int64_t init0 = d.init_ns;
  Keep(run());
  if (d.init_ns > init0) {
    ++first_calls_;
    first_call_ns_ += d.init_ns - init0;
  }
  d.init_ns = init0;
}

void CudaStageSession::MtpCommit(int rows) {
  DKv& kv = *d_->mtp_kv;
  LOCKSTEP_CHECK(rows >= kv.committed && rows <= kv.written) << "mtp commit " << rows;
  kv.committed = kv.written = rows;
}

// ---- host mirrors (SyncKv / SyncGdn in cuda_layers.cpp) ----

KvCache* CudaStageSession::kv(int il) {
  if (il < layer_begin() || il >= layer_end()) return nullptr;
  DKv* kv = d_->kv[U(il - layer_begin())].get();
  if (kv == nullptr) return nullptr;
  DeviceScope scope(device_);
  Keep(SyncKv(*d_, *kv));
  return kv->mirror.get();
}

GdnState* CudaStageSession::gdn(int il) {
  if (il < layer_begin() || il >= layer_end()) return nullptr;
  DGdn* g = d_->gdn[U(il - layer_begin())].get();
  if (g == nullptr) return nullptr;
  DeviceScope scope(device_);
  Keep(SyncGdn(*d_, *g));
  return g->mirror.get();
}

KvCache* CudaStageSession::mtp_kv() {
  if (!d_->mtp_kv) return nullptr;
  DeviceScope scope(device_);
  Keep(SyncKv(*d_, *d_->mtp_kv));
  return d_->mtp_kv->mirror.get();
}

const ExpertCache& CudaStageSession::experts() const {
  if (!d_->pending_routes.empty()) {
    DeviceScope scope(device_);
    if (cudaStreamSynchronize(d_->s()) == cudaSuccess) FlushRoutes(*d_);
  }
  return *d_->experts;
}

}  // namespace lockstep::cuda
