#include "cuda/cuda_stage.h"

#include <nvtx3/nvToolsExt.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/ops.h"
#include "lockstep/engine/check.h"

namespace lockstep::cuda {

namespace {

inline std::size_t U(int x) { return static_cast<std::size_t>(x); }

std::int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int KvDtypeCode(DType d) { return d == DType::kF32 ? 0 : d == DType::kBF16 ? 1 : 2; }

// A device weight matrix view: f32 [rows=out, cols=in].
struct DMat {
  const float* d = nullptr;
  int rows = 0;
  int cols = 0;
};
struct DFfn {
  DMat gate, up, down;
};

struct DLayer {
  LayerType type = LayerType::kLinearAttention;
  bool moe = true;
  const float* input_norm = nullptr;  // f32 [H]
  const float* post_norm = nullptr;   // f32 [H]
  // full attention
  DMat q_proj, k_proj, v_proj, o_proj;
  const float* q_norm = nullptr;  // f32 [D]
  const float* k_norm = nullptr;  // f32 [D]
  // gated DeltaNet
  DMat in_proj_qkvz, in_proj_ba, out_proj;
  const float* conv1d = nullptr;   // f32 [conv_dim, K]
  const float* dt_bias = nullptr;  // f32 [Hv]
  const float* a_log = nullptr;    // f32 [Hv]
  const float* norm = nullptr;     // f32 [Dv]
  // MoE
  DMat router;
  DFfn shared;
  const float* shared_gate = nullptr;    // f32 [H]
  const float* const* gate_ptrs = nullptr;  // device array [E] of expert gate weights (device or host-mapped)
  const float* const* up_ptrs = nullptr;
  const float* const* down_ptrs = nullptr;
  int cache_layer = -1;  // local index in the stage's (or the MTP's) ExpertCache
  // dense FFN
  DFfn dense;
};

// Device K/V cache of one attention layer: k, v dtype [capacity, Hkv, D]; scales f32
// [capacity, Hkv] (int8).
struct DKv {
  DeviceBuffer k, v, ks, vs;
  int capacity = 0;
  int committed = 0;
  int written = 0;
  std::unique_ptr<KvCache> mirror;  // host view, CPU layout
  std::size_t elem = 4;             // bytes per element
};

// Device GDN state: checkpoint conv f32 [K-1, conv_dim], ssm f32 [Hv, Dk, Dv]; per-step scratch.
struct DGdn {
  DeviceBuffer conv, ssm, steps_conv, steps_ssm;
  int steps_capacity = 0;
  int n_steps = 0;
  int position = 0;
  std::unique_ptr<GdnState> mirror;
};

// Scratch on the device, reused across calls (the device twin of engine/arena.h): blocks are
// never freed, so after the first window of a size no allocation happens.
class DeviceArena {
 public:
  Result<float*> Alloc(std::size_t n, std::int64_t* alloc_ns) {
    n = (n + 63) & ~std::size_t{63};  // 256-byte alignment
    while (block_ < blocks_.size()) {
      Block& b = blocks_[block_];
      if (offset_ + n <= b.floats) {
        float* p = b.buf.as<float>() + offset_;
        offset_ += n;
        return p;
      }
      ++block_;
      offset_ = 0;
    }
    const std::int64_t t0 = MonoNs();
    Block b;
    b.floats = std::max<std::size_t>(n, std::size_t{16} << 20);  // 64 MiB blocks
    LOCKSTEP_ASSIGN_OR_RETURN(b.buf, DeviceBuffer::Alloc(b.floats * sizeof(float)));
    *alloc_ns += MonoNs() - t0;
    blocks_.push_back(std::move(b));
    block_ = blocks_.size() - 1;
    offset_ = n;
    return blocks_.back().buf.as<float>();
  }
  void Reset() {
    block_ = 0;
    offset_ = 0;
  }

 private:
  struct Block {
    DeviceBuffer buf;
    std::size_t floats = 0;
  };
  std::vector<Block> blocks_;
  std::size_t block_ = 0;
  std::size_t offset_ = 0;
};

}  // namespace

struct DeviceStageImpl {
  StreamPtr stream;
  CublasPtr cublas;
  DeviceBuffer cublas_ws;
  // Timing events of the current call: begin (stream reaches the window) -> in (input there) ->
  // start/done (the stage's kernels); up0/up1 around the token upload, copy0/copy1 around the
  // logits download. consumed: recorded by the next stage once it has its copy of `hidden`.
  EventPtr ev_begin, ev_in, ev_start, ev_done, ev_up0, ev_up1, ev_copy0, ev_copy1, ev_consumed;
  bool up_timed = false;
  bool copy_timed = false;
  std::int64_t init_ns = 0;  // set-up time spent in the current call

  DeviceBuffer dense;      // every non-expert weight of the stage + resident experts
  PinnedBuffer host_experts;  // non-resident routed experts (host-mapped)
  DeviceBuffer ptr_tables;    // per MoE layer 3 x [E] expert pointers
  DeviceBuffer inv_freq;      // f32 [R/2]
  std::vector<DLayer> layers; // [layers in stage]
  DLayer mtp_layer;
  DMat embed, lm_head, mtp_fc;
  const float* final_norm = nullptr;
  const float* mtp_pre_emb = nullptr;
  const float* mtp_pre_hid = nullptr;
  const float* mtp_norm = nullptr;

  std::vector<std::unique_ptr<DKv>> kv;    // [layers in stage], null for GDN layers
  std::vector<std::unique_ptr<DGdn>> gdn;  // [layers in stage], null for attention layers
  std::unique_ptr<DKv> mtp_kv;
  std::unique_ptr<ExpertCache> experts;
  std::unique_ptr<ExpertCache> mtp_experts;

  DeviceBuffer hidden;  // f32 [hidden_rows, H] residual stream, in place
  int hidden_rows = 0;
  DeviceBuffer mtp_hidden;
  int mtp_rows = 0;
  DeviceBuffer tokens;  // int32 [token_cap]
  int token_cap = 0;
  PinnedBuffer staging;  // host staging for uploads / downloads
  DeviceArena arena;

  // Routing copied back for the expert counters: int32 [calls][T*k] in `route_host`.
  PinnedBuffer route_host;
  std::size_t route_cap = 0;  // ints
  struct RouteRec {
    ExpertCache* cache;
    int layer;
    int n;  // T*k ints at offset
    std::size_t offset;
  };
  std::vector<RouteRec> pending_routes;
  std::size_t route_used = 0;

  cudaStream_t s() const { return stream.get(); }
};

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

// ---- weights ----

namespace {

// Collects host tensors, then copies them into one device (or pinned) buffer and patches the
// views. Offsets are 256-byte aligned.
class Packer {
 public:
  void Add(const float* host, std::size_t n, const float** slot) {
    items_.push_back({host, n, slot, total_});
    total_ += (n + 63) & ~std::size_t{63};
  }
  void Add(const Mat& m, DMat* out) {
    out->rows = m.rows;
    out->cols = m.cols;
    Add(m.data, U(m.rows) * U(m.cols), &out->d);
  }
  std::size_t floats() const { return total_; }
  // Device copy (synchronous: start-up only).
  Result<DeviceBuffer> ToDevice() {
    LOCKSTEP_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Alloc(total_ * sizeof(float)));
    for (const Item& it : items_) {
      LOCKSTEP_CUDA_CHECK(cudaMemcpy(buf.as<float>() + it.offset, it.host, it.n * sizeof(float), cudaMemcpyHostToDevice));
      *it.slot = buf.as<float>() + it.offset;
    }
    return buf;
  }
  Result<PinnedBuffer> ToPinned() {
    LOCKSTEP_ASSIGN_OR_RETURN(PinnedBuffer buf, PinnedBuffer::Alloc(total_ * sizeof(float)));
    LOCKSTEP_ASSIGN_OR_RETURN(void* dev, buf.device_ptr());
    for (const Item& it : items_) {
      std::memcpy(buf.as<float>() + it.offset, it.host, it.n * sizeof(float));
      *it.slot = static_cast<float*>(dev) + it.offset;
    }
    return buf;
  }

 private:
  struct Item {
    const float* host;
    std::size_t n;
    const float** slot;
    std::size_t offset;
  };
  std::vector<Item> items_;
  std::size_t total_ = 0;
};

// Host-side pointer tables, patched by the packers, uploaded after.
struct ExpertTables {
  std::vector<const float*> gate, up, down;  // [E]
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
      p.Add(f.gate.data, U(f.gate.rows) * U(f.gate.cols), &tables->gate[e]);
      p.Add(f.up.data, U(f.up.rows) * U(f.up.cols), &tables->up[e]);
      p.Add(f.down.data, U(f.down.rows) * U(f.down.cols), &tables->down[e]);
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

  // Expert residency, as on the CPU (same logical map, so counters agree across backends).
  std::vector<int> moe_layers;
  std::uint64_t expert_bytes = 0;
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const LayerWeights& lw = w_.layers[U(il)];
    if (lw.moe) {
      moe_layers.push_back(il);
      expert_bytes = lw.ffn_moe.experts.empty() ? 0 : lw.ffn_moe.experts[0].bytes();
    }
  }
  const int n_exp = std::max(c_.n_experts, 0);
  d.experts = std::make_unique<ExpertCache>(moe_layers, n_exp, cfg_.ResidentExperts(n_exp), expert_bytes);
  const bool mtp = is_last() && w_.mtp.present;
  if (mtp)
    d.mtp_experts = std::make_unique<ExpertCache>(std::vector<int>{c_.n_layers}, n_exp, cfg_.ResidentExperts(n_exp),
                                                  expert_bytes);

  Packer dev, host;
  d.layers.resize(U(layer_end() - layer_begin()));
  std::vector<ExpertTables> tables(d.layers.size() + 1);
  int local_moe = 0;
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const std::size_t l = U(il - layer_begin());
    const LayerWeights& lw = w_.layers[U(il)];
    AddLayer(lw, c_, d.experts.get(), lw.moe ? local_moe : -1, dev, host, &d.layers[l], &tables[l]);
    if (lw.moe) ++local_moe;
  }
  if (is_first() || mtp) dev.Add(w_.embed, &d.embed);
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
  std::vector<const float*> flat;
  std::vector<std::size_t> table_offset(tables.size(), 0);
  for (std::size_t i = 0; i < tables.size(); ++i) {
    table_offset[i] = flat.size();
    flat.insert(flat.end(), tables[i].gate.begin(), tables[i].gate.end());
    flat.insert(flat.end(), tables[i].up.begin(), tables[i].up.end());
    flat.insert(flat.end(), tables[i].down.begin(), tables[i].down.end());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(d.ptr_tables, DeviceBuffer::Alloc(std::max<std::size_t>(flat.size(), 1) * sizeof(void*)));
  if (!flat.empty())
    LOCKSTEP_CUDA_CHECK(cudaMemcpy(d.ptr_tables.get(), flat.data(), flat.size() * sizeof(void*), cudaMemcpyHostToDevice));
  auto* base = d.ptr_tables.as<const float*>();
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
  LOCKSTEP_ASSIGN_OR_RETURN(d.inv_freq, DeviceBuffer::Alloc(inv.size() * sizeof(float)));
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
      LOCKSTEP_ASSIGN_OR_RETURN(g->conv, DeviceBuffer::Alloc(g->mirror->conv_size() * sizeof(float)));
      LOCKSTEP_ASSIGN_OR_RETURN(g->ssm, DeviceBuffer::Alloc(g->mirror->ssm_size() * sizeof(float)));
      LOCKSTEP_CUDA_CHECK(cudaMemset(g->conv.get(), 0, g->conv.bytes()));
      LOCKSTEP_CUDA_CHECK(cudaMemset(g->ssm.get(), 0, g->ssm.bytes()));
      d.gdn.push_back(std::move(g));
    }
  }
  if (mtp) d.mtp_kv = make_kv();
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

// ---- the forward, op by op (the CPU's LayerForward with device buffers) ----

namespace {

struct Ctx {
  const ModelConfig& c;
  DeviceStageImpl& d;
  ForwardMode mode;
  bool deterministic;
  cudaStream_t s;
  std::int64_t* init_ns;

  Result<float*> Alloc(std::size_t n) { return d.arena.Alloc(n, init_ns); }

  // y[T, ldy] = x[T, in] . W^T. Verify windows (and all of deterministic mode's decode path)
  // use the batch-invariant RowsMatmul; prefill uses cuBLAS. Non-deterministic mode sends
  // verify windows of more than one row to cuBLAS too (TF32, shape-dependent algorithm).
  Status Mm(const float* x, int T, const DMat& w, float* y, int ldy = -1) {
    if (ldy < 0) ldy = w.rows;
    const bool gemm = T > 1 && (mode == ForwardMode::kPrefill || !deterministic);
    if (!gemm) {
      RowsMatmul(x, T, w.d, w.rows, w.cols, y, ldy, s);
      return Status::Ok();
    }
    const float one = 1.0f, zero = 0.0f;
    // Row-major y[T, out] = x[T, in] W[out, in]^T is column-major y^T = W^T(op T) x^T.
    LOCKSTEP_CUBLAS_CHECK(cublasSgemm(d.cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, w.rows, T, w.cols, &one, w.d, w.cols, x,
                                      w.cols, &zero, y, ldy));
    return Status::Ok();
  }
};

Status EnsureKvCapacity(DKv& kv, int rows, int hkv, int hd, bool int8, cudaStream_t s, std::int64_t* init_ns) {
  if (rows <= kv.capacity) return Status::Ok();
  const std::int64_t t0 = MonoNs();
  int cap = std::max(kv.capacity * 2, 256);
  while (cap < rows) cap *= 2;
  const std::size_t row_bytes = U(hkv) * U(hd) * kv.elem, srow = U(hkv) * sizeof(float);
  auto grow = [&](DeviceBuffer& buf, std::size_t per_row) -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(DeviceBuffer nb, DeviceBuffer::Alloc(U(cap) * per_row));
    if (kv.written > 0)
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(nb.get(), buf.get(), U(kv.written) * per_row, cudaMemcpyDeviceToDevice, s));
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));  // the old buffer must not be freed under the copy
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
  *init_ns += MonoNs() - t0;
  return Status::Ok();
}

// a f32 [T, H] (normed input) -> out f32 [T, H].
Status AttentionForward(Ctx& x, const DLayer& L, const float* a, int T, int p, DKv& kv, float* out) {
  const ModelConfig& c = x.c;
  const int hq = c.n_heads, hkv = c.n_heads_kv, hd = c.head_dim;
  const std::size_t ut = U(T);
  LOCKSTEP_ASSIGN_OR_RETURN(float* qg, x.Alloc(ut * U(2 * hq * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* k, x.Alloc(ut * U(hkv * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* v, x.Alloc(ut * U(hkv * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* q, x.Alloc(ut * U(hq * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* gate, x.Alloc(ut * U(hq * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* o, x.Alloc(ut * U(hq * hd)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* scores, x.Alloc(ut * U(hq) * U(p + T)));
  LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, L.q_proj, qg));
  LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, L.k_proj, k));
  LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, L.v_proj, v));
  SplitQGate(qg, T, hq, hd, q, gate, x.s);
  RmsNormZc(q, hd, T * hq, hd, L.q_norm, c.rms_norm_eps, q, hd, x.s);
  RopeApply(q, T, hq * hd, hq, hd, c.rotary_dim, x.d.inv_freq.as<float>(), p, x.s);
  RmsNormZc(k, hd, T * hkv, hd, L.k_norm, c.rms_norm_eps, k, hd, x.s);
  RopeApply(k, T, hkv * hd, hkv, hd, c.rotary_dim, x.d.inv_freq.as<float>(), p, x.s);
  const bool int8 = kv.mirror->dtype() == DType::kI8;
  const int code = KvDtypeCode(kv.mirror->dtype());
  LOCKSTEP_RETURN_IF_ERROR(EnsureKvCapacity(kv, p + T, hkv, hd, int8, x.s, x.init_ns));
  KvStore(k, v, T, p, hkv, hd, code, kv.k.get(), kv.v.get(), int8 ? kv.ks.as<float>() : nullptr,
          int8 ? kv.vs.as<float>() : nullptr, x.s);
  kv.written = p + T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Attention(q, T, p, hq, hkv, hd, code, kv.k.get(), kv.v.get(), int8 ? kv.ks.as<float>() : nullptr,
            int8 ? kv.vs.as<float>() : nullptr, scale, scores, p + T, o, x.s);
  MulSigmoid(o, gate, static_cast<std::int64_t>(ut * U(hq * hd)), x.s);
  return x.Mm(o, T, L.o_proj, out);
}

Status EnsureSteps(DGdn& g, int T, std::size_t conv_floats, std::size_t ssm_floats, std::int64_t* init_ns) {
  if (T <= g.steps_capacity) return Status::Ok();
  const std::int64_t t0 = MonoNs();
  const int cap = std::max(T, 16);
  LOCKSTEP_ASSIGN_OR_RETURN(g.steps_conv, DeviceBuffer::Alloc(U(cap) * conv_floats * sizeof(float)));
  LOCKSTEP_ASSIGN_OR_RETURN(g.steps_ssm, DeviceBuffer::Alloc(U(cap) * ssm_floats * sizeof(float)));
  g.steps_capacity = cap;
  *init_ns += MonoNs() - t0;
  return Status::Ok();
}

Status GdnForward(Ctx& x, const DLayer& L, const float* a, int T, DGdn& g, float* out) {
  const ModelConfig& c = x.c;
  const int hk = c.n_k_heads, hv = c.n_v_heads, dk = c.k_head_dim, dv = c.v_head_dim;
  const int conv_dim = c.conv_dim(), kw = c.conv_kernel, kr = kw - 1;
  const std::size_t ut = U(T), conv_floats = U(kr) * U(conv_dim), ssm_floats = U(hv) * U(dk) * U(dv);
  LOCKSTEP_ASSIGN_OR_RETURN(float* P, x.Alloc(ut * U(c.qkvz_dim())));
  LOCKSTEP_ASSIGN_OR_RETURN(float* B, x.Alloc(ut * U(2 * hv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* win, x.Alloc(U(kr + T) * U(conv_dim)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* Z, x.Alloc(ut * U(hv) * U(dv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* beta, x.Alloc(ut * U(hv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* gdec, x.Alloc(ut * U(hv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* Uc, x.Alloc(ut * U(conv_dim)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* qh, x.Alloc(ut * U(hk) * U(dk)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* kh, x.Alloc(ut * U(hk) * U(dk)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* O, x.Alloc(ut * U(hv) * U(dv)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* On, x.Alloc(ut * U(hv) * U(dv)));
  LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, L.in_proj_qkvz, P));
  LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, L.in_proj_ba, B));
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(win, g.conv.get(), conv_floats * sizeof(float), cudaMemcpyDeviceToDevice, x.s));
  GdnSplit(P, B, T, hk, hv, dk, dv, kw, L.a_log, L.dt_bias, win, Z, beta, gdec, x.s);
  CausalConvSilu(win, T, conv_dim, kw, L.conv1d, Uc, x.s);
  GdnQkNorm(Uc, T, hk, dk, conv_dim, qh, kh, x.s);
  if (x.mode == ForwardMode::kVerify) {
    LOCKSTEP_RETURN_IF_ERROR(EnsureSteps(g, T, conv_floats, ssm_floats, x.init_ns));
    for (int t = 0; t < T; ++t)  // conv state after step t = the K-1 inputs ending at t
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(g.steps_conv.as<float>() + U(t) * conv_floats, win + U(t + 1) * U(conv_dim),
                                          conv_floats * sizeof(float), cudaMemcpyDeviceToDevice, x.s));
    GdnRecurrent(g.ssm.as<float>(), g.steps_ssm.as<float>(), qh, kh, Uc, gdec, beta, T, hk, hv, dk, dv, conv_dim, O,
                 x.s);
    g.n_steps = T;
  } else {
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(g.conv.get(), win + ut * U(conv_dim), conv_floats * sizeof(float),
                                        cudaMemcpyDeviceToDevice, x.s));
    GdnRecurrent(g.ssm.as<float>(), nullptr, qh, kh, Uc, gdec, beta, T, hk, hv, dk, dv, conv_dim, O, x.s);
    g.position += T;
  }
  GatedRmsNorm(O, Z, T * hv, dv, L.norm, c.rms_norm_eps, On, x.s);
  return x.Mm(On, T, L.out_proj, out);
}

Status FfnForward(Ctx& x, const DFfn& f, const float* a, int T, float* out) {
  const std::size_t n = U(T) * U(f.gate.rows);
  LOCKSTEP_ASSIGN_OR_RETURN(float* g, x.Alloc(n));
  LOCKSTEP_ASSIGN_OR_RETURN(float* u, x.Alloc(n));
  LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, f.gate, g));
  LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, f.up, u));
  SiluMul(g, u, static_cast<std::int64_t>(n), x.s);
  return x.Mm(g, T, f.down, out);
}

Status MoeForward(Ctx& x, const DLayer& L, const float* a, int T, ExpertCache* cache, float* out) {
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
  LOCKSTEP_RETURN_IF_ERROR(x.Mm(a, T, L.router, logits));
  RouteTopK(logits, T, ne, k, c.norm_topk_prob, idx, wts, x.s);
  GroupByExpert(idx, T, k, ne, slot_of, first, active, n_active, x.s);
  ExpertGateUp(a, h, inter, k, slot_of, first, active, n_active, max_active, L.gate_ptrs, L.up_ptrs, act, x.s);
  ExpertDown(act, h, inter, slot_of, first, active, n_active, max_active, L.down_ptrs, ranked, x.s);
  MoeCombine(ranked, wts, T, k, h, out, x.s);
  if (L.shared.gate.rows > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(float* sh, x.Alloc(U(T) * U(h)));
    LOCKSTEP_RETURN_IF_ERROR(FfnForward(x, L.shared, a, T, sh));
    SharedGateAdd(a, L.shared_gate, sh, T, h, out, x.s);
  }
  // Routing goes back to the host for the expert counters (read after the stream syncs).
  DeviceStageImpl& d = x.d;
  if (cache != nullptr) {
    if (d.route_used + U(slots) > d.route_cap) {
      // Growing would free memory a pending copy may still target: flush first.
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(x.s));
      for (const auto& r : d.pending_routes) {
        const int* ids = d.route_host.as<int>() + r.offset;
        std::vector<int> count(U(r.cache->n_experts()), 0);
        for (int i = 0; i < r.n; ++i) ++count[U(ids[i])];
        for (int e = 0; e < r.cache->n_experts(); ++e)
          if (count[U(e)] > 0) r.cache->Record(r.layer, e, count[U(e)]);
      }
      d.pending_routes.clear();
      d.route_used = 0;
      if (U(slots) * 64 > d.route_cap) {
        d.route_cap = std::max<std::size_t>(U(slots) * 64, 1 << 16);
        LOCKSTEP_ASSIGN_OR_RETURN(d.route_host, PinnedBuffer::Alloc(d.route_cap * sizeof(int)));
      }
    }
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(d.route_host.as<int>() + d.route_used, idx, U(slots) * sizeof(int),
                                        cudaMemcpyDeviceToHost, x.s));
    d.pending_routes.push_back({cache, L.cache_layer, slots, d.route_used});
    d.route_used += U(slots);
  }
  return Status::Ok();
}

Status LayerForward(Ctx& x, const DLayer& L, ExpertCache* cache, float* hid, int T, int p, DKv* kv, DGdn* g) {
  const ModelConfig& c = x.c;
  const int h = c.n_embd;
  const std::int64_t n = static_cast<std::int64_t>(T) * h;
  LOCKSTEP_ASSIGN_OR_RETURN(float* a, x.Alloc(U(T) * U(h)));
  LOCKSTEP_ASSIGN_OR_RETURN(float* mix, x.Alloc(U(T) * U(h)));
  RmsNormZc(hid, h, T, h, L.input_norm, c.rms_norm_eps, a, h, x.s);
  if (L.type == LayerType::kFullAttention) {
    LOCKSTEP_RETURN_IF_ERROR(AttentionForward(x, L, a, T, p, *kv, mix));
  } else {
    LOCKSTEP_RETURN_IF_ERROR(GdnForward(x, L, a, T, *g, mix));
  }
  AddInPlace(hid, mix, n, x.s);
  RmsNormZc(hid, h, T, h, L.post_norm, c.rms_norm_eps, a, h, x.s);
  if (L.moe) {
    LOCKSTEP_RETURN_IF_ERROR(MoeForward(x, L, a, T, cache, mix));
  } else {
    LOCKSTEP_RETURN_IF_ERROR(FfnForward(x, L.dense, a, T, mix));
  }
  AddInPlace(hid, mix, n, x.s);
  return Status::Ok();
}

// Host counters from the routing copied back (the stream must have synchronised).
void FlushRoutes(DeviceStageImpl& d) {
  for (const auto& r : d.pending_routes) {
    const int* ids = d.route_host.as<int>() + r.offset;
    std::vector<int> count(U(r.cache->n_experts()), 0);
    for (int i = 0; i < r.n; ++i) ++count[U(ids[i])];
    for (int e = 0; e < r.cache->n_experts(); ++e)
      if (count[U(e)] > 0) r.cache->Record(r.layer, e, count[U(e)]);
  }
  d.pending_routes.clear();
  d.route_used = 0;
}

Status EnsureRows(DeviceBuffer& buf, int* rows, int need, int h, std::int64_t* init_ns, cudaStream_t s) {
  if (need <= *rows) return Status::Ok();
  const std::int64_t t0 = MonoNs();
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  const int cap = std::max(need, 64);
  LOCKSTEP_ASSIGN_OR_RETURN(buf, DeviceBuffer::Alloc(U(cap) * U(h) * sizeof(float)));
  *rows = cap;
  *init_ns += MonoNs() - t0;
  return Status::Ok();
}

Status EnsureStaging(DeviceStageImpl& d, std::size_t bytes) {
  if (d.staging.bytes() >= bytes) return Status::Ok();
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));
  LOCKSTEP_ASSIGN_OR_RETURN(d.staging, PinnedBuffer::Alloc(std::max(bytes, std::size_t{1} << 20)));
  return Status::Ok();
}

Status Upload(DeviceStageImpl& d, void* dst, const void* src, std::size_t bytes) {
  LOCKSTEP_RETURN_IF_ERROR(EnsureStaging(d, bytes));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));  // staging may still feed an earlier copy
  std::memcpy(d.staging.get(), src, bytes);
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, d.staging.get(), bytes, cudaMemcpyHostToDevice, d.s()));
  return Status::Ok();
}

Status Download(DeviceStageImpl& d, void* dst, const void* src, std::size_t bytes) {
  LOCKSTEP_RETURN_IF_ERROR(EnsureStaging(d, bytes));
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(d.staging.get(), src, bytes, cudaMemcpyDeviceToHost, d.s()));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(d.s()));
  std::memcpy(dst, d.staging.get(), bytes);
  return Status::Ok();
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
      const std::int64_t t0 = MonoNs();
      cublasHandle_t hnd = nullptr;
      LOCKSTEP_CUBLAS_CHECK(cublasCreate(&hnd));
      d.cublas.reset(hnd);
      LOCKSTEP_CUBLAS_CHECK(cublasSetStream(hnd, d.s()));
      LOCKSTEP_ASSIGN_OR_RETURN(d.cublas_ws, DeviceBuffer::Alloc(std::size_t{32} << 20));
      LOCKSTEP_CUBLAS_CHECK(cublasSetWorkspace(hnd, d.cublas_ws.get(), d.cublas_ws.bytes()));
      LOCKSTEP_CUBLAS_CHECK(cublasSetMathMode(
          hnd, backend_->deterministic() ? CUBLAS_PEDANTIC_MATH : CUBLAS_TF32_TENSOR_OP_MATH));
      d.init_ns += MonoNs() - t0;
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
        LOCKSTEP_ASSIGN_OR_RETURN(d.tokens, DeviceBuffer::Alloc(U(d.token_cap) * sizeof(int)));
      }
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_up0.get(), d.s()));
      LOCKSTEP_RETURN_IF_ERROR(Upload(d, d.tokens.get(), tokens, U(T) * sizeof(int)));
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_up1.get(), d.s()));
      d.up_timed = true;
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_in.get(), d.s()));
      EmbedRows(d.embed.d, d.tokens.as<int>(), T, h, d.hidden.as<float>(), d.s());
    } else {
      const auto* in = dynamic_cast<const CudaActivation*>(act.device.get());
      if (in == nullptr) return Status::Runtime("cuda stage", "input activations are not on a CUDA device");
      // Start of the hand-off: the time between this and ev_in is the synchronisation.
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_begin.get(), d.s()));
      LOCKSTEP_RETURN_IF_ERROR(backend_->HandOff(*in, device_, d.s(), d.hidden.as<float>()));
      LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_in.get(), d.s()));
    }
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(d.ev_start.get(), d.s()));
    Ctx x{c_, d, mode, backend_->deterministic(), d.s(), &d.init_ns};
    for (int il = layer_begin(); il < layer_end(); ++il) {
      const std::size_t l = U(il - layer_begin());
      LOCKSTEP_RETURN_IF_ERROR(
          LayerForward(x, d.layers[l], d.experts.get(), d.hidden.as<float>(), T, act.p, d.kv[l].get(), d.gdn[l].get()));
    }
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
  return st;
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
    RowsMatmul(nd, T, d.lm_head.d, V, h, ld, V, d.s());  // always batch-invariant, as on the CPU
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

void CudaStageSession::Perturb(const std::string& item, int layer, float factor, Activation& act) {
  if (!error_.ok()) return;
  DeviceScope scope(device_);
  DeviceStageImpl& d = *d_;
  if (item == "k" || item == "v") {
    DKv& kv = *d.kv[U(layer - layer_begin())];
    const bool int8 = kv.mirror->dtype() == DType::kI8;
    KvScaleRows(item == "k" ? 0 : 1, act.p, act.T, c_.n_heads_kv, c_.head_dim, KvDtypeCode(kv.mirror->dtype()),
                kv.k.get(), kv.v.get(), int8 ? kv.ks.as<float>() : nullptr, int8 ? kv.vs.as<float>() : nullptr, factor,
                d.s());
  } else if (item == "conv_state" || item == "ssm_state") {
    DGdn& g = *d.gdn[U(layer - layer_begin())];
    const bool conv = item == "conv_state";
    const std::size_t per = conv ? g.mirror->conv_size() : g.mirror->ssm_size();
    Scale(conv ? g.steps_conv.as<float>() : g.steps_ssm.as<float>(), static_cast<std::int64_t>(per * U(g.n_steps)),
          factor, d.s());
  } else if (item == "hidden_out") {
    Scale(d.hidden.as<float>(), static_cast<std::int64_t>(act.T) * c_.n_embd, factor, d.s());
  }
  const cudaError_t e = cudaGetLastError();
  Keep(e == cudaSuccess ? Status::Ok() : Status::Runtime("cuda perturb " + item, cudaGetErrorString(e)));
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
    Ctx x{c_, d, mode, backend_->deterministic(), d.s(), &d.init_ns};
    LOCKSTEP_RETURN_IF_ERROR(EnsureRows(d.mtp_hidden, &d.mtp_rows, T, h, &d.init_ns, d.s()));
    LOCKSTEP_ASSIGN_OR_RETURN(float* hd, x.Alloc(U(T) * U(h)));
    LOCKSTEP_ASSIGN_OR_RETURN(float* emb, x.Alloc(U(T) * U(h)));
    LOCKSTEP_ASSIGN_OR_RETURN(float* cat, x.Alloc(U(T) * U(2 * h)));
    LOCKSTEP_ASSIGN_OR_RETURN(float* tok, x.Alloc(U(T)));
    LOCKSTEP_ASSIGN_OR_RETURN(float* md, x.Alloc(U(T) * U(h)));
    const int nl = std::min(n_logits, T);
    LOCKSTEP_ASSIGN_OR_RETURN(float* ld, x.Alloc(U(std::max(nl, 1)) * U(V)));
    LOCKSTEP_RETURN_IF_ERROR(Upload(d, hd, hid, U(T) * U(h) * sizeof(float)));
    LOCKSTEP_RETURN_IF_ERROR(Upload(d, tok, next_tokens, U(T) * sizeof(int)));
    EmbedRows(d.embed.d, reinterpret_cast<const int*>(tok), T, h, emb, d.s());
    RmsNormZc(emb, h, T, h, d.mtp_pre_emb, c_.rms_norm_eps, cat, 2 * h, d.s());
    RmsNormZc(hd, h, T, h, d.mtp_pre_hid, c_.rms_norm_eps, cat + h, 2 * h, d.s());
    float* mh = d.mtp_hidden.as<float>();
    LOCKSTEP_RETURN_IF_ERROR(x.Mm(cat, T, d.mtp_fc, mh));
    LOCKSTEP_RETURN_IF_ERROR(LayerForward(x, d.mtp_layer, d.mtp_experts.get(), mh, T, p, d.mtp_kv.get(), nullptr));
    RmsNormZc(mh, h, T, h, d.mtp_norm, c_.rms_norm_eps, md, h, d.s());
    if (nl > 0) RowsMatmul(md + U(T - nl) * U(h), nl, d.lm_head.d, V, h, ld, V, d.s());
    LOCKSTEP_CUDA_CHECK(cudaGetLastError());
    LOCKSTEP_RETURN_IF_ERROR(Download(d, m, md, U(T) * U(h) * sizeof(float)));
    if (nl > 0) LOCKSTEP_RETURN_IF_ERROR(Download(d, logits, ld, U(nl) * U(V) * sizeof(float)));
    FlushRoutes(d);
    return Status::Ok();
  };
  Keep(run());
}

void CudaStageSession::MtpCommit(int rows) {
  DKv& kv = *d_->mtp_kv;
  LOCKSTEP_CHECK(rows >= kv.committed && rows <= kv.written) << "mtp commit " << rows;
  kv.committed = kv.written = rows;
}

// ---- host mirrors ----

namespace {

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
      LOCKSTEP_RETURN_IF_ERROR(Download(d, ks.data(), kv.ks.as<std::byte>() + U(mc) * sb, U(n) * sb));
      LOCKSTEP_RETURN_IF_ERROR(Download(d, vs.data(), kv.vs.as<std::byte>() + U(mc) * sb, U(n) * sb));
    }
  }
  const int nc = dc - mc;  // newly committed rows first, then the speculative ones
  m.WriteRaw(mc, nc, k.data(), v.data(), int8 ? ks.data() : nullptr, int8 ? vs.data() : nullptr);
  if (dc > mc) m.Commit(dc);
  const std::size_t hk = U(m.n_heads_kv());
  m.WriteRaw(dc, dw - dc, k.data() + U(nc) * rb, v.data() + U(nc) * rb, int8 ? ks.data() + U(nc) * hk : nullptr,
             int8 ? vs.data() + U(nc) * hk : nullptr);
  return Status::Ok();
}

Status SyncGdn(DeviceStageImpl& d, DGdn& g) {
  GdnState& m = *g.mirror;
  LOCKSTEP_RETURN_IF_ERROR(Download(d, m.conv(), g.conv.get(), m.conv_size() * sizeof(float)));
  LOCKSTEP_RETURN_IF_ERROR(Download(d, m.ssm(), g.ssm.get(), m.ssm_size() * sizeof(float)));
  if (g.n_steps > 0) {
    m.BeginSteps(g.n_steps);
    for (int t = 0; t < g.n_steps; ++t) {
      LOCKSTEP_RETURN_IF_ERROR(
          Download(d, m.step_conv(t), g.steps_conv.as<float>() + U(t) * m.conv_size(), m.conv_size() * sizeof(float)));
      LOCKSTEP_RETURN_IF_ERROR(
          Download(d, m.step_ssm(t), g.steps_ssm.as<float>() + U(t) * m.ssm_size(), m.ssm_size() * sizeof(float)));
    }
  } else {
    m.DiscardSteps();
  }
  if (g.position > m.position()) m.Advance(g.position - m.position());
  return Status::Ok();
}

}  // namespace

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
