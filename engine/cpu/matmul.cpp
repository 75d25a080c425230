#include "cpu/matmul.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>

namespace lockstep::cpu {

namespace {

// GCC/clang vector extension: 8 floats. Compiles to AVX when available and to SSE pairs
// otherwise, with the same per-lane arithmetic (IEEE, no contraction: -ffp-contract=off).
typedef float v8f __attribute__((vector_size(32)));

inline v8f Load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Fixed-order reduction shared by every dot product: 32 lanes, lane l accumulates elements i
// with i % 32 == l in increasing i (a tail is zero-padded to 32); then lanes combine as
// (l, l+16), (l, l+8), then 4 + 4, 2 + 2, 1 + 1 within the last 8.
inline float Reduce32(v8f a0, v8f a1, v8f a2, v8f a3) {
  v8f s = (a0 + a2) + (a1 + a3);
  float t[8];
  std::memcpy(t, &s, sizeof(t));
  float u0 = t[0] + t[4], u1 = t[1] + t[5], u2 = t[2] + t[6], u3 = t[3] + t[7];
  float w0 = u0 + u2, w1 = u1 + u3;
  return w0 + w1;
}

// R rows of x against one weight row b: R x 4 independent accumulator chains (ILP), each weight
// vector loaded once. Every (row, weight) pair goes through exactly the same per-lane adds, tail
// padding and Reduce32 whatever R is, so results are bitwise independent of how rows are grouped.
template <int R>
inline void DotRows(const float* const* x, const float* b, int n, float* out) {
  v8f acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < 4; ++k) acc[r][k] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const v8f b0 = Load8(b + i), b1 = Load8(b + i + 8), b2 = Load8(b + i + 16),
              b3 = Load8(b + i + 24);
    for (int r = 0; r < R; ++r) {
      acc[r][0] += Load8(x[r] + i) * b0;
      acc[r][1] += Load8(x[r] + i + 8) * b1;
      acc[r][2] += Load8(x[r] + i + 16) * b2;
      acc[r][3] += Load8(x[r] + i + 24) * b3;
    }
  }
  if (i < n) {
    const std::size_t rem = static_cast<std::size_t>(n - i) * sizeof(float);
    float tb[32] = {0};
    std::memcpy(tb, b + i, rem);
    for (int r = 0; r < R; ++r) {
      float tx[32] = {0};
      std::memcpy(tx, x[r] + i, rem);
      for (int k = 0; k < 4; ++k) acc[r][k] += Load8(tx + 8 * k) * Load8(tb + 8 * k);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = Reduce32(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
}

}  // namespace

float Dot(const float* a, const float* b, int n) {
  float out;
  DotRows<1>(&a, b, n, &out);
  return out;
}

namespace {

// Weight rows stream from memory once per call while the x rows stay in cache; x rows go four
// at a time through DotRows<4> and the remainder through Dot: identical bits either way. The
// weight row ~4 KiB ahead is prefetched while the current one is used (measured on `small`, 2
// threads: a T = 9 verify window ~8% faster, T = 1 unchanged; the many short per-expert
// products start their streams cold, so the hardware prefetcher alone runs behind).
void InvariantBlock(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
                    int ldy, int y_col0) {
  const int in = w.cols;
  const std::size_t sx = static_cast<std::size_t>(in), sy = static_cast<std::size_t>(ldy);
  constexpr int kPrefetchBytes = 4096;
  const int ahead = std::max(1, kPrefetchBytes / std::max(1, in * static_cast<int>(sizeof(float))));
  for (int o = o_begin; o < o_end; ++o) {
    const float* wr = w.row(o);
    if (o + ahead < o_end) {
      const float* nx = w.row(o + ahead);
      for (int c = 0; c < in; c += 16) __builtin_prefetch(nx + c);
    }
    float* yc = y + static_cast<std::size_t>(o - y_col0);
    int t = 0;
    for (; t + 4 <= n_rows; t += 4) {
      float r[4];
      const float* xt = x + static_cast<std::size_t>(t) * sx;
      const float* rows[4] = {xt, xt + sx, xt + 2 * sx, xt + 3 * sx};
      DotRows<4>(rows, wr, in, r);
      for (int j = 0; j < 4; ++j) yc[static_cast<std::size_t>(t + j) * sy] = r[j];
    }
    for (; t < n_rows; ++t)
      yc[static_cast<std::size_t>(t) * sy] = Dot(x + static_cast<std::size_t>(t) * sx, wr, in);
  }
}

}  // namespace

void MatmulRowsRange(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
                     int ldy) {
  InvariantBlock(x, n_rows, w, o_begin, o_end, y, ldy, o_begin);
}

void Matmul(MatmulKind kind, const float* x, int n_rows, const Mat& w, float* y, ThreadPool* pool,
            int ldy) {
  if (ldy < 0) ldy = w.rows;
  if (n_rows <= 0 || w.rows <= 0) return;
  if (kind == MatmulKind::kInvariant) {
    auto body = [&](std::size_t b, std::size_t e) {
      InvariantBlock(x, n_rows, w, static_cast<int>(b), static_cast<int>(e), y, ldy, 0);
    };
    if (pool) {
      // ~16 KiB of weights per range at least, so dispatch stays cheap relative to work.
      std::size_t min_rows = static_cast<std::size_t>(std::max(1, 4096 / std::max(1, w.cols)));
      pool->ParallelFor(static_cast<std::size_t>(w.rows), body, min_rows);
    } else {
      body(0, static_cast<std::size_t>(w.rows));
    }
    return;
  }
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMat> X(x, n_rows, w.cols);
  auto body = [&](std::size_t b, std::size_t e) {
    const int ob = static_cast<int>(b), oe = static_cast<int>(e);
    Eigen::Map<const RowMat> W(w.row(ob), oe - ob, w.cols);
    Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y + ob, n_rows, oe - ob,
                                                  Eigen::OuterStride<>(ldy));
    Y.noalias() = X * W.transpose();
  };
  if (pool) {
    pool->ParallelFor(static_cast<std::size_t>(w.rows), body, 64);
  } else {
    body(0, static_cast<std::size_t>(w.rows));
  }
}

}  // namespace lockstep::cpu
