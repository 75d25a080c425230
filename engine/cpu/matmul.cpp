#include "cpu/matmul.h"

#include <Eigen/Core>
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

// Fixed-order reduction shared by every Dot: lanes l = 0..15 accumulate elements i with
// i % 16 == l in increasing i; then lanes combine as ((l, l+8), then +4, +2, +1).
inline float Reduce16(v8f a0, v8f a1) {
  v8f s = a0 + a1;  // lane l + lane l+8
  float t[8];
  std::memcpy(t, &s, sizeof(t));
  float u0 = t[0] + t[4], u1 = t[1] + t[5], u2 = t[2] + t[6], u3 = t[3] + t[7];
  float w0 = u0 + u2, w1 = u1 + u3;
  return w0 + w1;
}

}  // namespace

float Dot(const float* a, const float* b, int n) {
  v8f acc0 = {0, 0, 0, 0, 0, 0, 0, 0};
  v8f acc1 = acc0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += Load8(a + i) * Load8(b + i);
    acc1 += Load8(a + i + 8) * Load8(b + i + 8);
  }
  if (i < n) {  // tail: lane (i % 16) as if zero-padded to a multiple of 16
    float ta[16] = {0}, tb[16] = {0};
    std::memcpy(ta, a + i, static_cast<std::size_t>(n - i) * sizeof(float));
    std::memcpy(tb, b + i, static_cast<std::size_t>(n - i) * sizeof(float));
    acc0 += Load8(ta) * Load8(tb);
    acc1 += Load8(ta + 8) * Load8(tb + 8);
  }
  return Reduce16(acc0, acc1);
}

namespace {

// Four output rows against one x row at a time: W rows stream from memory once per call while
// x stays in cache. Each (t, o) still gets exactly the Dot() arithmetic, so results are
// identical to calling Dot() per element.
void InvariantBlock(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
                    int ldy, int y_col0) {
  const int in = w.cols;
  const std::size_t sx = static_cast<std::size_t>(in);
  for (int o = o_begin; o < o_end; ++o) {
    const float* wr = w.row(o);
    for (int t = 0; t < n_rows; ++t)
      y[static_cast<std::size_t>(t) * static_cast<std::size_t>(ldy) + static_cast<std::size_t>(o - y_col0)] =
          Dot(x + static_cast<std::size_t>(t) * sx, wr, in);
  }
}

}  // namespace

void MatmulRowsRange(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y, int ldy) {
  InvariantBlock(x, n_rows, w, o_begin, o_end, y, ldy, o_begin);
}

void Matmul(MatmulKind kind, const float* x, int n_rows, const Mat& w, float* y, ThreadPool* pool, int ldy) {
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
    Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y + ob, n_rows, oe - ob, Eigen::OuterStride<>(ldy));
    Y.noalias() = X * W.transpose();
  };
  if (pool) {
    pool->ParallelFor(static_cast<std::size_t>(w.rows), body, 64);
  } else {
    body(0, static_cast<std::size_t>(w.rows));
  }
}

}  // namespace lockstep::cpu
