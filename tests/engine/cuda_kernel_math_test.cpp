// CudaKernelMath: the arithmetic of the CUDA kernels (engine/cuda/kernel_math.h bodies) run on the
// host, with each kernel's lane / thread / block structure emulated by loops in the kernel's order,
// against the CPU ops of engine/cpu. Runs in CI without a GPU.
//
// What is bitwise and what is bounded:
//   * bitwise: every op whose kernel performs the CPU's own sequence of IEEE operations -- bf16 /
//     int8 cache bits (KvCache), ScaleRows, elementwise activations, RoPE, causal conv, the gated
//     delta step, the GDN split, routing, grouping, the rank-order combine -- and the batch
//     invariance of the emulated RowsMatmul / expert products (row t identical for any T).
//   * bounded: dot products and what is built on them (norms, attention, expert products),
//     because the GPU's lane layout ((i / 4) % 32 == l, one float4 per lane) differs from the
//     CPU's (i % 32 == l). Tolerances are the first-order worst-case bounds of the two summation
//     orders, not measured fits: a sum of n products in 32 lanes plus a 5-level tree has error
//     <= (n/32 + 6) u sum|a_i b_i| in either order (u = 2^-24), so the two differ by at most
//     DotTol = 2 (n/32 + 8) u sum|a_i b_i|. Each derived bound is commented where used.
//     Measured (x86-64, g++ 12, -O2 -ffp-contract=off), largest |diff| / bound per check: dot
//     0.023, RowsMatmul 0.008, RMS / gated / l2 norms 0.21 / 0.29 / 0.17, GDN q/k norm 0.14,
//     attention 0.0024, expert products 0.0075. The bounds are worst-case, so a bias of a few ulp
//     in a normaliser would pass; the bitwise checks, not these, pin the per-op expressions.
// On a GPU the transcendental functions (expf, log1pf, sinf, cosf) are CUDA's (<= 2 ulp) rather
// than glibc's, which only tests/gpu/cuda_ops_test.cpp can see.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/attention.h"
#include "cpu/gdn.h"
#include "cpu/matmul.h"
#include "cpu/moe.h"
#include "cpu/norm.h"
#include "cpu/rope.h"
#include "cuda/kernel_math.h"
#include "kernel_test_math.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/kv_cache.h"
#include "lockstep/engine/weights.h"
#include "util/arena.h"

namespace lockstep::cuda {
namespace {

using test::AbsDot;
using test::AttentionTol;
using test::DotTol;
using test::FVec;
using test::kU;
using test::RandomVec;
using test::Z;

// ---- emulated warp dot (kernel_math.h lane order + butterfly) ----

float WarpDot(const float* a, const float* b, int n) {
  float v[km::kWarp];
  for (int l = 0; l < km::kWarp; ++l) v[l] = km::LanePartial(a, b, n, l);
  return km::CombineLanes(v);
}
// The float4 path's sequence (n % 4 == 0): lane l takes float4 groups g = l, l + 32, ...
float WarpDotVec(const float* a, const float* b, int n) {
  float v[km::kWarp];
  for (int l = 0; l < km::kWarp; ++l) {
    float acc = 0.0f;
    for (int g = l; g < n / 4; g += km::kWarp) {
      const float* p = a + 4 * g;
      const float* q = b + 4 * g;
      acc = km::LaneStep4(acc, p[0], p[1], p[2], p[3], q[0], q[1], q[2], q[3]);
    }
    v[l] = acc;
  }
  return km::CombineLanes(v);
}

// The RowsMatmul kernel (and the expert kernels) for one weight row: passes of RowGroupSize rows
// run at width RowPassWidth (extra slots repeat the pass's first row and are dropped),
// LaneAccumRows per lane, the butterfly per row.
template <int W>
void EmulateWidth(const float* const* rows, int n, const float* w, int n_in, float* out) {
  const float* padded[W];
  for (int r = 0; r < W; ++r) padded[r] = rows[r < n ? r : 0];
  float lanes[W][km::kWarp];
  for (int l = 0; l < km::kWarp; ++l) {
    float acc[W];
    km::LaneAccumRows<W>(padded, w, n_in, l, acc);
    for (int r = 0; r < W; ++r) lanes[r][l] = acc[r];
  }
  for (int r = 0; r < n; ++r) out[r] = km::CombineLanes(lanes[r]);
}
void EmulateRowsPass(const float* const* rows, int n, const float* w, int n_in, float* out) {
  km::WithPassWidth(n, [&]<int R>() { EmulateWidth<R>(rows, n, w, n_in, out); });
}
// y[t, o] = x[t] . W[o] for the rows given by row pointers.
void EmulateRows(const float* const* x, int T, const float* W, int n_out, int n_in, float* y,
                 int ldy) {
  for (int o = 0; o < n_out; ++o) {
    for (int t0 = 0; t0 < T;) {
      const int g = km::RowGroupSize(T - t0);
      float out[km::kMaxRowsPerPass];
      EmulateRowsPass(x + t0, g, W + Z(o) * Z(n_in), n_in, out);
      for (int r = 0; r < g; ++r) y[Z(t0 + r) * Z(ldy) + Z(o)] = out[r];
      t0 += g;
    }
  }
}
std::vector<const float*> RowPtrs(const float* x, int T, int n) {
  std::vector<const float*> p(Z(T));
  for (int t = 0; t < T; ++t) p[Z(t)] = x + Z(t) * Z(n);
  return p;
}

// ---- bits ----

TEST(CudaKernelMath, Bf16MatchesDtypeBitwise) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const auto b = static_cast<std::uint16_t>(c);
    ASSERT_EQ(km::FloatBits(km::Bf16ToF32(b)), km::FloatBits(bf16_to_f32(b))) << c;
  }
  std::mt19937 rng(1);
  std::vector<std::uint32_t> pats = {0u,          0x80000000u, 0x7f800000u, 0xff800000u,
                                     0x7fc00000u, 0x7f800001u, 0xff800123u, 0x7f7fffffu,
                                     0x3f808000u, 0x3f818000u, 0x00000001u, 0x007fffffu};
  for (int i = 0; i < 1 << 20; ++i) pats.push_back(static_cast<std::uint32_t>(rng()));
  for (std::uint32_t u : pats)
    ASSERT_EQ(km::F32ToBf16(km::BitsFloat(u)), f32_to_bf16(km::BitsFloat(u))) << u;
}

// The KvStore kernel for one (row, head) slice of D values, warp-emulated (lane max, butterfly
// max).
float EmulateInt8Slice(const float* x, int D, std::int8_t* codes) {
  float lanes[km::kWarp];
  for (int l = 0; l < km::kWarp; ++l) {
    lanes[l] = 0.0f;
    for (int i = l; i < D; i += km::kWarp) lanes[l] = km::AbsMaxStep(lanes[l], x[i]);
  }
  for (int off = km::kWarp / 2; off > 0; off >>= 1) {
    float nv[km::kWarp];
    for (int l = 0; l < km::kWarp; ++l) nv[l] = km::AbsMaxCombine(lanes[l], lanes[l ^ off]);
    std::copy(nv, nv + km::kWarp, lanes);
  }
  const float scale = km::Int8Scale(lanes[0]);
  for (int i = 0; i < D; ++i) codes[i] = km::Int8Code(x[i], scale);
  return scale;
}

// Rows for the cache tests: random, all-zero, exact ties (max 127 -> scale 1), tiny (scale
// underflows to 0), mixed magnitudes.
FVec CacheRows(std::mt19937& rng, int rows, int hkv, int D) {
  FVec x = RandomVec(rng, Z(rows) * Z(hkv) * Z(D), -3.0f, 3.0f);
  auto slice = [&](int r, int h) { return x.data() + (Z(r) * Z(hkv) + Z(h)) * Z(D); };
  std::fill_n(slice(1, 0), D, 0.0f);
  float* t = slice(2, 0);
  for (int i = 0; i < D; ++i) t[i] = static_cast<float>(i % 9) - 4.0f + 0.5f;
  t[0] = 127.0f;
  std::fill_n(slice(3, 0), D, 1e-44f);
  float* m = slice(4, hkv - 1);
  for (int i = 0; i < D; ++i) m[i] *= std::ldexp(1.0f, (i % 40) - 20);
  return x;
}

TEST(CudaKernelMath, KvStoreMatchesKvCacheBitwise) {
  const int hkv = 3, D = 72, rows = 6;
  std::mt19937 rng(2);
  const FVec k = CacheRows(rng, rows, hkv, D), v = RandomVec(rng, Z(rows) * Z(hkv) * Z(D));
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI8}) {
    KvCache cache(hkv, D, dt, 4);
    cache.Write(0, rows, k.data(), v.data());
    for (int which = 0; which < 2; ++which) {
      const float* src = which == 0 ? k.data() : v.data();
      for (int r = 0; r < rows; ++r) {
        const std::byte* raw = which == 0 ? cache.KRaw(r) : cache.VRaw(r);
        for (int h = 0; h < hkv; ++h) {
          const float* x = src + (Z(r) * Z(hkv) + Z(h)) * Z(D);
          if (dt == DType::kF32) {
            ASSERT_EQ(std::memcmp(raw + Z(h) * Z(D) * 4, x, Z(D) * 4), 0);
          } else if (dt == DType::kBF16) {
            std::vector<std::uint16_t> b(Z(D));
            for (int i = 0; i < D; ++i) b[Z(i)] = km::F32ToBf16(x[i]);
            ASSERT_EQ(std::memcmp(raw + Z(h) * Z(D) * 2, b.data(), Z(D) * 2), 0) << r << " " << h;
          } else {
            std::vector<std::int8_t> c(Z(D));
            const float scale = EmulateInt8Slice(x, D, c.data());
            ASSERT_EQ(std::memcmp(raw + Z(h) * Z(D), c.data(), Z(D)), 0) << r << " " << h;
            const float* sc = which == 0 ? cache.KScales(r) : cache.VScales(r);
            ASSERT_EQ(km::FloatBits(scale), km::FloatBits(sc[h])) << r << " " << h;
            FVec deq(Z(D));
            const float* want = which == 0 ? cache.K(r, h, deq.data()) : cache.V(r, h, deq.data());
            for (int i = 0; i < D; ++i)
              ASSERT_EQ(km::FloatBits(km::Int8Dequant(c[Z(i)], scale)), km::FloatBits(want[i]));
          }
        }
      }
    }
  }
}

TEST(CudaKernelMath, KvScaleRowsMatchesKvCacheBitwise) {
  const int hkv = 2, D = 20, rows = 5;
  std::mt19937 rng(3);
  const FVec k = CacheRows(rng, rows, hkv, D), v = RandomVec(rng, Z(rows) * Z(hkv) * Z(D));
  const float factor = 1.37f;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI8}) {
    KvCache cache(hkv, D, dt, 8);
    cache.Write(0, rows, k.data(), v.data());
    // Before: raw copy of rows 1..3 of V; after ScaleRows the kernel's per-element rule must map
    // the before bits to the after bits.
    std::vector<std::vector<std::byte>> before;
    std::vector<FVec> sc_before;
    for (int r = 1; r < 4; ++r) {
      before.emplace_back(cache.VRaw(r), cache.VRaw(r) + cache.row_bytes());
      if (dt == DType::kI8) sc_before.emplace_back(cache.VScales(r), cache.VScales(r) + hkv);
    }
    cache.ScaleRows(1, 1, 3, factor);
    for (int r = 1; r < 4; ++r) {
      const std::vector<std::byte>& b = before[Z(r - 1)];
      for (int e = 0; e < hkv * D; ++e) {
        if (dt == DType::kF32) {
          float x, y;
          std::memcpy(&x, b.data() + Z(e) * 4, 4);
          std::memcpy(&y, cache.VRaw(r) + Z(e) * 4, 4);
          ASSERT_EQ(km::FloatBits(km::ScaleElem(x, factor)), km::FloatBits(y));
        } else if (dt == DType::kBF16) {
          std::uint16_t x, y;
          std::memcpy(&x, b.data() + Z(e) * 2, 2);
          std::memcpy(&y, cache.VRaw(r) + Z(e) * 2, 2);
          ASSERT_EQ(km::F32ToBf16(km::ScaleElem(km::Bf16ToF32(x), factor)), y);
        }
      }
      if (dt == DType::kI8) {
        ASSERT_EQ(std::memcmp(b.data(), cache.VRaw(r), cache.row_bytes()), 0);  // codes untouched
        for (int h = 0; h < hkv; ++h)
          ASSERT_EQ(km::FloatBits(km::ScaleElem(sc_before[Z(r - 1)][Z(h)], factor)),
                    km::FloatBits(cache.VScales(r)[h]));
      }
    }
  }
}

// ---- elementwise ----

TEST(CudaKernelMath, ElementwiseMatchCpuBitwise) {
  std::mt19937 rng(4);
  const FVec a = RandomVec(rng, 20000, -30.0f, 30.0f), b = RandomVec(rng, 20000, -4.0f, 4.0f);
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(km::FloatBits(km::Sigmoid(a[i])), km::FloatBits(cpu::Sigmoid(a[i])));
    ASSERT_EQ(km::FloatBits(km::Silu(a[i])), km::FloatBits(cpu::Silu(a[i])));
    ASSERT_EQ(km::FloatBits(km::Softplus(a[i])), km::FloatBits(cpu::Softplus(a[i])));
    ASSERT_EQ(km::FloatBits(km::SiluMulElem(a[i], b[i])), km::FloatBits(cpu::Silu(a[i]) * b[i]));
    ASSERT_EQ(km::FloatBits(km::SwiGlu(a[i], b[i])), km::FloatBits(cpu::Silu(a[i]) * b[i]));
    ASSERT_EQ(km::FloatBits(km::MulSigmoidElem(b[i], a[i])),
              km::FloatBits(b[i] * cpu::Sigmoid(a[i])));
    ASSERT_EQ(km::FloatBits(km::AddElem(a[i], b[i])), km::FloatBits(a[i] + b[i]));
    // GDN gates exactly as GdnForward writes them.
    ASSERT_EQ(km::FloatBits(km::GdnBeta(a[i])), km::FloatBits(cpu::Sigmoid(a[i])));
    ASSERT_EQ(km::FloatBits(km::GdnDecay(a[i], b[i] * 0.5f, b[i])),
              km::FloatBits(-std::exp(b[i] * 0.5f) * cpu::Softplus(a[i] + b[i])));
  }
}

// ---- dot products, RowsMatmul ----

// Values where the order of a butterfly's operands shows: NaNs with different payloads (x86
// keeps the first operand's), signed zeros (AbsMaxCombine keeps its first on a tie), infinities
// of both signs, subnormals, and ordinary numbers of mixed scale.
std::array<float, km::kWarp> ButterflyInputs(std::mt19937& rng, int kind) {
  std::array<float, km::kWarp> v{};
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int l = 0; l < km::kWarp; ++l)
    v[Z(l)] = std::ldexp(u(rng), static_cast<int>(rng() % 40) - 20);
  if (kind >= 1) {
    auto nan = [](std::uint32_t payload) { return std::bit_cast<float>(0x7fc00000u | payload); };
    v[3] = nan(1), v[17] = nan(2), v[20] = -0.0f, v[21] = 0.0f, v[5] = INFINITY;
    v[9] = std::numeric_limits<float>::denorm_min();
  }
  if (kind >= 2) v[30] = -INFINITY, v[0] = -0.0f, v[16] = 0.0f;
  return v;
}

// ButterflyLane (the emulator's form of WarpCombine / WarpAbsMax, and CombineLanes) computes only
// the 31 operations one lane's result depends on: each lane's result must be the bits of the whole
// 32-lane butterfly, op(own, partner) at every step.
TEST(CudaKernelMath, ButterflyLaneIsTheWholeButterflyForEveryLane) {
  std::mt19937 rng(11);
  auto check = [&](auto op, const char* name) {
    for (int kind = 0; kind < 3; ++kind) {
      const std::array<float, km::kWarp> in = ButterflyInputs(rng, kind);
      std::array<float, km::kWarp> whole = in;
      for (int off = km::kWarp / 2; off > 0; off >>= 1) {
        std::array<float, km::kWarp> nv{};
        for (int l = 0; l < km::kWarp; ++l) nv[Z(l)] = op(whole[Z(l)], whole[Z(l ^ off)]);
        whole = nv;
      }
      for (int lane = 0; lane < km::kWarp; ++lane) {
        std::array<float, km::kWarp> v = in;
        EXPECT_EQ(km::FloatBits(km::ButterflyLane(v.data(), lane, op)),
                  km::FloatBits(whole[Z(lane)]))
            << name << " kind " << kind << " lane " << lane;
      }
    }
  };
  check(km::CombineStep, "CombineStep");
  check(km::AbsMaxCombine, "AbsMaxCombine");
  // The operand order matters for these inputs (the test would not see a swapped op otherwise).
  std::array<float, km::kWarp> v = ButterflyInputs(rng, 2), w = v;
  int differ = 0;
  for (int lane = 0; lane < km::kWarp; ++lane) {
    v = w;
    std::array<float, km::kWarp> x = w;
    differ += km::FloatBits(km::ButterflyLane(v.data(), lane, km::AbsMaxCombine)) !=
              km::FloatBits(km::ButterflyLane(
                  x.data(), lane, [](float a, float b) { return km::AbsMaxCombine(b, a); }));
  }
  EXPECT_GT(differ, 0) << "inputs too tame to show a swapped operand order";
}

TEST(CudaKernelMath, DotWithinOrderBound) {
  std::mt19937 rng(5);
  for (int n : {1, 3, 4, 31, 33, 127, 128, 129, 500, 1000, 2048, 2051, 8192}) {
    const FVec a = RandomVec(rng, Z(n)), b = RandomVec(rng, Z(n));
    const float g = WarpDot(a.data(), b.data(), n), c = cpu::Dot(a.data(), b.data(), n);
    EXPECT_LE(std::fabs(static_cast<double>(g) - c), DotTol(n, AbsDot(a.data(), b.data(), n))) << n;
    // The float4 path is the same sequence as the scalar path.
    if (n % 4 == 0) {
      EXPECT_EQ(km::FloatBits(WarpDotVec(a.data(), b.data(), n)), km::FloatBits(g)) << n;
    }
  }
}

TEST(CudaKernelMath, RowsMatmulBatchInvariantAndWithinBound) {
  const int n_in = 389, n_out = 7, T_max = 37;  // n_in: a partial chunk and a partial float4
  std::mt19937 rng(6);
  const FVec x = RandomVec(rng, Z(T_max) * Z(n_in)), W = RandomVec(rng, Z(n_out) * Z(n_in));
  const auto rows = RowPtrs(x.data(), T_max, n_in);
  FVec ref(Z(T_max) * Z(n_out));
  EmulateRows(rows.data(), T_max, W.data(), n_out, n_in, ref.data(), n_out);
  for (int T : {1, 3, 5, 9, 16, 17, 37}) {
    // Rows [T_max - T, T_max) as a batch of T (each row lands in different passes and pass widths
    // per T: 9 rows run a 16-wide pass with 7 padded slots).
    FVec y(Z(T) * Z(n_out));
    EmulateRows(rows.data() + (T_max - T), T, W.data(), n_out, n_in, y.data(), n_out);
    for (int t = 0; t < T; ++t)
      for (int o = 0; o < n_out; ++o)
        ASSERT_EQ(km::FloatBits(y[Z(t) * Z(n_out) + Z(o)]),
                  km::FloatBits(ref[Z(T_max - T + t) * Z(n_out) + Z(o)]))
            << "T=" << T << " t=" << t << " o=" << o;
  }
  FVec cpu_y(Z(T_max) * Z(n_out));
  cpu::Matmul(cpu::MatmulKind::kInvariant, x.data(), T_max, Mat{W.data(), n_out, n_in},
              cpu_y.data(), nullptr);
  for (int t = 0; t < T_max; ++t)
    for (int o = 0; o < n_out; ++o) {
      const std::size_t i = Z(t) * Z(n_out) + Z(o);
      EXPECT_EQ(km::FloatBits(ref[i]),
                km::FloatBits(WarpDot(rows[Z(t)], W.data() + Z(o) * Z(n_in), n_in)));
      EXPECT_LE(std::fabs(static_cast<double>(ref[i]) - cpu_y[i]),
                DotTol(n_in, AbsDot(rows[Z(t)], W.data() + Z(o) * Z(n_in), n_in)));
    }
}

// bf16 device weights: LaneAccumRows over bf16 bits is LaneAccumRows over the same values as f32,
// bit for bit, for every row-pass size (the cuda stage's lossless bf16 matrices rest on this);
// IsBf16Exact accepts exactly the floats whose low half is zero.
TEST(CudaKernelMath, Bf16WeightsGiveTheF32Bits) {
  const int n = 389;  // a partial chunk and a partial float4
  std::mt19937 rng(11);
  const FVec x = RandomVec(rng, Z(8) * Z(n));
  FVec w = RandomVec(rng, Z(n));
  std::vector<std::uint16_t> wb(Z(n));
  for (int i = 0; i < n; ++i) {
    wb[Z(i)] = static_cast<std::uint16_t>(km::FloatBits(w[Z(i)]) >> 16);
    w[Z(i)] = km::Bf16ToF32(wb[Z(i)]);  // w now holds bf16 values
    ASSERT_TRUE(km::IsBf16Exact(w[Z(i)]));
  }
  const auto rows = RowPtrs(x.data(), 8, n);
  for (int l = 0; l < km::kWarp; ++l) {
    float a8[8], b8[8], a1[1], b1[1];
    km::LaneAccumRows<8>(rows.data(), w.data(), n, l, a8);
    km::LaneAccumRows<8, std::uint16_t>(rows.data(), wb.data(), n, l, b8);
    km::LaneAccumRows<1>(rows.data(), w.data(), n, l, a1);
    km::LaneAccumRows<1, std::uint16_t>(rows.data(), wb.data(), n, l, b1);
    for (int r = 0; r < 8; ++r)
      ASSERT_EQ(km::FloatBits(a8[r]), km::FloatBits(b8[r])) << "lane " << l << " row " << r;
    ASSERT_EQ(km::FloatBits(a1[0]), km::FloatBits(b1[0])) << "lane " << l;
  }
  EXPECT_FALSE(km::IsBf16Exact(1.0f + 0x1p-20f));
  EXPECT_TRUE(km::IsBf16Exact(-0.0f));
  EXPECT_TRUE(km::IsBf16Exact(INFINITY));
}

// ---- norms ----

// Relative bound of a norm output: the sum of squares (all terms positive) differs by DotTol, so
// the scale r by half that, plus the remaining roundings (/, +, sqrt, /, 2-3 *): (n/32 + 16) u.
double NormRelTol(int n) { return (n / 32.0 + 16.0) * kU; }

TEST(CudaKernelMath, NormsWithinBoundAndBitwiseGivenCpuSum) {
  std::mt19937 rng(7);
  for (int n : {5, 96, 130, 2048}) {
    const FVec x = RandomVec(rng, Z(n), -2.0f, 2.0f), w = RandomVec(rng, Z(n)),
               z = RandomVec(rng, Z(n), -4.0f, 4.0f);
    FVec yc(Z(n)), gc(Z(n)), lc = x;
    cpu::RmsNormZc(x.data(), n, w.data(), 1e-6f, yc.data());
    cpu::GatedRmsNorm(x.data(), z.data(), n, w.data(), 1e-6f, gc.data());
    cpu::L2NormInPlace(lc.data(), n, 1e-6f);
    const float ss = WarpDot(x.data(), x.data(), n), ss_cpu = cpu::Dot(x.data(), x.data(), n);
    const float r = km::RmsInv(ss, n, 1e-6f), rc = km::RmsInv(ss_cpu, n, 1e-6f);
    const float l2 = km::L2Inv(ss, 1e-6f), l2c = km::L2Inv(ss_cpu, 1e-6f);
    for (int i = 0; i < n; ++i) {
      const std::size_t u = Z(i);
      EXPECT_NEAR(km::RmsNormZcElem(x[u], r, w[u]), yc[u], NormRelTol(n) * std::fabs(yc[u]));
      EXPECT_NEAR(km::GatedRmsNormElem(x[u], r, w[u], z[u]), gc[u],
                  NormRelTol(n) * std::fabs(gc[u]));
      EXPECT_NEAR(km::L2NormElem(x[u], l2), lc[u], NormRelTol(n) * std::fabs(lc[u]));
      // Given the CPU's own sum of squares the bodies are the CPU's expressions bit for bit.
      ASSERT_EQ(km::FloatBits(km::RmsNormZcElem(x[u], rc, w[u])), km::FloatBits(yc[u]));
      ASSERT_EQ(km::FloatBits(km::GatedRmsNormElem(x[u], rc, w[u], z[u])), km::FloatBits(gc[u]));
      ASSERT_EQ(km::FloatBits(km::L2NormElem(x[u], l2c)), km::FloatBits(lc[u]));
    }
  }
}

// ---- RoPE ----

TEST(CudaKernelMath, RopeMatchesCpuBitwise) {
  const int R = 64, D = 96, heads = 3, T = 4;
  const double theta = 1e7;
  cpu::Rope rope(R, theta);
  FVec inv(Z(R / 2));  // as the engine computes it on the host for RopeApply (cpu::Rope's formula)
  for (int i = 0; i < R / 2; ++i)
    inv[Z(i)] = 1.0f / std::pow(static_cast<float>(theta),
                                static_cast<float>(2 * i) / static_cast<float>(R));
  std::mt19937 rng(8);
  for (int p0 : {0, 7, 30000}) {
    const FVec x = RandomVec(rng, Z(T) * Z(heads) * Z(D));
    FVec c = x, g = x;
    for (int t = 0; t < T; ++t) rope.Apply(c.data() + Z(t) * Z(heads) * Z(D), heads, D, p0 + t);
    for (int t = 0; t < T; ++t)  // RopeKernel: one thread per (t, head, pair)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < R / 2; ++i) {
          const float phi = km::RopeAngle(p0 + t, inv[Z(i)]);
          float* v = g.data() + (Z(t) * Z(heads) + Z(h)) * Z(D);
          km::RopeRotate(v[i], v[i + R / 2], ::cosf(phi), ::sinf(phi), &v[i], &v[i + R / 2]);
        }
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(km::FloatBits(g[i]), km::FloatBits(c[i])) << i;
  }
}

// ---- attention ----

// AttentionKernel for one (t, h, split) block over cache rows [u0, u1): scores by warp dots,
// strided max / f64 partials over kAttnThreads threads with the shared-memory trees, output in
// increasing u. whole: normalised output (the row's only block, u0 = 0). Otherwise the split's
// unnormalised sums (inv = 1) and its max *m and f64 sum *l, as the partials hold them.
// Raises *score_tol to the bound on the score difference to the CPU (for the tolerance).
// K / V elements are KvCache's dequantised values: the kernels' loads (km::Bf16ToF32,
// km::Int8Dequant) give the same bits (KvStoreMatchesKvCacheBitwise).
void EmulateAttentionBlock(const float* q, int u0, int u1, bool whole, int kvh, const KvCache& c,
                           float scale, float* o, float* m, double* l, double* score_tol) {
  const int D = c.head_dim(), B = km::kAttnThreads;
  FVec sc(Z(u1)), tmp(Z(D));
  for (int u = u0; u < u1; ++u) {
    const float* kr = c.K(u, kvh, tmp.data());
    sc[Z(u)] = WarpDot(q, kr, D) * scale;
    *score_tol =
        std::max(*score_tol, DotTol(D, AbsDot(q, kr, D)) * scale + 2 * kU * std::fabs(sc[Z(u)]));
  }
  std::vector<float> rf(Z(B));
  for (int tid = 0; tid < B; ++tid) {
    rf[Z(tid)] = -INFINITY;
    for (int u = u0 + tid; u < u1; u += B) rf[Z(tid)] = km::MaxStep(rf[Z(tid)], sc[Z(u)]);
  }
  for (int s = B / 2; s > 0; s >>= 1)
    for (int tid = 0; tid < s; ++tid) rf[Z(tid)] = km::MaxStep(rf[Z(tid)], rf[Z(tid + s)]);
  const float mx = rf[0];
  std::vector<double> rd(Z(B), 0.0);
  for (int tid = 0; tid < B; ++tid)
    for (int u = u0 + tid; u < u1; u += B) {
      sc[Z(u)] = km::SoftmaxExp(sc[Z(u)], mx);
      rd[Z(tid)] = rd[Z(tid)] + static_cast<double>(sc[Z(u)]);
    }
  for (int s = B / 2; s > 0; s >>= 1)
    for (int tid = 0; tid < s; ++tid) rd[Z(tid)] = rd[Z(tid)] + rd[Z(tid + s)];
  const float inv = whole ? km::SoftmaxInv(rd[0]) : 1.0f;
  std::fill_n(o, D, 0.0f);  // thread i's accumulator for dim i, rows in increasing u
  for (int u = u0; u < u1; ++u) {
    const float* vr = c.V(u, kvh, tmp.data());
    for (int i = 0; i < D; ++i) o[i] = km::AttnAccum(o[i], sc[Z(u)] * inv, vr[i]);
  }
  *m = mx;
  *l = rd[0];
}

// One (t, h) row of Attention with context split `split` (<= 0: none): the whole block, or the
// split blocks and AttnCombineKernel's fold. *n_blocks: the blocks the row used.
void EmulateAttention(const float* q, int n_ctx, int kvh, const KvCache& c, float scale, int split,
                      float* o, double* score_tol, int* n_blocks) {
  const int D = c.head_dim();
  float m;
  double l;
  *score_tol = 0.0;
  if (split <= 0 || n_ctx <= split) {
    *n_blocks = 1;
    EmulateAttentionBlock(q, 0, n_ctx, true, kvh, c, scale, o, &m, &l, score_tol);
    return;
  }
  const int used = (n_ctx + split - 1) / split;
  *n_blocks = used;
  std::vector<FVec> acc(Z(used), FVec(Z(D)));
  FVec ms(Z(used));
  std::vector<double> ls(Z(used));
  for (int j = 0; j < used; ++j)
    EmulateAttentionBlock(q, j * split, std::min(n_ctx, (j + 1) * split), false, kvh, c, scale,
                          acc[Z(j)].data(), &ms[Z(j)], &ls[Z(j)], score_tol);
  float M = -INFINITY;
  for (int j = 0; j < used; ++j) M = km::MaxStep(M, ms[Z(j)]);
  double L = 0.0;
  for (int j = 0; j < used; ++j) L = km::AttnRescaledSum(L, ls[Z(j)], km::SoftmaxExp(ms[Z(j)], M));
  const float inv = km::SoftmaxInv(L);
  std::fill_n(o, D, 0.0f);
  for (int j = 0; j < used; ++j)
    for (int i = 0; i < D; ++i)
      o[i] = km::AttnAccum(o[i], km::SoftmaxExp(ms[Z(j)], M) * inv, acc[Z(j)][Z(i)]);
}

TEST(CudaKernelMath, AttentionWithinBound) {
  const int hq = 6, hkv = 2, group = hq / hkv, T = 3, p = 297;  // n_ctx up to 300 > kAttnThreads
  std::mt19937 rng(9);
  for (int D : {72, 256}) {
    const int rows = p + T;
    const FVec k = RandomVec(rng, Z(rows) * Z(hkv) * Z(D), -2.0f, 2.0f),
               v = RandomVec(rng, Z(rows) * Z(hkv) * Z(D));
    const FVec q = RandomVec(rng, Z(T) * Z(hq) * Z(D), -2.0f, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (DType dt : {DType::kF32, DType::kBF16, DType::kI8})
      for (int split : {0, 64, 100, 299}) {  // 299: row 0 whole, rows 1 and 2 in two blocks
        KvCache cache(hkv, D, dt, 64);
        cache.Write(0, rows, k.data(), v.data());
        FVec scores(Z(group) * Z(rows)), tmp(2 * Z(D)), oc(Z(group) * Z(D)), og(Z(D));
        for (int t = 0; t < T; ++t)
          for (int j = 0; j < hkv; ++j) {
            const int n_ctx = p + t + 1;
            const float* qg = q.data() + (Z(t) * Z(hq) + Z(j * group)) * Z(D);
            cpu::AttendGroup(qg, group, j, cache, n_ctx, scale, oc.data(), scores.data(),
                             tmp.data());
            for (int gi = 0; gi < group; ++gi) {
              double ds;
              int n_blocks;
              EmulateAttention(qg + Z(gi) * Z(D), n_ctx, j, cache, scale, split, og.data(), &ds,
                               &n_blocks);
              ASSERT_EQ(n_blocks, split == 0 || n_ctx <= split ? 1 : (n_ctx + split - 1) / split);
              const float* pc = scores.data() + Z(gi) * Z(n_ctx);  // the CPU's normalised p
              std::vector<double> pv(Z(D), 0.0);                   // sum_u p_u |v_u[i]|
              for (int u = 0; u < n_ctx; ++u) {
                const float* vr = cache.V(u, j, tmp.data());
                for (int i = 0; i < D; ++i)
                  pv[Z(i)] += static_cast<double>(pc[u]) * std::fabs(vr[i]);
              }
              for (int i = 0; i < D; ++i)
                ASSERT_NEAR(og[Z(i)], oc[Z(gi) * Z(D) + Z(i)],
                            AttentionTol(ds, n_ctx, n_blocks, pv[Z(i)], 1.0))
                    << "D=" << D << " split " << split << " t=" << t << " head " << j * group + gi;
            }
          }
      }
  }
}

// A split that leaves out a block's last row, or weights a block by its own max instead of the
// common one, is caught by the bound above (the test's own sensitivity, on one row).
TEST(CudaKernelMath, AttentionSplitBoundCatchesAWrongCombine) {
  const int hkv = 1, D = 64, n_ctx = 300, split = 64;
  std::mt19937 rng(19);
  const FVec k = RandomVec(rng, Z(n_ctx) * Z(D), -2.0f, 2.0f), v = RandomVec(rng, Z(n_ctx) * Z(D));
  const FVec q = RandomVec(rng, Z(D), -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  KvCache cache(hkv, D, DType::kF32, 64);
  cache.Write(0, n_ctx, k.data(), v.data());
  FVec scores(Z(n_ctx)), tmp(2 * Z(D)), oc(Z(D));
  cpu::AttendGroup(q.data(), 1, 0, cache, n_ctx, scale, oc.data(), scores.data(), tmp.data());
  std::vector<double> pv(Z(D), 0.0);
  for (int u = 0; u < n_ctx; ++u)
    for (int i = 0; i < D; ++i)
      pv[Z(i)] += static_cast<double>(scores[Z(u)]) * std::fabs(v[Z(u) * Z(D) + Z(i)]);
  // Correct fold, then the two planted mistakes (block 2's range one row short; no rescale).
  auto worst = [&](int variant) {
    const int used = (n_ctx + split - 1) / split;
    std::vector<FVec> acc(Z(used), FVec(Z(D)));
    FVec ms(Z(used));
    std::vector<double> ls(Z(used));
    double ds = 0.0;
    for (int j = 0; j < used; ++j) {
      const int u1 = std::min(n_ctx, (j + 1) * split) - (variant == 1 && j == 2 ? 1 : 0);
      EmulateAttentionBlock(q.data(), j * split, u1, false, 0, cache, scale, acc[Z(j)].data(),
                            &ms[Z(j)], &ls[Z(j)], &ds);
    }
    float M = -INFINITY;
    for (int j = 0; j < used; ++j) M = km::MaxStep(M, ms[Z(j)]);
    double L = 0.0;
    for (int j = 0; j < used; ++j)
      L = km::AttnRescaledSum(L, ls[Z(j)], variant == 2 ? 1.0f : km::SoftmaxExp(ms[Z(j)], M));
    const float inv = km::SoftmaxInv(L);
    double ratio = 0.0;
    for (int i = 0; i < D; ++i) {
      float o = 0.0f;
      for (int j = 0; j < used; ++j)
        o = km::AttnAccum(o, (variant == 2 ? 1.0f : km::SoftmaxExp(ms[Z(j)], M)) * inv,
                          acc[Z(j)][Z(i)]);
      ratio =
          std::max(ratio, std::fabs(o - oc[Z(i)]) / AttentionTol(ds, n_ctx, used, pv[Z(i)], 1.0));
    }
    return ratio;
  };
  EXPECT_LE(worst(0), 1.0);
  EXPECT_GT(worst(1), 1.0);
  EXPECT_GT(worst(2), 1.0);
}

// ---- gated DeltaNet ----

TEST(CudaKernelMath, GdnSplitMatchesCpuLayoutBitwise) {
  const int hk = 2, hv = 6, r = hv / hk, dk = 5, dv = 3, K = 4, T = 3;
  const int key_dim = hk * dk, conv_dim = 2 * key_dim + hv * dv, qkvz = 2 * key_dim + 2 * hv * dv,
            wg = 2 * dk + 2 * r * dv;
  std::mt19937 rng(10);
  const FVec P = RandomVec(rng, Z(T) * Z(qkvz)), B = RandomVec(rng, Z(T) * Z(2 * hv), -3.0f, 3.0f);
  const FVec a_log = RandomVec(rng, Z(hv)), dt_bias = RandomVec(rng, Z(hv));
  const std::size_t n_win = Z(K - 1 + T) * Z(conv_dim);
  // The CPU's loop (cpu/gdn.cpp GdnForward), transcribed.
  FVec win_c(n_win, 0.0f), z_c(Z(T * hv * dv)), beta_c(Z(T * hv)), g_c(Z(T * hv));
  for (int t = 0; t < T; ++t)
    for (int gi = 0; gi < hk; ++gi) {
      const float* grp = P.data() + Z(t) * Z(qkvz) + Z(gi) * Z(wg);
      float* x = win_c.data() + Z(K - 1 + t) * Z(conv_dim);
      std::copy_n(grp, dk, x + gi * dk);
      std::copy_n(grp + dk, dk, x + key_dim + gi * dk);
      for (int i = 0; i < r; ++i) {
        const int j = gi * r + i;
        std::copy_n(grp + 2 * dk + i * dv, dv, x + 2 * key_dim + j * dv);
        std::copy_n(grp + 2 * dk + r * dv + i * dv, dv, z_c.data() + (Z(t) * Z(hv) + Z(j)) * Z(dv));
        const float bb = B[Z(t) * Z(2 * hv) + Z(gi * 2 * r + i)],
                    aa = B[Z(t) * Z(2 * hv) + Z(gi * 2 * r + r + i)];
        beta_c[Z(t * hv + j)] = cpu::Sigmoid(bb);
        g_c[Z(t * hv + j)] = -std::exp(a_log[Z(j)]) * cpu::Softplus(aa + dt_bias[Z(j)]);
      }
    }
  // GdnSplitKernel: one thread per column of the (qkvz + Hv)-wide virtual row.
  FVec win_g(n_win, 0.0f), z_g(z_c.size()), beta_g(beta_c.size()), g_g(g_c.size());
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < qkvz + hv; ++c) {
      if (c < qkvz) {
        const km::SplitDest d = km::GdnSplitDest(c, hk, dk, dv, r);
        const float val = P[Z(t) * Z(qkvz) + Z(c)];
        (d.to_z ? z_g[Z(t * hv * dv + d.col)] : win_g[Z((K - 1 + t) * conv_dim + d.col)]) = val;
      } else {
        const int j = c - qkvz;
        const float* brow = B.data() + Z(t) * Z(2 * hv);
        beta_g[Z(t * hv + j)] = km::GdnBeta(brow[km::GdnBaColumn(j, r, false)]);
        g_g[Z(t * hv + j)] =
            km::GdnDecay(brow[km::GdnBaColumn(j, r, true)], a_log[Z(j)], dt_bias[Z(j)]);
      }
    }
  auto same = [](const FVec& a, const FVec& b) {
    return std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  EXPECT_TRUE(same(win_g, win_c));
  EXPECT_TRUE(same(z_g, z_c));
  EXPECT_TRUE(same(beta_g, beta_c));
  EXPECT_TRUE(same(g_g, g_c));
}

// GdnSplitConv reads each conv channel and Z column from the qkvz column GdnSplitSource names:
// the inverse of GdnSplitDest, for one and several value heads per key head.
TEST(CudaKernelMath, GdnSplitSourceInvertsGdnSplitDest) {
  for (const auto [hk, hv, dk, dv] :
       {std::array{2, 6, 5, 3}, std::array{4, 8, 64, 64}, std::array{3, 3, 4, 7}}) {
    const int r = hv / hk, qkvz = 2 * hk * dk + 2 * hv * dv;
    std::vector<int> seen(Z(qkvz), 0);
    for (int c = 0; c < qkvz; ++c) {
      const km::SplitDest d = km::GdnSplitDest(c, hk, dk, dv, r);
      ASSERT_EQ(km::GdnSplitSource(d.to_z, d.col, hk, dk, dv, r), c)
          << "hk " << hk << " hv " << hv << " column " << c;
      ++seen[Z(c)];
    }
    // every conv channel and Z column has a source, and no two share one
    std::vector<int> hit(Z(qkvz), 0);
    for (int ch = 0; ch < 2 * hk * dk + hv * dv; ++ch)
      ++hit[Z(km::GdnSplitSource(false, ch, hk, dk, dv, r))];
    for (int zc = 0; zc < hv * dv; ++zc) ++hit[Z(km::GdnSplitSource(true, zc, hk, dk, dv, r))];
    EXPECT_EQ(hit, seen);
  }
}

TEST(CudaKernelMath, CausalConvMatchesCpuBitwise) {
  const int T = 5, C = 37, K = 4;
  std::mt19937 rng(11);
  const FVec win = RandomVec(rng, Z(K - 1 + T) * Z(C), -2.0f, 2.0f),
             w = RandomVec(rng, Z(C) * Z(K));
  FVec uc(Z(T) * Z(C));
  cpu::CausalConvSilu(win.data(), T, C, K, w.data(), uc.data());
  for (int t = 0; t < T; ++t)
    for (int ch = 0; ch < C; ++ch)
      ASSERT_EQ(km::FloatBits(km::ConvSiluAt(win.data(), C, K, w.data(), t, ch)),
                km::FloatBits(uc[Z(t * C + ch)]));
}

TEST(CudaKernelMath, GdnQkNormWithinBound) {
  const int T = 2, hk = 3, dk = 132, conv_dim = 2 * hk * dk + 40;
  std::mt19937 rng(12);
  const FVec U = RandomVec(rng, Z(T) * Z(conv_dim), -2.0f, 2.0f);
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int t = 0; t < T; ++t)
    for (int item = 0; item < 2 * hk; ++item) {  // QkNormKernel: warp per (t, head, q or k)
      const int is_k = item % 2, gi = item / 2;
      const float* x = U.data() + Z(t) * Z(conv_dim) + Z(is_k * hk * dk + gi * dk);
      FVec c(x, x + dk);
      cpu::L2NormInPlace(c.data(), dk, 1e-6f);
      const float r = km::L2Inv(WarpDot(x, x, dk), 1e-6f);
      for (int i = 0; i < dk; ++i) {
        const float want = is_k ? c[Z(i)] : c[Z(i)] * qscale;
        const float got =
            is_k ? km::L2NormElem(x[i], r) : km::L2NormElem(x[i], r) * km::GdnQScale(dk);
        ASSERT_NEAR(got, want, NormRelTol(dk) * std::fabs(want));
      }
    }
}

TEST(CudaKernelMath, GdnRecurrentMatchesCpuStepsBitwise) {
  const int hk = 2, hv = 4, r = hv / hk, dk = 24, dv = 20, T = 6;
  const int key_dim = hk * dk, conv_dim = 2 * key_dim + hv * dv;
  const std::size_t s_head = Z(dk) * Z(dv), s_all = Z(hv) * s_head;
  std::mt19937 rng(13);
  const FVec S0 = RandomVec(rng, s_all), qh = RandomVec(rng, Z(T * hk * dk)),
             kh = RandomVec(rng, Z(T * hk * dk), -0.3f, 0.3f);
  const FVec U = RandomVec(rng, Z(T) * Z(conv_dim)), g = RandomVec(rng, Z(T * hv), -2.0f, 0.0f),
             beta = RandomVec(rng, Z(T * hv), 0.0f, 1.0f);
  // CPU: GdnForward's verify loop (GatedDeltaStep on step slots).
  std::vector<float> steps_c(Z(T) * s_all), o_c(Z(T * hv * dv));
  for (int j = 0; j < hv; ++j)
    for (int t = 0; t < T; ++t) {
      const float* prev = (t == 0 ? S0.data() : steps_c.data() + Z(t - 1) * s_all) + Z(j) * s_head;
      float* S = steps_c.data() + Z(t) * s_all + Z(j) * s_head;
      std::copy_n(prev, s_head, S);
      const std::size_t th = Z(t * hv + j), tg = (Z(t * hk) + Z(j / r)) * Z(dk);
      cpu::GatedDeltaStep(S, qh.data() + tg, kh.data() + tg,
                          U.data() + Z(t) * Z(conv_dim) + Z(2 * key_dim + j * dv), std::exp(g[th]),
                          beta[th], dk, dv, o_c.data() + th * Z(dv));
    }
  // RecurrentKernel, verify form (steps) and prefill form (in place), thread per column.
  FVec steps_g(Z(T) * s_all), o_v(o_c.size()), o_p(o_c.size()), S_in_place = S0;
  for (int j = 0; j < hv; ++j)
    for (int t = 0; t < T; ++t) {
      const std::size_t th = Z(t * hv + j), tg = (Z(t * hk) + Z(j / r)) * Z(dk);
      const float alpha = km::GdnAlpha(g[th]);
      const float* vrow = U.data() + Z(t) * Z(conv_dim) + Z(2 * key_dim + j * dv);
      const float* prev = (t == 0 ? S0.data() : steps_g.data() + Z(t - 1) * s_all) + Z(j) * s_head;
      float* cur = steps_g.data() + Z(t) * s_all + Z(j) * s_head;
      float* sp = S_in_place.data() + Z(j) * s_head;
      for (int c = 0; c < dv; ++c) {
        o_v[th * Z(dv) + Z(c)] = km::DeltaColumnStep(prev + c, cur + c, dv, qh.data() + tg,
                                                     kh.data() + tg, vrow[c], alpha, beta[th], dk);
        o_p[th * Z(dv) + Z(c)] = km::DeltaColumnStep(sp + c, sp + c, dv, qh.data() + tg,
                                                     kh.data() + tg, vrow[c], alpha, beta[th], dk);
      }
    }
  EXPECT_EQ(std::memcmp(steps_g.data(), steps_c.data(), steps_c.size() * 4), 0);
  EXPECT_EQ(std::memcmp(o_v.data(), o_c.data(), o_c.size() * 4), 0);
  EXPECT_EQ(std::memcmp(o_p.data(), o_c.data(), o_c.size() * 4), 0);
  EXPECT_EQ(std::memcmp(S_in_place.data(), steps_c.data() + Z(T - 1) * s_all, s_all * 4), 0);
}

// ---- MoE ----

// RouteKernel for one token: max tree, sequential f32 sum, k argmax trees over kRouteThreads.
void EmulateRoute(const float* lg, int E, int k, bool norm, int* idx, float* w) {
  const int B = km::kRouteThreads;
  std::vector<float> rp(Z(B)), probs(Z(E));
  std::vector<int> ri(Z(B));
  for (int tid = 0; tid < B; ++tid) {
    rp[Z(tid)] = -INFINITY;
    for (int e = tid; e < E; e += B) rp[Z(tid)] = km::MaxStep(rp[Z(tid)], lg[e]);
  }
  for (int s = B / 2; s > 0; s >>= 1)
    for (int tid = 0; tid < s; ++tid) rp[Z(tid)] = km::MaxStep(rp[Z(tid)], rp[Z(tid + s)]);
  const float mx = rp[0];
  for (int e = 0; e < E; ++e) probs[Z(e)] = km::SoftmaxExp(lg[e], mx);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum = sum + probs[Z(e)];
  for (int e = 0; e < E; ++e) probs[Z(e)] = probs[Z(e)] / sum;
  std::vector<char> taken(Z(E), 0);
  for (int r = 0; r < k; ++r) {
    for (int tid = 0; tid < B; ++tid) {
      rp[Z(tid)] = 0.0f;
      ri[Z(tid)] = -1;
      for (int e = tid; e < E; e += B)
        if (!taken[Z(e)] && km::RouteBetter(probs[Z(e)], e, rp[Z(tid)], ri[Z(tid)])) {
          rp[Z(tid)] = probs[Z(e)];
          ri[Z(tid)] = e;
        }
    }
    for (int s = B / 2; s > 0; s >>= 1)
      for (int tid = 0; tid < s; ++tid)
        if (km::RouteBetter(rp[Z(tid + s)], ri[Z(tid + s)], rp[Z(tid)], ri[Z(tid)])) {
          rp[Z(tid)] = rp[Z(tid + s)];
          ri[Z(tid)] = ri[Z(tid + s)];
        }
    taken[Z(ri[0])] = 1;
    idx[r] = ri[0];
    w[r] = probs[Z(ri[0])];
  }
  if (norm) {
    float sel = 0.0f;
    for (int r = 0; r < k; ++r) sel = sel + w[r];
    for (int r = 0; r < k; ++r) w[r] = w[r] / sel;
  }
}

TEST(CudaKernelMath, RouteTopKMatchesCpuBitwise) {
  std::mt19937 rng(14);
  for (int E : {37, 512, 4096})
    for (bool norm : {false, true})
      for (int trial = 0; trial < 6; ++trial) {
        FVec lg = RandomVec(rng, Z(E), -4.0f, 4.0f);
        if (trial % 2 == 1)  // many exact ties: the lower id must win, as on the CPU
          for (float& x : lg) x = std::round(x * 2.0f) / 2.0f;
        const int k = std::min(E, 10);
        std::vector<int> ic(Z(k)), ig(Z(k));
        FVec wc(Z(k)), wg(Z(k));
        cpu::RouteToken(lg.data(), E, k, norm, ic.data(), wc.data());
        EmulateRoute(lg.data(), E, k, norm, ig.data(), wg.data());
        ASSERT_EQ(ig, ic) << E;
        for (int r = 0; r < k; ++r) ASSERT_EQ(km::FloatBits(wg[Z(r)]), km::FloatBits(wc[Z(r)]));
      }
}

// GroupKernel's algorithm: counts, segment totals and their scan, then slots in ascending order.
void EmulateGroup(const std::vector<int>& idx, int E, std::vector<int>* slot_of,
                  std::vector<int>* first, std::vector<int>* active, int* n_active) {
  const int n = static_cast<int>(idx.size()), B = 512, seg = (E + B - 1) / B;
  std::vector<int> cnt(Z(E));
  for (int e = 0; e < E; ++e)
    for (int s = 0; s < n; ++s) cnt[Z(e)] += idx[Z(s)] == e ? 1 : 0;
  first->assign(Z(E) + 1, 0);
  active->assign(Z(n), -1);
  slot_of->assign(Z(n), -1);
  int run = 0, na = 0;
  for (int tid = 0; tid < B; ++tid) {  // the scan's result: prefix of every earlier segment
    const int e0 = std::min(tid * seg, E), e1 = std::min(e0 + seg, E);
    for (int e = e0; e < e1; ++e) {
      (*first)[Z(e)] = run;
      if (cnt[Z(e)] > 0) (*active)[Z(na++)] = e;
      run += cnt[Z(e)];
    }
  }
  (*first)[Z(E)] = run;
  *n_active = na;
  for (int e = 0; e < E; ++e) {
    int pos = (*first)[Z(e)];
    for (int s = 0; s < n; ++s)
      if (idx[Z(s)] == e) (*slot_of)[Z(pos++)] = s;
  }
}

TEST(CudaKernelMath, GroupAndExpertsMatchCpu) {
  const int T = 11, E = 9, k = 3, H = 70, I = 44;
  std::mt19937 rng(15);
  const FVec x = RandomVec(rng, Z(T) * Z(H)), logits = RandomVec(rng, Z(T) * Z(E), -2.0f, 2.0f);
  std::vector<int> idx(Z(T * k));
  FVec wts(Z(T * k));
  for (int t = 0; t < T; ++t)
    cpu::RouteToken(logits.data() + Z(t * E), E, k, true, idx.data() + Z(t * k),
                    wts.data() + Z(t * k));
  std::vector<int> slot_of, first, active;
  int n_active = 0;
  EmulateGroup(idx, E, &slot_of, &first, &active, &n_active);
  // The CPU's order (cpu/moe.cpp MoeForward), transcribed.
  std::vector<int> want_slots, want_first, want_active;
  for (int e = 0; e < E; ++e) {
    want_first.push_back(static_cast<int>(want_slots.size()));
    for (int s = 0; s < T * k; ++s)
      if (idx[Z(s)] == e) want_slots.push_back(s);
    if (static_cast<int>(want_slots.size()) > want_first.back()) want_active.push_back(e);
  }
  want_first.push_back(T * k);
  ASSERT_EQ(slot_of, want_slots);
  ASSERT_EQ(first, want_first);
  ASSERT_EQ(n_active, static_cast<int>(want_active.size()));
  for (int a = 0; a < T * k; ++a) ASSERT_EQ(active[Z(a)], a < n_active ? want_active[Z(a)] : -1);

  // Experts: GateUpKernel / DownKernel per active expert (passes of RowGroupSize slots), then
  // CombineKernel; against cpu::FfnForward per slot and the CPU's combine loop.
  std::vector<FVec> wg(Z(E)), wu(Z(E)), wd(Z(E));
  for (int e = 0; e < E; ++e) {
    wg[Z(e)] = RandomVec(rng, Z(I) * Z(H));
    wu[Z(e)] = RandomVec(rng, Z(I) * Z(H));
    wd[Z(e)] = RandomVec(rng, Z(H) * Z(I));
  }
  FVec act(Z(T * k) * Z(I)), ranked(Z(T * k) * Z(H));
  for (int a = 0; a < n_active; ++a) {
    const int e = active[Z(a)], s0 = first[Z(e)], ns = first[Z(e) + 1] - s0;
    std::vector<const float*> rows;
    for (int i = 0; i < ns; ++i) rows.push_back(x.data() + Z(slot_of[Z(s0 + i)] / k) * Z(H));
    FVec gv(Z(ns) * Z(I)), uv(Z(ns) * Z(I)), yv(Z(ns) * Z(H));
    EmulateRows(rows.data(), ns, wg[Z(e)].data(), I, H, gv.data(), I);
    EmulateRows(rows.data(), ns, wu[Z(e)].data(), I, H, uv.data(), I);
    for (std::size_t i = 0; i < gv.size(); ++i) act[Z(s0) * Z(I) + i] = km::SwiGlu(gv[i], uv[i]);
    const auto arows = RowPtrs(act.data() + Z(s0) * Z(I), ns, I);
    EmulateRows(arows.data(), ns, wd[Z(e)].data(), H, I, yv.data(), H);
    for (int i = 0; i < ns; ++i)
      std::copy_n(yv.data() + Z(i) * Z(H), H, ranked.data() + Z(slot_of[Z(s0 + i)]) * Z(H));
  }
  Arena arena;
  for (int s = 0; s < T * k; ++s) {
    const int e = idx[Z(s)], t = s / k;
    const FfnWeights f{Mat{wg[Z(e)].data(), I, H}, Mat{wu[Z(e)].data(), I, H},
                       Mat{wd[Z(e)].data(), H, I}};
    FVec want(Z(H));
    cpu::FfnForward(f, x.data() + Z(t) * Z(H), 1, cpu::MatmulKind::kInvariant, nullptr, arena,
                    want.data());
    // Alone (a batch of one slot) the emulated expert gives the same bits: batch invariance.
    FVec g1(Z(I)), u1(Z(I)), a1(Z(I)), y1(Z(H));
    const float* xr = x.data() + Z(t) * Z(H);
    EmulateRows(&xr, 1, wg[Z(e)].data(), I, H, g1.data(), I);
    EmulateRows(&xr, 1, wu[Z(e)].data(), I, H, u1.data(), I);
    for (int i = 0; i < I; ++i) a1[Z(i)] = km::SwiGlu(g1[Z(i)], u1[Z(i)]);
    const float* ar = a1.data();
    EmulateRows(&ar, 1, wd[Z(e)].data(), H, I, y1.data(), H);
    ASSERT_EQ(std::memcmp(y1.data(), ranked.data() + Z(s) * Z(H), Z(H) * 4), 0) << s;
    // Bound: act_i differs by |silu'| dg |u| + |silu(g)| du + 4u|act| (silu' <= 1.1, dg, du the
    // gate / up dot bounds); each output adds the down dot's bound.
    for (int o = 0; o < H; ++o) {
      const float* wrow = wd[Z(e)].data() + Z(o) * Z(I);
      double tol = DotTol(I, AbsDot(a1.data(), wrow, I));
      for (int i = 0; i < I; ++i) {
        const double dg = DotTol(H, AbsDot(xr, wg[Z(e)].data() + Z(i) * Z(H), H));
        const double du = DotTol(H, AbsDot(xr, wu[Z(e)].data() + Z(i) * Z(H), H));
        const double da = 1.1 * dg * std::fabs(u1[Z(i)]) + std::fabs(cpu::Silu(g1[Z(i)])) * du +
                          4 * kU * std::fabs(a1[Z(i)]);
        tol += (da + 4 * kU * std::fabs(a1[Z(i)])) * std::fabs(wrow[i]);
      }
      ASSERT_NEAR(y1[Z(o)], want[Z(o)], tol) << s << " " << o;
    }
  }
  // Combine: the CPU's loop (o = 0; o += w_r * y_r in rank order), bitwise.
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) {
      float acc = 0.0f, want = 0.0f;
      for (int r = 0; r < k; ++r) {
        const std::size_t tr = Z(t * k + r);
        acc = km::CombineRank(acc, wts[tr], ranked[tr * Z(H) + Z(i)]);
        want += wts[tr] * ranked[tr * Z(H) + Z(i)];
      }
      ASSERT_EQ(km::FloatBits(acc), km::FloatBits(want));
    }
}

TEST(CudaKernelMath, SharedGateAddWithinBound) {
  const int H = 300;
  std::mt19937 rng(16);
  const FVec x = RandomVec(rng, Z(H)), gw = RandomVec(rng, Z(H)), sh = RandomVec(rng, Z(H)),
             out0 = RandomVec(rng, Z(H));
  const float gate_c = cpu::Sigmoid(cpu::Dot(x.data(), gw.data(), H));
  const float gate_g = km::Sigmoid(WarpDot(x.data(), gw.data(), H));
  // sigmoid' <= 1/4: the gate differs by <= DotTol / 4 plus a few roundings.
  const double dgate = 0.25 * DotTol(H, AbsDot(x.data(), gw.data(), H)) + 8 * kU;
  for (int i = 0; i < H; ++i) {
    const float want = out0[Z(i)] + gate_c * sh[Z(i)];
    const float got = km::SharedGateAddElem(out0[Z(i)], gate_g, sh[Z(i)]);
    ASSERT_NEAR(got, want, dgate * std::fabs(sh[Z(i)]) + 2 * kU * std::fabs(want));
    ASSERT_EQ(km::FloatBits(km::SharedGateAddElem(out0[Z(i)], gate_c, sh[Z(i)])),
              km::FloatBits(want));
  }
}

}  // namespace
}  // namespace lockstep::cuda
