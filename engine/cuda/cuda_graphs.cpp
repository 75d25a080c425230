// CUDA graphs for the stage: the verify layer loop and the MTP head's draft step captured once
// per shape and replayed, with the host bookkeeping a replay must redo, and the layout keys that
// say when a captured graph is still valid. See cuda_stage_impl.h (SectionGraph).
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/cuda_stage.h"
#include "cuda/cuda_stage_impl.h"

namespace lockstep::cuda {

using namespace detail;  // NOLINT: this file, cuda_stage.cpp and cuda_layers.cpp are one component

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
    LOCKSTEP_RETURN_IF_ERROR(LayerForward(x, d.layers[l], d.experts.get(), d.hidden.as<float>(), T,
                                          p, d.kv[l].get(), d.gdn[l].get(), link));
  }
  return Status::Ok();
}

void CudaStageSession::GraphsOff(const std::string& why) {
  DeviceStageImpl& d = *d_;
  d.graphs_off = why;
  d.graphs.clear();
  d.mtp_graphs.clear();
  cudaGetLastError();  // the failed capture's error is handled here: the layers run eagerly
  std::fprintf(stderr,
               "lockstep: warning: cuda stage %d: CUDA graphs off for this run (%s); kernels are "
               "launched one by one\n",
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
  if (!backend_->graphs() || x.mode != ForwardMode::kVerify || !d.graphs_off.empty())
    return EagerLayers(x, T, p);
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
      d.graphs[T], [&d] { return LayoutKey(d); }, [&] { return EagerLayers(x, T, p); }, replay,
      &d.last_graph_use);
}

Status CudaStageSession::Graphed(SectionGraph& gr,
                                 const std::function<std::vector<std::uintptr_t>()>& key_of,
                                 const std::function<Status()>& body,
                                 const std::function<void()>& replay, GraphUse* use) {
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
      GraphsOff(!st.ok() ? "capture: " + st.ToString()
                         : std::string("capture: ") + cudaGetErrorString(e));
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

// ---- layout keys ----

namespace detail {

namespace {
void AddToKey(std::vector<std::uintptr_t>& key, const void* p, std::size_t n) {
  key.push_back(reinterpret_cast<std::uintptr_t>(p));
  key.push_back(n);
}
}  // namespace

std::vector<std::uintptr_t> MtpLayoutKey(const DeviceStageImpl& d) {
  std::vector<std::uintptr_t> key = LayoutKey(d);
  AddToKey(key, d.mtp_hidden.get(), U(d.mtp_rows));
  if (d.mtp_kv) {
    AddToKey(key, d.mtp_kv->k.get(), U(d.mtp_kv->capacity));
    AddToKey(key, d.mtp_kv->v.get(), 0);
    AddToKey(key, d.mtp_kv->ks.get(), 0);
    AddToKey(key, d.mtp_kv->vs.get(), 0);
  }
  return key;
}

std::vector<std::uintptr_t> LayoutKey(const DeviceStageImpl& d) {
  std::vector<std::uintptr_t> key;
  auto add = [&key](const void* p, std::size_t n) { AddToKey(key, p, n); };
  add(d.hidden.get(), U(d.hidden_rows));
  add(d.widen.get(), d.widen.bytes());
  add(d.route_host.get(), d.route_cap);
  key.push_back(d.arena.blocks());  // arena blocks are never freed: a new one is the only change
  for (const auto& kv : d.kv) {
    if (!kv) continue;
    add(kv->k.get(), U(kv->capacity));
    add(kv->v.get(), 0);
    add(kv->ks.get(), 0);
    add(kv->vs.get(), 0);
  }
  for (const auto& g : d.gdn) {
    if (!g) continue;
    add(g->steps_conv.get(), U(g->steps_capacity));
    add(g->steps_ssm.get(), 0);
  }
  return key;
}

}  // namespace detail

}  // namespace lockstep::cuda
