// CudaOps: every launcher of engine/cuda/ops.h on a real GPU against the CPU ops (engine/cpu) and
// against the host emulation of its own arithmetic (engine/cuda/kernel_math.h), on random inputs.
// Every test skips (GTEST_SKIP) when no CUDA device is visible, so CI without a GPU reports them
// skipped, never passed.
//
// Expectations:
//   * bitwise: ops made only of +, *, /, sqrt and copies (RowsMatmul and the host emulation of
//     its lane order, cache stores and ScaleRows against KvCache, the q/gate split, the GDN
//     projection copies, grouping, the rank-order combine, Add / Scale / Embed); batch invariance
//     (RowsMatmul T=1 vs T=9, attention of one row alone vs in a window, an expert slot alone vs
//     in a batch); GdnRecurrent's verify form against its prefill form; the delta rule against the
//     CPU when every decay is exp(0) = 1 exactly.
//   * bounded: dot-product orders (the first-order bound DotTol of cuda_kernel_math_test.cpp) and
//     the device's expf / log1pf / sinf / cosf: within 2 ulp of exact (CUDA C Programming
//     Guide, "Mathematical Functions"; glibc's are within ~0.5 ulp), 1 ulp <= 2u relative with
//     u = 2^-24, so each use moves a result by up to ~5u, ~9u after silu's add and divide.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "cpu/gdn.h"
#include "cpu/matmul.h"
#include "cpu/moe.h"
#include "cpu/norm.h"
#include "cpu/rope.h"
#include "cuda/kernel_math.h"
#include "cuda/ops.h"
#include "gpu/require_gpu.h"
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

// Launch errors, then execution errors.
::testing::AssertionResult Sync() {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// Device array of n T's; freed on scope exit.
template <class T>
class Dev {
 public:
  explicit Dev(std::size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) != cudaSuccess)
      ADD_FAILURE() << "cudaMalloc";
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { Up(h); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p_); }
  T* get() const { return p_; }
  void Up(const std::vector<T>& h) {
    if (n_ > 0) cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Down() const {
    std::vector<T> h(n_);
    if (n_ > 0) cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

double NormRelTol(int n) { return (n / 32.0 + 24.0) * kU; }  // host test's bound + device silu
bool SameBits(const void* a, const void* b, std::size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

// Host emulation of one warp dot (kernel_math.h): the device must reproduce it bit for bit.
float WarpDot(const float* a, const float* b, int n) {
  float v[km::kWarp];
  for (int l = 0; l < km::kWarp; ++l) v[l] = km::LanePartial(a, b, n, l);
  return km::CombineLanes(v);
}

TEST(CudaOps, RowsMatmulMatchesEmulationCpuAndIsBatchInvariant) {
  LOCKSTEP_REQUIRE_GPU(1);
  std::mt19937 rng(1);
  for (int n_in : {389, 2048}) {  // scalar path (unaligned rows), float4 path
    const int n_out = 37, T = 9, ldy = 40;
    const FVec x = RandomVec(rng, Z(T) * Z(n_in)), W = RandomVec(rng, Z(n_out) * Z(n_in));
    Dev<float> dx(x), dW(W), dy(Z(T) * Z(ldy)), d1(Z(ldy));
    RowsMatmul(dx.get(), T, dW.get(), n_out, n_in, dy.get(), ldy, nullptr);
    ASSERT_TRUE(Sync());
    const FVec y = dy.Down();
    FVec yc(Z(T) * Z(n_out));
    cpu::Matmul(cpu::MatmulKind::kInvariant, x.data(), T, Mat{W.data(), n_out, n_in}, yc.data(),
                nullptr);
    for (int t = 0; t < T; ++t) {
      RowsMatmul(dx.get() + Z(t) * Z(n_in), 1, dW.get(), n_out, n_in, d1.get(), ldy, nullptr);
      ASSERT_TRUE(Sync());
      const FVec y1 = d1.Down();
      for (int o = 0; o < n_out; ++o) {
        const float got = y[Z(t) * Z(ldy) + Z(o)];
        const float* xr = x.data() + Z(t) * Z(n_in);
        const float* wr = W.data() + Z(o) * Z(n_in);
        ASSERT_EQ(km::FloatBits(y1[Z(o)]), km::FloatBits(got))
            << "T=1 vs T=9, t=" << t << " o=" << o;
        ASSERT_EQ(km::FloatBits(WarpDot(xr, wr, n_in)), km::FloatBits(got)) << "host emulation";
        ASSERT_NEAR(got, yc[Z(t) * Z(n_out) + Z(o)], DotTol(n_in, AbsDot(xr, wr, n_in)));
      }
    }
  }
}

TEST(CudaOps, NormsMatchCpu) {
  LOCKSTEP_REQUIRE_GPU(1);
  std::mt19937 rng(2);
  const int rows = 5, n = 260, ld = 264;
  const FVec x = RandomVec(rng, Z(rows) * Z(ld), -2.0f, 2.0f), w = RandomVec(rng, Z(n)),
             z = RandomVec(rng, Z(rows) * Z(n));
  Dev<float> dx(x), dw(w), dz(z), dg(Z(rows) * Z(n));
  RmsNormZc(dx.get(), ld, rows, n, dw.get(), 1e-6f, dx.get(), ld,
            nullptr);  // in place, strided rows
  GatedRmsNorm(dz.get(), dz.get(), rows, n, dw.get(), 1e-6f, dg.get(), nullptr);  // x = z = dz
  ASSERT_TRUE(Sync());
  const FVec y = dx.Down(), g = dg.Down();
  FVec yc(Z(n)), gc(Z(n));
  for (int r = 0; r < rows; ++r) {
    cpu::RmsNormZc(x.data() + Z(r) * Z(ld), n, w.data(), 1e-6f, yc.data());
    cpu::GatedRmsNorm(z.data() + Z(r) * Z(n), z.data() + Z(r) * Z(n), n, w.data(), 1e-6f,
                      gc.data());
    for (int i = 0; i < n; ++i) {
      ASSERT_NEAR(y[Z(r) * Z(ld) + Z(i)], yc[Z(i)], NormRelTol(n) * std::fabs(yc[Z(i)]));
      ASSERT_NEAR(g[Z(r) * Z(n) + Z(i)], gc[Z(i)], NormRelTol(n) * std::fabs(gc[Z(i)]));
    }
    for (int i = n; i < ld; ++i)
      ASSERT_EQ(y[Z(r) * Z(ld) + Z(i)], x[Z(r) * Z(ld) + Z(i)]);  // padding kept
  }
}

TEST(CudaOps, RopeMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU(1);
  const int R = 64, D = 256, heads = 4, T = 3, ld = heads * D + 8, p0 = 20000;
  const double theta = 1e7;
  cpu::Rope rope(R, theta);
  FVec inv(Z(R / 2));
  for (int i = 0; i < R / 2; ++i)
    inv[Z(i)] = 1.0f / std::pow(static_cast<float>(theta),
                                static_cast<float>(2 * i) / static_cast<float>(R));
  std::mt19937 rng(3);
  const FVec x = RandomVec(rng, Z(T) * Z(ld));
  Dev<float> dx(x), dinv(inv);
  RopeApply(dx.get(), T, ld, heads, D, R, dinv.get(), p0, nullptr);
  ASSERT_TRUE(Sync());
  const FVec g = dx.Down();
  FVec c = x;
  for (int t = 0; t < T; ++t) rope.Apply(c.data() + Z(t) * Z(ld), heads, D, p0 + t);
  // cos / sin differ by <= ~5u relative: a rotated value moves by <= ~8u (|a| + |b|).
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < D; ++i) {
        const std::size_t at = Z(t) * Z(ld) + Z(h) * Z(D) + Z(i);
        const int pair = i < R / 2 ? i + R / 2 : i - R / 2;
        const double mag = std::fabs(x[at]) + std::fabs(x[Z(t) * Z(ld) + Z(h) * Z(D) + Z(pair)]);
        if (i >= R) {
          ASSERT_EQ(km::FloatBits(g[at]), km::FloatBits(x[at]));
        } else {
          ASSERT_NEAR(g[at], c[at], 16 * kU * mag) << t << " " << h << " " << i;
        }
      }
}

// KvStore / KvScaleRows / Attention against KvCache and cpu::AttendGroup for one cache dtype and
// context split (0: none; 64: every row of the window in 5 blocks and the combine) and head_dim
// (a multiple of 4 takes the one-load-per-4-elements path, others the scalar loads) at position p.
void CheckAttention(DType dt, int kv_dtype, int split = 0, int D = 256, int p = 300) {
  const int hq = 6, hkv = 2, group = hq / hkv, T = 4, rows = p + T, n_ctx_max = rows + 5;
  std::mt19937 rng(4 + static_cast<unsigned>(kv_dtype));
  const FVec k = RandomVec(rng, Z(rows) * Z(hkv) * Z(D), -2.0f, 2.0f),
             v = RandomVec(rng, Z(rows) * Z(hkv) * Z(D));
  const FVec q = RandomVec(rng, Z(T) * Z(hq) * Z(D), -2.0f, 2.0f);
  const std::size_t elem = kv_dtype == 0   ? 4
                           : kv_dtype == 1 ? 2
                                           : 1,
                    row_bytes = Z(hkv) * Z(D) * elem;
  KvCache cache(hkv, D, dt, 128);
  cache.Write(0, rows, k.data(), v.data());
  Dev<float> dk(k), dv(v), dq(q), dks(Z(rows) * Z(hkv)), dvs(Z(rows) * Z(hkv));
  Dev<std::uint8_t> kc(Z(rows) * row_bytes), vc(Z(rows) * row_bytes);
  float* ks = kv_dtype == 2 ? dks.get() : nullptr;
  float* vs = kv_dtype == 2 ? dvs.get() : nullptr;
  // Two stores (rows [0, 100) then [100, rows)): row bits must not depend on where they split.
  KvStore(dk.get(), dv.get(), 100, 0, hkv, D, kv_dtype, kc.get(), vc.get(), ks, vs, nullptr);
  KvStore(dk.get() + 100 * Z(hkv) * Z(D), dv.get() + 100 * Z(hkv) * Z(D), rows - 100, 100, hkv, D,
          kv_dtype, kc.get(), vc.get(), ks, vs, nullptr);
  ASSERT_TRUE(Sync());
  {
    const auto hk = kc.Down(), hv = vc.Down();
    const FVec hks = dks.Down(), hvs = dvs.Down();
    for (int r = 0; r < rows; ++r) {
      ASSERT_TRUE(SameBits(hk.data() + Z(r) * row_bytes, cache.KRaw(r), row_bytes))
          << "K row " << r;
      ASSERT_TRUE(SameBits(hv.data() + Z(r) * row_bytes, cache.VRaw(r), row_bytes))
          << "V row " << r;
      if (kv_dtype == 2) {
        ASSERT_TRUE(SameBits(hks.data() + Z(r) * Z(hkv), cache.KScales(r), Z(hkv) * 4)) << r;
        ASSERT_TRUE(SameBits(hvs.data() + Z(r) * Z(hkv), cache.VScales(r), Z(hkv) * 4)) << r;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const std::size_t n_scratch = AttentionScratchFloats(T, hq, D, n_ctx_max, split),
                    n_row = AttentionScratchFloats(1, hq, D, n_ctx_max, split);
  ASSERT_EQ(n_scratch, Z(T) * n_row);
  Dev<float> scratch(std::max<std::size_t>(1, n_scratch)), dout(Z(T) * Z(hq) * Z(D)),
      dlast(Z(hq) * Z(D)), drows(Z(T) * Z(hq) * Z(D));
  Attention(dq.get(), T, p, hq, hkv, D, kv_dtype, kc.get(), vc.get(), ks, vs, scale, n_ctx_max,
            split, scratch.get(), n_scratch, dout.get(), nullptr);
  // The window's last row alone (T = 1 at position p + T - 1): identical bits.
  Attention(dq.get() + Z(T - 1) * Z(hq) * Z(D), 1, p + T - 1, hq, hkv, D, kv_dtype, kc.get(),
            vc.get(), ks, vs, scale, n_ctx_max, split, scratch.get(), n_row, dlast.get(), nullptr);
  // Scratch for one row: the launcher runs the window one row per launch, with identical bits.
  Attention(dq.get(), T, p, hq, hkv, D, kv_dtype, kc.get(), vc.get(), ks, vs, scale, n_ctx_max,
            split, scratch.get(), std::max<std::size_t>(1, n_row), drows.get(), nullptr);
  ASSERT_TRUE(Sync());
  const FVec o = dout.Down(), last = dlast.Down(), by_rows = drows.Down();
  ASSERT_TRUE(SameBits(last.data(), o.data() + Z(T - 1) * Z(hq) * Z(D), Z(hq) * Z(D) * 4));
  ASSERT_TRUE(SameBits(by_rows.data(), o.data(), o.size() * 4));
  FVec sc(Z(group) * Z(rows)), tmp(2 * Z(D)), oc(Z(group) * Z(D)), kr(Z(D));
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < hkv; ++j) {
      const int n_ctx = p + t + 1;
      const float* qg = q.data() + (Z(t) * Z(hq) + Z(j * group)) * Z(D);
      cpu::AttendGroup(qg, group, j, cache, n_ctx, scale, oc.data(), sc.data(), tmp.data());
      // sum_u p_u |v_u[i]| per (head, dim), with each V row dequantised once.
      std::vector<double> pv(Z(group) * Z(D), 0.0);
      for (int u = 0; u < n_ctx; ++u) {
        const float* vv = cache.V(u, j, kr.data());
        for (int gi = 0; gi < group; ++gi)
          for (int i = 0; i < D; ++i)
            pv[Z(gi) * Z(D) + Z(i)] +=
                static_cast<double>(sc[Z(gi) * Z(n_ctx) + Z(u)]) * std::fabs(vv[i]);
      }
      const int n_blocks = split > 0 && n_ctx > split ? (n_ctx + split - 1) / split : 1;
      for (int gi = 0; gi < group; ++gi) {
        // The host test's bound, with the device expf's 2 ulp.
        double ds = 0.0;
        for (int u = 0; u < n_ctx; ++u) {
          const float* kk = cache.K(u, j, kr.data());
          const double s = cpu::Dot(qg + Z(gi) * Z(D), kk, D) * static_cast<double>(scale);
          ds = std::max(
              ds, DotTol(D, AbsDot(qg + Z(gi) * Z(D), kk, D)) * scale + 2 * kU * std::fabs(s));
        }
        for (int i = 0; i < D; ++i) {
          const double tol = AttentionTol(ds, n_ctx, n_blocks, pv[Z(gi) * Z(D) + Z(i)], 4.0);
          ASSERT_NEAR(o[(Z(t) * Z(hq) + Z(j * group + gi)) * Z(D) + Z(i)], oc[Z(gi) * Z(D) + Z(i)],
                      tol)
              << "split " << split << " t=" << t << " head " << j * group + gi << " dim " << i;
        }
      }
    }
  // Fault injection: V rows [p, p + T) scaled on both sides.
  cache.ScaleRows(1, p, T, 1.5f);
  KvScaleRows(1, p, T, hkv, D, kv_dtype, kc.get(), vc.get(), ks, vs, 1.5f, nullptr);
  ASSERT_TRUE(Sync());
  const auto hv = vc.Down();
  const FVec hvs = dvs.Down();
  for (int r = p; r < rows; ++r) {
    ASSERT_TRUE(SameBits(hv.data() + Z(r) * row_bytes, cache.VRaw(r), row_bytes))
        << "scaled V row " << r;
    if (kv_dtype == 2) {
      ASSERT_TRUE(SameBits(hvs.data() + Z(r) * Z(hkv), cache.VScales(r), Z(hkv) * 4));
    }
  }
}

TEST(CudaOps, AttentionF32Cache) {
  LOCKSTEP_REQUIRE_GPU(1);
  CheckAttention(DType::kF32, 0);
}
TEST(CudaOps, AttentionBf16Cache) {
  LOCKSTEP_REQUIRE_GPU(1);
  CheckAttention(DType::kBF16, 1);
}
TEST(CudaOps, AttentionInt8Cache) {
  LOCKSTEP_REQUIRE_GPU(1);
  CheckAttention(DType::kI8, 2);
}

// Split-context attention (EngineConfig::cuda_attn_split, 512 by default; 64 here so the blocks
// are few and short):
// within the CPU bound for every cache dtype, a window's row bitwise the row alone.
TEST(CudaOps, AttentionSplitContext) {
  LOCKSTEP_REQUIRE_GPU(1);
  CheckAttention(DType::kF32, 0, 64);
  CheckAttention(DType::kBF16, 1, 64);
  CheckAttention(DType::kI8, 2, 64);
  CheckAttention(DType::kBF16, 1, 64, 30);  // scalar loads
  CheckAttention(DType::kF32, 0, 0, 30);
  // A split past what shared memory holds (4096 positions): scores in global scratch, with the
  // partials after them; rows of 4201..4204 positions in two blocks.
  ASSERT_GT(AttentionScratchFloats(1, 6, 64, 4209, 4100), 6u * 4209u);
  CheckAttention(DType::kF32, 0, 4100, 64, 4200);
}

// Rows on both sides of the split (n_ctx 62..67 with split 64) in one window: each row bitwise the
// row attended alone; the rows that fit in one split bitwise the unsplit launch; a split at or
// past n_ctx_max launches no splits and gives the unsplit bits; the longer rows differ from the
// unsplit ones (the combine's order), so the split path did run.
TEST(CudaOps, AttentionSplitBoundaryIsBatchInvariant) {
  LOCKSTEP_REQUIRE_GPU(1);
  const int hq = 4, hkv = 2, D = 64, p = 61, T = 6, rows = p + T, n_ctx_max = 80, split = 64;
  std::mt19937 rng(31);
  const FVec k = RandomVec(rng, Z(rows) * Z(hkv) * Z(D), -2.0f, 2.0f),
             v = RandomVec(rng, Z(rows) * Z(hkv) * Z(D));
  const FVec q = RandomVec(rng, Z(T) * Z(hq) * Z(D), -2.0f, 2.0f);
  Dev<float> dk(k), dv(v), dq(q);
  Dev<std::uint8_t> kc(Z(rows) * Z(hkv) * Z(D) * 4), vc(Z(rows) * Z(hkv) * Z(D) * 4);
  KvStore(dk.get(), dv.get(), rows, 0, hkv, D, 0, kc.get(), vc.get(), nullptr, nullptr, nullptr);
  const float scale = 0.125f;
  ASSERT_EQ(AttentionSplits(n_ctx_max, split), 2);
  ASSERT_EQ(AttentionSplits(n_ctx_max, n_ctx_max), 1);
  // No global scratch when the split bounds the scores (shared memory) and nothing is split.
  ASSERT_EQ(AttentionScratchFloats(T, hq, D, n_ctx_max, n_ctx_max), 0u);
  ASSERT_GT(AttentionScratchFloats(T, hq, D, n_ctx_max, 0), Z(T) * Z(hq) * Z(n_ctx_max) - 1);
  auto run = [&](int t0, int nt, int sp) {
    const std::size_t n = AttentionScratchFloats(nt, hq, D, n_ctx_max, sp);
    Dev<float> out(Z(nt) * Z(hq) * Z(D)), scratch(std::max<std::size_t>(1, n));
    Attention(dq.get() + Z(t0) * Z(hq) * Z(D), nt, p + t0, hq, hkv, D, 0, kc.get(), vc.get(),
              nullptr, nullptr, scale, n_ctx_max, sp, scratch.get(), n, out.get(), nullptr);
    EXPECT_TRUE(Sync());
    return out.Down();
  };
  const FVec window = run(0, T, split), whole = run(0, T, 0), past = run(0, T, n_ctx_max);
  const std::size_t row = Z(hq) * Z(D);
  ASSERT_TRUE(SameBits(past.data(), whole.data(), Z(T) * row * 4));
  for (int t = 0; t < T; ++t) {
    const FVec alone = run(t, 1, split);
    ASSERT_TRUE(SameBits(alone.data(), window.data() + Z(t) * row, row * 4)) << "row " << t;
    const bool fits = p + t + 1 <= split;
    EXPECT_EQ(SameBits(window.data() + Z(t) * row, whole.data() + Z(t) * row, row * 4), fits)
        << "row " << t << " (n_ctx " << p + t + 1 << ")";
  }
}

// Blocks of several query heads of one kv head (each K / V element loaded once for all of them)
// give bitwise the one-head blocks' output: for 2, 4 and 8 heads per block, every cache dtype,
// scores in shared memory (split 64) and in global scratch (split 0), whole rows and split ones.
// Grouped blocks use the 4-element loads only: D = 30 stays one head per block.
TEST(CudaOps, AttentionGroupedHeadsAreBitwiseOneHeadPerBlock) {
  LOCKSTEP_REQUIRE_GPU(1);
  const int p = 90, T = 3, rows = p + T, n_ctx_max = 100;
  std::mt19937 rng(41);
  for (int hq : {4, 8, 16})
    for (int D : {64, 30})
      for (int kv_dtype : {0, 1, 2})
        for (int split : {0, 64}) {
          const int hkv = 2;
          const std::string where = "hq " + std::to_string(hq) + " D " + std::to_string(D) +
                                    " kv " + std::to_string(kv_dtype) + " split " +
                                    std::to_string(split);
          const int kg = D % 4 == 0 ? hq / hkv : 1;
          ASSERT_EQ(AttentionHeadsPerBlock(hq, hkv, D, n_ctx_max, split, AttnHeads::kGrouped), kg)
              << where;
          ASSERT_EQ(AttentionHeadsPerBlock(hq, hkv, D, n_ctx_max, split, AttnHeads::kOne), 1);
          // Auto groups only the launches that split rows.
          ASSERT_EQ(AttentionHeadsPerBlock(hq, hkv, D, n_ctx_max, split, AttnHeads::kAuto),
                    split > 0 ? kg : 1);
          const std::size_t elem = kv_dtype == 0 ? 4 : kv_dtype == 1 ? 2 : 1;
          const FVec k = RandomVec(rng, Z(rows) * Z(hkv) * Z(D), -2.0f, 2.0f),
                     v = RandomVec(rng, Z(rows) * Z(hkv) * Z(D));
          const FVec q = RandomVec(rng, Z(T) * Z(hq) * Z(D), -2.0f, 2.0f);
          Dev<float> dk(k), dv(v), dq(q), ks(Z(rows) * Z(hkv)), vs(Z(rows) * Z(hkv));
          Dev<std::uint8_t> kc(Z(rows) * Z(hkv) * Z(D) * elem), vc(Z(rows) * Z(hkv) * Z(D) * elem);
          float* kss = kv_dtype == 2 ? ks.get() : nullptr;
          float* vss = kv_dtype == 2 ? vs.get() : nullptr;
          KvStore(dk.get(), dv.get(), rows, 0, hkv, D, kv_dtype, kc.get(), vc.get(), kss, vss,
                  nullptr);
          const std::size_t n = AttentionScratchFloats(T, hq, D, n_ctx_max, split);
          Dev<float> scratch(std::max<std::size_t>(1, n)), one(Z(T) * Z(hq) * Z(D)),
              grouped(Z(T) * Z(hq) * Z(D));
          for (auto [heads, out] : {std::pair{AttnHeads::kOne, one.get()},
                                    std::pair{AttnHeads::kGrouped, grouped.get()}})
            Attention(dq.get(), T, p, hq, hkv, D, kv_dtype, kc.get(), vc.get(), kss, vss, 0.2f,
                      n_ctx_max, split, scratch.get(), n, out, nullptr, heads);
          ASSERT_TRUE(Sync());
          const FVec a = one.Down(), b = grouped.Down();
          ASSERT_TRUE(SameBits(a.data(), b.data(), a.size() * 4)) << where;
        }
}

// The attention scratch of a long-context prefill chunk stays within the launcher's 64 MiB budget
// (rows run in groups). The scale: a 2048-row chunk at 130,658 positions, 16 query heads
// of 256 (unbounded, its scores alone were 2048 * 16 * 130658 floats, 16 GiB).
TEST(CudaOps, AttentionScratchIsBoundedAtLongContext) {
  LOCKSTEP_REQUIRE_GPU(1);
  const std::size_t budget = std::size_t{16} << 20;
  for (int split : {512, 0, 100000})
    for (int n_ctx : {4096, 130658, 1 << 20}) {
      const std::size_t n = AttentionScratchFloats(2048, 16, 256, n_ctx, split);
      const std::size_t one = AttentionScratchFloats(1, 16, 256, n_ctx, split);
      EXPECT_LE(n, std::max(budget, one)) << "split " << split << " n_ctx " << n_ctx;
      EXPECT_GE(n, one);
      EXPECT_EQ(n % one, 0u) << "whole rows";
    }
  // A decode window that fits is one launch: all T rows' scratch.
  EXPECT_EQ(AttentionScratchFloats(9, 16, 256, 4096, 512),
            9 * AttentionScratchFloats(1, 16, 256, 4096, 512));
}

TEST(CudaOps, SplitQGateCopiesBitwise) {
  LOCKSTEP_REQUIRE_GPU(1);
  const int T = 3, hq = 5, D = 36;
  std::mt19937 rng(8);
  const FVec qg = RandomVec(rng, Z(T) * Z(hq) * 2 * Z(D));
  Dev<float> dqg(qg), dq(Z(T * hq * D)), dg(Z(T * hq * D));
  SplitQGate(dqg.get(), T, hq, D, dq.get(), dg.get(), nullptr);
  ASSERT_TRUE(Sync());
  const FVec q = dq.Down(), g = dg.Down();
  for (int th = 0; th < T * hq; ++th) {
    ASSERT_TRUE(SameBits(q.data() + Z(th) * Z(D), qg.data() + Z(2 * th) * Z(D), Z(D) * 4));
    ASSERT_TRUE(SameBits(g.data() + Z(th) * Z(D), qg.data() + Z(2 * th + 1) * Z(D), Z(D) * 4));
  }
}

TEST(CudaOps, GdnPipelineMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU(1);
  const int hk = 2, hv = 4, r = hv / hk, dk = 128, dv = 96, K = 4, T = 7;
  const int key_dim = hk * dk, conv_dim = 2 * key_dim + hv * dv, qkvz = 2 * key_dim + 2 * hv * dv;
  const int wg = 2 * dk + 2 * r * dv;
  const std::size_t s_head = Z(dk) * Z(dv), s_all = Z(hv) * s_head;
  std::mt19937 rng(9);
  const FVec P = RandomVec(rng, Z(T) * Z(qkvz)), B = RandomVec(rng, Z(T) * Z(2 * hv), -3.0f, 3.0f);
  const FVec a_log = RandomVec(rng, Z(hv)), dt_bias = RandomVec(rng, Z(hv)),
             conv_w = RandomVec(rng, Z(conv_dim) * Z(K));
  FVec win(Z(K - 1 + T) * Z(conv_dim));
  const FVec state = RandomVec(rng, Z(K - 1) * Z(conv_dim));
  std::copy(state.begin(), state.end(), win.begin());  // the host reference's window
  // The device window starts as zeros: GdnSplit copies the state into rows [0, K-1).
  Dev<float> dP(P), dB(B), dal(a_log), ddt(dt_bias), dstate(state), dwin(FVec(win.size(), 0.0f)),
      dZ(Z(T * hv * dv)), dbeta(Z(T * hv)), dg(Z(T * hv));
  Dev<float> dcw(conv_w), dU(Z(T) * Z(conv_dim)), dq(Z(T * hk * dk)), dkh(Z(T * hk * dk));
  GdnSplit(dP.get(), dB.get(), T, hk, hv, dk, dv, K, dal.get(), ddt.get(), dstate.get(), dwin.get(),
           dZ.get(), dbeta.get(), dg.get(), nullptr);
  Dev<float> dU2(Z(T) * Z(conv_dim)), dcs(Z(T) * Z(K - 1) * Z(conv_dim));
  CausalConvSilu(dwin.get(), T, conv_dim, K, dcw.get(), dU.get(), nullptr);
  CausalConvSilu(dwin.get(), T, conv_dim, K, dcw.get(), dU2.get(), nullptr,
                 dcs.get());  // + conv states
  GdnQkNorm(dU.get(), T, hk, dk, conv_dim, dq.get(), dkh.get(), nullptr);
  ASSERT_TRUE(Sync());
  {
    // The verify form's conv states: block t is window rows [t+1, t+K), copied; U is unchanged.
    const FVec U1 = dU.Down(), U2 = dU2.Down(), cs = dcs.Down(), w = dwin.Down();
    ASSERT_TRUE(SameBits(U1.data(), U2.data(), U1.size() * 4));
    for (int t = 0; t < T; ++t)
      ASSERT_TRUE(SameBits(cs.data() + Z(t) * Z(K - 1) * Z(conv_dim),
                           w.data() + Z(t + 1) * Z(conv_dim), Z(K - 1) * Z(conv_dim) * 4))
          << "conv state after step " << t;
  }
  const FVec gwin = dwin.Down(), gZ = dZ.Down(), gbeta = dbeta.Down(), gg = dg.Down(),
             gU = dU.Down();
  const FVec gq = dq.Down(), gk = dkh.Down();
  ASSERT_TRUE(SameBits(gwin.data(), state.data(), state.size() * 4))
      << "conv state rows of the window";
  // Split: copies bitwise (the CPU's loop, transcribed); gates within the device exp / log1p ulps.
  for (int t = 0; t < T; ++t)
    for (int gi = 0; gi < hk; ++gi) {
      const float* grp = P.data() + Z(t) * Z(qkvz) + Z(gi) * Z(wg);
      const float* x = gwin.data() + Z(K - 1 + t) * Z(conv_dim);
      ASSERT_TRUE(SameBits(x + gi * dk, grp, Z(dk) * 4));
      ASSERT_TRUE(SameBits(x + key_dim + gi * dk, grp + dk, Z(dk) * 4));
      for (int i = 0; i < r; ++i) {
        const int j = gi * r + i;
        ASSERT_TRUE(SameBits(x + 2 * key_dim + j * dv, grp + 2 * dk + i * dv, Z(dv) * 4));
        ASSERT_TRUE(
            SameBits(gZ.data() + Z(t * hv + j) * Z(dv), grp + 2 * dk + r * dv + i * dv, Z(dv) * 4));
        const float bb = B[Z(t * 2 * hv + gi * 2 * r + i)],
                    aa = B[Z(t * 2 * hv + gi * 2 * r + r + i)];
        const float beta_c = cpu::Sigmoid(bb),
                    g_c = -std::exp(a_log[Z(j)]) * cpu::Softplus(aa + dt_bias[Z(j)]);
        ASSERT_NEAR(gbeta[Z(t * hv + j)], beta_c, 16 * kU * beta_c);
        ASSERT_NEAR(gg[Z(t * hv + j)], g_c, 32 * kU * std::fabs(g_c));  // exp, exp, log1p
      }
    }
  ASSERT_TRUE(
      SameBits(gwin.data(), state.data(), state.size() * 4));  // the conv state rows untouched
  // Conv: the CPU op on the device's window; only silu's expf differs.
  FVec Uc(Z(T) * Z(conv_dim));
  cpu::CausalConvSilu(gwin.data(), T, conv_dim, K, conv_w.data(), Uc.data());
  for (std::size_t i = 0; i < Uc.size(); ++i) {
    double mag = 0.0;  // |silu(s)| <= |s|: bound by the conv's own magnitude
    const int t = static_cast<int>(i / Z(conv_dim)), ch = static_cast<int>(i % Z(conv_dim));
    for (int j = 0; j < K; ++j)
      mag += std::fabs(conv_w[Z(ch * K + j)] * gwin[Z((t + j) * conv_dim + ch)]);
    ASSERT_NEAR(gU[i], Uc[i], 8 * kU * (std::fabs(Uc[i]) + mag));
  }
  // q / k norms on the device's U.
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int t = 0; t < T; ++t)
    for (int gi = 0; gi < hk; ++gi)
      for (int is_k = 0; is_k < 2; ++is_k) {
        const float* x = gU.data() + Z(t) * Z(conv_dim) + Z(is_k * key_dim + gi * dk);
        FVec c(x, x + dk);
        cpu::L2NormInPlace(c.data(), dk, 1e-6f);
        const float* got = (is_k ? gk : gq).data() + (Z(t) * Z(hk) + Z(gi)) * Z(dk);
        for (int i = 0; i < dk; ++i) {
          const float want = is_k ? c[Z(i)] : c[Z(i)] * qscale;
          ASSERT_NEAR(got[i], want, NormRelTol(dk) * std::fabs(want));
        }
      }
  // Recurrence: verify form vs prefill form (bitwise); vs the CPU steps, bitwise on the heads
  // whose decays are all exp(0) = 1, within a bound elsewhere (alpha within ~3 ulp).
  FVec g = RandomVec(rng, Z(T * hv), -1.0f, 0.0f);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < hv; j += 2) g[Z(t * hv + j)] = 0.0f;
  const FVec beta = RandomVec(rng, Z(T * hv), 0.0f, 1.0f), S0 = RandomVec(rng, s_all, -0.5f, 0.5f);
  Dev<float> dS(S0), dS2(S0), dsteps(Z(T) * s_all), dO(Z(T * hv * dv)), dO2(Z(T * hv * dv)), dgg(g),
      dbb(beta);
  GdnRecurrent(dS.get(), dsteps.get(), dq.get(), dkh.get(), dU.get(), dgg.get(), dbb.get(), T, hk,
               hv, dk, dv, conv_dim, dO.get(), nullptr);
  GdnRecurrent(dS2.get(), nullptr, dq.get(), dkh.get(), dU.get(), dgg.get(), dbb.get(), T, hk, hv,
               dk, dv, conv_dim, dO2.get(), nullptr);
  ASSERT_TRUE(Sync());
  const FVec steps = dsteps.Down(), O = dO.Down(), O2 = dO2.Down(), S_after = dS.Down(),
             S_in_place = dS2.Down();
  ASSERT_TRUE(SameBits(S_after.data(), S0.data(), s_all * 4)) << "verify form must not touch S0";
  ASSERT_TRUE(SameBits(S_in_place.data(), steps.data() + Z(T - 1) * s_all, s_all * 4));
  ASSERT_TRUE(SameBits(O.data(), O2.data(), O.size() * 4));
  std::vector<float> S = S0;
  FVec oc(Z(dv));
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < hv; ++j) {
      float* Sj = S.data() + Z(j) * s_head;
      const std::size_t th = Z(t * hv + j), tg = (Z(t * hk) + Z(j / r)) * Z(dk);
      cpu::GatedDeltaStep(Sj, gq.data() + tg, gk.data() + tg,
                          gU.data() + Z(t) * Z(conv_dim) + Z(2 * key_dim + j * dv), std::exp(g[th]),
                          beta[th], dk, dv, oc.data());
      const float* og = O.data() + th * Z(dv);
      const float* sg = steps.data() + Z(t) * s_all + Z(j) * s_head;
      if (j % 2 == 0) {
        ASSERT_TRUE(SameBits(og, oc.data(), Z(dv) * 4)) << "t=" << t << " head " << j;
        ASSERT_TRUE(SameBits(sg, Sj, s_head * 4)) << "t=" << t << " head " << j;
      } else {
        // alpha differs by <= ~4u per step; (I - beta k k^T) with |k| = 1 is a contraction, so a
        // state column's error stays <= sum_t 4u |S_col|_2 (+ roundings): ~1e-5 for 7 steps and
        // |S_col|_2 <= ~6. 5e-5 leaves headroom; a layout error is O(1).
        for (int c = 0; c < dv; ++c)
          ASSERT_NEAR(og[c], oc[Z(c)], 5e-5 * (1.0 + std::fabs(oc[Z(c)])));
        for (std::size_t e = 0; e < s_head; ++e)
          ASSERT_NEAR(sg[e], Sj[e], 5e-5 * (1.0 + std::fabs(Sj[e])));
      }
    }
}

// The held-column recurrence (registers, Dk in {16, 32, 64, 128}) is bitwise the generic
// kernel: outputs, every verify step's state and the in-place state, across Dv that are not a
// multiple of the one-warp block (idle threads), several value heads per key head, and T = 1
// (decode) and 9 (a verify window); and so is the held form that l2-normalises q / k from U
// itself (qh = kh = nullptr, the engine's verify path) against GdnQkNorm's qh / kh. Dk = 48 has
// no held form: kAuto is the generic kernel.
TEST(CudaOps, GdnRecurrentHeldColumnsAreBitwiseTheGenericForm) {
  LOCKSTEP_REQUIRE_GPU(1);
  struct Case {
    int hk, hv, dk, dv, T;
  };
  const Case cases[] = {{2, 4, 16, 16, 9}, {1, 3, 32, 40, 9},   {2, 4, 64, 64, 1},
                        {2, 4, 64, 96, 9}, {2, 6, 128, 130, 9}, {1, 2, 128, 128, 1},
                        {2, 2, 48, 40, 9}};
  std::mt19937 rng(31);
  for (const Case& cs : cases) {
    const std::string where = "dk=" + std::to_string(cs.dk) + " dv=" + std::to_string(cs.dv) +
                              " hv=" + std::to_string(cs.hv) + " T=" + std::to_string(cs.T);
    SCOPED_TRACE(where);
    const bool held = cs.dk != 48;
    EXPECT_EQ(GdnRecurrentHoldsColumns(cs.dk), held);
    const int key_dim = cs.hk * cs.dk, conv_dim = 2 * key_dim + cs.hv * cs.dv;
    const std::size_t s_all = Z(cs.hv) * Z(cs.dk) * Z(cs.dv), n_o = Z(cs.T * cs.hv * cs.dv),
                      n_qk = Z(cs.T * cs.hk) * Z(cs.dk);
    const FVec Uv = RandomVec(rng, Z(cs.T) * Z(conv_dim)),
               g = RandomVec(rng, Z(cs.T * cs.hv), -1.0f, 0.0f),
               beta = RandomVec(rng, Z(cs.T * cs.hv), 0.0f, 1.0f),
               S0 = RandomVec(rng, s_all, -0.5f, 0.5f);
    const Dev<float> dU(Uv), dg(g), db(beta), dq(n_qk), dk(n_qk);
    GdnQkNorm(dU.get(), cs.T, cs.hk, cs.dk, conv_dim, dq.get(), dk.get(),
              nullptr);     // unit q / k rows
    std::vector<FVec> out;  // per form: O, steps, O in place, S in place
    struct Form {
      GdnBlocks blocks;
      bool qk_from_u;
    };
    std::vector<Form> forms = {{GdnBlocks::kAuto, false}, {GdnBlocks::kOnePerHead, false}};
    if (held) forms.push_back({GdnBlocks::kAuto, true});
    for (const Form& f : forms) {
      Dev<float> dS(S0), dSi(S0), dsteps(Z(cs.T) * s_all), dO(n_o), dOi(n_o);
      const float* q = f.qk_from_u ? nullptr : dq.get();
      const float* k = f.qk_from_u ? nullptr : dk.get();
      GdnRecurrent(dS.get(), dsteps.get(), q, k, dU.get(), dg.get(), db.get(), cs.T, cs.hk, cs.hv,
                   cs.dk, cs.dv, conv_dim, dO.get(), nullptr, f.blocks);
      GdnRecurrent(dSi.get(), nullptr, q, k, dU.get(), dg.get(), db.get(), cs.T, cs.hk, cs.hv,
                   cs.dk, cs.dv, conv_dim, dOi.get(), nullptr, f.blocks);
      ASSERT_TRUE(Sync());
      const FVec S_after = dS.Down();
      ASSERT_TRUE(SameBits(S_after.data(), S0.data(), s_all * 4))
          << "verify form must not touch S0";
      for (const FVec& v : {dO.Down(), dsteps.Down(), dOi.Down(), dSi.Down()}) out.push_back(v);
    }
    const char* names[] = {"outputs", "step states", "in-place outputs", "in-place state"};
    for (std::size_t f = 1; f < forms.size(); ++f)
      for (std::size_t i = 0; i < 4; ++i)
        EXPECT_TRUE(SameBits(out[i].data(), out[4 * f + i].data(), out[i].size() * 4))
            << names[i] << " of form " << f
            << (forms[f].qk_from_u ? " (q / k normalised inside)" : "");
    // The state moved (a kernel that wrote nothing would be bitwise equal to another).
    EXPECT_FALSE(SameBits(out[3].data(), S0.data(), s_all * 4));
    EXPECT_TRUE(SameBits(out[3].data(), out[1].data() + Z(cs.T - 1) * s_all, s_all * 4))
        << "last step";
  }
}

// Runs routing, grouping and the experts for tokens x [T, H] on the device; returns ranked
// [T*k, H]. gate/up/down: device pointer arrays [E].
FVec RunExperts(const FVec& x, const FVec& logits, int T, int E, int k, int H, int I,
                const void* const* gate, const void* const* up, const void* const* down,
                std::vector<int>* idx_out, FVec* wts_out, bool bf16 = false) {
  Dev<float> dx(x), dl(logits), dw(Z(T * k)), dact(Z(T * k) * Z(I)), dr(Z(T * k) * Z(H));
  Dev<int> didx(Z(T * k)), dslot(Z(T * k)), dfirst(Z(E) + 1), dact_e(Z(T * k)), dna(1);
  // The ids also go to host-mapped pinned memory (the engine's expert counters read them there).
  int* mirror = nullptr;
  EXPECT_EQ(
      cudaHostAlloc(reinterpret_cast<void**>(&mirror), Z(T * k) * sizeof(int), cudaHostAllocMapped),
      cudaSuccess);
  RouteTopK(dl.get(), T, E, k, true, didx.get(), dw.get(), mirror, nullptr);
  GroupByExpert(didx.get(), T, k, E, dslot.get(), dfirst.get(), dact_e.get(), dna.get(), nullptr);
  ExpertGateUp(dx.get(), H, I, k, dslot.get(), dfirst.get(), dact_e.get(), dna.get(), T * k, gate,
               up, bf16, dact.get(), nullptr);
  ExpertDown(dact.get(), H, I, dslot.get(), dfirst.get(), dact_e.get(), dna.get(), T * k, down,
             bf16, dr.get(), nullptr);
  EXPECT_TRUE(Sync());
  *idx_out = didx.Down();
  *wts_out = dw.Down();
  EXPECT_EQ(std::vector<int>(mirror, mirror + T * k), *idx_out) << "host-mapped routing ids";
  cudaFreeHost(mirror);
  // Grouping: the CPU's expert-major slot order, bitwise.
  const std::vector<int> slot = dslot.Down(), first = dfirst.Down(), active = dact_e.Down(),
                         na = dna.Down();
  std::vector<int> want_slot, want_active;
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(first[Z(e)], static_cast<int>(want_slot.size()));
    for (int s = 0; s < T * k; ++s)
      if ((*idx_out)[Z(s)] == e) want_slot.push_back(s);
    if (static_cast<int>(want_slot.size()) > first[Z(e)]) want_active.push_back(e);
  }
  EXPECT_EQ(slot, want_slot);
  EXPECT_EQ(na[0], static_cast<int>(want_active.size()));
  for (int a = 0; a < T * k; ++a) EXPECT_EQ(active[Z(a)], a < na[0] ? want_active[Z(a)] : -1);
  return dr.Down();
}

TEST(CudaOps, MoeMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU(1);
  const int T = 5, E = 16, k = 4, H = 256, I = 96;
  std::mt19937 rng(10);
  const FVec x = RandomVec(rng, Z(T) * Z(H));
  // Distinct, well-separated logits per token, so the device's expf cannot reorder experts.
  FVec logits(Z(T * E));
  for (int t = 0; t < T; ++t) {
    std::vector<int> perm(Z(E));
    for (int e = 0; e < E; ++e) perm[Z(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int e = 0; e < E; ++e) logits[Z(t * E + e)] = 0.1f * static_cast<float>(perm[Z(e)]);
  }
  std::vector<FVec> wg(Z(E)), wu(Z(E)), wd(Z(E));
  std::vector<std::unique_ptr<Dev<float>>> dev_w;
  std::vector<const void*> pg(Z(E)), pu(Z(E)), pd(Z(E));
  float* mapped = nullptr;  // expert 0's gate in host-mapped pinned memory (read over PCIe)
  for (int e = 0; e < E; ++e) {
    wg[Z(e)] = RandomVec(rng, Z(I) * Z(H));
    wu[Z(e)] = RandomVec(rng, Z(I) * Z(H));
    wd[Z(e)] = RandomVec(rng, Z(H) * Z(I));
    for (const FVec* w : {&wg[Z(e)], &wu[Z(e)], &wd[Z(e)]})
      dev_w.push_back(std::make_unique<Dev<float>>(*w));
    pg[Z(e)] = dev_w[dev_w.size() - 3]->get();
    pu[Z(e)] = dev_w[dev_w.size() - 2]->get();
    pd[Z(e)] = dev_w[dev_w.size() - 1]->get();
  }
  if (cudaHostAlloc(reinterpret_cast<void**>(&mapped), wg[0].size() * 4, cudaHostAllocMapped) ==
      cudaSuccess) {
    std::memcpy(mapped, wg[0].data(), wg[0].size() * 4);
    float* dev_view = nullptr;
    if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_view), mapped, 0) == cudaSuccess)
      pg[0] = dev_view;
  }
  Dev<const void*> dpg(pg), dpu(pu), dpd(pd);
  std::vector<int> idx;
  FVec wts;
  const FVec ranked =
      RunExperts(x, logits, T, E, k, H, I, dpg.get(), dpu.get(), dpd.get(), &idx, &wts);
  Arena arena;
  for (int t = 0; t < T; ++t) {
    std::vector<int> ic(Z(k));
    FVec wc(Z(k));
    cpu::RouteToken(logits.data() + Z(t * E), E, k, true, ic.data(), wc.data());
    for (int r = 0; r < k; ++r) {
      ASSERT_EQ(idx[Z(t * k + r)], ic[Z(r)]);
      ASSERT_NEAR(wts[Z(t * k + r)], wc[Z(r)], 64 * kU * wc[Z(r)]);  // exps, sum, 2 divisions
    }
    // Token t alone: same experts, identical bits (batch invariance of the expert products).
    std::vector<int> idx1;
    FVec wts1;
    const FVec ranked1 = RunExperts(FVec(x.begin() + t * H, x.begin() + (t + 1) * H),
                                    FVec(logits.begin() + t * E, logits.begin() + (t + 1) * E), 1,
                                    E, k, H, I, dpg.get(), dpu.get(), dpd.get(), &idx1, &wts1);
    ASSERT_TRUE(SameBits(ranked1.data(), ranked.data() + Z(t * k) * Z(H), Z(k) * Z(H) * 4))
        << "token " << t;
    for (int r = 0; r < k; ++r) {
      const int e = ic[Z(r)];
      const FfnWeights f{Mat{wg[Z(e)].data(), I, H}, Mat{wu[Z(e)].data(), I, H},
                         Mat{wd[Z(e)].data(), H, I}};
      FVec want(Z(H)), g1(Z(I)), u1(Z(I));
      const float* xr = x.data() + Z(t) * Z(H);
      cpu::FfnForward(f, xr, 1, cpu::MatmulKind::kInvariant, nullptr, arena, want.data());
      for (int i = 0; i < I; ++i) {
        g1[Z(i)] = cpu::Dot(xr, wg[Z(e)].data() + Z(i) * Z(H), H);
        u1[Z(i)] = cpu::Dot(xr, wu[Z(e)].data() + Z(i) * Z(H), H);
      }
      // The host test's bound with 8u more per activation for the device's silu.
      for (int o = 0; o < H; ++o) {
        const float* wrow = wd[Z(e)].data() + Z(o) * Z(I);
        double tol = 0.0, abs_sum = 0.0;
        for (int i = 0; i < I; ++i) {
          const double act = std::fabs(cpu::Silu(g1[Z(i)]) * u1[Z(i)]);
          const double dg = DotTol(H, AbsDot(xr, wg[Z(e)].data() + Z(i) * Z(H), H));
          const double du = DotTol(H, AbsDot(xr, wu[Z(e)].data() + Z(i) * Z(H), H));
          const double da =
              1.1 * dg * std::fabs(u1[Z(i)]) + std::fabs(cpu::Silu(g1[Z(i)])) * du + 16 * kU * act;
          tol += da * std::fabs(wrow[i]);
          abs_sum += act * std::fabs(wrow[i]);
        }
        tol += DotTol(I, abs_sum);
        ASSERT_NEAR(ranked[Z(t * k + r) * Z(H) + Z(o)], want[Z(o)], tol)
            << t << " " << r << " " << o;
      }
    }
  }
  if (mapped != nullptr) cudaFreeHost(mapped);
  // Combine (rank order from 0, bitwise) and the shared gate.
  const FVec gate_w = RandomVec(rng, Z(H)), sh = RandomVec(rng, Z(T) * Z(H)),
             out0 = RandomVec(rng, Z(T) * Z(H));
  Dev<float> dr(ranked), dw(wts), dout(Z(T) * Z(H)), dx(x), dgw(gate_w), dsh(sh), dacc(out0);
  MoeCombine(dr.get(), dw.get(), T, k, H, dout.get(), nullptr);
  SharedGateAdd(dx.get(), dgw.get(), dsh.get(), T, H, dacc.get(), nullptr);
  ASSERT_TRUE(Sync());
  const FVec out = dout.Down(), acc = dacc.Down();
  for (int t = 0; t < T; ++t) {
    const float gate = cpu::Sigmoid(cpu::Dot(x.data() + Z(t) * Z(H), gate_w.data(), H));
    const double dgate =
        0.25 * DotTol(H, AbsDot(x.data() + Z(t) * Z(H), gate_w.data(), H)) + 16 * kU;
    for (int i = 0; i < H; ++i) {
      float want = 0.0f;
      for (int r = 0; r < k; ++r) want += wts[Z(t * k + r)] * ranked[Z(t * k + r) * Z(H) + Z(i)];
      ASSERT_EQ(km::FloatBits(out[Z(t) * Z(H) + Z(i)]), km::FloatBits(want));
      const std::size_t at = Z(t) * Z(H) + Z(i);
      const float w2 = out0[at] + gate * sh[at];
      ASSERT_NEAR(acc[at], w2, dgate * std::fabs(sh[at]) + 2 * kU * std::fabs(w2));
    }
  }
}

TEST(CudaOps, ElementwiseMatchCpu) {
  LOCKSTEP_REQUIRE_GPU(1);
  const int n = 100003, vocab = 50, H = 64, T = 7;
  std::mt19937 rng(11);
  const FVec a = RandomVec(rng, Z(n), -20.0f, 20.0f), b = RandomVec(rng, Z(n), -3.0f, 3.0f),
             emb = RandomVec(rng, Z(vocab * H));
  const std::vector<int> tok = {3, 0, 49, 3, 17, 8, 8};
  Dev<float> d_add(a), d_silu(a), d_sig(b), d_scale(a), db(b), dgate(a), demb(emb), dout(Z(T * H));
  Dev<int> dtok(tok);
  AddInPlace(d_add.get(), db.get(), n, nullptr);
  SiluMul(d_silu.get(), db.get(), n, nullptr);
  MulSigmoid(d_sig.get(), dgate.get(), n, nullptr);
  Scale(d_scale.get(), n, 0.37f, nullptr);
  EmbedRows(demb.get(), dtok.get(), T, H, dout.get(), nullptr);
  ASSERT_TRUE(Sync());
  const FVec add = d_add.Down(), silu = d_silu.Down(), sig = d_sig.Down(), sc = d_scale.Down(),
             out = dout.Down();
  for (std::size_t i = 0; i < Z(n); ++i) {
    ASSERT_EQ(km::FloatBits(add[i]), km::FloatBits(a[i] + b[i]));
    ASSERT_EQ(km::FloatBits(sc[i]), km::FloatBits(a[i] * 0.37f));
    const float s = cpu::Silu(a[i]) * b[i], m = b[i] * cpu::Sigmoid(a[i]);
    ASSERT_NEAR(silu[i], s, 16 * kU * std::fabs(s));  // ~9u (header), then *
    ASSERT_NEAR(sig[i], m, 16 * kU * std::fabs(m));
  }
  for (int t = 0; t < T; ++t)
    ASSERT_TRUE(SameBits(out.data() + Z(t * H), emb.data() + Z(tok[Z(t)] * H), Z(H) * 4));
}

}  // namespace
}  // namespace lockstep::cuda
