#include "cpu/moe.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "cpu/norm.h"

namespace lockstep::cpu {

namespace {
inline std::size_t U(int x) { return static_cast<std::size_t>(x); }
}  // namespace

void RouteToken(const float* logits, int n_experts, int k, bool norm, int* idx, float* weights) {
  float mx = -INFINITY;
  for (int e = 0; e < n_experts; ++e) mx = std::max(mx, logits[e]);
  float probs[4096];
  float sum = 0.0f;
  for (int e = 0; e < n_experts; ++e) sum += (probs[e] = std::exp(logits[e] - mx));
  for (int e = 0; e < n_experts; ++e) probs[e] /= sum;
  // Selection: k passes of argmax with strict '>' so the lower id wins ties.
  bool taken[4096] = {};
  float sel = 0.0f;
  for (int r = 0; r < k; ++r) {
    int best = -1;
    for (int e = 0; e < n_experts; ++e)
      if (!taken[e] && (best < 0 || probs[e] > probs[best])) best = e;
    taken[best] = true;
    idx[r] = best;
    weights[r] = probs[best];
    sel += probs[best];
  }
  if (norm)
    for (int r = 0; r < k; ++r) weights[r] /= sel;
}

namespace {
// SwiGLU with caller-provided scratch g, u f32 [T, I] (no arena: callable from pool workers).
void FfnInto(const FfnWeights& f, const float* x, int T, MatmulKind kind, ThreadPool* pool,
             float* g, float* u, float* out) {
  const int inter = f.gate.rows;
  Matmul(kind, x, T, f.gate, g, pool);
  Matmul(kind, x, T, f.up, u, pool);
  for (std::size_t i = 0; i < U(T) * U(inter); ++i) g[i] = Silu(g[i]) * u[i];
  Matmul(kind, g, T, f.down, out, pool);
}
}  // namespace

void FfnForward(const FfnWeights& f, const float* x, int T, MatmulKind kind, ThreadPool* pool,
                Arena& arena, float* out) {
  Arena::Scope scope(arena);
  const int inter = f.gate.rows;
  float* g = arena.Alloc(U(T) * U(inter));
  float* u = arena.Alloc(U(T) * U(inter));
  FfnInto(f, x, T, kind, pool, g, u, out);
}

namespace {
// Records expert e's routed rows in each sequence's cache: `slots` [n] are its (t*k + r) slots in
// increasing row order, so each sequence's rows form one run.
void RecordRouted(const MoeSeq* seqs, int n_seqs, int cache_layer, int e, const int* slots, int n,
                  int k) {
  int si = 0, count = 0;
  for (int i = 0; i < n; ++i) {
    const int t = slots[i] / k;
    while (si < n_seqs && t >= seqs[si].row0 + seqs[si].T) {
      if (count > 0 && seqs[si].cache) seqs[si].cache->Record(cache_layer, e, count);
      count = 0;
      ++si;
    }
    ++count;
  }
  if (count > 0 && si < n_seqs && seqs[si].cache) seqs[si].cache->Record(cache_layer, e, count);
}
}  // namespace

void MoeForward(const MoeWeights& w, const ModelConfig& c, const float* x, int T, MatmulKind kind,
                ThreadPool* pool, Arena& arena, ExpertCache* cache, int cache_layer, float* out) {
  const MoeSeq seq{0, T, cache};
  MoeForwardSeqs(w, c, x, T, &seq, 1, kind, pool, arena, cache_layer, out);
}

void MoeForwardSeqs(const MoeWeights& w, const ModelConfig& c, const float* x, int T,
                    const MoeSeq* seqs, int n_seqs, MatmulKind kind, ThreadPool* pool, Arena& arena,
                    int cache_layer, float* out) {
  Arena::Scope scope(arena);
  const int h = c.n_embd, ne = c.n_experts, k = c.n_experts_used;
  const std::size_t uh = U(h);
  float* logits = arena.Alloc(U(T) * U(ne));
  Matmul(kind, x, T, w.router, logits, pool);
  int* idx = arena.AllocAs<int>(U(T) * U(k));
  float* wts = arena.Alloc(U(T) * U(k));
  for (int t = 0; t < T; ++t)
    RouteToken(logits + U(t) * U(ne), ne, k, c.norm_topk_prob, idx + U(t) * U(k),
               wts + U(t) * U(k));

  // Per (token, rank) expert outputs, gathered per expert so each expert's weights are read once.
  // The active experts run in parallel, one expert per worker at a time with single-threaded
  // products (a verify window of T rows activates up to T*k experts, and splitting each small
  // product over the pool costs more in dispatch than it computes). Each expert's rows see the
  // same kernel whatever the partition: results are independent of the thread count.
  float* ranked = arena.Alloc(U(T) * U(k) * uh);   // [T, k, H]
  int* slot_of = arena.AllocAs<int>(U(T) * U(k));  // expert-major list of (t*k + r) slots
  int* first = arena.AllocAs<int>(U(ne) + 1);      // slots of expert e: [first[e], first[e+1])
  int n_slots = 0;
  for (int e = 0; e < ne; ++e) {
    first[e] = n_slots;
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < k; ++r)
        if (idx[U(t) * U(k) + U(r)] == e) slot_of[n_slots++] = t * k + r;
  }
  first[ne] = n_slots;
  int* active = arena.AllocAs<int>(U(ne));
  int n_active = 0;
  for (int e = 0; e < ne; ++e)
    if (first[e + 1] > first[e]) {
      active[n_active++] = e;
      RecordRouted(seqs, n_seqs, cache_layer, e, slot_of + first[e], first[e + 1] - first[e], k);
    }
  const int inter = c.moe_ffn;
  // Scratch per slot: gathered input [H], gate and up [I], output [H].
  const std::size_t per_slot = 2 * uh + 2 * U(inter);
  float* scratch = arena.Alloc(U(n_slots) * per_slot);
  auto run_one = [&](std::size_t a) {
    const int e = active[a], s0 = first[e], n = first[e + 1] - s0;
    float* xin = scratch + U(s0) * per_slot;
    float* g = xin + U(n) * uh;
    float* u = g + U(n) * U(inter);
    float* yout = u + U(n) * U(inter);
    for (int i = 0; i < n; ++i) {
      const int t = slot_of[s0 + i] / k;
      std::memcpy(xin + U(i) * uh, x + U(t) * uh, uh * sizeof(float));
    }
    FfnInto(w.experts[U(e)], xin, n, kind, nullptr, g, u, yout);
    for (int i = 0; i < n; ++i)
      std::memcpy(ranked + U(slot_of[s0 + i]) * uh, yout + U(i) * uh, uh * sizeof(float));
  };
  const bool shared = w.shared.gate.rows > 0;
  const bool parallel = pool != nullptr && pool->size() > 1;
  // In verify windows (kInvariant) the shared expert is one more work item beside the routed
  // ones rather than three pool-wide products after them: fewer barriers, and its weights stream
  // while the other thread works on routed experts. Its bits are the same either way (each output
  // is one Dot whatever the split). Prefill (kGemm) keeps the pool-wide products.
  const bool shared_item = shared && parallel && kind == MatmulKind::kInvariant;
  float* sh = shared ? arena.Alloc(U(T) * uh) : nullptr;
  float* sh_g = shared_item ? arena.Alloc(U(T) * U(w.shared.gate.rows)) : nullptr;
  float* sh_u = shared_item ? arena.Alloc(U(T) * U(w.shared.gate.rows)) : nullptr;
  const int n_items = n_active + (shared_item ? 1 : 0);
  auto run_item = [&](int a) {
    if (shared_item && a == 0) {
      FfnInto(w.shared, x, T, kind, nullptr, sh_g, sh_u, sh);
    } else {
      run_one(U(a - (shared_item ? 1 : 0)));
    }
  };
  if (parallel && n_items > 1) {
    // Work items are handed out one at a time, largest first (the shared expert, then routed
    // experts by row count), to whichever thread is free: a fixed split of the expert list left
    // one thread waiting while the other finished its share (a T = 9 window routes ~21 experts
    // with 1 to 5 rows each). Which thread runs an item changes nothing in its rows' bits.
    std::stable_sort(active, active + n_active, [&](int a, int b) {
      return first[a + 1] - first[a] > first[b + 1] - first[b];
    });
    std::atomic<int> next{0};
    pool->ParallelFor(U(pool->size()), [&](std::size_t, std::size_t) {
      for (int a = next.fetch_add(1, std::memory_order_relaxed); a < n_items;
           a = next.fetch_add(1, std::memory_order_relaxed))
        run_item(a);
    });
  } else {
    for (int a = 0; a < n_items; ++a) run_item(a);
  }
  // Combine in rank order, then the gated shared expert.
  for (int t = 0; t < T; ++t) {
    float* o = out + U(t) * uh;
    std::fill_n(o, h, 0.0f);
    for (int r = 0; r < k; ++r) {
      const float wr = wts[U(t) * U(k) + U(r)];
      const float* y = ranked + (U(t) * U(k) + U(r)) * uh;
      for (int i = 0; i < h; ++i) o[i] += wr * y[i];
    }
  }
  if (shared) {
    if (!shared_item) FfnForward(w.shared, x, T, kind, pool, arena, sh);
    for (int t = 0; t < T; ++t) {
      const float gate = Sigmoid(Dot(x + U(t) * uh, w.shared_gate, h));
      float* o = out + U(t) * uh;
      const float* s = sh + U(t) * uh;
      for (int i = 0; i < h; ++i) o[i] += gate * s[i];
    }
  }
}

}  // namespace lockstep::cpu
