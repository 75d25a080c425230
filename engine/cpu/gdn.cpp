#include "cpu/gdn.h"

#include <Eigen/Core>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "cpu/activation.h"
#include "cpu/norm.h"
#include "cpu/op_report.h"

namespace lockstep::cpu {

namespace {
inline std::size_t U(int x) { return static_cast<std::size_t>(x); }
}  // namespace

void GatedDeltaStep(float* S, const float* q, const float* k, const float* v, float alpha,
                    float beta, int dk, int dv, float* o) {
  GatedDeltaStepFrom(S, S, q, k, v, alpha, beta, dk, dv, o);
}

namespace {

// 16 floats (one zmm register with AVX-512, else pairs), IEEE per lane, no contraction.
typedef float v16f __attribute__((vector_size(64)));
constexpr int kBlk = 64;  // value columns held in registers: 4 x v16f

inline v16f Ld(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void St(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }

// GatedDeltaStepFrom for dv % 64 == 0: the same per-element operations in the same order (m[j]
// and o[j] accumulate over kappa in increasing order; each S element gets the decay, then the
// rank-1 term), with a block of 64 value columns of m and o in registers across the kappa loop
// instead of loaded and stored per kappa. The loop form stored twice per 8 floats and was bound
// by those stores (~3,500 cycles per 64 x 64 head step, the state in L2).
// The decayed state is not stored between the passes: pass 2 takes the entering block again (in
// L1 / L2 after pass 1) and rounds in * alpha again (the same value), so S is written once. With
// `stream`, that write is a non-temporal store: the state a window leaves is read next at the next
// window, after the whole model's weights have passed through the caches, so the write skips the
// read-for-ownership of S's lines (2 of the 6 MiB a 2 MiB state moved per step).
void DeltaStepBlocked(const float* S_in, float* S, const float* q, const float* k, const float* v,
                      float alpha, float beta, int dk, int dv, float* o, bool stream) {
  const std::size_t row = U(dv);
#if defined(__AVX512F__)
  stream = stream && reinterpret_cast<std::uintptr_t>(S) % 64 == 0;
#else
  stream = false;
#endif
  for (int j0 = 0; j0 < dv; j0 += kBlk) {
    v16f m[4] = {};
    for (int kk = 0; kk < dk; ++kk) {
      const float* in = S_in + U(kk) * row + U(j0);
      const float kv = k[kk];
      for (int b = 0; b < 4; ++b) m[b] += (Ld(in + 16 * b) * alpha) * kv;
    }
    v16f delta[4], acc[4] = {};
    for (int b = 0; b < 4; ++b) delta[b] = beta * (Ld(v + j0 + 16 * b) - m[b]);
    for (int kk = 0; kk < dk; ++kk) {
      const float* in = S_in + U(kk) * row + U(j0);
      float* r = S + U(kk) * row + U(j0);
      const float kv = k[kk], qv = q[kk];
      for (int b = 0; b < 4; ++b) {
        const v16f x = Ld(in + 16 * b) * alpha + kv * delta[b];
#if defined(__AVX512F__)
        if (stream)
          _mm512_stream_ps(r + 16 * b, reinterpret_cast<const __m512&>(x));
        else
#endif
          St(r + 16 * b, x);
        acc[b] += x * qv;
      }
    }
    for (int b = 0; b < 4; ++b) St(o + j0 + 16 * b, acc[b]);
  }
#if defined(__AVX512F__)
  if (stream) _mm_sfence();  // the streamed stores ordered before what the caller publishes
#endif
}

}  // namespace

void GatedDeltaStepFrom(const float* S_in, float* S, const float* q, const float* k, const float* v,
                        float alpha, float beta, int dk, int dv, float* o, bool stream) {
  if (dv % kBlk == 0) return DeltaStepBlocked(S_in, S, q, k, v, alpha, beta, dk, dv, o, stream);
  // Pass 1: decay and m = S^T k, accumulating over kappa in increasing order (vectorised over v).
  float m[1024];
  std::fill_n(m, dv, 0.0f);
  for (int kk = 0; kk < dk; ++kk) {
    const float* in = S_in + U(kk) * U(dv);
    float* row = S + U(kk) * U(dv);
    const float kv = k[kk];
    for (int j = 0; j < dv; ++j) {
      row[j] = in[j] * alpha;
      m[j] += row[j] * kv;
    }
  }
  float delta[1024];
  for (int j = 0; j < dv; ++j) delta[j] = beta * (v[j] - m[j]);
  // Pass 2: rank-1 update and o = S^T q with the updated state.
  std::fill_n(o, dv, 0.0f);
  for (int kk = 0; kk < dk; ++kk) {
    float* row = S + U(kk) * U(dv);
    const float kv = k[kk], qv = q[kk];
    for (int j = 0; j < dv; ++j) {
      row[j] += kv * delta[j];
      o[j] += row[j] * qv;
    }
  }
}

void GatedDeltaChunked(float* S, const float* Q, const float* K, const float* V, const float* g,
                       const float* beta, int T, int dk, int dv, float* O, int chunk) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<RowMat> Sm(S, dk, dv);
  RowMat A, Tm, KK, QK, Wm, Um, Delta, Kg, Qg, Vb, Kb;
  std::vector<float> gam;
  for (int c0 = 0; c0 < T; c0 += chunk) {
    const int n = std::min(chunk, T - c0);
    Eigen::Map<const RowMat> Kc(K + U(c0) * U(dk), n, dk);
    Eigen::Map<const RowMat> Qc(Q + U(c0) * U(dk), n, dk);
    Eigen::Map<const RowMat> Vc(V + U(c0) * U(dv), n, dv);
    Eigen::Map<RowMat> Oc(O + U(c0) * U(dv), n, dv);
    gam.assign(U(n), 0.0f);
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) gam[U(i)] = (acc += g[c0 + i]);
    KK.noalias() = Kc * Kc.transpose();
    // A (strictly lower): beta_i exp(gam_i - gam_m) <k_i, k_m>; forward substitution for (I+A)^-1.
    Tm.setZero(n, n);
    for (int i = 0; i < n; ++i)
      for (int m = 0; m < i; ++m)
        Tm(i, m) = -beta[c0 + i] * std::exp(gam[U(i)] - gam[U(m)]) * KK(i, m);
    for (int i = 1; i < n; ++i) {
      // X[i, :i] += X[i, :i] * X[:i, :i]  (rows < i are already final)
      Eigen::Matrix<float, 1, Eigen::Dynamic> row = Tm.block(i, 0, 1, i);
      Tm.block(i, 0, 1, i) = row + row * Tm.block(0, 0, i, i);
    }
    for (int i = 0; i < n; ++i) Tm(i, i) = 1.0f;
    Vb = Vc;
    Kb = Kc;
    for (int i = 0; i < n; ++i) {
      Vb.row(i) *= beta[c0 + i];
      Kb.row(i) *= beta[c0 + i] * std::exp(gam[U(i)]);
    }
    Um.noalias() = Tm * Vb;  // U = Tm diag(beta) V
    Wm.noalias() = Tm * Kb;  // W = Tm diag(beta Gamma) K
    Delta = Um;
    Delta.noalias() -= Wm * Sm;  // Delta = U - W S0
    // O = diag(Gamma) Q S0 + ((Q K^T) .* D) Delta, with D incl. the diagonal.
    Qg = Qc;
    for (int i = 0; i < n; ++i) Qg.row(i) *= std::exp(gam[U(i)]);
    QK.noalias() = Qc * Kc.transpose();
    for (int i = 0; i < n; ++i)
      for (int m = 0; m < n; ++m)
        QK(i, m) = m <= i ? QK(i, m) * std::exp(gam[U(i)] - gam[U(m)]) : 0.0f;
    Oc.noalias() = Qg * Sm;
    Oc.noalias() += QK * Delta;
    // S_end = Gamma_last S0 + sum_i exp(gam_last - gam_i) k_i (x) Delta_i.
    const float gl = gam[U(n - 1)];
    Kg = Kc;
    for (int i = 0; i < n; ++i) Kg.row(i) *= std::exp(gl - gam[U(i)]);
    Sm *= std::exp(gl);
    Sm.noalias() += Kg.transpose() * Delta;
  }
}

void CausalConvSilu(const float* win, int T, int C, int K, const float* weight, float* Uo,
                    ThreadPool* pool) {
  auto channels = [&](std::size_t b, std::size_t e) {
    for (int t = 0; t < T; ++t) {
      float* urow = Uo + U(t) * U(C);
      std::size_t ch = b;
#if defined(__AVX512F__)
      // 16 channels at a time, each its own sum in the scalar order below: their taps are 64
      // consecutive weights ([C, K], K = 4), tap j of channel i at 4i + j, picked out of the
      // four registers by two vpermt2ps and a blend per tap. The same bits.
      if (K == 4) {
        for (; ch + 16 <= e; ch += 16) {
          const float* wp = weight + ch * 4;
          const __m512 w0 = _mm512_loadu_ps(wp), w1 = _mm512_loadu_ps(wp + 16),
                       w2 = _mm512_loadu_ps(wp + 32), w3 = _mm512_loadu_ps(wp + 48);
          __m512 s = _mm512_setzero_ps();
          for (int j = 0; j < 4; ++j) {
            // lane i < 8: element 4i + j of (w0, w1); lane i >= 8: 4(i - 8) + j of (w2, w3)
            const __m512i idx = _mm512_add_epi32(
                _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
                _mm512_set1_epi32(j));
            const __m512 wj = _mm512_mask_blend_ps(0xFF00, _mm512_permutex2var_ps(w0, idx, w1),
                                                   _mm512_permutex2var_ps(w2, idx, w3));
            s = _mm512_add_ps(s, _mm512_mul_ps(wj, _mm512_loadu_ps(win + U(t + j) * U(C) + ch)));
          }
          _mm512_storeu_ps(urow + ch, s);
        }
      }
#endif
      for (; ch < e; ++ch) {
        const float* wc = weight + ch * U(K);
        float s = 0.0f;
        for (int j = 0; j < K; ++j) s += wc[j] * win[U(t + j) * U(C) + ch];
        urow[ch] = s;
      }
      SiluInPlace(urow + b, e - b);
    }
  };
  // A decode step's SiLU over Qwen3-Next's 8,192 channels was ~60 us of scalar expf on one core
  // (~3% of a quantised step of `wide --layers 8` while the other thread waited); split over the
  // pool, then in vector form (activation.h: ~16 -> ~2.5 us per 8,192 on one core).
  if (pool != nullptr)
    pool->ParallelFor(U(C), channels, 1024);
  else
    channels(0, U(C));
}

namespace {

// The per-row inputs of the recurrence (arena views).
struct GdnInputs {
  const ModelConfig& c;
  int T;
  const float* win;   // f32 [K-1+T, conv_dim]: the conv window (previous inputs, then the rows)
  const float* Uc;    // f32 [T, conv_dim]: conv + SiLU output (v is read from it)
  const float* qh;    // f32 [T, Hk, Dk]: l2-normalised, scaled q
  const float* kh;    // f32 [T, Hk, Dk]: l2-normalised k
  const float* beta;  // f32 [T, Hv]
  const float* gdec;  // f32 [T, Hv]: log decay
};

// Verify: one step per row into the per-step scratch (the checkpoint stays until commit). Begin
// sizes the scratch and fills the per-step conv states; the steps of each value head are then
// one work item (VerifyHead), run in parallel over the heads of every verifying sequence.
void VerifyBegin(const GdnInputs& in, GdnState& state) {
  const ModelConfig& c = in.c;
  const int conv_dim = c.conv_dim(), kr = c.conv_kernel - 1;
  state.BeginSteps(in.T);
  for (int t = 0; t < in.T; ++t) {  // conv state after step t = last K-1 inputs ending at t
    std::memcpy(state.step_conv(t), in.win + U(t + 1) * U(conv_dim),
                U(kr) * U(conv_dim) * sizeof(float));
  }
}

void VerifyHead(const GdnInputs& in, GdnState& state, std::size_t j, float* O) {
  const ModelConfig& c = in.c;
  const int hk = c.n_k_heads, hv = c.n_v_heads, dk = c.k_head_dim, dv = c.v_head_dim, r = hv / hk;
  const int key_dim = c.key_dim(), conv_dim = c.conv_dim();
  const std::size_t s_head = U(dk) * U(dv);
  const float *Uc = in.Uc, *qh = in.qh, *kh = in.kh, *beta = in.beta, *gdec = in.gdec;
  const int gi = static_cast<int>(j) / r;
  for (int t = 0; t < in.T; ++t) {
    const float* prev = t == 0 ? state.ssm() : state.step_ssm(t - 1);
    float* S = state.step_ssm(t) + j * s_head;
    const std::size_t th = U(t) * U(hv) + j;
    GatedDeltaStepFrom(prev + j * s_head, S, qh + (U(t) * U(hk) + U(gi)) * U(dk),
                       kh + (U(t) * U(hk) + U(gi)) * U(dk),
                       Uc + U(t) * U(conv_dim) + U(2 * key_dim) + j * U(dv), std::exp(gdec[th]),
                       beta[th], dk, dv, O + th * U(dv), t == in.T - 1);
  }
}

// Prefill: chunked form per value head, in place on the checkpoint; value heads in slices, one
// per worker.
void RecurPrefill(const GdnInputs& in, GdnState& state, ThreadPool* pool, Arena& arena, float* O) {
  const ModelConfig& c = in.c;
  const int T = in.T;
  const int hk = c.n_k_heads, hv = c.n_v_heads, dk = c.k_head_dim, dv = c.v_head_dim, r = hv / hk;
  const int key_dim = c.key_dim(), conv_dim = c.conv_dim(), kr = c.conv_kernel - 1;
  const std::size_t ut = U(T);
  const std::size_t s_head = U(dk) * U(dv);
  const float *win = in.win, *Uc = in.Uc, *qh = in.qh, *kh = in.kh, *beta = in.beta,
              *gdec = in.gdec;
  // Prefill: chunked form per value head, in place on the checkpoint.
  std::memcpy(state.conv(), win + ut * U(conv_dim), U(kr) * U(conv_dim) * sizeof(float));
  const int n_slices = pool ? std::min(pool->size(), hv) : 1;
  const std::size_t per = ut * U(2 * dk + 2 * dv + 2);
  float* scratch = arena.Alloc(U(n_slices) * per);
  auto slices = [&](std::size_t sb, std::size_t se) {
    for (std::size_t s = sb; s < se; ++s) {
      float* Qj = scratch + s * per;
      float* Kj = Qj + ut * U(dk);
      float* Vj = Kj + ut * U(dk);
      float* gj = Vj + ut * U(dv);
      float* bj = gj + ut;
      float* Oj = bj + ut;
      int jb = static_cast<int>(s) * hv / n_slices, je = (static_cast<int>(s) + 1) * hv / n_slices;
      for (int j = jb; j < je; ++j) {
        const int gi = j / r;
        for (int t = 0; t < T; ++t) {
          std::memcpy(Qj + U(t) * U(dk), qh + (U(t) * U(hk) + U(gi)) * U(dk),
                      U(dk) * sizeof(float));
          std::memcpy(Kj + U(t) * U(dk), kh + (U(t) * U(hk) + U(gi)) * U(dk),
                      U(dk) * sizeof(float));
          std::memcpy(Vj + U(t) * U(dv), Uc + U(t) * U(conv_dim) + U(2 * key_dim) + U(j) * U(dv),
                      U(dv) * sizeof(float));
          gj[t] = gdec[U(t) * U(hv) + U(j)];
          bj[t] = beta[U(t) * U(hv) + U(j)];
        }
        GatedDeltaChunked(state.ssm() + U(j) * s_head, Qj, Kj, Vj, gj, bj, T, dk, dv, Oj);
        for (int t = 0; t < T; ++t)
          std::memcpy(O + (U(t) * U(hv) + U(j)) * U(dv), Oj + U(t) * U(dv), U(dv) * sizeof(float));
      }
    }
  };
  if (pool && n_slices > 1)
    pool->ParallelFor(U(n_slices), slices);
  else
    slices(0, 1);
  state.Advance(T);
}

}  // namespace

namespace {

// The projections' outputs and the per-row tensors built from them, rows of all sequences.
struct GdnRows {
  float* P;     // f32 [n_rows, qkvz_dim]: in_proj_qkvz output
  float* B;     // f32 [n_rows, 2 Hv]: in_proj_ba output
  float* Z;     // f32 [n_rows, Hv, Dv]
  float* beta;  // f32 [n_rows, Hv]
  float* gdec;  // f32 [n_rows, Hv]
  float* Uc;    // f32 [n_rows, conv_dim]
  float* qh;    // f32 [n_rows, Hk, Dk]
  float* kh;    // f32 [n_rows, Hk, Dk]
  float* O;     // f32 [n_rows, Hv, Dv]
};

GdnRows GdnProject(const GdnWeights& w, const ModelConfig& c, const float* a, int n_rows,
                   MatmulKind kind, ThreadPool* pool, Arena& arena) {
  const int hk = c.n_k_heads, hv = c.n_v_heads, dk = c.k_head_dim, dv = c.v_head_dim;
  const std::size_t ut = U(n_rows);
  GdnRows r{};
  r.P = arena.Alloc(ut * U(c.qkvz_dim()));
  r.B = arena.Alloc(ut * U(2 * hv));
  Matmul(kind, a, n_rows, w.in_proj_qkvz, r.P, pool);
  Matmul(kind, a, n_rows, w.in_proj_ba, r.B, pool);
  r.Z = arena.Alloc(ut * U(hv) * U(dv));
  r.beta = arena.Alloc(ut * U(hv));
  r.gdec = arena.Alloc(ut * U(hv));
  r.Uc = arena.Alloc(ut * U(c.conv_dim()));
  r.qh = arena.Alloc(ut * U(hk) * U(dk));
  r.kh = arena.Alloc(ut * U(hk) * U(dk));
  r.O = arena.Alloc(ut * U(hv) * U(dv));
  return r;
}

// One sequence's conv window [K-1 previous inputs (its checkpoint) ; its rows] into `win` f32
// [K-1+T, conv_dim], z, beta, g, the conv and the l2-normalised q (scaled) and k per key head;
// returns its recurrence inputs. Touches only the sequence's own rows and state: sequences are
// prepared in parallel.
GdnInputs GdnPrepare(const GdnWeights& w, const ModelConfig& c, const GdnSeq& sq, const GdnRows& rw,
                     float* win, ThreadPool* pool) {
  const int hk = c.n_k_heads, hv = c.n_v_heads, dk = c.k_head_dim, dv = c.v_head_dim, r = hv / hk;
  const int key_dim = c.key_dim(), conv_dim = c.conv_dim(), kw = c.conv_kernel, kr = kw - 1;
  const int wg = 2 * dk + 2 * r * dv;  // per-key-head group width of in_proj_qkvz
  const int T = sq.T;
  const std::size_t r0 = U(sq.row0);
  const float* P = rw.P + r0 * U(c.qkvz_dim());
  const float* B = rw.B + r0 * U(2 * hv);
  float *Z = rw.Z + r0 * U(hv) * U(dv), *beta = rw.beta + r0 * U(hv), *gdec = rw.gdec + r0 * U(hv),
        *Uc = rw.Uc + r0 * U(conv_dim), *qh = rw.qh + r0 * U(hk) * U(dk),
        *kh = rw.kh + r0 * U(hk) * U(dk);
  std::memcpy(win, sq.state->conv(), U(kr) * U(conv_dim) * sizeof(float));
  for (int t = 0; t < T; ++t) {
    const float* pr = P + U(t) * U(c.qkvz_dim());
    float* x = win + U(kr + t) * U(conv_dim);
    for (int gi = 0; gi < hk; ++gi) {
      const float* grp = pr + U(gi) * U(wg);
      std::memcpy(x + U(gi) * U(dk), grp, U(dk) * sizeof(float));
      std::memcpy(x + U(key_dim) + U(gi) * U(dk), grp + dk, U(dk) * sizeof(float));
      for (int i = 0; i < r; ++i) {
        const int j = gi * r + i;
        std::memcpy(x + U(2 * key_dim) + U(j) * U(dv), grp + 2 * dk + i * dv,
                    U(dv) * sizeof(float));
        std::memcpy(Z + (U(t) * U(hv) + U(j)) * U(dv), grp + 2 * dk + r * dv + i * dv,
                    U(dv) * sizeof(float));
        const float bb = B[U(t) * U(2 * hv) + U(gi * 2 * r + i)];
        const float aa = B[U(t) * U(2 * hv) + U(gi * 2 * r + r + i)];
        beta[U(t) * U(hv) + U(j)] = Sigmoid(bb);
        gdec[U(t) * U(hv) + U(j)] = -std::exp(w.a_log[j]) * Softplus(aa + w.dt_bias[j]);
      }
    }
  }
  CausalConvSilu(win, T, conv_dim, kw, w.conv1d, Uc, pool);
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int t = 0; t < T; ++t) {
    const float* urow = Uc + U(t) * U(conv_dim);
    for (int gi = 0; gi < hk; ++gi) {
      float* qd = qh + (U(t) * U(hk) + U(gi)) * U(dk);
      float* kd = kh + (U(t) * U(hk) + U(gi)) * U(dk);
      std::memcpy(qd, urow + U(gi) * U(dk), U(dk) * sizeof(float));
      std::memcpy(kd, urow + U(key_dim) + U(gi) * U(dk), U(dk) * sizeof(float));
      L2NormInPlace(qd, dk, 1e-6f);
      L2NormInPlace(kd, dk, 1e-6f);
      for (int i = 0; i < dk; ++i) qd[i] *= qscale;
    }
  }
  return GdnInputs{c, T, win, Uc, qh, kh, beta, gdec};
}

// The recurrences: every sequence's preparation (GdnPrepare, and VerifyBegin for kVerify) in one
// parallel loop over sequences; every kVerify sequence's (sequence, value head) items in one
// parallel loop, each followed by the gated RMSNorm of its output rows (On); then each kPrefill
// sequence's chunked form (parallel over its heads) and its rows' gated norm. Each item touches
// only its own sequence's rows and state, so the split over threads changes no bit. (The
// preparation and the norm ran on the calling thread while the others waited: with 16 decoding
// sequences on 2 threads, moving them into the loops took ~9% off the step's wall time.)
void GdnCore(const GdnWeights& w, const ModelConfig& c, const GdnSeq* seqs, int n_seqs, int n_rows,
             const GdnRows& rw, ThreadPool* pool, Arena& arena, float* On) {
  const int hv = c.n_v_heads, dv = c.v_head_dim, kr = c.conv_kernel - 1;
  const std::size_t uhv = U(hv), o_row = uhv * U(dv);
  // Reporting ops: the recurrence and the gated norm run apart (same bits).
  const bool split = CurrentOpTap() != nullptr;
  for (int i = 0; i < n_seqs; ++i) {  // the checkpoint each sequence starts from
    const GdnState* st = seqs[i].state;
    ReportState(OpId::kStateConv, seqs[i].row0, 1, st->conv_size() * sizeof(float),
                [st](int) -> const void* { return st->conv(); });
    ReportState(OpId::kStateSsm, seqs[i].row0, 1, st->ssm_size() * sizeof(float),
                [st](int) -> const void* { return st->ssm(); });
  }
  std::vector<std::optional<GdnInputs>> ins(U(n_seqs));
  std::vector<float*> wins(U(n_seqs));
  for (int i = 0; i < n_seqs; ++i) wins[U(i)] = arena.Alloc(U(kr + seqs[i].T) * U(c.conv_dim()));
  auto prepare = [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      ins[i].emplace(GdnPrepare(w, c, seqs[i], rw, wins[i], pool));  // nested: inline
      if (seqs[i].mode == GdnMode::kVerify) VerifyBegin(*ins[i], *seqs[i].state);
    }
  };
  if (pool)
    pool->ParallelFor(U(n_seqs), prepare);
  else
    prepare(0, U(n_seqs));
  {
    const int hk = c.n_k_heads, dk = c.k_head_dim;
    ReportOp(OpId::kConv, rw.Uc, 0, n_rows, U(c.conv_dim()));
    ReportOp(OpId::kGates, rw.beta, 0, n_rows, uhv, 0, 0);
    ReportOp(OpId::kGates, rw.gdec, 0, n_rows, uhv, 0, 1);
    ReportOp(OpId::kL2Norm, rw.qh, 0, n_rows, U(hk) * U(dk), 0, 0);
    ReportOp(OpId::kL2Norm, rw.kh, 0, n_rows, U(hk) * U(dk), 0, 1);
  }
  std::vector<int> verify;
  for (int i = 0; i < n_seqs; ++i)
    if (seqs[i].mode == GdnMode::kVerify) verify.push_back(i);
  auto norm_rows = [&](int row0, int T, std::size_t j0, std::size_t j1) {
    for (int t = row0; t < row0 + T; ++t)
      for (std::size_t j = j0; j < j1; ++j) {
        const std::size_t th = U(t) * uhv + j;
        GatedRmsNorm(rw.O + th * U(dv), rw.Z + th * U(dv), dv, w.norm, c.rms_norm_eps,
                     On + th * U(dv));
      }
  };
  auto heads = [&](std::size_t b, std::size_t e) {
    for (std::size_t item = b; item < e; ++item) {
      const int i = verify[item / uhv];
      const std::size_t j = item % uhv;
      VerifyHead(*ins[U(i)], *seqs[i].state, j, rw.O + U(seqs[i].row0) * o_row);
      if (!split) norm_rows(seqs[i].row0, seqs[i].T, j, j + 1);
    }
  };
  if (!verify.empty()) {
    if (pool)
      pool->ParallelFor(verify.size() * uhv, heads);
    else
      heads(0, verify.size() * uhv);
  }
  for (int i = 0; i < n_seqs; ++i)
    if (seqs[i].mode == GdnMode::kPrefill) {
      RecurPrefill(*ins[U(i)], *seqs[i].state, pool, arena, rw.O + U(seqs[i].row0) * o_row);
      if (!split) norm_rows(seqs[i].row0, seqs[i].T, 0, uhv);
    }
  if (split) {
    ReportOp(OpId::kRecurrence, rw.O, 0, n_rows, o_row);
    norm_rows(0, n_rows, 0, uhv);  // on this thread: a pool barrier costs more at decode sizes
    ReportOp(OpId::kGatedNorm, On, 0, n_rows, o_row);
  }
}

}  // namespace

void GdnForward(const GdnWeights& w, const ModelConfig& c, const float* a, int T, GdnState& state,
                GdnMode mode, MatmulKind kind, ThreadPool* pool, Arena& arena, float* out) {
  const GdnSeq seq{0, T, &state, mode};
  GdnForwardSeqs(w, c, a, T, &seq, 1, kind, pool, arena, out);
}

void GdnForwardSeqs(const GdnWeights& w, const ModelConfig& c, const float* a, int n_rows,
                    const GdnSeq* seqs, int n_seqs, MatmulKind kind, ThreadPool* pool, Arena& arena,
                    float* out) {
  Arena::Scope scope(arena);
  const int hv = c.n_v_heads, dv = c.v_head_dim;
  const GdnRows rw = GdnProject(w, c, a, n_rows, kind, pool, arena);
  ReportOp(OpId::kInProj, rw.P, 0, n_rows, U(c.qkvz_dim()));
  ReportOp(OpId::kInProjBa, rw.B, 0, n_rows, U(2 * hv));
  // Recurrences and the gated RMSNorm per (row, value head) into On, then out_proj.
  float* On = arena.Alloc(U(n_rows) * U(hv) * U(dv));
  GdnCore(w, c, seqs, n_seqs, n_rows, rw, pool, arena, On);
  Matmul(kind, On, n_rows, w.out_proj, out, pool);
  ReportOp(OpId::kOutProj, out, 0, n_rows, U(c.n_embd));
}

}  // namespace lockstep::cpu
