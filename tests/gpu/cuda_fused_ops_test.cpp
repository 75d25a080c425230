// The fused ops of the decode path must give bitwise what the ops they replace give:
//   RowsMatmulMulti (up to three products of the same x in one launch) vs one RowsMatmul call per
//   product: f32 and bf16 weights, 1-3 products with output widths that are not multiples of the
//   block's four rows, T = 1..17 (one and two passes), a row stride wider than the output, and an
//   unaligned x (the scalar path);
//   AddRmsNormZc vs AddInPlace then RmsNormZc: the updated residual and the normed rows, widths
//   on the vector and the scalar path;
//   MoeEpilogue vs MoeCombine, SharedGateAdd, AddInPlace and RmsNormZc: with and without the
//   shared expert and the next norm, k = 1 / 4 / 10, widths on the vector and the scalar path and
//   past one block's threads.
// Runs in cuda_tests on a GPU and in the emulator (tests/cuda_emu) in CI.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/ops.h"
#include "gpu/require_gpu.h"
#include "test_util.h"

namespace lockstep::cuda {
namespace {

template <typename T>
T* DevCopy(const std::vector<T>& h) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> HostCopy(const T* d, std::size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

std::vector<std::uint16_t> Bf16Bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t u;
    std::memcpy(&u, &v[i], 4);
    out[i] = static_cast<std::uint16_t>(u >> 16);  // truncation: any bf16 value will do
  }
  return out;
}

template <typename WT>
void Check(const std::string& what, int n_in, const std::vector<int>& n_out, int T, bool aligned_x) {
  const int ldy_extra = 3;
  std::vector<float> xh = test::Random(static_cast<std::size_t>(T) * n_in + 1, 11);
  float* xbuf = DevCopy(xh);
  const float* x = xbuf + (aligned_x ? 0 : 1);  // +1 float: not 16-byte aligned
  std::vector<WT*> ws;
  std::vector<float*> y_multi, y_single;
  std::vector<RowsProduct<WT>> prods;
  for (std::size_t i = 0; i < n_out.size(); ++i) {
    const std::size_t n = static_cast<std::size_t>(n_out[i]) * n_in;
    std::vector<float> wf = test::Random(n, 100 + i);
    WT* w;
    if constexpr (sizeof(WT) == 2) {
      w = DevCopy(Bf16Bits(wf));
    } else {
      w = DevCopy(wf);
    }
    ws.push_back(w);
    const int ldy = n_out[i] + ldy_extra;
    std::vector<float> zeros(static_cast<std::size_t>(T) * ldy, 0.0f);
    y_multi.push_back(DevCopy(zeros));
    y_single.push_back(DevCopy(zeros));
    prods.push_back({w, n_out[i], y_multi.back(), ldy});
    RowsMatmul(x, T, w, n_out[i], n_in, y_single.back(), ldy, nullptr);
  }
  RowsMatmulMulti(x, T, n_in, prods.data(), static_cast<int>(prods.size()), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (std::size_t i = 0; i < n_out.size(); ++i) {
    const std::size_t n = static_cast<std::size_t>(T) * (n_out[i] + ldy_extra);
    const auto a = HostCopy(y_multi[i], n), b = HostCopy(y_single[i], n);
    EXPECT_TRUE(test::BitwiseEqual(a, b)) << what << " product " << i << " T=" << T;
    bool written = false;
    for (float v : a) written = written || v != 0.0f;
    EXPECT_TRUE(written) << what << " product " << i << " T=" << T;
  }
  cudaFree(xbuf);
  for (WT* w : ws) cudaFree(w);
  for (float* y : y_multi) cudaFree(y);
  for (float* y : y_single) cudaFree(y);
}

TEST(CudaOps, RowsMatmulMultiIsBitwiseOneCallPerProduct) {
  LOCKSTEP_REQUIRE_GPU(1);
  for (int T : {1, 3, 9, 17}) {
    Check<float>("f32 x3", 132, {37, 6, 13}, T, true);
    Check<std::uint16_t>("bf16 x3", 132, {37, 6, 13}, T, true);
    Check<float>("f32 x2 unaligned x", 130, {9, 21}, T, false);
    Check<std::uint16_t>("bf16 x1", 64, {5}, T, true);
  }
}

TEST(CudaOps, AddRmsNormZcIsBitwiseAddThenNorm) {
  LOCKSTEP_REQUIRE_GPU(1);
  for (int rows : {1, 3, 9}) {
    for (int n : {64, 130, 512}) {
      const std::size_t total = static_cast<std::size_t>(rows) * n;
      const std::vector<float> h0 = test::Random(total, 21), add = test::Random(total, 22),
                               w = test::Random(static_cast<std::size_t>(n), 23, -0.5f, 0.5f);
      float *ha = DevCopy(h0), *hb = DevCopy(h0), *ad = DevCopy(add), *wd = DevCopy(w);
      std::vector<float> zeros(total, 0.0f);
      float *ya = DevCopy(zeros), *yb = DevCopy(zeros);
      AddRmsNormZc(ha, ad, rows, n, wd, 1e-6f, ya, nullptr);
      AddInPlace(hb, ad, static_cast<std::int64_t>(total), nullptr);
      RmsNormZc(hb, n, rows, n, wd, 1e-6f, yb, n, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::string where = "rows " + std::to_string(rows) + " n " + std::to_string(n);
      EXPECT_TRUE(test::BitwiseEqual(HostCopy(ha, total), HostCopy(hb, total))) << where << " residual";
      EXPECT_TRUE(test::BitwiseEqual(HostCopy(ya, total), HostCopy(yb, total))) << where << " normed";
      EXPECT_FALSE(test::BitwiseEqual(HostCopy(ha, total), h0)) << where << " the add happened";
      for (float* p : {ha, hb, ad, wd, ya, yb}) cudaFree(p);
    }
  }
}

TEST(CudaOps, MoeEpilogueIsBitwiseCombineGateAddNorm) {
  LOCKSTEP_REQUIRE_GPU(1);
  for (int T : {1, 9}) {
    for (int k : {1, 4, 10}) {
      for (int H : {64, 130, 2048}) {
        for (int variant = 0; variant < 4; ++variant) {
          const bool shared = variant & 1, norm = variant & 2;
          const std::string where = "T " + std::to_string(T) + " k " + std::to_string(k) + " H " +
                                    std::to_string(H) + (shared ? " shared" : "") + (norm ? " norm" : "");
          const std::size_t th = static_cast<std::size_t>(T) * H, tk = static_cast<std::size_t>(T) * k;
          const std::vector<float> ranked = test::Random(tk * H, 31), wts = test::Random(tk, 32, 0.0f, 1.0f),
                                   x = test::Random(th, 33), gw = test::Random(static_cast<std::size_t>(H), 34),
                                   sh = test::Random(th, 35), h0 = test::Random(th, 36),
                                   nw = test::Random(static_cast<std::size_t>(H), 37, -0.5f, 0.5f);
          const std::vector<float> zeros(th, 0.0f);
          float *rd = DevCopy(ranked), *wd = DevCopy(wts), *xd = DevCopy(x), *gd = DevCopy(gw), *sd = DevCopy(sh),
                *nd = DevCopy(nw), *ha = DevCopy(h0), *hb = DevCopy(h0), *ya = DevCopy(zeros), *yb = DevCopy(zeros),
                *out = DevCopy(zeros);
          MoeEpilogue(rd, wd, T, k, H, xd, gd, shared ? sd : nullptr, ha, norm ? nd : nullptr, 1e-6f,
                      norm ? ya : nullptr, nullptr);
          MoeCombine(rd, wd, T, k, H, out, nullptr);
          if (shared) SharedGateAdd(xd, gd, sd, T, H, out, nullptr);
          AddInPlace(hb, out, static_cast<std::int64_t>(th), nullptr);
          if (norm) RmsNormZc(hb, H, T, H, nd, 1e-6f, yb, H, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;
          const std::vector<float> got_h = HostCopy(ha, th), got_y = HostCopy(ya, th);
          EXPECT_TRUE(test::BitwiseEqual(got_h, HostCopy(hb, th))) << where << " residual";
          EXPECT_TRUE(test::BitwiseEqual(got_y, HostCopy(yb, th))) << where << " normed";
          EXPECT_FALSE(test::BitwiseEqual(got_h, h0)) << where << " the add happened";
          if (norm) {
            EXPECT_FALSE(test::BitwiseEqual(got_y, zeros)) << where << " the norm happened";
          }
          for (float* p : {rd, wd, xd, gd, sd, nd, ha, hb, ya, yb, out}) cudaFree(p);
        }
      }
    }
  }
}

}  // namespace
}  // namespace lockstep::cuda
