// Weight packing for the CUDA stage: the stage's host weights into one device buffer (and the
// routed experts that are not resident into pinned host memory), bf16 when lossless, and the
// experts' device pointer tables. Start-up only (CudaStageSession::Init). See cuda_stage_impl.h.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/cuda_stage_impl.h"

namespace lockstep::cuda::detail {

namespace {

// `m` as f32 host rows: its own data when stored f32, else a widened copy (exact for bf16/f16)
// kept for the life of the process (the host weights stay in their file type, the packer
// uploads from f32). Thread-safe: stages may initialise concurrently.
const float* HostF32(const Mat& m) {
  if (m.type == WeightType::kF32 && m.parts == nullptr) return static_cast<const float*>(m.data);
  static std::mutex mu;
  static std::map<const void*, std::vector<float>> widened;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<float>& v = widened[m.data];
  if (v.empty()) {
    v.resize(U(m.rows) * U(m.cols));
    for (int r = 0; r < m.rows; ++r) m.RowToF32(r, v.data() + U(r) * U(m.cols));
  }
  return v.data();
}

// Collects host tensors, then copies them into one device (or pinned) buffer and patches the
// views. Offsets are 256-byte aligned. Matrices go in as bf16 bits when the packer is told the
// stage's matrices are all bf16 values (`bf16_matrices`: truncation to the high half is then
// exact); vectors always stay f32.
class Packer {
 public:
  explicit Packer(bool bf16_matrices) : bf16_(bf16_matrices) {}
  void Add(const float* host, std::size_t n, const float** slot) {
    Push(host, n, false, slot, nullptr);
  }
  // A matrix stored in the packer's matrix dtype; `slot` gets the device address.
  void AddMatrix(const float* host, std::size_t n, const void** slot) {
    Push(host, n, bf16_, nullptr, slot);
  }
  void Add(const Mat& m, DMat* out) {
    out->rows = m.rows;
    out->cols = m.cols;
    out->bf16 = bf16_;
    AddMatrix(HostF32(m), U(m.rows) * U(m.cols), &out->d);
  }
  // The embedding table is read by row lookups, not products: always f32.
  void AddF32(const Mat& m, DMat* out) {
    out->rows = m.rows;
    out->cols = m.cols;
    out->bf16 = false;
    Push(HostF32(m), U(m.rows) * U(m.cols), false, nullptr, &out->d);
  }
  std::size_t bytes() const { return total_; }
  // Device copy (synchronous: start-up only), through a host buffer of at most 64 MiB.
  Result<DeviceBuffer> ToDevice() {
    LOCKSTEP_ASSIGN_OR_RETURN(
        DeviceBuffer buf,
        DeviceBuffer::Alloc(std::max<std::size_t>(total_, 1), "resident weights"));
    std::vector<std::uint16_t> narrow;
    for (const Item& it : items_) {
      std::byte* dst = buf.as<std::byte>() + it.offset;
      if (it.bf16) {
        constexpr std::size_t kPiece = std::size_t{32} << 20;  // elements per host conversion
        for (std::size_t i0 = 0; i0 < it.n; i0 += kPiece) {
          const std::size_t m = std::min(kPiece, it.n - i0);
          narrow.resize(m);
          Narrow(it.host + i0, m, narrow.data());
          LOCKSTEP_CUDA_CHECK(
              cudaMemcpy(dst + i0 * 2, narrow.data(), m * 2, cudaMemcpyHostToDevice));
        }
      } else {
        LOCKSTEP_CUDA_CHECK(cudaMemcpy(dst, it.host, it.n * sizeof(float), cudaMemcpyHostToDevice));
      }
      it.Patch(dst);
    }
    return buf;
  }
  Result<PinnedBuffer> ToPinned() {
    LOCKSTEP_ASSIGN_OR_RETURN(
        PinnedBuffer buf,
        PinnedBuffer::Alloc(std::max<std::size_t>(total_, 1), "host-resident experts"));
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
  void Push(const float* host, std::size_t n, bool bf16, const float** f32_slot,
            const void** slot) {
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
    if (m.type == WeightType::kBF16 && m.parts == nullptr) return true;
    const float* data = HostF32(m);
    const std::size_t n = U(m.rows) * U(m.cols);
    std::uint32_t any = 0;  // OR of the low halves: zero iff all are bf16 values
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u;
      std::memcpy(&u, data + i, sizeof u);
      any |= u & 0xffffu;
    }
    return any == 0;
  };
  auto ffn = [&](const FfnWeights& f) {
    return f.gate.rows == 0 || (exact(f.gate) && exact(f.up) && exact(f.down));
  };
  auto layer = [&](const LayerWeights& lw) {
    bool ok =
        lw.type == LayerType::kFullAttention
            ? exact(lw.attn.q_proj) && exact(lw.attn.k_proj) && exact(lw.attn.v_proj) &&
                  exact(lw.attn.o_proj)
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

void AddLayer(const LayerWeights& lw, const ModelConfig& c, const ExpertCache* cache,
              int cache_layer, Packer& dev, Packer& host, DLayer* out, ExpertTables* tables) {
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
      p.AddMatrix(HostF32(f.gate), U(f.gate.rows) * U(f.gate.cols), &tables->gate[e]);
      p.AddMatrix(HostF32(f.up), U(f.up.rows) * U(f.up.cols), &tables->up[e]);
      p.AddMatrix(HostF32(f.down), U(f.down.rows) * U(f.down.cols), &tables->down[e]);
    }
  } else {
    dev.Add(lw.ffn_dense.gate, &out->dense.gate);
    dev.Add(lw.ffn_dense.up, &out->dense.up);
    dev.Add(lw.ffn_dense.down, &out->dense.down);
  }
}

// The experts' pointer tables: 3 x [E] per MoE layer (and the MTP layer), one device buffer;
// each MoE layer's gate_ptrs / up_ptrs / down_ptrs point into it. tables.back() is the MTP's.
Status UploadPointerTables(const std::vector<ExpertTables>& tables, bool mtp, DeviceStageImpl& d) {
  std::vector<const void*> flat;
  std::vector<std::size_t> table_offset(tables.size(), 0);
  for (std::size_t i = 0; i < tables.size(); ++i) {
    table_offset[i] = flat.size();
    flat.insert(flat.end(), tables[i].gate.begin(), tables[i].gate.end());
    flat.insert(flat.end(), tables[i].up.begin(), tables[i].up.end());
    flat.insert(flat.end(), tables[i].down.begin(), tables[i].down.end());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      d.ptr_tables, DeviceBuffer::Alloc(std::max<std::size_t>(flat.size(), 1) * sizeof(void*),
                                        "expert pointer tables"));
  if (!flat.empty())
    LOCKSTEP_CUDA_CHECK(cudaMemcpy(d.ptr_tables.get(), flat.data(), flat.size() * sizeof(void*),
                                   cudaMemcpyHostToDevice));
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
  return Status::Ok();
}

}  // namespace

Status UploadWeights(const ModelWeights& w, const EngineConfig& cfg, const StageWeightsSpec& spec,
                     DeviceStageImpl& d) {
  const ModelConfig& c = w.config;
  const bool mtp = spec.mtp;
  // LOCKSTEP_CUDA_F32_WEIGHTS=1 keeps f32 matrices even when bf16 would be lossless (to compare
  // the two paths; they must agree bit for bit).
  const char* force_f32 =
      std::getenv("LOCKSTEP_CUDA_F32_WEIGHTS");  // env: LOCKSTEP_CUDA_F32_WEIGHTS
  d.weights_bf16 = !(force_f32 && std::string(force_f32) == "1") &&
                   MatricesAreBf16(w, spec.layer_begin, spec.layer_end, spec.last, mtp);

  // Expert residency, as on the CPU (the same logical map, so hits and misses agree across
  // backends). Bytes fetched are the bytes a miss reads over PCIe here: half the CPU's f32
  // figure when the experts are held as bf16.
  std::vector<int> moe_layers;
  std::uint64_t expert_bytes = 0;
  for (int il = spec.layer_begin; il < spec.layer_end; ++il) {
    const LayerWeights& lw = w.layers[U(il)];
    if (lw.moe) {
      moe_layers.push_back(il);
      expert_bytes = lw.ffn_moe.experts.empty() ? 0 : lw.ffn_moe.experts[0].bytes();
    }
  }
  if (d.weights_bf16) expert_bytes /= 2;
  const int n_exp = std::max(c.n_experts, 0);
  d.experts =
      std::make_unique<ExpertCache>(moe_layers, n_exp, cfg.ResidentExperts(n_exp), expert_bytes);
  if (mtp)
    d.mtp_experts = std::make_unique<ExpertCache>(std::vector<int>{c.n_layers}, n_exp,
                                                  cfg.ResidentExperts(n_exp), expert_bytes);

  Packer dev(d.weights_bf16), host(d.weights_bf16);
  d.layers.resize(U(spec.layer_end - spec.layer_begin));
  std::vector<ExpertTables> tables(d.layers.size() + 1);
  int local_moe = 0;
  for (int il = spec.layer_begin; il < spec.layer_end; ++il) {
    const std::size_t l = U(il - spec.layer_begin);
    const LayerWeights& lw = w.layers[U(il)];
    AddLayer(lw, c, d.experts.get(), lw.moe ? local_moe : -1, dev, host, &d.layers[l], &tables[l]);
    if (lw.moe) ++local_moe;
  }
  if (spec.first || mtp) dev.AddF32(w.embed, &d.embed);
  if (spec.last) {
    dev.Add(w.lm_head, &d.lm_head);
    dev.Add(w.final_norm, U(c.n_embd), &d.final_norm);
  }
  if (mtp) {
    const MtpWeights& mw = w.mtp;
    dev.Add(mw.fc, &d.mtp_fc);
    dev.Add(mw.pre_fc_norm_embedding, U(c.n_embd), &d.mtp_pre_emb);
    dev.Add(mw.pre_fc_norm_hidden, U(c.n_embd), &d.mtp_pre_hid);
    dev.Add(mw.norm, U(c.n_embd), &d.mtp_norm);
    AddLayer(mw.layer, c, d.mtp_experts.get(), mw.layer.moe ? 0 : -1, dev, host, &d.mtp_layer,
             &tables.back());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(d.dense, dev.ToDevice());
  LOCKSTEP_ASSIGN_OR_RETURN(d.host_experts, host.ToPinned());
  return UploadPointerTables(tables, mtp, d);
}

}  // namespace lockstep::cuda::detail
