// Internals of the CUDA stage session shared by cuda_stage.cpp (the session: set-up, state, the
// StageSession calls), cuda_weights.cpp (weight packing), cuda_graphs.cpp (CUDA graph capture and
// replay, layout keys) and cuda_layers.cpp (the forward op by op, host copies and mirrors).
// Not a public header: engine/cuda only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_handles.h"
#include "cuda/ops.h"
#include "lockstep/engine/clock.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/expert_cache.h"
#include "lockstep/engine/gdn_state.h"
#include "lockstep/engine/kv_cache.h"
#include "lockstep/engine/stage.h"
#include "lockstep/engine/weights.h"

namespace lockstep::cuda {

namespace detail {

inline std::size_t U(int x) { return static_cast<std::size_t>(x); }

inline int KvDtypeCode(DType d) { return d == DType::kF32 ? 0 : d == DType::kBF16 ? 1 : 2; }

// A device weight matrix view [rows=out, cols=in]: f32, or bf16 bits when the stage keeps its
// matrices as bf16 (DeviceStageImpl::weights_bf16).
struct DMat {
  const void* d = nullptr;
  int rows = 0;
  int cols = 0;
  bool bf16 = false;
  const float* f32() const { return static_cast<const float*>(d); }
  const std::uint16_t* bf16_bits() const { return static_cast<const std::uint16_t*>(d); }
  std::size_t elems() const { return U(rows) * U(cols); }
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
  const float* shared_gate = nullptr;  // f32 [H]
  // Device arrays [E] of expert weights (device or host-mapped), f32 or bf16 bits as the stage's.
  const void* const* gate_ptrs = nullptr;
  const void* const* up_ptrs = nullptr;
  const void* const* down_ptrs = nullptr;
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
    const std::int64_t t0 = MonotonicNs();
    Block b;
    b.floats = std::max<std::size_t>(n, std::size_t{16} << 20);  // 64 MiB blocks
    LOCKSTEP_ASSIGN_OR_RETURN(b.buf,
                              DeviceBuffer::Alloc(b.floats * sizeof(float), "scratch arena block"));
    *alloc_ns += MonotonicNs() - t0;
    blocks_.push_back(std::move(b));
    block_ = blocks_.size() - 1;
    offset_ = n;
    return blocks_.back().buf.as<float>();
  }
  void Reset() {
    block_ = 0;
    offset_ = 0;
  }
  // Where the next allocation starts; Rewind(m) makes later allocations start there again.
  struct Mark {
    std::size_t block = 0, offset = 0;
  };
  Mark Here() const { return {block_, offset_}; }
  void Rewind(Mark m) {
    block_ = m.block;
    offset_ = m.offset;
  }
  std::size_t blocks() const { return blocks_.size(); }

 private:
  struct Block {
    DeviceBuffer buf;
    std::size_t floats = 0;
  };
  std::vector<Block> blocks_;
  std::size_t block_ = 0;
  std::size_t offset_ = 0;
};

// A captured section of a forward (CudaStageSession::Graphed). It holds the addresses of every
// buffer its kernels touch, so it is only replayed while the section's layout key (those
// addresses and capacities) is what it was at capture.
struct SectionGraph {
  struct RouteRec {
    ExpertCache* cache;
    int layer;
    int n;  // T*k ints at offset
    std::size_t offset;
  };
  GraphExecPtr exec;
  std::vector<std::uintptr_t> layout;  // the layout key at capture
  std::vector<std::uintptr_t> warm;    // the layout key of the last eager run that grew nothing
  std::vector<RouteRec> routes;        // routing the graph writes to route_host (host bookkeeping)
  std::size_t route_used = 0;
  DeviceArena::Mark arena_end;  // the arena after the section (later scratch starts there)
};

// Everything a CudaStageSession owns on the device (and its host staging).
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

  // Weight matrices (and experts) as bf16: every value of every matrix of the stage is a bf16
  // value (the model's files are bf16), so bf16 storage is lossless and halves the bytes each
  // decode step reads. Vectors (norms, biases) and the embedding table stay f32.
  bool weights_bf16 = false;
  DeviceBuffer widen;          // f32 scratch: a bf16 matrix widened for a cuBLAS GEMM (prefill)
  DeviceBuffer dense;          // every non-expert weight of the stage + resident experts
  PinnedBuffer host_experts;   // non-resident routed experts (host-mapped)
  DeviceBuffer ptr_tables;     // per MoE layer 3 x [E] expert pointers
  DeviceBuffer inv_freq;       // f32 [R/2]
  std::vector<DLayer> layers;  // [layers in stage]
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

  // Routing ids for the expert counters: int32 [calls][T*k] in `route_host` (host-mapped; the
  // router kernel writes them through `route_dev`, its device address).
  PinnedBuffer route_host;
  int* route_dev = nullptr;
  std::size_t route_cap = 0;  // ints
  using RouteRec = SectionGraph::RouteRec;
  std::vector<RouteRec> pending_routes;
  std::size_t route_used = 0;

  // The position the kernels of a forward read (ops.h Pos): int32 [1], set on the stream before
  // the layers run, so a graph captured at one position replays at any other.
  DeviceBuffer pos;

  // CUDA graphs of the verify / decode layer loop, one per window size T (see RunLayers in
  // cuda_graphs.cpp), and of the MTP head's forward, one per (T, logit rows) (MtpForward).
  std::map<int, SectionGraph> graphs;
  std::map<std::pair<int, int>, SectionGraph> mtp_graphs;
  std::string graphs_off;  // why this stage stopped using graphs ("" while it may)
  std::int64_t graph_captures = 0;
  std::int64_t graph_launches = 0;
  GraphUse last_graph_use = GraphUse::kEager;  // how the last Forward ran its layers

  cudaStream_t s() const { return stream.get(); }
};

// ---- weights (cuda_weights.cpp) ----

// What a stage holds: its layers [layer_begin, layer_end) and the model's ends.
struct StageWeightsSpec {
  int layer_begin = 0;
  int layer_end = 0;
  bool first = false;  // the embedding table
  bool last = false;   // lm_head and the final norm
  bool mtp = false;    // the MTP head (last stage of a model that has one; needs the embedding)
};
// Uploads the stage's weights into d (synchronous: start-up only). Sets weights_bf16 (matrices as
// bf16 when every value is one, unless LOCKSTEP_CUDA_F32_WEIGHTS=1), makes the expert residency
// maps (experts, mtp_experts: the CPU's map), packs every non-expert weight and the resident
// experts into `dense` and the other routed experts into pinned `host_experts`, and uploads the
// experts' pointer tables (ptr_tables). kRuntime on device errors.
Status UploadWeights(const ModelWeights& w, const EngineConfig& cfg, const StageWeightsSpec& spec,
                     DeviceStageImpl& d);

// ---- CUDA graphs (cuda_graphs.cpp) ----

// The addresses and sizes of every reallocatable buffer a forward's kernels may use. Equal keys:
// a graph captured under one is valid under the other.
std::vector<std::uintptr_t> LayoutKey(const DeviceStageImpl& d);
// LayoutKey plus the MTP head's own buffers (its residual rows and K/V cache).
std::vector<std::uintptr_t> MtpLayoutKey(const DeviceStageImpl& d);

// y[T, ldy] = x[T, n_in] . W^T with the batch-invariant RowsMatmul, for either weight dtype.
inline void RowsMm(const float* x, int T, const DMat& w, float* y, int ldy, cudaStream_t s);

// One forward's context: the session's device state, the mode and the stream.
struct Ctx {
  const ModelConfig& c;
  DeviceStageImpl& d;
  ForwardMode mode;
  bool deterministic;
  int attn_split;   // Attention's context split (EngineConfig::cuda_attn_split)
  int kv_headroom;  // rows a K/V cache that grows in prefill reserves past p + T (KvHeadroom)
  cudaStream_t s;
  std::int64_t* init_ns;
  const int* pos = nullptr;  // device int the kernels read the position from (SetPosition)
  int pos_host = -1;         // the value SetPosition last put there

  // Puts p in the device position the kernels read; every layer loop starts with it (outside any
  // captured graph, so a replay sees the new position).
  void SetPosition(int p) {
    pos = d.pos.as<int>();
    pos_host = p;
    SetInt(d.pos.as<int>(), p, s);
  }

  Result<float*> Alloc(std::size_t n) { return d.arena.Alloc(n, init_ns); }

  // y[T, ldy] = x[T, in] . W^T. Verify windows (and all of deterministic mode's decode path)
  // use the batch-invariant RowsMatmul; prefill uses cuBLAS. Non-deterministic mode sends
  // verify windows of more than one row to cuBLAS too (TF32, shape-dependent algorithm).
  Status Mm(const float* x, int T, const DMat& w, float* y, int ldy = -1);
  // True when Mm of T rows runs RowsMatmul (not cuBLAS).
  bool RowsPath(int T) const {
    return !(T > 1 && (mode == ForwardMode::kPrefill || !deterministic));
  }
  // y_i = x . W_i^T for up to three matrices over the same x (row stride = their common width):
  // one launch where Mm would use RowsMatmul (RowsMatmulMulti, the same bits as one call each),
  // one Mm per matrix where it would use cuBLAS. With `up` (a SwiGLU pair, up shaped as w):
  // y_i = silu(x . W_i^T) * (x . up^T), in the same launch (RowsProduct::W_up), or as two Mm and
  // SiluMul: the same bits either way.
  struct MmOut {
    const DMat* w;
    float* y;
    const DMat* up = nullptr;
  };
  Status MmShared(const float* x, int T, std::initializer_list<MmOut> outs);
};

// How a layer meets its neighbours on the stage: the previous layer may have applied this layer's
// input norm already (fused into its residual add), and this one may do the same for the next.
struct LayerLink {
  const float* a = nullptr;          // hid rows through L.input_norm; nullptr: normalised here
  const float* next_norm = nullptr;  // the next layer's input_norm weight, or nullptr
  float** next_a = nullptr;          // gets the next layer's normalised rows (with next_norm)
};
// One decoder layer in place on hid f32 [T, H] (device) at positions p..; kv for attention
// layers, g for GDN layers; routing of MoE layers queued for `cache`'s counters. The fused norms
// of `link` give the bits of the unfused layer loop.
Status LayerForward(Ctx& x, const DLayer& L, ExpertCache* cache, float* hid, int T, int p, DKv* kv,
                    DGdn* g, LayerLink link = {});
// Expert counters from the routing the router kernels wrote to route_host (the stream must have
// synchronised).
void FlushRoutes(DeviceStageImpl& d);
// Grows buf to at least `need` rows of h floats (syncs the stream first; counts as init time).
Status EnsureRows(DeviceBuffer& buf, int* rows, int need, int h, std::int64_t* init_ns,
                  cudaStream_t s);
// Host -> device through pinned staging, ordered on the session's stream.
Status Upload(DeviceStageImpl& d, void* dst, const void* src, std::size_t bytes);
// Device -> host through pinned staging; returns when the bytes are in dst (syncs the stream).
Status Download(DeviceStageImpl& d, void* dst, const void* src, std::size_t bytes);
// The same for several host pieces that lie back to back on the device: one copy and (download)
// one sync for all of them.
template <typename P>
struct HostPart {
  P p;
  std::size_t bytes;
};
Status UploadParts(DeviceStageImpl& d, void* dst,
                   std::initializer_list<HostPart<const void*>> parts);
Status DownloadParts(DeviceStageImpl& d, const void* src,
                     std::initializer_list<HostPart<void*>> parts);
// Brings the host mirrors up to date with the device state (rows / states that changed).
Status SyncKv(DeviceStageImpl& d, DKv& kv);
Status SyncGdn(DeviceStageImpl& d, DGdn& g);

inline void RowsMm(const float* x, int T, const DMat& w, float* y, int ldy, cudaStream_t s) {
  if (w.bf16) {
    RowsMatmul(x, T, w.bf16_bits(), w.rows, w.cols, y, ldy, s);
  } else {
    RowsMatmul(x, T, w.f32(), w.rows, w.cols, y, ldy, s);
  }
}

}  // namespace detail
}  // namespace lockstep::cuda
