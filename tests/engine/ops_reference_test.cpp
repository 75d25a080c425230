// Every CPU op, and the whole tiny model with its MTP module, against naive double-precision
// references written from MODEL.md (sections 3 and 4), on random non-zero inputs.
//
// The references share nothing with the engine but the document: they index tensors exactly as
// MODEL.md describes them (q/gate interleaved per head in q_proj, in_proj_qkvz / in_proj_ba
// grouped per key head, conv window oldest first, S as [Dk, Dv], GQA head h -> h / (Hq/Hkv),
// fc input = [normed embedding ; normed hidden]), and the whole-model reference reads the
// checkpoint tensors by their safetensors names (not through the loader's views). A layout
// mistake in a kernel or in the loader therefore shows up as a large error, not a silent match.
// Shapes are chosen so that swapped dimensions cannot alias: Dk != Dv, Hq/Hkv = 3 (so h / G and
// h % Hkv differ), widths that are not multiples of 16 (Dot's lane count), R < D.
//
// Metrics: per-tensor NRMSE (compare/'s definition, reference rounded to f32) and a per-element
// bound |got - ref| <= atol * rms(ref) + rtol * |ref| (atol is relative to the tensor's RMS so that
// elements near zero after cancellation are judged at the tensor's own scale). Every check prints
// its measured NRMSE on a "[ nrmse    ]" line so the limits can be re-measured.
//
// Tolerances (the Tol constants below): f32 engine vs f64 reference. Measured on x86-64
// (AVX2, g++ 12, -O2 -march=native -ffp-contract=off, serial and 2 threads); each limit is about
// 10x the largest value measured over that constant's cases (quoted at each constant), for the
// NRMSE and for the per-element bound alike.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/attention.h"
#include "cpu/gdn.h"
#include "cpu/matmul.h"
#include "cpu/moe.h"
#include "cpu/norm.h"
#include "cpu/rope.h"
#include "engine/reference_model.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/gdn_state.h"
#include "lockstep/engine/kv_cache.h"
#include "lockstep/engine/safetensors.h"
#include "lockstep/engine/thread_pool.h"
#include "test_util.h"
#include "util/arena.h"

namespace lockstep::cpu {
namespace {

using Vec = std::vector<double>;
using FVec = std::vector<float>;

inline std::size_t Z(int x) { return static_cast<std::size_t>(x); }

// ---- tolerances ----

struct Tol {
  double nrmse;  // per-tensor NRMSE limit
  double atol;   // per-element absolute bound, in units of rms(reference)
  double rtol;   // per-element relative bound
};

// Single reductions (Dot, Matmul, norms, RoPE, routing, conv): f32 rounding of one sum of up to
// ~2000 products. Measured max NRMSE 3.3e-7 (Matmul gemm, in = 1031; RouteToken E = 512),
// max |err| / rms 1.0e-6.
constexpr Tol kTolReduce{3e-6, 1e-5, 1e-5};
// Scalar activations (sigmoid, silu, softplus): relative bound only (atol 1e-12 * rms absorbs
// sigmoid(-30) ~ 1e-13). Measured max NRMSE 2.8e-8, max relative error below 2e-7 (~3 ulp).
constexpr Tol kTolElementwise{3e-7, 1e-12, 2e-6};
// Composite ops (attention, one GDN step or verify window, SwiGLU, MoE): a few chained f32
// reductions. Measured max NRMSE 2.9e-7 (AttentionForward, GdnForward verify),
// max |err| / rms 1.9e-6.
constexpr Tol kTolOp{3e-6, 2e-5, 2e-5};
// Whole layers in prefill form and the whole model / MTP. MODEL.md 3.10 expects <~1e-5 on logits.
// Measured max NRMSE 4.0e-7 (tiny model, chunked prefill + verify), max |err| / rms 2.1e-6.
constexpr Tol kTolDeep{4e-6, 2e-5, 2e-5};
// The chunked delta rule alone vs the f64 recurrence. Forward substitution for (I + A)^-1 loses
// accuracy when a chunk holds more rows than the key dimension (keys linearly dependent, here
// Dk = 16 with 64-row chunks): measured max NRMSE 2.8e-6 (S after T = 65, chunk 64), max
// |err| / rms 1.3e-5; with Dk = 128 (as in the 80B model) it stays below 9e-7.
constexpr Tol kTolChunk{3e-5, 1e-4, 1e-4};
// bf16 K/V cache vs the f32 reference: bf16 keeps 8 significant bits (relative step 2^-8), so
// K and V each carry ~1e-3 relative error. Measured max NRMSE 1.9e-3, max |err| / rms 8.3e-3.
constexpr Tol kTolKvBf16{2e-2, 8e-2, 8e-2};
// int8 K/V cache (per-row-per-head scale max|x|/127): ~0.4% of the row max per element.
// Measured max NRMSE 5.8e-3, max |err| / rms 1.9e-2.
constexpr Tol kTolKvInt8{5e-2, 2e-1, 2e-1};

// ---- helpers ----

FVec ToF(const Vec& v) {
  FVec o(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) o[i] = static_cast<float>(v[i]);
  return o;
}
Vec ToD(const float* p, std::size_t n) {
  Vec o(n);
  for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<double>(p[i]);
  return o;
}
Vec ToD(const FVec& v) { return ToD(v.data(), v.size()); }

FVec Rand(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return test::Random(n, seed, lo, hi);
}
// A weight [rows, cols] with unit-variance outputs for unit-variance inputs (times `gain`).
FVec RandW(int rows, int cols, std::uint64_t seed, float gain = 1.0f) {
  const float a = gain * std::sqrt(3.0f / static_cast<float>(cols));
  return Rand(Z(rows) * Z(cols), seed, -a, a);
}
// Small integers in {-3, ..., 3} (as floats) for the exact-arithmetic checks.
FVec RandInt(std::size_t n, std::uint64_t seed) {
  FVec v = test::Random(n, seed, 0.0f, 7.0f);
  for (float& x : v) x = std::min(std::floor(x), 6.0f) - 3.0f;
  return v;
}
Mat MatOf(const FVec& v, int rows, int cols) {
  Mat m;
  m.data = v.data();
  m.rows = rows;
  m.cols = cols;
  return m;
}

// Output buffers get kGuard sentinel floats after their end (STYLE 24): a kernel that writes past
// its output is caught even when the overrun lands in memory nobody reads.
constexpr std::size_t kGuard = 16;
constexpr float kSentinel = -1.2345e30f;
FVec Guarded(std::size_t n) { return FVec(n + kGuard, kSentinel); }
// Checks that the sentinels after the first n floats survived, then drops them.
void ExpectGuardAndTrim(FVec& v, std::size_t n, const std::string& what) {
  bool intact = v.size() == n + kGuard;
  for (std::size_t i = n; intact && i < v.size(); ++i) intact = v[i] == kSentinel;
  EXPECT_TRUE(intact) << what << ": wrote past the end of its output";
  v.resize(n);
}

// Compares `got` with `ref` (NRMSE and per-element bound), prints the measured NRMSE.
double Check(const std::string& what, const Vec& ref, const float* got, std::size_t n, Tol tol) {
  EXPECT_EQ(ref.size(), n) << what;
  if (ref.size() != n || n == 0) return std::numeric_limits<double>::infinity();
  FVec g(got, got + n);
  double ss = 0.0;
  for (double r : ref) ss += r * r;
  const double rms = std::sqrt(ss / static_cast<double>(n));
  EXPECT_GT(rms, 0.0) << what << ": the reference is all zeros (inputs must never be)";
  std::size_t n_bad = 0, first_bad = 0, n_nonfinite = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(g[i])) ++n_nonfinite;
    const double err = std::fabs(static_cast<double>(g[i]) - ref[i]);
    const double bound = tol.atol * rms + tol.rtol * std::fabs(ref[i]);
    if (!(err <= bound)) {
      if (n_bad++ == 0) first_bad = i;
    }
    worst = std::max(worst, err / (rms > 0 ? rms : 1.0));
  }
  const double e = test::Nrmse(ToF(ref), g);
  std::printf("[ nrmse    ] %-56s %.2e  (limit %.0e; max|err|/rms %.1e)\n", what.c_str(), e,
              tol.nrmse, worst);
  EXPECT_EQ(n_nonfinite, 0u) << what << ": NaN or Inf in the output";
  EXPECT_LT(e, tol.nrmse) << what;
  EXPECT_EQ(n_bad, 0u) << what << ": " << n_bad << " of " << n
                       << " elements outside atol*rms + rtol*|ref|; first at index " << first_bad
                       << ": got " << g[first_bad] << ", ref " << ref[first_bad] << " (rms " << rms
                       << ")";
  return e;
}
double Check(const std::string& what, const Vec& ref, const FVec& got, Tol tol) {
  return Check(what, ref, got.data(), got.size(), tol);
}

using ref::RefModel;
using ref::RefTensorsOf;

// =================================================================================================
// Matrix products
// =================================================================================================

TEST(OpReference, Dot) {
  const int sizes[] = {1, 7, 15, 16, 17, 33, 64, 100, 1000, 2049};
  std::uint64_t seed = 100;
  Vec ref_all;
  FVec got_all;
  for (int n : sizes) {
    FVec a = Rand(Z(n), seed++), b = Rand(Z(n), seed++, -2.0f, 3.0f);
    ref_all.push_back(ref::Dot(ToD(a).data(), ToD(b).data(), n));
    got_all.push_back(Dot(a.data(), b.data(), n));
    // Small integers: every partial sum is an exact f32 integer, so the result is exact.
    FVec ia = RandInt(Z(n), seed++), ib = RandInt(Z(n), seed++);
    double exact = ref::Dot(ToD(ia).data(), ToD(ib).data(), n);
    EXPECT_EQ(static_cast<double>(Dot(ia.data(), ib.data(), n)), exact) << "n=" << n;
  }
  EXPECT_EQ(Dot(nullptr, nullptr, 0), 0.0f);
  Check("Dot n in 1..2049", ref_all, got_all, kTolReduce);
}

// Matmul: both kinds, with and without a pool, against y = x W^T in f64; then the exact check.
TEST(OpReference, Matmul) {
  ThreadPool pool(2);
  struct Shape {
    int rows, out, in;
  };
  const Shape shapes[] = {{1, 5, 7}, {3, 33, 64}, {17, 64, 130}, {4, 300, 48}, {2, 9, 1031}};
  std::uint64_t seed = 200;
  for (const Shape& s : shapes) {
    FVec x = Rand(Z(s.rows) * Z(s.in), seed++), wv = Rand(Z(s.out) * Z(s.in), seed++, -0.5f, 1.0f);
    Vec xd = ToD(x), wd = ToD(wv);
    Vec y_ref(Z(s.rows) * Z(s.out));
    for (int t = 0; t < s.rows; ++t) {
      Vec y = ref::Linear(xd.data() + Z(t) * Z(s.in), wd, s.out, s.in);
      std::copy(y.begin(), y.end(), y_ref.begin() + static_cast<std::ptrdiff_t>(t * s.out));
    }
    const Mat w = MatOf(wv, s.out, s.in);
    for (MatmulKind kind : {MatmulKind::kInvariant, MatmulKind::kGemm}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        // ldy > out with sentinels in the gap: nothing may be written outside [0, out).
        const int ldy = s.out + 3;
        FVec y(Z(s.rows) * Z(ldy), 12345.0f);
        Matmul(kind, x.data(), s.rows, w, y.data(), p, ldy);
        FVec yc(Z(s.rows) * Z(s.out));
        for (int t = 0; t < s.rows; ++t)
          for (int o = 0; o < ldy; ++o) {
            const float v = y[Z(t) * Z(ldy) + Z(o)];
            if (o < s.out) {
              yc[Z(t) * Z(s.out) + Z(o)] = v;
            } else {
              EXPECT_EQ(v, 12345.0f) << "write outside the row at t=" << t << " o=" << o;
            }
          }
        Check("Matmul " + std::string(kind == MatmulKind::kGemm ? "gemm" : "inv") +
                  (p ? " pool2" : " serial") + " [" + std::to_string(s.rows) + "x" +
                  std::to_string(s.in) + "]x[" + std::to_string(s.out) + "]^T",
              y_ref, yc, kTolReduce);
      }
    }
    // MatmulRowsRange over a middle slice of W's rows.
    const int ob = s.out / 3, oe = s.out - s.out / 4;
    if (oe > ob) {
      const int ldy = oe - ob + 2;
      FVec y(Z(s.rows) * Z(ldy), -777.0f);
      MatmulRowsRange(MatmulKind::kInvariant, x.data(), s.rows, w, ob, oe, y.data(), ldy);
      Vec r;
      FVec g;
      for (int t = 0; t < s.rows; ++t)
        for (int o = 0; o < ldy; ++o) {
          const float v = y[Z(t) * Z(ldy) + Z(o)];
          if (o < oe - ob) {
            r.push_back(y_ref[Z(t) * Z(s.out) + Z(ob + o)]);
            g.push_back(v);
          } else {
            EXPECT_EQ(v, -777.0f) << "MatmulRowsRange wrote past its range at t=" << t
                                  << " o=" << o;
          }
        }
      Check("MatmulRowsRange [" + std::to_string(ob) + "," + std::to_string(oe) + ") of " +
                std::to_string(s.out),
            r, g, kTolReduce);
    }
  }
}

// Small-integer inputs: every product and partial sum is an exact integer below 2^24, so both
// kinds (any blocking, any order) must equal the integer reference bitwise.
TEST(OpReference, MatmulSmallIntegersExact) {
  ThreadPool pool(2);
  struct Shape {
    int rows, out, in;
  };
  const Shape shapes[] = {{1, 5, 7}, {3, 33, 64}, {17, 70, 130}, {5, 16, 1031}};
  std::uint64_t seed = 300;
  for (const Shape& s : shapes) {
    FVec x = RandInt(Z(s.rows) * Z(s.in), seed++), wv = RandInt(Z(s.out) * Z(s.in), seed++);
    FVec exact(Z(s.rows) * Z(s.out));
    bool any_nonzero = false;
    for (int t = 0; t < s.rows; ++t)
      for (int o = 0; o < s.out; ++o) {
        std::int64_t acc = 0;
        for (int i = 0; i < s.in; ++i)
          acc += static_cast<std::int64_t>(x[Z(t) * Z(s.in) + Z(i)]) *
                 static_cast<std::int64_t>(wv[Z(o) * Z(s.in) + Z(i)]);
        exact[Z(t) * Z(s.out) + Z(o)] = static_cast<float>(acc);
        any_nonzero = any_nonzero || acc != 0;
      }
    ASSERT_TRUE(any_nonzero);
    const Mat w = MatOf(wv, s.out, s.in);
    for (MatmulKind kind : {MatmulKind::kInvariant, MatmulKind::kGemm}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        FVec y(exact.size(), 0.5f);
        Matmul(kind, x.data(), s.rows, w, y.data(), p);
        EXPECT_TRUE(test::BitwiseEqual(exact, y))
            << (kind == MatmulKind::kGemm ? "gemm" : "invariant") << " rows=" << s.rows
            << " out=" << s.out << " in=" << s.in;
      }
    }
    FVec y(exact.size(), 0.5f);
    MatmulRowsRange(MatmulKind::kInvariant, x.data(), s.rows, w, 0, s.out, y.data(), s.out);
    EXPECT_TRUE(test::BitwiseEqual(exact, y)) << "MatmulRowsRange";
  }
}

// =================================================================================================
// Norms and activations
// =================================================================================================

// Inputs at several scales: at 1e-4 the mean of squares (~3e-9) is far below eps = 1e-6, so eps
// dominates and "eps on the mean" vs "eps on the sum" differ by a factor n.
const float kScales[] = {1e-4f, 1e-2f, 1.0f, 30.0f};

TEST(OpReference, RmsNormZc) {
  const float eps = 1e-6f;
  std::uint64_t seed = 400;
  for (int n : {1, 16, 32, 100, 2048}) {
    for (float scale : kScales) {
      FVec x = Rand(Z(n), seed++, -scale, scale), w = Rand(Z(n), seed++, -0.5f, 0.5f);
      Vec ref = ref::RmsNormZc(ToD(x).data(), n, ToD(w).data(), static_cast<double>(eps));
      FVec y = Guarded(Z(n));
      RmsNormZc(x.data(), n, w.data(), eps, y.data());
      ExpectGuardAndTrim(y, Z(n), "RmsNormZc");
      Check("RmsNormZc n=" + std::to_string(n) + " scale=" + std::to_string(scale), ref, y,
            kTolReduce);
      RmsNormZc(x.data(), n, w.data(), eps, x.data());  // documented: x and y may alias
      EXPECT_TRUE(test::BitwiseEqual(x, y)) << "aliased call differs, n=" << n;
    }
  }
}

TEST(OpReference, GatedRmsNorm) {
  const float eps = 1e-6f;
  std::uint64_t seed = 500;
  for (int n : {1, 16, 24, 128}) {
    for (float scale : kScales) {
      FVec x = Rand(Z(n), seed++, -scale, scale), z = Rand(Z(n), seed++, -4.0f, 4.0f);
      FVec w = Rand(Z(n), seed++, 0.5f, 1.5f);
      Vec ref = ref::GatedRmsNorm(ToD(x).data(), ToD(z).data(), n, ToD(w).data(),
                                  static_cast<double>(eps));
      FVec y = Guarded(Z(n));
      GatedRmsNorm(x.data(), z.data(), n, w.data(), eps, y.data());
      ExpectGuardAndTrim(y, Z(n), "GatedRmsNorm");
      Check("GatedRmsNorm n=" + std::to_string(n) + " scale=" + std::to_string(scale), ref, y,
            kTolReduce);
    }
  }
}

TEST(OpReference, L2NormInPlace) {
  std::uint64_t seed = 600;
  for (int n : {1, 16, 24, 128}) {
    for (float scale : kScales) {
      FVec x = Rand(Z(n), seed++, -scale, scale);
      Vec ref = ref::L2Norm(ToD(x).data(), n);
      L2NormInPlace(x.data(), n, 1e-6f);
      Check("L2NormInPlace n=" + std::to_string(n) + " scale=" + std::to_string(scale), ref, x,
            kTolReduce);
    }
  }
}

TEST(OpReference, Activations) {
  // A grid over [-30, 30] that includes 0, +-20 and its neighbours (the softplus threshold).
  FVec xs = Rand(400, 700, -30.0f, 30.0f);
  for (float v : {0.0f, 20.0f, -20.0f, std::nextafter(20.0f, 30.0f), std::nextafter(20.0f, 0.0f),
                  19.5f, 20.5f, 1e-3f, -1e-3f})
    xs.push_back(v);
  Vec r_sig, r_silu, r_sp;
  FVec g_sig, g_silu, g_sp;
  for (float x : xs) {
    const double xd = static_cast<double>(x);
    r_sig.push_back(ref::Sigmoid(xd));
    g_sig.push_back(Sigmoid(x));
    r_silu.push_back(ref::Silu(xd));
    g_silu.push_back(Silu(x));
    r_sp.push_back(ref::Softplus(xd));
    g_sp.push_back(Softplus(x));
  }
  Check("Sigmoid [-30,30]", r_sig, g_sig, kTolElementwise);
  Check("Silu [-30,30]", r_silu, g_silu, kTolElementwise);
  Check("Softplus [-30,30]", r_sp, g_sp, kTolElementwise);
  // Above the threshold softplus is the identity, exactly; below it log1p(exp(x)). Where exp(x)
  // overflows f32 (x > 88.7) only the threshold keeps the result finite.
  for (float x : {20.001f, 25.0f, 88.0f, 100.0f, 1000.0f, 3e38f}) EXPECT_EQ(Softplus(x), x) << x;
  EXPECT_EQ(Softplus(-200.0f), 0.0f);  // exp underflows: log1p(0) = 0
  EXPECT_NEAR(static_cast<double>(Softplus(0.0f)), std::log(2.0), 1e-7);
  // Saturation: no NaN at the extremes.
  EXPECT_EQ(Sigmoid(-1000.0f), 0.0f);
  EXPECT_EQ(Sigmoid(1000.0f), 1.0f);
  EXPECT_EQ(Silu(1000.0f), 1000.0f);
  EXPECT_EQ(Silu(-1000.0f), 0.0f);
}

// =================================================================================================
// RoPE
// =================================================================================================

TEST(OpReference, Rope) {
  struct Case {
    int D, R;
    double theta;
  };
  const Case cases[] = {{32, 8, 1e7}, {32, 8, 1e4}, {256, 64, 1e7}, {256, 64, 1e4}, {24, 24, 1e4}};
  const int n_heads = 3;
  std::uint64_t seed = 800;
  for (const Case& cs : cases) {
    Rope rope(cs.R, cs.theta);
    EXPECT_EQ(rope.rotary_dim(), cs.R);
    for (int pos : {0, 1, 7, 1000, 100000}) {
      FVec x = Rand(Z(n_heads) * Z(cs.D), seed++);
      FVec y = x;
      rope.Apply(y.data(), n_heads, cs.D, pos);
      const std::string tag = "D=" + std::to_string(cs.D) + " R=" + std::to_string(cs.R) +
                              " theta=" + std::to_string(static_cast<int>(cs.theta)) +
                              " p=" + std::to_string(pos);
      // MODEL.md's angle computation (f32 inv_freq and angle, as HF), f64 trig and rotation.
      Vec r = ToD(x);
      ref::Rope(r.data(), n_heads, cs.D, cs.R, cs.theta, pos, true);
      Check("Rope (HF f32 angles) " + tag, r, y, kTolReduce);
      // Pure f64 angles: the f32 angle error grows with p (half an ulp of p * inv_freq, ~4e-3 rad
      // at p = 1e5), so this independent check of the convention runs at p <= 1000 only; there
      // the angle error is <~1e-4 rad (measured max NRMSE 7.1e-6, max |err| / rms 3.2e-5).
      if (pos <= 1000) {
        Vec r64 = ToD(x);
        ref::Rope(r64.data(), n_heads, cs.D, cs.R, cs.theta, pos, false);
        Check("Rope (f64 angles) " + tag, r64, y, {1e-4, 3e-4, 0.0});
      }
      // Dims [R, D) pass through bitwise; position 0 is the identity bitwise.
      for (int h = 0; h < n_heads; ++h)
        for (int i = cs.R; i < cs.D; ++i) {
          const std::size_t at = Z(h) * Z(cs.D) + Z(i);
          EXPECT_EQ(y[at], x[at]) << tag << " pass-through dim " << i << " head " << h;
        }
      if (pos == 0) {
        EXPECT_TRUE(test::BitwiseEqual(x, y)) << tag;
      }
    }
  }
}

// =================================================================================================
// Attention
// =================================================================================================

TEST(OpReference, AttendGroup) {
  const int D = 40, n_rows = 11, G = 3;
  KvCache cache(2, D, DType::kF32, 4);
  FVec k = Rand(Z(n_rows) * 2 * Z(D), 900, -2.0f, 2.0f), v = Rand(Z(n_rows) * 2 * Z(D), 901);
  cache.Write(0, n_rows, k.data(), v.data());
  cache.Commit(n_rows);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int kv_head : {0, 1}) {
    for (int n_ctx : {1, 7, n_rows}) {  // n_ctx < rows: rows >= n_ctx must be ignored
      FVec q = Rand(Z(G) * Z(D), 910 + Z(n_ctx) + Z(kv_head) * 100, -2.0f, 2.0f);
      FVec o = Guarded(Z(G) * Z(D)), scores = Guarded(Z(G) * Z(n_ctx)), tmp = Guarded(2 * Z(D));
      AttendGroup(q.data(), G, kv_head, cache, n_ctx, scale, o.data(), scores.data(), tmp.data());
      ExpectGuardAndTrim(o, Z(G) * Z(D), "AttendGroup o");
      ExpectGuardAndTrim(scores, Z(G) * Z(n_ctx), "AttendGroup scores");
      ExpectGuardAndTrim(tmp, 2 * Z(D), "AttendGroup tmp");
      Vec ref(Z(G) * Z(D), 0.0);
      for (int g = 0; g < G; ++g) {
        Vec sc(Z(n_ctx));
        double mx = -1e300, sum = 0.0;
        for (int u = 0; u < n_ctx; ++u) {
          double s = 0.0;
          for (int i = 0; i < D; ++i)
            s += static_cast<double>(q[Z(g) * Z(D) + Z(i)]) *
                 static_cast<double>(k[(Z(u) * 2 + Z(kv_head)) * Z(D) + Z(i)]);
          sc[Z(u)] = s * static_cast<double>(scale);
          mx = std::max(mx, sc[Z(u)]);
        }
        for (double& s : sc) sum += (s = std::exp(s - mx));
        for (int u = 0; u < n_ctx; ++u)
          for (int i = 0; i < D; ++i)
            ref[Z(g) * Z(D) + Z(i)] +=
                sc[Z(u)] / sum * static_cast<double>(v[(Z(u) * 2 + Z(kv_head)) * Z(D) + Z(i)]);
      }
      Check("AttendGroup kv_head=" + std::to_string(kv_head) + " n_ctx=" + std::to_string(n_ctx),
            ref, o, kTolOp);
    }
  }
}

// A small attention layer with its own random weights (not the tiny model's): Hq = 6, Hkv = 2
// (G = 3, so h / G and h % Hkv differ), D = 32 with R = 8, H = 40.
struct AttnCase {
  ModelConfig c;
  FVec q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  AttentionWeights w;
  ref::AttnW rw;
  explicit AttnCase(std::uint64_t seed) {
    c.n_embd = 40;
    c.n_heads = 6;
    c.n_heads_kv = 2;
    c.head_dim = 32;
    c.rotary_dim = 8;
    c.rope_theta = 1e7;
    c.rms_norm_eps = 1e-6f;
    const int H = c.n_embd, Hq = c.n_heads, Hkv = c.n_heads_kv, D = c.head_dim;
    q_proj = RandW(2 * Hq * D, H, seed + 1);
    k_proj = RandW(Hkv * D, H, seed + 2);
    v_proj = RandW(Hkv * D, H, seed + 3);
    o_proj = RandW(H, Hq * D, seed + 4, 0.5f);
    q_norm = Rand(Z(D), seed + 5, -0.3f, 0.3f);
    k_norm = Rand(Z(D), seed + 6, -0.3f, 0.3f);
    w.q_proj = MatOf(q_proj, 2 * Hq * D, H);
    w.k_proj = MatOf(k_proj, Hkv * D, H);
    w.v_proj = MatOf(v_proj, Hkv * D, H);
    w.o_proj = MatOf(o_proj, H, Hq * D);
    w.q_norm = q_norm.data();
    w.k_norm = k_norm.data();
    rw = {ToD(q_proj), ToD(k_proj), ToD(v_proj), ToD(o_proj), ToD(q_norm), ToD(k_norm)};
  }
};

// The whole mixer: p = 5 committed rows already in the cache (page size 3, so the window crosses
// pages), then T = 3 new rows; f32 cache against the reference tightly, bf16 and int8 loosely.
TEST(OpReference, AttentionForward) {
  AttnCase ac(1000);
  const ModelConfig& c = ac.c;
  const int H = c.n_embd, Hkv = c.n_heads_kv, D = c.head_dim, p = 5, T = 3;
  const std::size_t row = Z(Hkv) * Z(D);
  FVec prior_k = Rand(Z(p) * row, 1010, -1.5f, 1.5f), prior_v = Rand(Z(p) * row, 1011);
  FVec a = Rand(Z(T) * Z(H), 1012, -1.5f, 1.5f);
  // Reference: prior rows as given, then the window.
  ref::KvRef kv_ref;
  for (int u = 0; u < p; ++u) {
    kv_ref.k.push_back(ToD(prior_k.data() + Z(u) * row, row));
    kv_ref.v.push_back(ToD(prior_v.data() + Z(u) * row, row));
  }
  Vec out_ref = ref::Attention(ac.rw, c, ToD(a).data(), T, p, kv_ref);

  ThreadPool pool(2);
  Rope rope(c.rotary_dim, c.rope_theta);
  struct Run {
    DType dt;
    Tol tol;
  };
  for (const Run& run :
       {Run{DType::kF32, kTolOp}, Run{DType::kBF16, kTolKvBf16}, Run{DType::kI8, kTolKvInt8}}) {
    for (MatmulKind kind : {MatmulKind::kInvariant, MatmulKind::kGemm}) {
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
        KvCache cache(Hkv, D, run.dt, 3);
        cache.Write(0, p, prior_k.data(), prior_v.data());
        cache.Commit(p);
        Arena arena;
        FVec out = Guarded(Z(T) * Z(H));
        AttentionForward(ac.w, c, rope, a.data(), T, p, cache, kind, tp, arena, out.data());
        ExpectGuardAndTrim(out, Z(T) * Z(H), "AttentionForward");
        const std::string tag = std::string("kv=") + std::string(dtype_name(run.dt)) +
                                (kind == MatmulKind::kGemm ? " gemm" : " inv") +
                                (tp ? " pool2" : " serial");
        Check("AttentionForward out " + tag, out_ref, out, run.tol);
        // The window's K/V rows: speculative, after k_norm + RoPE (K) / raw (V).
        EXPECT_EQ(cache.rows_committed(), p);
        EXPECT_EQ(cache.rows_written(), p + T);
        Vec kr, vr;
        FVec kg, vg;
        FVec tmp(Z(D));
        for (int u = p; u < p + T; ++u)
          for (int j = 0; j < Hkv; ++j) {
            const float* kp = cache.K(u, j, tmp.data());
            kg.insert(kg.end(), kp, kp + D);
            const float* vp = cache.V(u, j, tmp.data());
            vg.insert(vg.end(), vp, vp + D);
            kr.insert(kr.end(), kv_ref.k[Z(u)].begin() + j * D,
                      kv_ref.k[Z(u)].begin() + (j + 1) * D);
            vr.insert(vr.end(), kv_ref.v[Z(u)].begin() + j * D,
                      kv_ref.v[Z(u)].begin() + (j + 1) * D);
          }
        Check("AttentionForward cached K " + tag, kr, kg, run.tol);
        Check("AttentionForward cached V " + tag, vr, vg, run.tol);
        // Committed rows are untouched.
        if (run.dt == DType::kF32) {
          for (int u = 0; u < p; ++u)
            for (int j = 0; j < Hkv; ++j)
              EXPECT_EQ(std::memcmp(cache.K(u, j, tmp.data()),
                                    prior_k.data() + Z(u) * row + Z(j) * Z(D), Z(D) * 4),
                        0);
        }
      }
    }
  }
}

// =================================================================================================
// Gated DeltaNet
// =================================================================================================

TEST(OpReference, GatedDeltaStep) {
  std::uint64_t seed = 1100;
  for (auto [dk, dv] : {std::pair{16, 24}, std::pair{32, 8}, std::pair{128, 128}}) {
    const std::size_t ns = Z(dk) * Z(dv);
    FVec S = Rand(ns, seed++, -0.5f, 0.5f);
    Vec Sr = ToD(S);
    Vec o_ref;
    FVec o_got;
    for (int step = 0; step < 8; ++step) {
      FVec q = Rand(Z(dk), seed++), k = Rand(Z(dk), seed++), v = Rand(Z(dv), seed++, -2.0f, 2.0f);
      // k unit-norm as in the model (keeps ||I - beta k k^T|| <= 1).
      Vec kd = ref::L2Norm(ToD(k).data(), dk);
      k = ToF(kd);
      kd = ToD(k);
      const float alpha = Rand(1, seed++, 0.3f, 1.0f)[0], beta = Rand(1, seed++, 0.05f, 1.0f)[0];
      FVec o(Z(dv));
      GatedDeltaStep(S.data(), q.data(), k.data(), v.data(), alpha, beta, dk, dv, o.data());
      Vec orf = ref::DeltaStep(Sr.data(), ToD(q).data(), kd.data(), ToD(v).data(),
                               static_cast<double>(alpha), static_cast<double>(beta), dk, dv);
      o_ref.insert(o_ref.end(), orf.begin(), orf.end());
      o_got.insert(o_got.end(), o.begin(), o.end());
    }
    const std::string tag = "dk=" + std::to_string(dk) + " dv=" + std::to_string(dv);
    Check("GatedDeltaStep o (8 steps) " + tag, o_ref, o_got, kTolOp);
    Check("GatedDeltaStep S (8 steps) " + tag, Sr, S, kTolOp);
  }
}

// Inputs for the delta rule as the layer makes them: l2-normalised q (times Dk^-1/2) and k,
// beta = sigmoid(.), g = -A * softplus(.) spread over fast and slow decays.
struct DeltaInputs {
  FVec Q, K, V, g, beta;
};
DeltaInputs MakeDeltaInputs(int T, int dk, int dv, std::uint64_t seed) {
  DeltaInputs in;
  in.Q = Rand(Z(T) * Z(dk), seed + 1);
  in.K = Rand(Z(T) * Z(dk), seed + 2);
  in.V = Rand(Z(T) * Z(dv), seed + 3, -2.0f, 2.0f);
  for (int t = 0; t < T; ++t) {
    Vec q = ref::L2Norm(ToD(in.Q.data() + Z(t) * Z(dk), Z(dk)).data(), dk);
    Vec k = ref::L2Norm(ToD(in.K.data() + Z(t) * Z(dk), Z(dk)).data(), dk);
    for (int i = 0; i < dk; ++i) {
      in.Q[Z(t) * Z(dk) + Z(i)] = static_cast<float>(q[Z(i)] / std::sqrt(static_cast<double>(dk)));
      in.K[Z(t) * Z(dk) + Z(i)] = static_cast<float>(k[Z(i)]);
    }
  }
  FVec bl = Rand(Z(T), seed + 4, -3.0f, 3.0f), al = Rand(Z(T), seed + 5, -3.0f, 3.0f);
  for (int t = 0; t < T; ++t) {
    in.beta.push_back(static_cast<float>(ref::Sigmoid(static_cast<double>(bl[Z(t)]))));
    const double A = 1.0 + 3.0 * static_cast<double>(t % 3);  // decay rates 1, 4, 7
    in.g.push_back(static_cast<float>(-A * ref::Softplus(static_cast<double>(al[Z(t)]) - 2.0)));
  }
  return in;
}

TEST(OpReference, GatedDeltaChunked) {
  std::uint64_t seed = 1200;
  // Dk != Dv: a transposed state cannot pass. Dk = 16 < chunk is the ill-conditioned case.
  for (auto [dk, dv, T] : {std::tuple{16, 24, 1}, std::tuple{16, 24, 5}, std::tuple{16, 24, 63},
                           std::tuple{16, 24, 64}, std::tuple{16, 24, 65}, std::tuple{16, 24, 130},
                           std::tuple{128, 64, 65}, std::tuple{128, 64, 130}}) {
    const std::size_t ns = Z(dk) * Z(dv);
    DeltaInputs in = MakeDeltaInputs(T, dk, dv, seed);
    seed += 10;
    FVec S0 = Rand(ns, seed++, -0.5f, 0.5f);
    // Reference: the recurrence (MODEL.md 3.6 step 7), token by token, in f64.
    Vec Sr = ToD(S0), O_ref;
    for (int t = 0; t < T; ++t) {
      Vec o = ref::DeltaStep(Sr.data(), ToD(in.Q.data() + Z(t) * Z(dk), Z(dk)).data(),
                             ToD(in.K.data() + Z(t) * Z(dk), Z(dk)).data(),
                             ToD(in.V.data() + Z(t) * Z(dv), Z(dv)).data(),
                             std::exp(static_cast<double>(in.g[Z(t)])),
                             static_cast<double>(in.beta[Z(t)]), dk, dv);
      O_ref.insert(O_ref.end(), o.begin(), o.end());
    }
    for (int chunk : {64, 16}) {
      FVec S = Guarded(ns), O = Guarded(Z(T) * Z(dv));
      std::copy(S0.begin(), S0.end(), S.begin());
      GatedDeltaChunked(S.data(), in.Q.data(), in.K.data(), in.V.data(), in.g.data(),
                        in.beta.data(), T, dk, dv, O.data(), chunk);
      ExpectGuardAndTrim(S, ns, "GatedDeltaChunked S");
      ExpectGuardAndTrim(O, Z(T) * Z(dv), "GatedDeltaChunked O");
      const std::string tag = "dk=" + std::to_string(dk) + " dv=" + std::to_string(dv) +
                              " T=" + std::to_string(T) + " chunk=" + std::to_string(chunk);
      Check("GatedDeltaChunked O " + tag, O_ref, O, kTolChunk);
      Check("GatedDeltaChunked S " + tag, Sr, S, kTolChunk);
    }
  }
}

TEST(OpReference, CausalConvSilu) {
  const int C = 10, K = 4;
  std::uint64_t seed = 1300;
  for (int T : {1, 2, 5}) {
    FVec win = Rand(Z(K - 1 + T) * Z(C), seed++, -2.0f, 2.0f), wt = Rand(Z(C) * Z(K), seed++);
    FVec U = Guarded(Z(T) * Z(C));
    CausalConvSilu(win.data(), T, C, K, wt.data(), U.data());
    ExpectGuardAndTrim(U, Z(T) * Z(C), "CausalConvSilu");
    // U[t, ch] = silu(sum_j c[ch][j] * X[t - (K-1) + j, ch]); window row (K-1) + t is X[t].
    Vec ref(Z(T) * Z(C));
    for (int t = 0; t < T; ++t)
      for (int ch = 0; ch < C; ++ch) {
        double s = 0.0;
        for (int j = 0; j < K; ++j)
          s += static_cast<double>(wt[Z(ch) * Z(K) + Z(j)]) *
               static_cast<double>(win[Z(t + j) * Z(C) + Z(ch)]);
        ref[Z(t) * Z(C) + Z(ch)] = ref::Silu(s);
      }
    Check("CausalConvSilu T=" + std::to_string(T), ref, U, kTolReduce);
  }
}

// The channels split over a pool (a decode step's conv runs that way) give the serial bits.
TEST(OpReference, CausalConvSiluOverAPoolIsBitwiseTheSerialForm) {
  const int C = 8192 + 37, K = 4;  // Qwen3-Next's conv width and a ragged split
  std::uint64_t seed = 1400;
  for (int T : {1, 3}) {
    FVec win = Rand(Z(K - 1 + T) * Z(C), seed++, -2.0f, 2.0f), wt = Rand(Z(C) * Z(K), seed++);
    FVec serial(Z(T) * Z(C)), pooled(Z(T) * Z(C), -1.0f);
    CausalConvSilu(win.data(), T, C, K, wt.data(), serial.data());
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      CausalConvSilu(win.data(), T, C, K, wt.data(), pooled.data(), &pool);
      EXPECT_EQ(0, std::memcmp(serial.data(), pooled.data(), serial.size() * sizeof(float)))
          << "T=" << T << " threads=" << threads;
    }
  }
}

// A small GDN layer with its own random weights: H = 40, Hk = 2, Hv = 4 (r = 2), Dk = 16, Dv = 8
// (so q/k/v/z widths all differ), K = 4.
struct GdnCase {
  ModelConfig c;
  FVec qkvz, ba, conv, dt_bias, a_log, norm, out;
  GdnWeights w;
  ref::GdnW rw;
  explicit GdnCase(std::uint64_t seed) {
    c.n_embd = 40;
    c.n_k_heads = 2;
    c.n_v_heads = 4;
    c.k_head_dim = 16;
    c.v_head_dim = 8;
    c.conv_kernel = 4;
    c.rms_norm_eps = 1e-6f;
    const int H = c.n_embd, Hv = c.n_v_heads;
    qkvz = RandW(c.qkvz_dim(), H, seed + 1);
    ba = RandW(2 * Hv, H, seed + 2);
    conv = RandW(c.conv_dim(), c.conv_kernel, seed + 3);
    // Decays spread as in the synthetic model: A = exp(A_log) in [1, 16], dt_bias = softplus^-1(dt)
    // with dt in [1e-3, 1e-1].
    FVec ua = Rand(Z(Hv), seed + 4, 0.0f, 1.0f), ud = Rand(Z(Hv), seed + 5, 0.0f, 1.0f);
    for (int j = 0; j < Hv; ++j) {
      a_log.push_back(ua[Z(j)] * std::log(16.0f));
      const double dt = std::exp(std::log(1e-3) +
                                 static_cast<double>(ud[Z(j)]) * (std::log(1e-1) - std::log(1e-3)));
      dt_bias.push_back(static_cast<float>(dt + std::log(-std::expm1(-dt))));
    }
    norm = Rand(Z(c.v_head_dim), seed + 6, 0.8f, 1.2f);
    out = RandW(H, c.value_dim(), seed + 7, 0.5f);
    w.in_proj_qkvz = MatOf(qkvz, c.qkvz_dim(), H);
    w.in_proj_ba = MatOf(ba, 2 * Hv, H);
    w.conv1d = conv.data();
    w.dt_bias = dt_bias.data();
    w.a_log = a_log.data();
    w.norm = norm.data();
    w.out_proj = MatOf(out, H, c.value_dim());
    rw = {ToD(qkvz), ToD(ba), ToD(conv), ToD(dt_bias), ToD(a_log), ToD(norm), ToD(out)};
  }
  GdnState NewState(std::uint64_t seed) const {
    GdnState st(c.conv_dim(), c.conv_kernel, c.n_v_heads, c.k_head_dim, c.v_head_dim);
    FVec cv = Rand(st.conv_size(), seed, -1.0f, 1.0f),
         s = Rand(st.ssm_size(), seed + 1, -0.5f, 0.5f);
    std::copy(cv.begin(), cv.end(), st.conv());
    std::copy(s.begin(), s.end(), st.ssm());
    return st;
  }
  static ref::GdnSt RefState(const GdnState& st) {
    return {ToD(st.conv(), st.conv_size()), ToD(st.ssm(), st.ssm_size())};
  }
  // Reference over T rows of a [T, H]; returns y [T, H]; `after` (optional) gets the state after
  // each row.
  Vec RefForward(const FVec& a, int T, ref::GdnSt& st, std::vector<ref::GdnSt>* after) const {
    Vec ad = ToD(a), y;
    for (int t = 0; t < T; ++t) {
      Vec yt = ref::GdnToken(rw, c, ad.data() + Z(t) * Z(c.n_embd), st);
      y.insert(y.end(), yt.begin(), yt.end());
      if (after) after->push_back(st);
    }
    return y;
  }
};

// Verify mode: per-step states in scratch, the checkpoint untouched until CommitSteps(n), which
// makes step n-1 the checkpoint; a second window then continues from it.
TEST(OpReference, GdnForwardVerify) {
  GdnCase gc(1400);
  const ModelConfig& c = gc.c;
  const int H = c.n_embd, T = 5;
  ThreadPool pool(2);
  for (MatmulKind kind : {MatmulKind::kInvariant, MatmulKind::kGemm}) {
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
      const std::string tag =
          std::string(kind == MatmulKind::kGemm ? "gemm" : "inv") + (tp ? " pool2" : " serial");
      GdnState st = gc.NewState(1410);
      const FVec conv0(st.conv(), st.conv() + st.conv_size()),
          ssm0(st.ssm(), st.ssm() + st.ssm_size());
      ref::GdnSt rs = GdnCase::RefState(st);
      std::vector<ref::GdnSt> after;
      FVec a = Rand(Z(T) * Z(H), 1420, -1.5f, 1.5f);
      Vec y_ref = gc.RefForward(a, T, rs, &after);
      Arena arena;
      FVec y = Guarded(Z(T) * Z(H));
      GdnForward(gc.w, c, a.data(), T, st, GdnMode::kVerify, kind, tp, arena, y.data());
      ExpectGuardAndTrim(y, Z(T) * Z(H), "GdnForward verify");
      Check("GdnForward verify out " + tag, y_ref, y, kTolOp);
      ASSERT_EQ(st.n_steps(), T);
      for (int t = 0; t < T; ++t) {
        Check("GdnForward verify step " + std::to_string(t) + " conv " + tag, after[Z(t)].conv,
              st.step_conv(t), st.conv_size(), kTolOp);
        Check("GdnForward verify step " + std::to_string(t) + " ssm " + tag, after[Z(t)].S,
              st.step_ssm(t), st.ssm_size(), kTolOp);
      }
      // The checkpoint is untouched by a verify window.
      EXPECT_EQ(st.position(), 0);
      EXPECT_EQ(std::memcmp(st.conv(), conv0.data(), conv0.size() * 4), 0)
          << "checkpoint conv changed by verify";
      EXPECT_EQ(std::memcmp(st.ssm(), ssm0.data(), ssm0.size() * 4), 0)
          << "checkpoint ssm changed by verify";
      // Keep 3 of the 5 steps.
      const FVec step2_conv(st.step_conv(2), st.step_conv(2) + st.conv_size());
      const FVec step2_ssm(st.step_ssm(2), st.step_ssm(2) + st.ssm_size());
      st.CommitSteps(3);
      EXPECT_EQ(st.position(), 3);
      EXPECT_EQ(std::memcmp(st.conv(), step2_conv.data(), step2_conv.size() * 4), 0);
      EXPECT_EQ(std::memcmp(st.ssm(), step2_ssm.data(), step2_ssm.size() * 4), 0);
      // Second window from the committed state (the reference continues from its state after 3).
      ref::GdnSt rs2 = after[2];
      FVec a2 = Rand(2 * Z(H), 1430, -1.5f, 1.5f);
      Vec y2_ref = gc.RefForward(a2, 2, rs2, nullptr);
      FVec y2(2 * Z(H));
      GdnForward(gc.w, c, a2.data(), 2, st, GdnMode::kVerify, kind, tp, arena, y2.data());
      Check("GdnForward verify after commit out " + tag, y2_ref, y2, kTolOp);
      Check("GdnForward verify after commit ssm " + tag, rs2.S, st.step_ssm(1), st.ssm_size(),
            kTolOp);
    }
  }
}

// Prefill mode: chunked form (T = 70 crosses the 64-row chunk), checkpoint updated in place and
// position advanced; then a second prefill call continues from it.
TEST(OpReference, GdnForwardPrefill) {
  GdnCase gc(1500);
  const ModelConfig& c = gc.c;
  const int H = c.n_embd;
  ThreadPool pool(2);
  for (int T : {1, 5, 70}) {
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
      const std::string tag = "T=" + std::to_string(T) + (tp ? " pool2" : " serial");
      GdnState st = gc.NewState(1510 + Z(T));
      ref::GdnSt rs = GdnCase::RefState(st);
      FVec a = Rand(Z(T) * Z(H), 1520 + Z(T), -1.5f, 1.5f);
      Vec y_ref = gc.RefForward(a, T, rs, nullptr);
      Arena arena;
      FVec y = Guarded(Z(T) * Z(H));
      GdnForward(gc.w, c, a.data(), T, st, GdnMode::kPrefill, MatmulKind::kGemm, tp, arena,
                 y.data());
      ExpectGuardAndTrim(y, Z(T) * Z(H), "GdnForward prefill");
      Check("GdnForward prefill out " + tag, y_ref, y, kTolDeep);
      Check("GdnForward prefill conv " + tag, rs.conv, st.conv(), st.conv_size(), kTolDeep);
      Check("GdnForward prefill ssm " + tag, rs.S, st.ssm(), st.ssm_size(), kTolDeep);
      EXPECT_EQ(st.position(), T);
      FVec a2 = Rand(3 * Z(H), 1530 + Z(T), -1.5f, 1.5f);
      Vec y2_ref = gc.RefForward(a2, 3, rs, nullptr);
      FVec y2(3 * Z(H));
      GdnForward(gc.w, c, a2.data(), 3, st, GdnMode::kPrefill, MatmulKind::kGemm, tp, arena,
                 y2.data());
      Check("GdnForward prefill continued out " + tag, y2_ref, y2, kTolDeep);
      Check("GdnForward prefill continued ssm " + tag, rs.S, st.ssm(), st.ssm_size(), kTolDeep);
      EXPECT_EQ(st.position(), T + 3);
    }
  }
}

// =================================================================================================
// MoE
// =================================================================================================

TEST(OpReference, RouteToken) {
  std::uint64_t seed = 1600;
  for (auto [E, k] : {std::pair{8, 2}, std::pair{64, 8}, std::pair{512, 10}}) {
    for (bool norm : {true, false}) {
      for (int trial = 0; trial < 5; ++trial) {
        FVec logits = Rand(Z(E), seed++, -4.0f, 4.0f);
        std::vector<int> idx_ref;
        Vec w_ref;
        double gap = 0.0;
        ref::Route(ToD(logits).data(), E, k, norm, &idx_ref, &w_ref, &gap);
        ASSERT_GT(gap, 1e-5) << "random logits too close to a tie for an f32 comparison";
        std::vector<int> idx(Z(k));
        FVec wts(Z(k));
        RouteToken(logits.data(), E, k, norm, idx.data(), wts.data());
        EXPECT_EQ(idx, idx_ref) << "E=" << E << " k=" << k;
        Check("RouteToken E=" + std::to_string(E) + " k=" + std::to_string(k) +
                  (norm ? " norm" : " raw") + " #" + std::to_string(trial),
              w_ref, wts, kTolReduce);
      }
    }
  }
  // Ties: equal logits give equal probabilities; the lower expert id wins.
  {
    const FVec logits = {0.5f, 2.0f, 2.0f, -1.0f, 2.0f, 0.1f, 0.3f, 2.0f};
    std::vector<int> idx(3);
    FVec wts(3);
    RouteToken(logits.data(), 8, 3, true, idx.data(), wts.data());
    EXPECT_EQ(idx, (std::vector<int>{1, 2, 4}));
    for (float x : wts) EXPECT_NEAR(x, 1.0f / 3.0f, 1e-7f);
    RouteToken(logits.data(), 8, 2, false, idx.data(), wts.data());
    EXPECT_EQ(idx[0], 1);
    EXPECT_EQ(idx[1], 2);
  }
  {
    const FVec logits = {1.0f, 1.0f, 3.0f, 1.0f};  // a strict top-1, then a three-way tie
    std::vector<int> idx(2);
    FVec wts(2);
    RouteToken(logits.data(), 4, 2, true, idx.data(), wts.data());
    EXPECT_EQ(idx, (std::vector<int>{2, 0}));
    std::vector<int> idx_ref;
    Vec w_ref;
    ref::Route(ToD(logits).data(), 4, 2, true, &idx_ref, &w_ref, nullptr);
    EXPECT_EQ(idx_ref, idx);
    Check("RouteToken tie weights", w_ref, wts, kTolReduce);
  }
}

// One SwiGLU expert shape with its own random weights.
struct FfnCase {
  FVec gate, up, down;
  FfnWeights w;
  ref::FfnW rw;
  FfnCase(int H, int I, std::uint64_t seed) {
    gate = RandW(I, H, seed + 1);
    up = RandW(I, H, seed + 2);
    down = RandW(H, I, seed + 3, 0.5f);
    w.gate = MatOf(gate, I, H);
    w.up = MatOf(up, I, H);
    w.down = MatOf(down, H, I);
    rw = {ToD(gate), ToD(up), ToD(down), I};
  }
};

TEST(OpReference, FfnForward) {
  const int H = 40, I = 36, T = 3;
  FfnCase fc(H, I, 1700);
  FVec x = Rand(Z(T) * Z(H), 1710, -1.5f, 1.5f);
  Vec xd = ToD(x), ref;
  for (int t = 0; t < T; ++t) {
    Vec y = ref::Ffn(fc.rw, xd.data() + Z(t) * Z(H), H);
    ref.insert(ref.end(), y.begin(), y.end());
  }
  ThreadPool pool(2);
  for (MatmulKind kind : {MatmulKind::kInvariant, MatmulKind::kGemm}) {
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
      Arena arena;
      FVec out = Guarded(Z(T) * Z(H));
      FfnForward(fc.w, x.data(), T, kind, tp, arena, out.data());
      ExpectGuardAndTrim(out, Z(T) * Z(H), "FfnForward");
      Check(std::string("FfnForward ") + (kind == MatmulKind::kGemm ? "gemm" : "inv") +
                (tp ? " pool2" : " serial"),
            ref, out, kTolOp);
    }
  }
}

TEST(OpReference, MoeForward) {
  ModelConfig c;
  c.n_embd = 40;
  c.n_experts = 8;
  c.n_experts_used = 3;
  c.moe_ffn = 24;
  c.shared_ffn = 36;
  const int H = c.n_embd, E = c.n_experts, T = 6;
  std::vector<FfnCase> experts;
  for (int e = 0; e < E; ++e) experts.emplace_back(H, c.moe_ffn, 1800 + 10 * Z(e));
  FfnCase shared(H, c.shared_ffn, 1900);
  FVec router = RandW(E, H, 1910, 2.0f), sgate = RandW(1, H, 1911);
  MoeWeights w;
  w.router = MatOf(router, E, H);
  for (const FfnCase& f : experts) w.experts.push_back(f.w);
  w.shared = shared.w;
  w.shared_gate = sgate.data();
  ref::MoeW rw;
  rw.router = ToD(router);
  for (const FfnCase& f : experts) rw.experts.push_back(f.rw);
  rw.shared = shared.rw;
  rw.shared_gate = ToD(sgate);
  FVec x = Rand(Z(T) * Z(H), 1920, -1.5f, 1.5f);
  const Vec xd = ToD(x);
  ThreadPool pool(2);
  for (bool with_shared : {true, false}) {
    for (bool norm : {true, false}) {
      c.norm_topk_prob = norm;
      MoeWeights wc = w;
      ref::MoeW rwc = rw;
      if (!with_shared) {
        wc.shared = FfnWeights{};
        rwc.shared.inter = 0;
      }
      Vec ref;
      for (int t = 0; t < T; ++t) {
        double gap = 0.0;
        Vec y = ref::Moe(rwc, xd.data() + Z(t) * Z(H), H, E, c.n_experts_used, norm, &gap);
        ASSERT_GT(gap, 1e-5) << "routing of token " << t
                             << " too close to a tie for an f32 comparison";
        ref.insert(ref.end(), y.begin(), y.end());
      }
      for (MatmulKind kind : {MatmulKind::kInvariant, MatmulKind::kGemm}) {
        for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
          Arena arena;
          FVec out = Guarded(Z(T) * Z(H));
          MoeForward(wc, c, x.data(), T, kind, tp, arena, nullptr, 0, out.data());
          ExpectGuardAndTrim(out, Z(T) * Z(H), "MoeForward");
          Check(std::string("MoeForward") + (with_shared ? " shared" : " no-shared") +
                    (norm ? " norm" : " raw") + (kind == MatmulKind::kGemm ? " gemm" : " inv") +
                    (tp ? " pool2" : " serial"),
                ref, out, kTolOp);
        }
      }
    }
  }
}

// =================================================================================================
// The whole tiny model and its MTP module
// =================================================================================================

const std::vector<std::int32_t> kPrompt = {1, 17, 300, 45, 511, 2, 99, 250, 7, 128, 64, 400};

EngineConfig TinyEngineConfig() {
  EngineConfig cfg;
  cfg.model = test::ModelDir("tiny");
  cfg.stages = 2;  // a stage boundary inside the model
  cfg.threads = 2;
  cfg.kv_page_rows = 4;  // the 12 positions span three K/V pages
  return cfg;
}

TEST(OpReference, WholeModelTiny) {
  const ModelWeights& w = test::Model("tiny");
  const ModelConfig& c = w.config;
  ASSERT_EQ(c.n_layers, 8);
  auto store = TensorStore::OpenDir(test::ModelDir("tiny"));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  RefModel ref(RefTensorsOf(**store), c);
  const int n = static_cast<int>(kPrompt.size()), H = c.n_embd, V = c.n_vocab;
  Vec ref_logits, ref_normed;
  for (int t = 0; t < n; ++t) {
    Vec h, lg;
    ref.Token(kPrompt[Z(t)], &h, &lg);
    ref_normed.insert(ref_normed.end(), h.begin(), h.end());
    ref_logits.insert(ref_logits.end(), lg.begin(), lg.end());
  }
  ASSERT_GT(ref.min_route_gap(), 1e-5) << "a routing decision of the prompt is too close to a tie";

  // 1) One token per verify window, committed each time (decode-like).
  {
    auto eng = Engine::Create(TinyEngineConfig(), w);
    ASSERT_TRUE(eng.ok()) << eng.status().ToString();
    FVec logits(Z(n) * Z(V)), normed(Z(n) * Z(H));
    for (int t = 0; t < n; ++t) {
      ASSERT_TRUE((*eng)
                      ->Verify(std::span<const std::int32_t>(&kPrompt[Z(t)], 1),
                               logits.data() + Z(t) * Z(V), normed.data() + Z(t) * Z(H))
                      .ok());
      ASSERT_TRUE((*eng)->Commit(1).ok());
    }
    EXPECT_EQ((*eng)->position(), n);
    for (int t = 0; t < n; ++t) {
      Vec r(ref_logits.begin() + static_cast<std::ptrdiff_t>(Z(t) * Z(V)),
            ref_logits.begin() + static_cast<std::ptrdiff_t>(Z(t + 1) * Z(V)));
      Check("WholeModelTiny token-by-token logits p=" + std::to_string(t), r,
            logits.data() + Z(t) * Z(V), Z(V), kTolDeep);
    }
    Check("WholeModelTiny token-by-token logits all", ref_logits, logits, kTolDeep);
    Check("WholeModelTiny token-by-token final-normed hidden", ref_normed, normed, kTolDeep);
  }
  // 2) All 12 tokens in one verify window.
  {
    auto eng = Engine::Create(TinyEngineConfig(), w);
    ASSERT_TRUE(eng.ok());
    FVec logits(Z(n) * Z(V));
    ASSERT_TRUE((*eng)->Verify(kPrompt, logits.data()).ok());
    Check("WholeModelTiny one 12-row verify window logits", ref_logits, logits, kTolDeep);
  }
  // 3) Chunked prefill (chunks of 4: attention with prior rows, GDN chunked form from a nonzero
  //    state), then the last token by verify.
  {
    EngineConfig cfg = TinyEngineConfig();
    cfg.prefill_chunk = 4;
    auto eng = Engine::Create(cfg, w);
    ASSERT_TRUE(eng.ok());
    ASSERT_TRUE((*eng)->Prefill(std::span<const std::int32_t>(kPrompt.data(), Z(n - 1))).ok());
    FVec logits(Z(V));
    ASSERT_TRUE(
        (*eng)->Verify(std::span<const std::int32_t>(&kPrompt[Z(n - 1)], 1), logits.data()).ok());
    Vec r(ref_logits.end() - V, ref_logits.end());
    Check("WholeModelTiny prefill(11, chunk 4) + verify last logits", r, logits, kTolDeep);
  }
}

// The MTP module on the last stage: rows p = 0..3 in one call (verify kernels), committed, then
// rows 4..5 (prefill kernels) over the committed draft K/V. The reference gets the engine's own
// final-normed hidden states (checked above against the f64 model) so that this isolates the MTP.
TEST(OpReference, MtpTiny) {
  const ModelWeights& w = test::Model("tiny");
  const ModelConfig& c = w.config;
  ASSERT_TRUE(w.mtp.present);
  auto store = TensorStore::OpenDir(test::ModelDir("tiny"));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  RefModel ref(RefTensorsOf(**store), c);
  const int H = c.n_embd, V = c.n_vocab, n = 6;
  auto eng = Engine::Create(TinyEngineConfig(), w);
  ASSERT_TRUE(eng.ok());
  FVec logits(Z(n) * Z(V)), normed(Z(n) * Z(H));
  ASSERT_TRUE((*eng)
                  ->Verify(std::span<const std::int32_t>(kPrompt.data(), Z(n)), logits.data(),
                           normed.data())
                  .ok());
  ASSERT_TRUE((*eng)->Commit(n).ok());
  StageSession& last = (*eng)->stage((*eng)->n_stages() - 1);
  ASSERT_TRUE(last.has_mtp());
  // Row p pairs h_p with t_{p+1}.
  std::vector<std::int32_t> next(kPrompt.begin() + 1, kPrompt.begin() + 1 + n);
  FVec m(Z(n) * Z(H)), mlog(Z(n) * Z(V));
  last.MtpForward(normed.data(), next.data(), 0, 4, ForwardMode::kVerify, m.data(), mlog.data(), 4);
  EXPECT_EQ(last.mtp_kv()->rows_written(), 4);
  last.MtpCommit(4);
  last.MtpForward(normed.data() + 4 * Z(H), next.data() + 4, 4, 2, ForwardMode::kPrefill,
                  m.data() + 4 * Z(H), mlog.data() + 4 * Z(V), 2);
  Vec m_ref, lg_ref;
  const Vec hd = ToD(normed);
  for (int p = 0; p < n; ++p) {
    Vec mr, lr;
    ref.Mtp(hd.data() + Z(p) * Z(H), next[Z(p)], &mr, &lr);
    m_ref.insert(m_ref.end(), mr.begin(), mr.end());
    lg_ref.insert(lg_ref.end(), lr.begin(), lr.end());
  }
  ASSERT_GT(ref.min_route_gap(), 1e-5) << "an MTP routing decision is too close to a tie";
  Check("MtpTiny m (post mtp.norm) rows 0..5", m_ref, m, kTolDeep);
  Check("MtpTiny logits rows 0..5", lg_ref, mlog, kTolDeep);
}

}  // namespace
}  // namespace lockstep::cpu
