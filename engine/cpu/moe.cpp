#include "cpu/moe.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "cpu/activation.h"
#include "cpu/norm.h"
#include "cpu/op_report.h"

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
// SwiGLU's first half with caller-provided scratch g, u f32 [T, I]: g = SiLU(x gate) * (x up).
void FfnGateUp(const FfnWeights& f, const float* x, int T, MatmulKind kind, ThreadPool* pool,
               float* g, float* u) {
  const int inter = f.gate.rows;
  Matmul(kind, x, T, f.gate, g, pool);
  Matmul(kind, x, T, f.up, u, pool);
  SiluMulInPlace(g, u, U(T) * U(inter));
}

// SwiGLU with caller-provided scratch g, u f32 [T, I] (no arena: callable from pool workers).
void FfnInto(const FfnWeights& f, const float* x, int T, MatmulKind kind, ThreadPool* pool,
             float* g, float* u, float* out) {
  FfnGateUp(f, x, T, kind, pool, g, u);
  Matmul(kind, g, T, f.down, out, pool);
}

// The down product's output rows [o_begin, o_end) of g on the calling thread into out f32 [T, H]:
// the whole product (any kind), or a row range of an invariant one (a split item).
void DownRows(const Mat& down, const float* g, int T, MatmulKind kind, int o_begin, int o_end,
              float* out) {
  if (o_begin == 0 && o_end == down.rows) return Matmul(kind, g, T, down, out, nullptr);
  MatmulRowsRange(kind, g, T, down, o_begin, o_end, out + o_begin, down.rows);
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
  const MoePart part{x, T, seqs, n_seqs, kind, out, 0};
  MoeForwardParts(w, c, &part, 1, pool, arena, cache_layer);
}

namespace {

// Rows per thread at least in the per-row loops (routing, combine): each row costs ~1 us, and
// they ran on the calling thread while the others waited.
constexpr std::size_t kRowsPerRange = 4;

// One part's routing and per-expert slot lists (arena views).
struct PartRoutes {
  float* wts;     // [T, k] routing weights
  int* slot_of;   // expert-major list of (t*k + r) slots
  int* first;     // slots of expert e: [first[e], first[e+1])
  int* idx;       // [T, k] selected experts
  float* ranked;  // [T, k, H] per (token, rank) expert outputs
  float* scratch;
  float *sh, *sh_g, *sh_u;  // shared expert output and (as a work item) its gate / up scratch
  bool shared_item;
};

PartRoutes RoutePart(const MoeWeights& w, const ModelConfig& c, const MoePart& pt, ThreadPool* pool,
                     Arena& arena, int cache_layer, bool parallel) {
  const int T = pt.T, ne = c.n_experts, k = c.n_experts_used;
  const std::size_t uh = U(c.n_embd);
  PartRoutes r;
  float* logits = arena.Alloc(U(T) * U(ne));
  Matmul(pt.kind, pt.x, T, w.router, logits, pool);
  SetOpRow0(pt.row0);
  ReportOp(OpId::kRouterLogits, logits, 0, T, U(ne));
  int* idx = arena.AllocAs<int>(U(T) * U(k));
  r.idx = idx;
  r.wts = arena.Alloc(U(T) * U(k));
  auto route = [&](std::size_t b, std::size_t e) {
    for (std::size_t t = b; t < e; ++t)
      RouteToken(logits + t * U(ne), ne, k, c.norm_topk_prob, idx + t * U(k), r.wts + t * U(k));
  };
  if (pool != nullptr)
    pool->ParallelFor(U(T), route, kRowsPerRange);
  else
    route(0, U(T));
  ReportOp(OpId::kTopk, r.wts, 0, T, U(k));
  r.ranked = arena.Alloc(U(T) * U(k) * uh);
  r.slot_of = arena.AllocAs<int>(U(T) * U(k));
  r.first = arena.AllocAs<int>(U(ne) + 1);
  int n_slots = 0;
  for (int e = 0; e < ne; ++e) {
    r.first[e] = n_slots;
    for (int t = 0; t < T; ++t)
      for (int q = 0; q < k; ++q)
        if (idx[U(t) * U(k) + U(q)] == e) r.slot_of[n_slots++] = t * k + q;
  }
  r.first[ne] = n_slots;
  for (int e = 0; e < ne; ++e)
    if (r.first[e + 1] > r.first[e])
      RecordRouted(pt.seqs, pt.n_seqs, cache_layer, e, r.slot_of + r.first[e],
                   r.first[e + 1] - r.first[e], k);
  // Scratch per slot: gathered input [H], gate and up [I], output [H].
  r.scratch = arena.Alloc(U(n_slots) * (2 * uh + 2 * U(c.moe_ffn)));
  const bool shared = w.shared.gate.rows > 0;
  // In verify windows (kInvariant) the shared expert is one more work item beside the routed
  // ones rather than three pool-wide products after them: fewer barriers, and its weights stream
  // while the other thread works on routed experts. Its bits are the same either way (each output
  // is one Dot whatever the split). Prefill (kGemm) keeps the pool-wide products.
  r.shared_item = shared && parallel && IsInvariant(pt.kind);
  r.sh = shared ? arena.Alloc(U(T) * uh) : nullptr;
  r.sh_g = r.shared_item ? arena.Alloc(U(T) * U(w.shared.gate.rows)) : nullptr;
  r.sh_u = r.shared_item ? arena.Alloc(U(T) * U(w.shared.gate.rows)) : nullptr;
  return r;
}

// Expert e over the rows of one part routed to it: the rows gathered, then (FfnInto's steps)
// gate and up, SiLU(gate) * up into g, and down's output rows [o_begin, o_end) of each slot;
// `gate_up` and `down` pick the steps (a split item runs them apart, MoeForwardParts).
void RunExpert(const MoeWeights& w, const ModelConfig& c, const MoePart& pt, const PartRoutes& r,
               int e, bool gate_up, bool down, int o_begin, int o_end) {
  const int k = c.n_experts_used, s0 = r.first[e], n = r.first[e + 1] - s0;
  if (n == 0) return;
  const std::size_t uh = U(c.n_embd), per_slot = 2 * uh + 2 * U(c.moe_ffn);
  const FfnWeights& f = w.experts[U(e)];
  float* xin = r.scratch + U(s0) * per_slot;
  float* g = xin + U(n) * uh;
  float* u = g + U(n) * U(c.moe_ffn);
  float* yout = u + U(n) * U(c.moe_ffn);
  if (gate_up) {
    for (int i = 0; i < n; ++i) {
      const int t = r.slot_of[s0 + i] / k;
      std::memcpy(xin + U(i) * uh, pt.x + U(t) * uh, uh * sizeof(float));
    }
    FfnGateUp(f, xin, n, pt.kind, nullptr, g, u);
  }
  if (!down) return;
  DownRows(f.down, g, n, pt.kind, o_begin, o_end, yout);
  const std::size_t cols = U(o_end - o_begin);
  for (int i = 0; i < n; ++i)
    std::memcpy(r.ranked + U(r.slot_of[s0 + i]) * uh + U(o_begin), yout + U(i) * uh + U(o_begin),
                cols * sizeof(float));
}

// The shared expert of a part as a work item: gate / up and SiLU into sh_g, and / or down's output
// rows [o_begin, o_end) into sh.
void RunShared(const MoeWeights& w, const MoePart& pt, const PartRoutes& r, bool gate_up, bool down,
               int o_begin, int o_end) {
  if (gate_up) FfnGateUp(w.shared, pt.x, pt.T, pt.kind, nullptr, r.sh_g, r.sh_u);
  if (down) DownRows(w.shared.down, r.sh_g, pt.T, pt.kind, o_begin, o_end, r.sh);
}

// Combine in rank order, then the gated shared expert.
void CombinePart(const MoeWeights& w, const ModelConfig& c, const MoePart& pt, const PartRoutes& r,
                 ThreadPool* pool, Arena& arena) {
  const int h = c.n_embd, k = c.n_experts_used;
  const std::size_t uh = U(h);
  (void)arena;
  // Per row, independent of the others: rows split over the pool.
  auto combine = [&](std::size_t b, std::size_t e) {
    for (std::size_t t = b; t < e; ++t) {
      float* o = pt.out + t * uh;
      std::fill_n(o, h, 0.0f);
      for (int q = 0; q < k; ++q) {
        const float wr = r.wts[t * U(k) + U(q)];
        const float* y = r.ranked + (t * U(k) + U(q)) * uh;
        for (int i = 0; i < h; ++i) o[i] += wr * y[i];
      }
      if (r.sh != nullptr) {
        const float gate = Sigmoid(Dot(pt.x + t * uh, w.shared_gate, h));
        const float* s = r.sh + t * uh;
        for (int i = 0; i < h; ++i) o[i] += gate * s[i];
      }
    }
  };
  if (pool != nullptr)
    pool->ParallelFor(U(pt.T), combine, kRowsPerRange);
  else
    combine(0, U(pt.T));
}

}  // namespace

void MoeForwardParts(const MoeWeights& w, const ModelConfig& c, const MoePart* parts, int n_parts,
                     ThreadPool* pool, Arena& arena, int cache_layer, MoeWork* work) {
  Arena::Scope scope(arena);
  const int ne = c.n_experts;
  const bool parallel = pool != nullptr && pool->size() > 1;
  std::vector<PartRoutes> routes;
  for (int p = 0; p < n_parts; ++p)
    routes.push_back(RoutePart(w, c, parts[p], pool, arena, cache_layer, parallel));
  // Per (token, rank) expert outputs, gathered per expert so each expert's weights are read once
  // for every part: one work item runs the expert over each part's rows routed to it, back to
  // back (a prefill chunk's product then finds the weights the verify rows just read in cache).
  // The active experts run in parallel, one expert per worker at a time with single-threaded
  // products (a verify window of T rows activates up to T*k experts, and splitting each small
  // product over the pool costs more in dispatch than it computes). Each expert's rows see the
  // same kernel whatever the partition: results are independent of the thread count and of the
  // other parts.
  std::vector<int> active, rows_of(U(ne), 0);
  for (int e = 0; e < ne; ++e) {
    for (const PartRoutes& r : routes) rows_of[U(e)] += r.first[e + 1] - r.first[e];
    if (rows_of[U(e)] > 0) active.push_back(e);
  }
  if (work != nullptr) {
    work->experts = static_cast<int>(active.size());
    work->slots = 0;
    for (const PartRoutes& r : routes) work->slots += r.first[ne];
  }
  std::vector<int> shared_parts;
  for (int p = 0; p < n_parts; ++p)
    if (routes[U(p)].shared_item) shared_parts.push_back(p);
  const int n_shared = static_cast<int>(shared_parts.size());
  const int n_items = n_shared + static_cast<int>(active.size());
  const int h = c.n_embd;
  // Item a (< n_items): expert item a's steps over every part (the shared ones first), down's
  // output rows [o_begin, o_end).
  auto run_steps = [&](int a, bool gate_up, bool down, int o_begin, int o_end) {
    if (a < n_shared) {
      const int p = shared_parts[U(a)];
      return RunShared(w, parts[p], routes[U(p)], gate_up, down, o_begin, o_end);
    }
    const int e = active[U(a - n_shared)];
    for (int p = 0; p < n_parts; ++p)
      RunExpert(w, c, parts[p], routes[U(p)], e, gate_up, down, o_begin, o_end);
  };
  // Decode and verify steps (every part kInvariant*) split each item's down product in two
  // halves of its output rows, run after the item's gate / up: 2 * n_items more items that
  // the threads take as they come free, so the step's end waits for half a down product at
  // most instead of a whole expert (11 experts on 2 threads left one thread a whole expert's
  // time idle per layer). Each output is still one row's dot: same bits as one whole item.
  bool split = parallel && n_items > 1;
  for (int p = 0; p < n_parts; ++p) split = split && IsInvariant(parts[p].kind);
  if (parallel && n_items > 1) {
    // Work items are handed out one at a time, largest first (the shared expert, then routed
    // experts by row count), to whichever thread is free: a fixed split of the expert list left
    // one thread waiting while the other finished its share (a T = 9 window routes ~21 experts
    // with 1 to 5 rows each). Which thread runs an item changes nothing in its rows' bits.
    std::stable_sort(active.begin(), active.end(),
                     [&](int a, int b) { return rows_of[U(a)] > rows_of[U(b)]; });
    const int total = split ? 3 * n_items : n_items;
    std::vector<std::atomic<bool>> gated(U(n_items));  // an item's gate / up done (split)
    std::atomic<int> next{0};
    pool->ParallelFor(U(pool->size()), [&](std::size_t, std::size_t) {
      for (int a = next.fetch_add(1, std::memory_order_relaxed); a < total;
           a = next.fetch_add(1, std::memory_order_relaxed)) {
        if (!split) {
          run_steps(a, true, true, 0, h);
        } else if (a < n_items) {
          run_steps(a, true, false, 0, h);
          gated[U(a)].store(true, std::memory_order_release);
        } else {
          // Every gate / up item was handed out before this one: at most a wait for the other
          // thread to finish the same item's gate / up.
          const int item = (a - n_items) / 2, half = (a - n_items) % 2;
          while (!gated[U(item)].load(std::memory_order_acquire)) std::this_thread::yield();
          run_steps(item, false, true, half * (h / 2), half == 0 ? h / 2 : h);
        }
      }
    });
  } else {
    for (int a = 0; a < n_items; ++a) run_steps(a, true, true, 0, h);
  }
  const int k = c.n_experts_used;
  const std::size_t uh = U(c.n_embd);
  for (int p = 0; p < n_parts; ++p) {
    const MoePart& pt = parts[p];
    const PartRoutes& r = routes[U(p)];
    if (r.sh != nullptr && !r.shared_item)
      FfnForward(w.shared, pt.x, pt.T, pt.kind, pool, arena, r.sh);
    if (CurrentOpTap() == nullptr) continue;
    SetOpRow0(pt.row0);
    for (int t = 0; t < pt.T; ++t)
      for (int q = 0; q < k; ++q)
        ReportOp(OpId::kExpertOut, r.ranked + (U(t) * U(k) + U(q)) * uh, t, 1, uh, 0,
                 r.idx[U(t) * U(k) + U(q)]);
    if (r.sh != nullptr) ReportOp(OpId::kSharedExpert, r.sh, 0, pt.T, uh);
  }
  for (int p = 0; p < n_parts; ++p) {
    CombinePart(w, c, parts[p], routes[U(p)], pool, arena);
    SetOpRow0(parts[p].row0);
    ReportOp(OpId::kMoeCombine, parts[p].out, 0, parts[p].T, uh);
  }
}

}  // namespace lockstep::cpu
