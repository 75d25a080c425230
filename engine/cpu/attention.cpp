#include "cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/activation.h"
#include "cpu/norm.h"
#include "cpu/op_report.h"

namespace lockstep::cpu {

void AttendGroup(const float* q, int n_group, int kv_head, const KvCache& cache, int n_ctx,
                 float scale, float* o, float* scores, float* tmp) {
  const int d = cache.head_dim();
  const std::size_t ud = static_cast<std::size_t>(d);
  const std::size_t uctx = static_cast<std::size_t>(n_ctx);
  for (int u = 0; u < n_ctx; ++u) {
    const float* k = cache.K(u, kv_head, tmp);
    for (int g = 0; g < n_group; ++g)
      scores[static_cast<std::size_t>(g) * uctx + static_cast<std::size_t>(u)] =
          Dot(q + static_cast<std::size_t>(g) * ud, k, d) * scale;
  }
  for (int g = 0; g < n_group; ++g) {
    float* s = scores + static_cast<std::size_t>(g) * uctx;
    float mx = -INFINITY;
    for (int u = 0; u < n_ctx; ++u) mx = std::max(mx, s[u]);
    ExpShiftedInPlace(s, uctx, mx);  // vector expf, bitwise the scalar call (activation.h)
    double sum = 0.0;  // f64 sum: long contexts keep the normaliser exact to f32 precision
    for (int u = 0; u < n_ctx; ++u) sum += static_cast<double>(s[u]);
    float inv = static_cast<float>(1.0 / sum);
    for (int u = 0; u < n_ctx; ++u) s[u] *= inv;
    std::memset(o + static_cast<std::size_t>(g) * ud, 0, ud * sizeof(float));
  }
  for (int u = 0; u < n_ctx; ++u) {
    const float* v = cache.V(u, kv_head, tmp + ud);
    for (int g = 0; g < n_group; ++g) {
      float pu = scores[static_cast<std::size_t>(g) * uctx + static_cast<std::size_t>(u)];
      float* og = o + static_cast<std::size_t>(g) * ud;
      for (int i = 0; i < d; ++i) og[i] += pu * v[i];
    }
  }
}

namespace {

inline std::size_t U(int x) { return static_cast<std::size_t>(x); }

// The projections' outputs and the per-head views built from them, rows of all sequences.
struct AttnRows {
  float* qg;    // f32 [n_rows, Hq, 2, D]: q and gate interleaved per head (q_proj output)
  float* k;     // f32 [n_rows, Hkv, D]
  float* v;     // f32 [n_rows, Hkv, D]
  float* q;     // f32 [n_rows, Hq, D]: normalised, rotated
  float* gate;  // f32 [n_rows, Hq, D]
};

AttnRows AttnProject(const AttentionWeights& w, const ModelConfig& c, const float* a, int n_rows,
                     MatmulKind kind, ThreadPool* pool, Arena& arena) {
  const std::size_t ud = U(c.head_dim), ut = U(n_rows);
  const std::size_t qg_w = 2 * U(c.n_heads) * ud, kv_w = U(c.n_heads_kv) * ud;
  AttnRows r{};
  r.qg = arena.Alloc(ut * qg_w);
  r.k = arena.Alloc(ut * kv_w);
  r.v = arena.Alloc(ut * kv_w);
  Matmul(kind, a, n_rows, w.q_proj, r.qg, pool);
  Matmul(kind, a, n_rows, w.k_proj, r.k, pool);
  Matmul(kind, a, n_rows, w.v_proj, r.v, pool);
  r.q = arena.Alloc(ut * U(c.n_heads) * ud);
  r.gate = arena.Alloc(ut * U(c.n_heads) * ud);
  return r;
}

// One sequence: split q / gate (interleaved per head), normalise, rotate at its own positions.
// Touches only the sequence's rows: sequences run in parallel.
void AttnNormRope(const AttentionWeights& w, const ModelConfig& c, const Rope& rope,
                  const AttnSeq& sq, const AttnRows& r) {
  const int hq = c.n_heads, hkv = c.n_heads_kv, d = c.head_dim;
  const std::size_t ud = U(d), qg_w = 2 * U(hq) * ud, kv_w = U(hkv) * ud;
  for (int t = 0; t < sq.T; ++t) {
    const std::size_t ut_ = U(sq.row0 + t);
    for (int h = 0; h < hq; ++h) {
      const float* src = r.qg + ut_ * qg_w + 2 * U(h) * ud;
      float* qd = r.q + (ut_ * U(hq) + U(h)) * ud;
      RmsNormZc(src, d, w.q_norm, c.rms_norm_eps, qd);
      std::memcpy(r.gate + (ut_ * U(hq) + U(h)) * ud, src + ud, ud * sizeof(float));
    }
    rope.Apply(r.q + ut_ * U(hq) * ud, hq, d, sq.p + t);
    for (int j = 0; j < hkv; ++j) {
      float* kd = r.k + ut_ * kv_w + U(j) * ud;
      RmsNormZc(kd, d, w.k_norm, c.rms_norm_eps, kd);
    }
    rope.Apply(r.k + ut_ * kv_w, hkv, d, sq.p + t);
  }
}

// Attend: one item per (row, kv head) of every sequence, in row order; per-thread scratch, one
// slice of items per thread. Each item reads only its own sequence's cache, so its bits do not
// depend on the slicing; it then applies the output gate to its heads' outputs (o *= sigmoid(g),
// elementwise: this ran over all rows on the calling thread after the loop).
// o, gate f32 [n_rows, Hq, D].
void AttnCore(const ModelConfig& c, const AttnSeq* seqs, int n_seqs, const float* q,
              const float* gate, ThreadPool* pool, Arena& arena, float* o) {
  const int hq = c.n_heads, hkv = c.n_heads_kv, d = c.head_dim, group = hq / hkv;
  const std::size_t ud = U(d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  int n_items = 0, max_ctx_i = 0;
  for (int i = 0; i < n_seqs; ++i) {
    n_items += seqs[i].T * hkv;
    max_ctx_i = std::max(max_ctx_i, seqs[i].p + seqs[i].T);
  }
  const int n_slices = pool ? std::min(pool->size(), n_items) : 1;
  const std::size_t max_ctx = U(max_ctx_i);
  const std::size_t scratch_w = U(group) * max_ctx + 2 * ud;
  float* scratch = arena.Alloc(U(n_slices) * scratch_w);
  auto slice_fn = [&](std::size_t sb, std::size_t se) {
    for (std::size_t s = sb; s < se; ++s) {
      float* sc = scratch + s * scratch_w;
      int ib = static_cast<int>(s) * n_items / n_slices,
          ie = (static_cast<int>(s) + 1) * n_items / n_slices;
      int si = 0, item0 = 0;  // sequence of item ib and its first item
      while (ib >= item0 + seqs[si].T * hkv) item0 += seqs[si++].T * hkv;
      for (int item = ib; item < ie; ++item) {
        while (item >= item0 + seqs[si].T * hkv) item0 += seqs[si++].T * hkv;
        const AttnSeq& sq = seqs[si];
        int t = (item - item0) / hkv, j = (item - item0) % hkv;
        std::size_t qoff = (U(sq.row0 + t) * U(hq) + U(j * group)) * ud;
        AttendGroup(q + qoff, group, j, *sq.cache, sq.p + t + 1, scale, o + qoff, sc,
                    sc + U(group) * max_ctx);
        for (std::size_t i = qoff; i < qoff + U(group) * ud; ++i) o[i] = o[i] * Sigmoid(gate[i]);
      }
    }
  };
  if (pool && n_slices > 1) {
    pool->ParallelFor(U(n_slices), slice_fn);
  } else {
    slice_fn(0, 1);
  }
}

}  // namespace

void AttentionForward(const AttentionWeights& w, const ModelConfig& c, const Rope& rope,
                      const float* a, int T, int p, KvCache& cache, MatmulKind kind,
                      ThreadPool* pool, Arena& arena, float* out) {
  const AttnSeq seq{0, T, p, &cache};
  AttentionForwardSeqs(w, c, rope, a, T, &seq, 1, kind, pool, arena, out);
}

void AttentionForwardSeqs(const AttentionWeights& w, const ModelConfig& c, const Rope& rope,
                          const float* a, int n_rows, const AttnSeq* seqs, int n_seqs,
                          MatmulKind kind, ThreadPool* pool, Arena& arena, float* out) {
  Arena::Scope scope(arena);
  const AttnRows r = AttnProject(w, c, a, n_rows, kind, pool, arena);
  const std::size_t ud = U(c.head_dim), q_w = U(c.n_heads) * ud, kv_w = U(c.n_heads_kv) * ud;
  ReportOp(OpId::kQProj, r.qg, 0, n_rows, 2 * q_w);
  ReportOp(OpId::kKProj, r.k, 0, n_rows, kv_w);
  ReportOp(OpId::kVProj, r.v, 0, n_rows, kv_w);
  auto prepare = [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) AttnNormRope(w, c, rope, seqs[i], r);
  };
  if (pool)
    pool->ParallelFor(U(n_seqs), prepare);
  else
    prepare(0, U(n_seqs));
  ReportOp(OpId::kQRope, r.q, 0, n_rows, q_w);
  ReportOp(OpId::kKRope, r.k, 0, n_rows, kv_w);
  for (int i = 0; i < n_seqs; ++i) {  // the committed rows each sequence attends to
    const KvCache* kc = seqs[i].cache;
    ReportState(OpId::kStateK, seqs[i].row0, seqs[i].p, kc->row_bytes(),
                [kc](int u) -> const void* { return kc->KRaw(u); });
    ReportState(OpId::kStateV, seqs[i].row0, seqs[i].p, kc->row_bytes(),
                [kc](int u) -> const void* { return kc->VRaw(u); });
  }
  // K/V rows into each sequence's cache on this thread (pages may be shared copy-on-write).
  for (int i = 0; i < n_seqs; ++i)
    seqs[i].cache->Write(seqs[i].p, seqs[i].T, r.k + U(seqs[i].row0) * kv_w,
                         r.v + U(seqs[i].row0) * kv_w);
  float* o = arena.Alloc(U(n_rows) * U(c.n_heads) * U(c.head_dim));
  AttnCore(c, seqs, n_seqs, r.q, r.gate, pool, arena, o);
  ReportOp(OpId::kAttnOut, o, 0, n_rows, q_w);
  Matmul(kind, o, n_rows, w.o_proj, out, pool);
  ReportOp(OpId::kOProj, out, 0, n_rows, U(c.n_embd));
}

}  // namespace lockstep::cpu
