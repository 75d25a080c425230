// The CUDA stage's forward op by op (the CPU's LayerForward with device buffers), host copies
// through pinned staging, and the host mirrors of the device state. See cuda_stage_impl.h.
#include <cmath>
#include <cstring>

#include "cuda/cuda_stage_impl.h"
#include "cuda/ops.h"
#include "util/check.h"

namespace lockstep::cuda::detail {

Status Ctx::Mm(const float* x, int T, const DMat& w, float* y, int ldy) {
  if (ldy < 0) ldy = w.rows;
  if (RowsPath(T)) {
    RowsMm(x, T, w, y, ldy, s);
    return Status::Ok();
  }
  const float* wf = w.f32();
  if (w.bf16) {
    // cuBLAS has no bf16 x f32 product with f32 inputs kept whole: widen the matrix (exact) into
    // the stage's scratch, stream-ordered before the GEMM that reads it.
    if (d.widen.bytes() < w.elems() * sizeof(float)) {
      const std::int64_t t0 = MonotonicNs();
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));  // an earlier GEMM may still read the old one
      LOCKSTEP_ASSIGN_OR_RETURN(d.widen,
                                DeviceBuffer::Alloc(w.elems() * sizeof(float),
                                                    "f32 widening of a bf16 matrix for cuBLAS"));
      *init_ns += MonotonicNs() - t0;
    }
    WidenBf16(w.bf16_bits(), static_cast<std::int64_t>(w.elems()), d.widen.as<float>(), s);
    wf = d.widen.as<float>();
  }
  const float one = 1.0f, zero = 0.0f;
  // Row-major y[T, out] = x[T, in] W[out, in]^T is column-major y^T = W^T(op T) x^T.
  LOCKSTEP_CUBLAS_CHECK(cublasSgemm(d.cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, w.rows, T, w.cols,
                                    &one, wf, w.cols, x, w.cols, &zero, y, ldy));
  return Status::Ok();
}

Status Ctx::MmShared(const float* x, int T, std::initializer_list<MmOut> outs) {
  LOCKSTEP_CHECK(outs.size() >= 1 && outs.size() <= 3);
  const DMat& w0 = *outs.begin()->w;
  bool fused = RowsPath(T);
  for (const MmOut& o : outs) {
    LOCKSTEP_CHECK(o.up == nullptr ||
                   (o.up->rows == o.w->rows && o.up->cols == o.w->cols && o.up->bf16 == o.w->bf16));
    fused = fused && o.w->bf16 == w0.bf16 && o.w->cols == w0.cols;
  }
  if (!fused) {
    for (const MmOut& o : outs) {
      LOCKSTEP_RETURN_IF_ERROR(Mm(x, T, *o.w, o.y));
      if (o.up == nullptr) continue;
      const std::size_t n = U(T) * U(o.w->rows);
      LOCKSTEP_ASSIGN_OR_RETURN(float* u, Alloc(n));
      LOCKSTEP_RETURN_IF_ERROR(Mm(x, T, *o.up, u));
      SiluMul(o.y, u, static_cast<std::int64_t>(n), s);
    }
    return Status::Ok();
  }
  auto launch = [&](auto tag) {
    using WT = decltype(tag);
    RowsProduct<WT> p[3];
    int n = 0;
    for (const MmOut& o : outs)
      p[n++] = {static_cast<const WT*>(o.w->d), o.w->rows, o.y, o.w->rows,
                o.up != nullptr ? static_cast<const WT*>(o.up->d) : nullptr};
    RowsMatmulMulti(x, T, w0.cols, p, n, s);
  };
  if (w0.bf16) {
    launch(std::uint16_t{});
  } else {
    launch(float{});
  }
  return Status::Ok();
}

// Grows kv (doubling) to hold `rows` plus `headroom` more (prefill: what the request's decode
// will add, so that it never grows in decode). The headroom counts up to as many rows again as
// `rows` (at least 256): a max_new far past the prompt (it may be 16M) must not reserve memory
// the request will likely never use; such a decode grows later, by doubling.
Status EnsureKvCapacity(DKv& kv, int rows, int headroom, int hkv, int hd, bool int8, cudaStream_t s,
                        std::int64_t* init_ns) {
  const std::int64_t want =
      static_cast<std::int64_t>(rows) + std::min<std::int64_t>(headroom, std::max(rows, 256));
  if (want <= kv.capacity) return Status::Ok();
  const std::int64_t t0 = MonotonicNs();
  int cap = std::max(kv.capacity * 2, 256);
  while (cap < want) cap *= 2;
  const std::size_t row_bytes = U(hkv) * U(hd) * kv.elem, srow = U(hkv) * sizeof(float);
  auto grow = [&](DeviceBuffer& buf, std::size_t per_row) -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(
        DeviceBuffer nb, DeviceBuffer::Alloc(U(cap) * per_row, "K/V cache growth to " +
                                                                   std::to_string(cap) + " rows"));
    if (kv.written > 0)
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(nb.get(), buf.get(), U(kv.written) * per_row,
                                          cudaMemcpyDeviceToDevice, s));
    LOCKSTEP_CUDA_CHECK(
        cudaStreamSynchronize(s));  // the old buffer must not be freed under the copy
    buf = std::move(nb);
    return Status::Ok();
  };
  LOCKSTEP_RETURN_IF_ERROR(grow(kv.k, row_bytes));
  LOCKSTEP_RETURN_IF_ERROR(grow(kv.v, row_bytes));
  if (int8) {
    LOCKSTEP_RETURN_IF_ERROR(grow(kv.ks, srow));
    LOCKSTEP_RETURN_IF_ERROR(grow(kv.vs, srow));
  }
  kv.capacity = cap;
  *init_ns += MonotonicNs() - t0;
  return Status::Ok();
}

// a f32 [T, H] (normed input) -> out f32 [T, H].
Status AttentionForward(Ctx& x, const DLayer& L, const float* a, int T, int p, DKv& kv,
                        float* out) {
  const ModelConfig& c = x.c;
  const int hq = c.n_heads, hkv = c.n_heads_kv, hd = c.head_dim;
  const std::size_t ut = U(T);
  LOCKSTEP_ASSIGN_OR_RETURN(float* qg, x.Alloc(ut * U(2 * hq * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* k, x.Alloc(ut * U(hkv * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* v, x.Alloc(ut * U(hkv * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* q, x.Alloc(ut * U(hq * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* o, x.Alloc(ut * U(hq * hd)));
  const bool int8 = kv.mirror->dtype() == DType::kI8;
  const int code = KvDtypeCode(kv.mirror->dtype());
  LOCKSTEP_RETURN_IF_ERROR(
      EnsureKvCapacity(kv, p + T, x.kv_headroom, hkv, hd, int8, x.s, x.init_ns));
  // Verify scratch is sized by the cache's capacity, not by p: the arena then hands out the same
  // addresses at every position, as a replayed graph needs. Prefill (long T) keeps p + T.
  const int n_ctx_max = x.mode == ForwardMode::kVerify ? kv.capacity : p + T;
  // Scores (when not in shared memory) and split partials, bounded: a long prefill chunk runs its
  // rows in groups instead of asking for T * Hq * n_ctx floats.
  const std::size_t n_scratch = AttentionScratchFloats(T, hq, hd, n_ctx_max, x.attn_split);
  float* scratch = nullptr;
  if (n_scratch > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(scratch, x.Alloc(n_scratch));
  }
  const Pos pos(0, x.pos);
  LOCKSTEP_RETURN_IF_ERROR(x.MmShared(a, T, {{&L.q_proj, qg}, {&L.k_proj, k}, {&L.v_proj, v}}));
  // q / gate split, q and k norms, RoPE and the K / V store: one launch (bitwise the five ops).
  AttnPrep(qg, k, v, T, pos, hq, hkv, hd, c.rotary_dim, x.d.inv_freq.as<float>(), L.q_norm,
           L.k_norm, c.rms_norm_eps, code, kv.k.get(), kv.v.get(),
           int8 ? kv.ks.as<float>() : nullptr, int8 ? kv.vs.as<float>() : nullptr, q, x.s);
  kv.written = p + T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // The output gate (qg's gate half) is applied as attention stores its rows.
  Attention(q, T, pos, hq, hkv, hd, code, kv.k.get(), kv.v.get(),
            int8 ? kv.ks.as<float>() : nullptr, int8 ? kv.vs.as<float>() : nullptr, scale,
            n_ctx_max, x.attn_split, scratch, n_scratch, o, x.s, AttnHeads::kAuto,
            AttnGate{qg + hd, 2 * hd});
  return x.Mm(o, T, L.o_proj, out);
}

Status EnsureSteps(DGdn& g, int T, std::size_t conv_floats, std::size_t ssm_floats,
                   std::int64_t* init_ns) {
  if (T <= g.steps_capacity) return Status::Ok();
  const std::int64_t t0 = MonotonicNs();
  const int cap = std::max(T, 16);
  LOCKSTEP_ASSIGN_OR_RETURN(g.steps_conv, DeviceBuffer::Alloc(U(cap) * conv_floats * sizeof(float),
                                                              "GDN per-step conv states"));
  LOCKSTEP_ASSIGN_OR_RETURN(g.steps_ssm, DeviceBuffer::Alloc(U(cap) * ssm_floats * sizeof(float),
                                                             "GDN per-step recurrent states"));
  g.steps_capacity = cap;
  *init_ns += MonotonicNs() - t0;
  return Status::Ok();
}

Status GdnForward(Ctx& x, const DLayer& L, const float* a, int T, DGdn& g, float* out) {
  const ModelConfig& c = x.c;
  const int hk = c.n_k_heads, hv = c.n_v_heads, dk = c.k_head_dim, dv = c.v_head_dim;
  const int conv_dim = c.conv_dim(), kw = c.conv_kernel, kr = kw - 1;
  const std::size_t ut = U(T), conv_floats = U(kr) * U(conv_dim),
                    ssm_floats = U(hv) * U(dk) * U(dv);
  LOCKSTEP_ASSIGN_OR_RETURN(float* P, x.Alloc(ut * U(c.qkvz_dim())));
  LOCKSTEP_ASSIGN_OR_RETURN(float* B, x.Alloc(ut * U(2 * hv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* Z, x.Alloc(ut * U(hv) * U(dv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* beta, x.Alloc(ut * U(hv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* gdec, x.Alloc(ut * U(hv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* Uc, x.Alloc(ut * U(conv_dim)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* qh, x.Alloc(ut * U(hk) * U(dk)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* kh, x.Alloc(ut * U(hk) * U(dk)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* O, x.Alloc(ut * U(hv) * U(dv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* On, x.Alloc(ut * U(hv) * U(dv)));
  LOCKSTEP_RETURN_IF_ERROR(x.MmShared(a, T, {{&L.in_proj_qkvz, P}, {&L.in_proj_ba, B}}));
  const bool verify = x.mode == ForwardMode::kVerify;
  float* win = nullptr;
  if (verify) {
    // Split and conv in one launch; the conv states after each step go to the window's steps.
    LOCKSTEP_RETURN_IF_ERROR(EnsureSteps(g, T, conv_floats, ssm_floats, x.init_ns));
    GdnSplitConv(P, B, T, hk, hv, dk, dv, kw, L.a_log, L.dt_bias, g.conv.as<float>(), L.conv1d, Uc,
                 g.steps_conv.as<float>(), Z, beta, gdec, x.s);
  } else {
    // Prefill writes the window, whose last K-1 rows become the conv state.
    LOCKSTEP_ASSIGN_OR_RETURN(win, x.Alloc(U(kr + T) * U(conv_dim)));
    GdnSplit(P, B, T, hk, hv, dk, dv, kw, L.a_log, L.dt_bias, g.conv.as<float>(), win, Z, beta,
             gdec, x.s);
    CausalConvSilu(win, T, conv_dim, kw, L.conv1d, Uc, x.s);
  }
  // The held recurrence normalises q / k itself (one launch fewer per verify window).
  const bool qk_inside = verify && GdnRecurrentHoldsColumns(dk);
  if (!qk_inside) GdnQkNorm(Uc, T, hk, dk, conv_dim, qh, kh, x.s);
  if (verify) {
    GdnRecurrent(g.ssm.as<float>(), g.steps_ssm.as<float>(), qk_inside ? nullptr : qh,
                 qk_inside ? nullptr : kh, Uc, gdec, beta, T, hk, hv, dk, dv, conv_dim, O, x.s);
    g.n_steps = T;
  } else {
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(g.conv.get(), win + ut * U(conv_dim),
                                        conv_floats * sizeof(float), cudaMemcpyDeviceToDevice,
                                        x.s));
    // Chunked form (cpu::GatedDeltaChunked's twin), the checkpoint updated in place.
    LOCKSTEP_ASSIGN_OR_RETURN(float* chunk_scratch,
                              x.Alloc(GdnChunkedScratchFloats(hv, dk, dv, kGdnPrefillChunk)));
    GdnChunked(g.ssm.as<float>(), qh, kh, Uc, gdec, beta, T, hk, hv, dk, dv, conv_dim,
               kGdnPrefillChunk, chunk_scratch, O, x.s);
    g.position += T;
  }
  GatedRmsNorm(O, Z, T * hv, dv, L.norm, c.rms_norm_eps, On, x.s);
  return x.Mm(On, T, L.out_proj, out);
}

// The SwiGLU FFN: out = (silu(a . gate^T) * (a . up^T)) . down^T (the gate / up pair in one
// launch when decoding).
Status FfnForward(Ctx& x, const DFfn& f, const float* a, int T, float* out) {
  LOCKSTEP_ASSIGN_OR_RETURN(float* act, x.Alloc(U(T) * U(f.gate.rows)));
  LOCKSTEP_RETURN_IF_ERROR(x.MmShared(a, T, {{&f.gate, act, &f.up}}));
  return x.Mm(act, T, f.down, out);
}

// Host counters from the routing the router kernels wrote (the stream must have synchronised).
void FlushRoutes(DeviceStageImpl& d) {
  for (const auto& r : d.pending_routes) {
    const int* ids = d.route_host.as<int>() + r.offset;
    std::vector<int> count(U(r.cache->n_experts()), 0);
    for (int i = 0; i < r.n; ++i) {
      LOCKSTEP_CHECK(ids[i] >= 0 && ids[i] < r.cache->n_experts())
          << "routing id " << ids[i] << " (layer " << r.layer << ")";
      ++count[U(ids[i])];
    }
    for (int e = 0; e < r.cache->n_experts(); ++e)
      if (count[U(e)] > 0) r.cache->Record(r.layer, e, count[U(e)]);
  }
  d.pending_routes.clear();
  d.route_used = 0;
}

// The MoE block of layer L on its normalised input a, added into the residual hid; with
// next_norm, next_a gets the next layer's normalised input (MoeEpilogue's fused end).
Status MoeForward(Ctx& x, const DLayer& L, const float* a, int T, ExpertCache* cache, float* hid,
                  const float* next_norm, float* next_a) {
  const ModelConfig& c = x.c;
  const int h = c.n_embd, ne = c.n_experts, k = c.n_experts_used, inter = c.moe_ffn;
  const int slots = T * k, max_active = std::min(slots, ne);
  LOCKSTEP_ASSIGN_OR_RETURN(float* logits, x.Alloc(U(T) * U(ne)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* wts, x.Alloc(U(slots)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* ints, x.Alloc(U(slots) * 3 + U(ne) + 2));  // int32 storage
  int* idx = reinterpret_cast<int*>(ints);
  int* slot_of = idx + slots;
  int* active = slot_of + slots;
  int* first = active + slots;
  int* n_active = first + ne + 1;
  LOCKSTEP_ASSIGN_OR_RETURN(float* act, x.Alloc(U(slots) * U(inter)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* ranked, x.Alloc(U(slots) * U(h)));
  // The router and the shared expert's gate / up pair (its SwiGLU activation) all read `a`: one
  // launch when decoding.
  const bool shared = L.shared.gate.rows > 0;
  float* sact = nullptr;
  if (shared) {
    LOCKSTEP_ASSIGN_OR_RETURN(sact, x.Alloc(U(T) * U(L.shared.gate.rows)));
    LOCKSTEP_RETURN_IF_ERROR(
        x.MmShared(a, T, {{&L.router, logits}, {&L.shared.gate, sact, &L.shared.up}}));
  } else {
    LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, L.router, logits));
  }
  // The routing goes to the host for the expert counters: the router kernel writes the ids into
  // host-mapped pinned memory as well (no copy; FlushRoutes reads them after the stream syncs).
  DeviceStageImpl& d = x.d;
  int* idx_host = nullptr;
  if (cache != nullptr) {
    if (d.route_used + U(slots) > d.route_cap) {
      // Growing would free memory pending routing writes may still target: flush first.
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(x.s));
      FlushRoutes(d);
      if (U(slots) * 64 > d.route_cap) {
        d.route_cap = std::max<std::size_t>(U(slots) * 64, 1 << 16);
        LOCKSTEP_ASSIGN_OR_RETURN(
            d.route_host, PinnedBuffer::Alloc(d.route_cap * sizeof(int), "expert routing ids"));
        LOCKSTEP_ASSIGN_OR_RETURN(void* dev, d.route_host.device_ptr());
        d.route_dev = static_cast<int*>(dev);
      }
    }
    idx_host = d.route_dev + d.route_used;
    d.pending_routes.push_back({cache, L.cache_layer, slots, d.route_used});
    d.route_used += U(slots);
  }
  // Routing and expert-major grouping (one launch for a decode step).
  RouteAndGroup(logits, T, ne, k, c.norm_topk_prob, idx, wts, idx_host, slot_of, first, active,
                n_active, x.s);
  const bool bf16 = x.d.weights_bf16;
  ExpertGateUp(a, h, inter, k, slot_of, first, active, n_active, max_active, L.gate_ptrs, L.up_ptrs,
               bf16, act, x.s);
  float* sh = nullptr;
  if (shared) {
    LOCKSTEP_ASSIGN_OR_RETURN(sh, x.Alloc(U(T) * U(h)));
  }
  // The shared expert's down projection rides along the routed one's launch where Mm would run
  // RowsMatmul (the same bits); prefill (cuBLAS) keeps its own GEMM.
  const bool shared_along = shared && x.RowsPath(T) && L.shared.down.bf16 == bf16;
  ExpertDown(
      act, h, inter, slot_of, first, active, n_active, max_active, L.down_ptrs, bf16, ranked, x.s,
      shared_along ? DenseDown{sact, T, L.shared.down.cols, L.shared.down.d, sh} : DenseDown{});
  if (shared && !shared_along) LOCKSTEP_RETURN_IF_ERROR(x.Mm(sact, T, L.shared.down, sh));
  // Combine, shared gate, residual add and the next norm: one launch instead of four.
  MoeEpilogue(ranked, wts, T, k, h, a, L.shared_gate, sh, hid, next_norm, c.rms_norm_eps, next_a,
              x.s);
  return Status::Ok();
}

Status LayerForward(Ctx& x, const DLayer& L, ExpertCache* cache, float* hid, int T, int p, DKv* kv,
                    DGdn* g, LayerLink link) {
  LOCKSTEP_CHECK(x.pos != nullptr && x.pos_host == p)
      << "layer at position " << p << " without SetPosition";
  const ModelConfig& c = x.c;
  const int h = c.n_embd;
  const std::int64_t n = static_cast<std::int64_t>(T) * h;
  const float* a = link.a;
  if (a == nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(float* an, x.Alloc(U(T) * U(h)));
    RmsNormZc(hid, h, T, h, L.input_norm, c.rms_norm_eps, an, h, x.s);
    a = an;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(float* mix, x.Alloc(U(T) * U(h)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* b, x.Alloc(U(T) * U(h)));
  if (L.type == LayerType::kFullAttention) {
    LOCKSTEP_RETURN_IF_ERROR(AttentionForward(x, L, a, T, p, *kv, mix));
  } else {
    LOCKSTEP_RETURN_IF_ERROR(GdnForward(x, L, a, T, *g, mix));
  }
  AddRmsNormZc(hid, mix, T, h, L.post_norm, c.rms_norm_eps, b, x.s);
  float* next_a = nullptr;
  if (link.next_norm != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(next_a, x.Alloc(U(T) * U(h)));
    *link.next_a = next_a;
  }
  if (L.moe) return MoeForward(x, L, b, T, cache, hid, link.next_norm, next_a);
  LOCKSTEP_RETURN_IF_ERROR(FfnForward(x, L.dense, b, T, mix));
  if (next_a != nullptr) {
    AddRmsNormZc(hid, mix, T, h, link.next_norm, c.rms_norm_eps, next_a, x.s);
  } else {
    AddInPlace(hid, mix, n, x.s);
  }
  return Status::Ok();
}

Status EnsureRows(DeviceBuffer& buf, int* rows, int need, int h, std::int64_t* init_ns,
                  cudaStream_t s) {
  if (need <= *rows) return Status::Ok();
  const std::int64_t t0 = MonotonicNs();
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  const int cap = std::max(need, 64);
  LOCKSTEP_ASSIGN_OR_RETURN(buf,
                            DeviceBuffer::Alloc(U(cap) * U(h) * sizeof(float), "activation rows"));
  *rows = cap;
  *init_ns += MonotonicNs() - t0;
  return Status::Ok();
}

Status EnsureStaging(DeviceStageImpl& d, std::size_t bytes) {
  if (d.staging.bytes() >= bytes) return Status::Ok();
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));
  LOCKSTEP_ASSIGN_OR_RETURN(
      d.staging, PinnedBuffer::Alloc(std::max(bytes, std::size_t{1} << 20), "host staging"));
  return Status::Ok();
}

Status UploadParts(DeviceStageImpl& d, void* dst,
                   std::initializer_list<HostPart<const void*>> parts) {
  std::size_t bytes = 0;
  for (const auto& part : parts) bytes += part.bytes;
  LOCKSTEP_RETURN_IF_ERROR(EnsureStaging(d, bytes));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));  // staging may still feed an earlier copy
  auto* at = static_cast<char*>(d.staging.get());
  for (const auto& part : parts) {
    if (part.bytes > 0) std::memcpy(at, part.p, part.bytes);
    at += part.bytes;
  }
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, d.staging.get(), bytes, cudaMemcpyHostToDevice, d.s()));
  return Status::Ok();
}

Status Upload(DeviceStageImpl& d, void* dst, const void* src, std::size_t bytes) {
  return UploadParts(d, dst, {{src, bytes}});
}

Status DownloadParts(DeviceStageImpl& d, const void* src,
                     std::initializer_list<HostPart<void*>> parts) {
  std::size_t bytes = 0;
  for (const auto& part : parts) bytes += part.bytes;
  LOCKSTEP_RETURN_IF_ERROR(EnsureStaging(d, bytes));
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(d.staging.get(), src, bytes, cudaMemcpyDeviceToHost, d.s()));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));
  const auto* at = static_cast<const char*>(d.staging.get());
  for (const auto& part : parts) {
    if (part.bytes > 0) std::memcpy(part.p, at, part.bytes);
    at += part.bytes;
  }
  return Status::Ok();
}

Status Download(DeviceStageImpl& d, void* dst, const void* src, std::size_t bytes) {
  return DownloadParts(d, src, {{dst, bytes}});
}

Status SyncKv(DeviceStageImpl& d, DKv& kv) {
  KvCache& m = *kv.mirror;
  const int mc = m.rows_committed(), dc = kv.committed, dw = kv.written;
  if (dw <= mc && m.rows_written() == dw) return Status::Ok();
  const int n = dw - mc;
  const std::size_t rb = m.row_bytes(), sb = U(m.n_heads_kv()) * sizeof(float);
  const bool int8 = m.dtype() == DType::kI8;
  std::vector<std::byte> k(U(n) * rb), v(U(n) * rb);
  std::vector<float> ks(int8 ? U(n) * U(m.n_heads_kv()) : 0), vs(ks.size());
  if (n > 0) {
    LOCKSTEP_RETURN_IF_ERROR(Download(d, k.data(), kv.k.as<std::byte>() + U(mc) * rb, U(n) * rb));
    LOCKSTEP_RETURN_IF_ERROR(Download(d, v.data(), kv.v.as<std::byte>() + U(mc) * rb, U(n) * rb));
    if (int8) {
      LOCKSTEP_RETURN_IF_ERROR(
          Download(d, ks.data(), kv.ks.as<std::byte>() + U(mc) * sb, U(n) * sb));
      LOCKSTEP_RETURN_IF_ERROR(
          Download(d, vs.data(), kv.vs.as<std::byte>() + U(mc) * sb, U(n) * sb));
    }
  }
  const int nc = dc - mc;  // newly committed rows first, then the speculative ones
  m.WriteRaw(mc, nc, k.data(), v.data(), int8 ? ks.data() : nullptr, int8 ? vs.data() : nullptr);
  if (dc > mc) m.Commit(dc);
  const std::size_t hk = U(m.n_heads_kv());
  m.WriteRaw(dc, dw - dc, k.data() + U(nc) * rb, v.data() + U(nc) * rb,
             int8 ? ks.data() + U(nc) * hk : nullptr, int8 ? vs.data() + U(nc) * hk : nullptr);
  return Status::Ok();
}

Status SyncGdn(DeviceStageImpl& d, DGdn& g) {
  GdnState& m = *g.mirror;
  LOCKSTEP_RETURN_IF_ERROR(Download(d, m.conv(), g.conv.get(), m.conv_size() * sizeof(float)));
  LOCKSTEP_RETURN_IF_ERROR(Download(d, m.ssm(), g.ssm.get(), m.ssm_size() * sizeof(float)));
  if (g.n_steps > 0) {
    m.BeginSteps(g.n_steps);
    for (int t = 0; t < g.n_steps; ++t) {
      LOCKSTEP_RETURN_IF_ERROR(Download(d, m.step_conv(t),
                                        g.steps_conv.as<float>() + U(t) * m.conv_size(),
                                        m.conv_size() * sizeof(float)));
      LOCKSTEP_RETURN_IF_ERROR(Download(d, m.step_ssm(t),
                                        g.steps_ssm.as<float>() + U(t) * m.ssm_size(),
                                        m.ssm_size() * sizeof(float)));
    }
  } else {
    m.DiscardSteps();
  }
  if (g.position > m.position()) m.Advance(g.position - m.position());
  return Status::Ok();
}

}  // namespace lockstep::cuda::detail
