#include "cuda/cuda_stage.h"

#include <nvtx3/nvToolsExt.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_stage_impl.h"
#include "cuda/ops.h"
#include "util/check.h"

namespace lockstep::cuda {

using namespace detail;  // NOLINT: this file and cuda_layers.cpp are one component

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

Result<StageSessionPtr> CudaStageSession::Create(const StageParams& params, CudaBackend* backend, int device) {
  std::unique_ptr<CudaStageSession> st(new CudaStageSession(params, backend, device));
  LOCKSTEP_RETURN_IF_ERROR(st->Init().WithContext("cuda stage " + std::to_string(params.index) + " on device " +
                                                  std::to_string(device)));
  return StageSessionPtr(std::move(st));
}

bool CudaStageSession::has_mtp() const { return d_->mtp_kv != nullptr; }
bool CudaStageSession::weights_bf16() const { return d_->weights_bf16; }

// ---- weights ----

namespace {

// Collects host tensors, then copies them into one device (or pinned) buffer and patches the
// views. Offsets are 256-byte aligned. Matrices go in as bf16 bits when the packer is told the
// stage's matrices are all bf16 values (`bf16_matrices`: truncation to the high half is then
// exact); vectors always stay f32.
class Packer {
 public:
  explicit Packer(bool bf16_matrices) : bf16_(bf16_matrices) {}
  void Add(const float* host, std::size_t n, const float** slot) { Push(host, n, false, slot, nullptr); }
  // A matrix stored in the packer's matrix dtype; `slot` gets the device address.
  void AddMatrix(const float* host, std::size_t n, const void** slot) { Push(host, n, bf16_, nullptr, slot); }
  void Add(const Mat& m, DMat* out) {
    out->rows = m.rows;
    out->cols = m.cols;
    out->bf16 = bf16_;
    AddMatrix(m.data, U(m.rows) * U(m.cols), &out->d);
  }
  // The embedding table is read by row lookups, not products: always f32.
  void AddF32(const Mat& m, DMat* out) {
    out->rows = m.rows;
    out->cols = m.cols;
    out->bf16 = false;
    Push(m.data, U(m.rows) * U(m.cols), false, nullptr, &out->d);
  }
  std::size_t bytes() const { return total_; }
  // Device copy (synchronous: start-up only), through a host buffer of at most 64 MiB.
  Result<DeviceBuffer> ToDevice() {
    LOCKSTEP_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Alloc(std::max<std::size_t>(total_, 1), "resident weights"));
    std::vector<std::uint16_t> narrow;
    for (const Item& it : items_) {
      std::byte* dst = buf.as<std::byte>() + it.offset;
      if (it.bf16) {
        constexpr std::size_t kPiece = std::size_t{32} << 20;  // elements per host conversion
        for (std::size_t i0 = 0; i0 < it.n; i0 += kPiece) {
          const std::size_t m = std::min(kPiece, it.n - i0);
          narrow.resize(m);
          Narrow(it.host + i0, m, narrow.data());
          LOCKSTEP_CUDA_CHECK(cudaMemcpy(dst + i0 * 2, narrow.data(), m * 2, cudaMemcpyHostToDevice));
        }
      } else {
        LOCKSTEP_CUDA_CHECK(cudaMemcpy(dst, it.host, it.n * sizeof(float), cudaMemcpyHostToDevice));
      }
      it.Patch(dst);
    }
    return buf;
  }
  Result<PinnedBuffer> ToPinned() {
    LOCKSTEP_ASSIGN_OR_RETURN(PinnedBuffer buf, PinnedBuffer::Alloc(std::max<std::size_t>(total_, 1), "host-resident experts"));
    LOCKSTEP_ASSIGN_OR_RETURN(void* dev, buf.device_ptr());
    for (const Item& it : items_) {
      std::byte* host = buf.as<std::byte>() + it.offset;
      if (it.bf16) {
        Narrow(it.host, it.n, reinterpret_cast<std::uint16_t*>(host));
      } else {
        std::memcpy(host, it.host, it.n * sizeof(float));
      }
      it.Patch(static_cast<std::byte*>(dev) + it.offset);
    }
    return buf;
  }

 private:
  struct Item {
    const float* host;
    std::size_t n;
    bool bf16;
    const float** f32_slot;  // a vector's view (always f32) ...
    const void** slot;       // ... or a matrix's
    std::size_t offset;      // bytes
    void Patch(void* p) const {
      if (f32_slot) *f32_slot = static_cast<const float*>(p);
      if (slot) *slot = p;
    }
  };
  void Push(const float* host, std::size_t n, bool bf16, const float** f32_slot, const void** slot) {
    items_.push_back({host, n, bf16, f32_slot, slot, total_});
    total_ += (n * (bf16 ? 2 : 4) + 255) & ~std::size_t{255};
  }
  // High halves of bf16-valued floats (exact: their low halves are zero).
  static void Narrow(const float* src, std::size_t n, std::uint16_t* dst) {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u;
      std::memcpy(&u, src + i, sizeof u);
      dst[i] = static_cast<std::uint16_t>(u >> 16);
    }
  }
  bool bf16_;
  std::vector<Item> items_;
  std::size_t total_ = 0;
};

// True when every value of every weight matrix this stage uploads (its layers' projections,
// routers, shared and routed experts; lm_head and the MTP head where it holds them) is a bf16
// value. One pass over the host weights at start-up.
bool MatricesAreBf16(const ModelWeights& w, int layer_begin, int layer_end, bool last, bool mtp) {
  auto exact = [](const Mat& m) {
    const std::size_t n = U(m.rows) * U(m.cols);
    std::uint32_t any = 0;  // OR of the low halves: zero iff all are bf16 values
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u;
      std::memcpy(&u, m.data + i, sizeof u);
      any |= u & 0xffffu;
    }
    return any == 0;
  };
  auto ffn = [&](const FfnWeights& f) { return f.gate.rows == 0 || (exact(f.gate) && exact(f.up) && exact(f.down)); };
  auto layer = [&](const LayerWeights& lw) {
    bool ok = lw.type == LayerType::kFullAttention
                  ? exact(lw.attn.q_proj) && exact(lw.attn.k_proj) && exact(lw.attn.v_proj) && exact(lw.attn.o_proj)
                  : exact(lw.gdn.in_proj_qkvz) && exact(lw.gdn.in_proj_ba) && exact(lw.gdn.out_proj);
    if (!ok) return false;
    if (!lw.moe) return ffn(lw.ffn_dense);
    if (!exact(lw.ffn_moe.router) || !ffn(lw.ffn_moe.shared)) return false;
    for (const FfnWeights& f : lw.ffn_moe.experts)
      if (!ffn(f)) return false;
    return true;
  };
  for (int il = layer_begin; il < layer_end; ++il)
    if (!layer(w.layers[U(il)])) return false;
  if (last && !exact(w.lm_head)) return false;
  if (mtp && (!exact(w.mtp.fc) || !layer(w.mtp.layer))) return false;
  return true;
}

// Host-side pointer tables, patched by the packers, uploaded after.
struct ExpertTables {
  std::vector<const void*> gate, up, down;  // [E]
};

void AddLayer(const LayerWeights& lw, const ModelConfig& c, const ExpertCache* cache, int cache_layer, Packer& dev,
              Packer& host, DLayer* out, ExpertTables* tables) {
  out->type = lw.type;
  out->moe = lw.moe;
  dev.Add(lw.input_norm, U(c.n_embd), &out->input_norm);
  dev.Add(lw.post_norm, U(c.n_embd), &out->post_norm);
  if (lw.type == LayerType::kFullAttention) {
    dev.Add(lw.attn.q_proj, &out->q_proj);
    dev.Add(lw.attn.k_proj, &out->k_proj);
    dev.Add(lw.attn.v_proj, &out->v_proj);
    dev.Add(lw.attn.o_proj, &out->o_proj);
    dev.Add(lw.attn.q_norm, U(c.head_dim), &out->q_norm);
    dev.Add(lw.attn.k_norm, U(c.head_dim), &out->k_norm);
  } else {
    dev.Add(lw.gdn.in_proj_qkvz, &out->in_proj_qkvz);
    dev.Add(lw.gdn.in_proj_ba, &out->in_proj_ba);
    dev.Add(lw.gdn.out_proj, &out->out_proj);
    dev.Add(lw.gdn.conv1d, U(c.conv_dim()) * U(c.conv_kernel), &out->conv1d);
    dev.Add(lw.gdn.dt_bias, U(c.n_v_heads), &out->dt_bias);
    dev.Add(lw.gdn.a_log, U(c.n_v_heads), &out->a_log);
    dev.Add(lw.gdn.norm, U(c.v_head_dim), &out->norm);
  }
  if (lw.moe) {
    dev.Add(lw.ffn_moe.router, &out->router);
    if (lw.ffn_moe.shared.gate.rows > 0) {
      dev.Add(lw.ffn_moe.shared.gate, &out->shared.gate);
      dev.Add(lw.ffn_moe.shared.up, &out->shared.up);
      dev.Add(lw.ffn_moe.shared.down, &out->shared.down);
      dev.Add(lw.ffn_moe.shared_gate, U(c.n_embd), &out->shared_gate);
    }
    const std::size_t ne = lw.ffn_moe.experts.size();
    tables->gate.assign(ne, nullptr);
    tables->up.assign(ne, nullptr);
    tables->down.assign(ne, nullptr);
    out->cache_layer = cache_layer;
    for (std::size_t e = 0; e < ne; ++e) {
      const FfnWeights& f = lw.ffn_moe.experts[e];
      Packer& p = cache->resident(cache_layer, static_cast<int>(e)) ? dev : host;
      p.AddMatrix(f.gate.data, U(f.gate.rows) * U(f.gate.cols), &tables->gate[e]);
      p.AddMatrix(f.up.data, U(f.up.rows) * U(f.up.cols), &tables->up[e]);
      p.AddMatrix(f.down.data, U(f.down.rows) * U(f.down.cols), &tables->down[e]);
    }
  } else {
    dev.Add(lw.ffn_dense.gate, &out->dense.gate);
    dev.Add(lw.ffn_dense.up, &out->dense.up);
    dev.Add(lw.ffn_dense.down, &out->dense.down);
  }
}

}  // namespace

Status CudaStageSession::Init() {
  DeviceScope scope(device_);
  LOCKSTEP_CUDA_CHECK(cudaSetDevice(device_));
  DeviceStageImpl& d = *d_;
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

  const bool mtp = is_last() && w_.mtp.present;
  // LOCKSTEP_CUDA_F32_WEIGHTS=1 keeps f32 matrices even when bf16 would be lossless (to compare
  // the two paths; they must agree bit for bit).
  const char* force_f32 = std::getenv("LOCKSTEP_CUDA_F32_WEIGHTS");  // env: LOCKSTEP_CUDA_F32_WEIGHTS
  d.weights_bf16 = !(force_f32 && std::string(force_f32) == "1") &&
                   MatricesAreBf16(w_, layer_begin(), layer_end(), is_last(), mtp);

  // Expert residency, as on the CPU (the same logical map, so hits and misses agree across
  // backends). Bytes fetched are the bytes a miss reads over PCIe here: half the CPU's f32
  // figure when the experts are held as bf16.
  std::vector<int> moe_layers;
  std::uint64_t expert_bytes = 0;
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const LayerWeights& lw = w_.layers[U(il)];
    if (lw.moe) {
      moe_layers.push_back(il);
      expert_bytes = lw.ffn_moe.experts.empty() ? 0 : lw.ffn_moe.experts[0].bytes();
    }
  }
  if (d.weights_bf16) expert_bytes /= 2;
  const int n_exp = std::max(c_.n_experts, 0);
  d.experts = std::make_unique<ExpertCache>(moe_layers, n_exp, cfg_.ResidentExperts(n_exp), expert_bytes);
  if (mtp)
    d.mtp_experts = std::make_unique<ExpertCache>(std::vector<int>{c_.n_layers}, n_exp, cfg_.ResidentExperts(n_exp),
                                                  expert_bytes);

  Packer dev(d.weights_bf16), host(d.weights_bf16);
  d.layers.resize(U(layer_end() - layer_begin()));
  std::vector<ExpertTables> tables(d.layers.size() + 1);
  int local_moe = 0;
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const std::size_t l = U(il - layer_begin());
    const LayerWeights& lw = w_.layers[U(il)];
    AddLayer(lw, c_, d.experts.get(), lw.moe ? local_moe : -1, dev, host, &d.layers[l], &tables[l]);
    if (lw.moe) ++local_moe;
  }
  if (is_first() || mtp) dev.AddF32(w_.embed, &d.embed);
  if (is_last()) {
    dev.Add(w_.lm_head, &d.lm_head);
    dev.Add(w_.final_norm, U(c_.n_embd), &d.final_norm);
  }
  if (mtp) {
    const MtpWeights& mw = w_.mtp;
    dev.Add(mw.fc, &d.mtp_fc);
    dev.Add(mw.pre_fc_norm_embedding, U(c_.n_embd), &d.mtp_pre_emb);
    dev.Add(mw.pre_fc_norm_hidden, U(c_.n_embd), &d.mtp_pre_hid);
    dev.Add(mw.norm, U(c_.n_embd), &d.mtp_norm);
    AddLayer(mw.layer, c_, d.mtp_experts.get(), mw.layer.moe ? 0 : -1, dev, host, &d.mtp_layer, &tables.back());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(d.dense, dev.ToDevice());
  LOCKSTEP_ASSIGN_OR_RETURN(d.host_experts, host.ToPinned());

  // Pointer tables: 3 x [E] per MoE layer (and the MTP layer), one device buffer.
  std::vector<const void*> flat;
  std::vector<std::size_t> table_offset(tables.size(), 0);
  for (std::size_t i = 0; i < tables.size(); ++i) {
    table_offset[i] = flat.size();
    flat.insert(flat.end(), tables[i].gate.begin(), tables[i].gate.end());
    flat.insert(flat.end(), tables[i].up.begin(), tables[i].up.end());
    flat.insert(flat.end(), tables[i].down.begin(), tables[i].down.end());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(d.ptr_tables, DeviceBuffer::Alloc(std::max<std::size_t>(flat.size(), 1) * sizeof(void*), "expert pointer tables"));
  if (!flat.empty())
    LOCKSTEP_CUDA_CHECK(cudaMemcpy(d.ptr_tables.get(), flat.data(), flat.size() * sizeof(void*), cudaMemcpyHostToDevice));
  auto* base = d.ptr_tables.as<const void*>();
  auto patch = [&](DLayer& L, std::size_t ti) {
    if (!L.moe) return;
    const std::size_t ne = tables[ti].gate.size();
    L.gate_ptrs = base + table_offset[ti];
    L.up_ptrs = base + table_offset[ti] + ne;
    L.down_ptrs = base + table_offset[ti] + 2 * ne;
  };
  for (std::size_t l = 0; l < d.layers.size(); ++l) patch(d.layers[l], l);
  if (mtp) patch(d.mtp_layer, tables.size() - 1);

  // RoPE inverse frequencies, exactly as cpu::Rope computes them.
  const int half = c_.rotary_dim / 2;
  std::vector<float> inv(U(std::max(half, 1)), 0.0f);
  for (int i = 0; i < half; ++i)
    inv[U(i)] = 1.0f / std::pow(static_cast<float>(c_.rope_theta), static_cast<float>(2 * i) / static_cast<float>(c_.rotary_dim));
  LOCKSTEP_ASSIGN_OR_RETURN(d.inv_freq, DeviceBuffer::Alloc(inv.size() * sizeof(float), "RoPE frequencies"));
  LOCKSTEP_CUDA_CHECK(cudaMemcpy(d.inv_freq.get(), inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice));

  // State: K/V caches and GDN checkpoints (zeros, like the CPU's).
  auto make_kv = [&]() {
    auto kv = std::make_unique<DKv>();
    kv->elem = dtype_size(cfg_.kv_dtype);
    kv->mirror = std::make_unique<KvCache>(c_.n_heads_kv, c_.head_dim, cfg_.kv_dtype, cfg_.kv_page_rows);
    return kv;
  };
  for (int il = layer_begin(); il < layer_end(); ++il) {
    if (w_.layers[U(il)].type == LayerType::kFullAttention) {
      d.kv.push_back(make_kv());
      d.gdn.push_back(nullptr);
    } else {
      d.kv.push_back(nullptr);
      auto g = std::make_unique<DGdn>();
      g->mirror = std::make_unique<GdnState>(c_.conv_dim(), c_.conv_kernel, c_.n_v_heads, c_.k_head_dim, c_.v_head_dim);
      LOCKSTEP_ASSIGN_OR_RETURN(g->conv, DeviceBuffer::Alloc(g->mirror->conv_size() * sizeof(float), "GDN conv state"));
      LOCKSTEP_ASSIGN_OR_RETURN(g->ssm, DeviceBuffer::Alloc(g->mirror->ssm_size() * sizeof(float), "GDN recurrent state"));
      LOCKSTEP_CUDA_CHECK(cudaMemset(g->conv.get(), 0, g->conv.bytes()));
      LOCKSTEP_CUDA_CHECK(cudaMemset(g->ssm.get(), 0, g->ssm.bytes()));
      d.gdn.push_back(std::move(g));
    }
  }
  if (mtp) d.mtp_kv = make_kv();
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

// ---- the layer loop, eager or from a CUDA graph ----

Status CudaStageSession::EagerLayers(Ctx& x, int T, int p) {
  DeviceStageImpl& d = *d_;
  // Each layer's residual add also applies the next layer's input norm (one launch fewer per
  // layer; bitwise the separate kernels). The stage's last layer ends with the add alone.
  float* a = nullptr;
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const std::size_t l = U(il - layer_begin());
    LayerLink link;
    link.a = a;
    if (il + 1 < layer_end()) {
      link.next_norm = d.layers[l + 1].input_norm;
      link.next_a = &a;
    }
    LOCKSTEP_RETURN_IF_ERROR(LayerForward(x, d.layers[l], d.experts.get(), d.hidden.as<float>(), T, p,
                                          d.kv[l].get(), d.gdn[l].get(), link));
  }
  return Status::Ok();
}

void CudaStageSession::GraphsOff(const std::string& why) {
  DeviceStageImpl& d = *d_;
  d.graphs_off = why;
  d.graphs.clear();
  d.mtp_graphs.clear();
  cudaGetLastError();  // the failed capture's error is handled here: the layers run eagerly
  std::fprintf(stderr, "lockstep: warning: cuda stage %d: CUDA graphs off for this run (%s); kernels are launched one by one\n",
               index(), why.c_str());
}

// Verify windows (decode is a window of one) are where launch overhead matters: a stage issues
// ~17 kernels per layer for a few microseconds of work each. Their layer loop is captured once
// per window size T into a CUDA graph and replayed; the kernels and arguments are the eager ones
// (the position comes from device memory, ops.h Pos), so results are bitwise the same. The MTP
// head's draft steps are graphed the same way (MtpForward).
//
// A graph holds buffer addresses, so it is used only while nothing it points into has been
// reallocated (the section's layout key). Nothing may grow during a capture either (an allocation
// or a sync would invalidate it), so a section is captured only after an eager run with the same
// layout grew nothing, and only when the K/V caches already hold p + T rows. Anything else runs
// eagerly, which grows what it needs; capture and instantiation count as one-time set-up
// (init_ns).
Status CudaStageSession::RunLayers(Ctx& x, int T, int p) {
  DeviceStageImpl& d = *d_;
  x.SetPosition(p);
  d.last_graph_use = GraphUse::kEager;
  if (!backend_->graphs() || x.mode != ForwardMode::kVerify || !d.graphs_off.empty()) return EagerLayers(x, T, p);
  for (const auto& kv : d.kv)
    if (kv && p + T > kv->capacity) return EagerLayers(x, T, p);
  for (const auto& g : d.gdn)
    if (g && T > g->steps_capacity) return EagerLayers(x, T, p);
  auto replay = [&] {  // the host bookkeeping EagerLayers does for a verify window
    for (auto& kv : d.kv)
      if (kv) kv->written = p + T;
    for (auto& g : d.gdn)
      if (g) g->n_steps = T;
  };
  return Graphed(
      d.graphs[T], [&d] { return LayoutKey(d); }, [&] { return EagerLayers(x, T, p); }, replay, &d.last_graph_use);
}

Status CudaStageSession::Graphed(SectionGraph& gr, const std::function<std::vector<std::uintptr_t>()>& key_of,
                                 const std::function<Status()>& body, const std::function<void()>& replay,
                                 GraphUse* use) {
  DeviceStageImpl& d = *d_;
  *use = GraphUse::kEager;
  // The graph's router kernels write the routing at fixed offsets of route_host: those of an empty
  // buffer (Forward and MtpForward flush the previous call's routing first).
  if (d.route_used != 0) return body();
  const std::vector<std::uintptr_t> key = key_of();
  if (!gr.exec || gr.layout != key) {
    gr.exec.reset();
    if (gr.warm != key) {
      LOCKSTEP_RETURN_IF_ERROR(body());
      if (key_of() == key) gr.warm = key;
      return Status::Ok();
    }
    // Capture. The host bookkeeping of the section (K/V rows written, GDN steps, routing records)
    // happens as the capture runs it; a replay redoes it below.
    const std::int64_t t0 = MonotonicNs();
    const DeviceArena::Mark arena0 = d.arena.Here();
    cudaError_t e = cudaStreamBeginCapture(d.s(), cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      GraphsOff(std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e));
      return body();
    }
    const Status st = body();
    cudaGraph_t g = nullptr;
    e = cudaStreamEndCapture(d.s(), &g);
    GraphPtr graph(g);
    cudaGraphExec_t exec = nullptr;
    if (st.ok() && e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph.get(), 0);
    if (!st.ok() || e != cudaSuccess) {
      // Nothing of the capture ran: undo its bookkeeping and run the section for real.
      d.pending_routes.clear();
      d.route_used = 0;
      d.arena.Rewind(arena0);
      GraphsOff(!st.ok() ? "capture: " + st.ToString() : std::string("capture: ") + cudaGetErrorString(e));
      return body();
    }
    gr.exec.reset(exec);
    gr.layout = key;
    gr.routes = d.pending_routes;
    gr.route_used = d.route_used;
    gr.arena_end = d.arena.Here();
    ++d.graph_captures;
    d.init_ns += MonotonicNs() - t0;
    *use = GraphUse::kCapture;
  } else {
    replay();
    d.pending_routes = gr.routes;
    d.route_used = gr.route_used;
    d.arena.Rewind(gr.arena_end);
    *use = GraphUse::kReplay;
  }
  LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(gr.exec.get(), d.s()));
  ++d.graph_launches;
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
      LOCKSTEP_ASSIGN_OR_RETURN(d.cublas_ws, DeviceBuffer::Alloc(std::size_t{32} << 20, "cuBLAS workspace"));
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
                                                      " outside the vocabulary (size " + std::to_string(c_.n_vocab) + ")");
      if (T > d.token_cap) {
        LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));
        d.token_cap = std::max(T, 1024);
        LOCKSTEP_ASSIGN_OR_RETURN(d.tokens, DeviceBuffer::Alloc(U(d.token_cap) * sizeof(int), "token ids"));
      }
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_up0.get(), d.s()));
      LOCKSTEP_RETURN_IF_ERROR(Upload(d, d.tokens.get(), tokens, U(T) * sizeof(int)));
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_up1.get(), d.s()));
      d.up_timed = true;
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_in.get(), d.s()));
      EmbedRows(d.embed.f32(), d.tokens.as<int>(), T, h, d.hidden.as<float>(), d.s());
    } else {
      const auto* in = dynamic_cast<const CudaActivation*>(act.device.get());
      if (in == nullptr) return Status::Runtime("cuda stage", "input activations are not on a CUDA device");
      // Start of the hand-off: the time between this and ev_in is the synchronisation.
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_begin.get(), d.s()));
      LOCKSTEP_RETURN_IF_ERROR(backend_->HandOff(*in, device_, d.s(), d.hidden.as<float>()));
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_in.get(), d.s()));
    }
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_start.get(), d.s()));
    Ctx x{c_, d, mode, backend_->deterministic(), backend_->attn_split(),
          mode == ForwardMode::kPrefill ? KvHeadroom(cfg_) : 0, d.s(), &d.init_ns};
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
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(g->conv.get(), g->steps_conv.as<float>() + U(n - 1) * conv_floats,
                                          conv_floats * sizeof(float), cudaMemcpyDeviceToDevice, d.s()));
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(g->ssm.get(), g->steps_ssm.as<float>() + U(n - 1) * ssm_floats,
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
    KvScaleRows(item == ItemKind::kK ? 0 : 1, act.p, act.T, c_.n_heads_kv, c_.head_dim, KvDtypeCode(kv.mirror->dtype()),
                kv.k.get(), kv.v.get(), int8 ? kv.ks.as<float>() : nullptr, int8 ? kv.vs.as<float>() : nullptr, factor,
                d.s());
  } else if (item == ItemKind::kConvState || item == ItemKind::kSsmState) {
    DGdn& g = *d.gdn[U(layer - layer_begin())];
    const bool conv = item == ItemKind::kConvState;
    const std::size_t per = conv ? g.mirror->conv_size() : g.mirror->ssm_size();
    Scale(conv ? g.steps_conv.as<float>() : g.steps_ssm.as<float>(), static_cast<std::int64_t>(per * U(g.n_steps)),
          factor, d.s());
  } else if (item == ItemKind::kHiddenOut) {
    Scale(d.hidden.as<float>(), static_cast<std::int64_t>(act.T) * c_.n_embd, factor, d.s());
  }
  const cudaError_t e = cudaGetLastError();
  Keep(e == cudaSuccess ? Status::Ok() : Status::Runtime(std::string("cuda perturb ") + ItemKindName(item), cudaGetErrorString(e)));
}

void CudaStageSession::FillDeviceTiming(StageTiming* t) {
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  auto ms_to_ns = [](float ms) { return static_cast<std::int64_t>(static_cast<double>(ms) * 1e6); };
  float ms = 0;
  if (cudaEventElapsedTime(&ms, d.ev_start.get(), d.ev_done.get()) == cudaSuccess) t->dev_compute_ns = ms_to_ns(ms);
  if (cudaEventElapsedTime(&ms, d.ev_begin.get(), d.ev_in.get()) == cudaSuccess) t->dev_wait_ns = ms_to_ns(ms);
  std::int64_t copy = 0;  // measured: 0 when this stage copied nothing to or from the host
  if (d.up_timed && cudaEventElapsedTime(&ms, d.ev_up0.get(), d.ev_up1.get()) == cudaSuccess) copy += ms_to_ns(ms);
  if (d.copy_timed && cudaEventElapsedTime(&ms, d.ev_copy0.get(), d.ev_copy1.get()) == cudaSuccess)
    copy += ms_to_ns(ms);
  t->dev_copy_ns = copy;
  t->init_ns = d.init_ns;
  t->graph = d.last_graph_use;
  cudaGetLastError();  // a failed elapsed-time query (event not recorded) is not an error of the run
}

void CudaStageSession::MtpForward(const float* hid, const std::int32_t* next_tokens, int p, int T, ForwardMode mode,
                                  float* m, float* logits, int n_logits) {
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
    Ctx x{c_, d, mode, backend_->deterministic(), backend_->attn_split(),
          mode == ForwardMode::kPrefill ? KvHeadroom(cfg_) : 0, d.s(), &d.init_ns};
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
    LOCKSTEP_RETURN_IF_ERROR(UploadParts(d, in, {{hid, U(T) * U(h) * sizeof(float)}, {next_tokens, U(T) * sizeof(int)}}));
    x.SetPosition(p);
    float* mh = d.mtp_hidden.as<float>();
    auto body = [&]() -> Status {
      EmbedRows(d.embed.f32(), tok, T, h, emb, d.s());
      RmsNormZc(emb, h, T, h, d.mtp_pre_emb, c_.rms_norm_eps, cat, 2 * h, d.s());
      RmsNormZc(hd, h, T, h, d.mtp_pre_hid, c_.rms_norm_eps, cat + h, 2 * h, d.s());
      LOCKSTEP_RETURN_IF_ERROR(x.Mm(cat, T, d.mtp_fc, mh));
      LOCKSTEP_RETURN_IF_ERROR(LayerForward(x, d.mtp_layer, d.mtp_experts.get(), mh, T, p, d.mtp_kv.get(), nullptr));
      RmsNormZc(mh, h, T, h, d.mtp_norm, c_.rms_norm_eps, md, h, d.s());
      if (nl > 0) RowsMm(md + U(T - nl) * U(h), nl, d.lm_head, ld, V, d.s());
      LOCKSTEP_CUDA_CHECK(cudaGetLastError());
      return Status::Ok();
    };
    // Draft steps (verify mode) replay a graph per (T, logit rows) like the verify layers do; the
    // MTP's K/V cache must already hold the rows (growing it syncs, which a capture cannot).
    if (backend_->graphs() && mode == ForwardMode::kVerify && d.graphs_off.empty() && p + T <= d.mtp_kv->capacity) {
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
