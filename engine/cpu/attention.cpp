#include "cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/norm.h"

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
    double sum = 0.0;  // f64 sum: long contexts keep the normaliser exact to f32 precision
    for (int u = 0; u < n_ctx; ++u) {
      s[u] = std::exp(s[u] - mx);
      sum += static_cast<double>(s[u]);
    }
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

void AttentionForward(const AttentionWeights& w, const ModelConfig& c, const Rope& rope,
                      const float* a, int T, int p, KvCache& cache, MatmulKind kind,
                      ThreadPool* pool, Arena& arena, float* out) {
  Arena::Scope scope(arena);
  const int hq = c.n_heads, hkv = c.n_heads_kv, d = c.head_dim, group = hq / hkv;
  const std::size_t ud = static_cast<std::size_t>(d), ut = static_cast<std::size_t>(T);
  const std::size_t qg_w = 2 * static_cast<std::size_t>(hq) * ud,
                    kv_w = static_cast<std::size_t>(hkv) * ud;
  float* qg = arena.Alloc(ut * qg_w);
  float* k = arena.Alloc(ut * kv_w);
  float* v = arena.Alloc(ut * kv_w);
  Matmul(kind, a, T, w.q_proj, qg, pool);
  Matmul(kind, a, T, w.k_proj, k, pool);
  Matmul(kind, a, T, w.v_proj, v, pool);

  // Split q / gate (interleaved per head), normalise, rotate.
  float* q = arena.Alloc(ut * static_cast<std::size_t>(hq) * ud);
  float* gate = arena.Alloc(ut * static_cast<std::size_t>(hq) * ud);
  for (int t = 0; t < T; ++t) {
    const std::size_t ut_ = static_cast<std::size_t>(t);
    for (int h = 0; h < hq; ++h) {
      const float* src = qg + ut_ * qg_w + 2 * static_cast<std::size_t>(h) * ud;
      float* qd = q + (ut_ * static_cast<std::size_t>(hq) + static_cast<std::size_t>(h)) * ud;
      RmsNormZc(src, d, w.q_norm, c.rms_norm_eps, qd);
      std::memcpy(gate + (ut_ * static_cast<std::size_t>(hq) + static_cast<std::size_t>(h)) * ud,
                  src + ud, ud * sizeof(float));
    }
    rope.Apply(q + ut_ * static_cast<std::size_t>(hq) * ud, hq, d, p + t);
    for (int j = 0; j < hkv; ++j) {
      float* kd = k + ut_ * kv_w + static_cast<std::size_t>(j) * ud;
      RmsNormZc(kd, d, w.k_norm, c.rms_norm_eps, kd);
    }
    rope.Apply(k + ut_ * kv_w, hkv, d, p + t);
  }
  cache.Write(p, T, k, v);

  // Attend: one item per (row, kv head); per-thread scratch, one slice of items per thread.
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int n_items = T * hkv;
  const int n_slices = pool ? std::min(pool->size(), n_items) : 1;
  const std::size_t max_ctx = static_cast<std::size_t>(p + T);
  const std::size_t scratch_w = static_cast<std::size_t>(group) * max_ctx + 2 * ud;
  float* scratch = arena.Alloc(static_cast<std::size_t>(n_slices) * scratch_w);
  float* o = arena.Alloc(ut * static_cast<std::size_t>(hq) * ud);
  auto slice_fn = [&](std::size_t sb, std::size_t se) {
    for (std::size_t s = sb; s < se; ++s) {
      float* sc = scratch + s * scratch_w;
      int ib = static_cast<int>(s) * n_items / n_slices,
          ie = (static_cast<int>(s) + 1) * n_items / n_slices;
      for (int item = ib; item < ie; ++item) {
        int t = item / hkv, j = item % hkv;
        std::size_t qoff = (static_cast<std::size_t>(t) * static_cast<std::size_t>(hq) +
                            static_cast<std::size_t>(j * group)) *
                           ud;
        AttendGroup(q + qoff, group, j, cache, p + t + 1, scale, o + qoff, sc,
                    sc + static_cast<std::size_t>(group) * max_ctx);
      }
    }
  };
  if (pool && n_slices > 1) {
    pool->ParallelFor(static_cast<std::size_t>(n_slices), slice_fn);
  } else {
    slice_fn(0, 1);
  }
  // Output gate and projection.
  const std::size_t n_o = ut * static_cast<std::size_t>(hq) * ud;
  for (std::size_t i = 0; i < n_o; ++i) o[i] = o[i] * Sigmoid(gate[i]);
  Matmul(kind, o, T, w.o_proj, out, pool);
}

}  // namespace lockstep::cpu
