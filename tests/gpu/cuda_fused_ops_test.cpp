// The fused ops of the decode path must give bitwise what the ops they replace give:
//   RowsMatmulMulti (up to three products of the same x in one launch) vs one RowsMatmul call per
//   product: f32 and bf16 weights, 1-3 products with output widths that are not multiples of the
//   block's four rows, T = 1..17 (one and two passes), a row stride wider than the output, and an
//   unaligned x (the scalar path); a SwiGLU pair (RowsProduct::W_up) vs both products and SiluMul;
//   AddRmsNormZc vs AddInPlace then RmsNormZc: the updated residual and the normed rows, widths
//   on the vector and the scalar path;
//   MoeEpilogue vs MoeCombine, SharedGateAdd, AddInPlace and RmsNormZc: with and without the
//   shared expert and the next norm, k = 1 / 4 / 10, widths on the vector and the scalar path and
//   past one block's threads;
//   AttnPrep vs SplitQGate, RmsNormZc (q and k per head), RopeApply (q and k) and KvStore: every
//   cache dtype, full and partial rotation, head_dim on the vector and the scalar path, several
//   query heads per kv head, the position on the device;
//   Attention with its output gate vs Attention then MulSigmoid: whole rows and split rows (the
//   combine kernel gates those), one head per block and grouped heads, rows in several launches;
//   GdnSplitConv vs GdnSplit then CausalConvSilu with steps: one and several value heads per key
//   head, T = 1 and 9, conv kernels 2 and 4;
//   RouteAndGroup (one launch: a warp per token) vs RouteTopK then GroupByExpert: T = 1 to 16, 5 to
//   512 experts, top-2 to top-10 and every expert, with and without renormalisation, ties;
//   ExpertDown with a dense product along (DenseDown: the shared expert's down projection) vs
//   ExpertDown and RowsMatmul: f32 and bf16, T = 1 / 9 / 17, a dense width unlike the experts'.
// Runs in cuda_tests on a GPU and in the emulator (tests/cuda_emu) in CI.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// Random weights on the device: f32, or bf16 bits (WT = std::uint16_t).
template <typename WT>
WT* DevWeights(std::size_t n, std::uint64_t seed) {
  const std::vector<float> f = test::Random(n, seed);
  if constexpr (sizeof(WT) == 2) {
    return DevCopy(Bf16Bits(f));
  } else {
    return DevCopy(f);
  }
}

// glu: product 1 is a SwiGLU pair (W_up), against RowsMatmul of both matrices and SiluMul.
template <typename WT>
void Check(const std::string& what, int n_in, const std::vector<int>& n_out, int T, bool aligned_x,
           bool glu = false) {
  const int ldy_extra = 3;
  std::vector<float> xh = test::Random(static_cast<std::size_t>(T) * n_in + 1, 11);
  float* xbuf = DevCopy(xh);
  const float* x = xbuf + (aligned_x ? 0 : 1);  // +1 float: not 16-byte aligned
  std::vector<WT*> ws;
  std::vector<float*> y_multi, y_single, ups;
  std::vector<RowsProduct<WT>> prods;
  for (std::size_t i = 0; i < n_out.size(); ++i) {
    const std::size_t n = static_cast<std::size_t>(n_out[i]) * n_in;
    WT* w = DevWeights<WT>(n, 100 + i);
    ws.push_back(w);
    const int ldy = n_out[i] + ldy_extra;
    std::vector<float> zeros(static_cast<std::size_t>(T) * ldy, 0.0f);
    y_multi.push_back(DevCopy(zeros));
    y_single.push_back(DevCopy(zeros));
    prods.push_back({w, n_out[i], y_multi.back(), ldy});
    RowsMatmul(x, T, w, n_out[i], n_in, y_single.back(), ldy, nullptr);
    if (glu && i == 1) {
      WT* wu = DevWeights<WT>(n, 200 + i);
      ws.push_back(wu);
      prods.back().W_up = wu;
      float* u = DevCopy(zeros);
      ups.push_back(u);
      RowsMatmul(x, T, wu, n_out[i], n_in, u, ldy, nullptr);
      SiluMul(y_single[i], u, static_cast<std::int64_t>(T) * ldy, nullptr);
    }
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
  for (float* u : ups) cudaFree(u);
}

TEST(CudaOps, RowsMatmulMultiIsBitwiseOneCallPerProduct) {
  LOCKSTEP_REQUIRE_GPU(1);
  for (int T : {1, 3, 9, 17}) {
    Check<float>("f32 x3", 132, {37, 6, 13}, T, true);
    Check<std::uint16_t>("bf16 x3", 132, {37, 6, 13}, T, true);
    Check<float>("f32 x2 unaligned x", 130, {9, 21}, T, false);
    Check<std::uint16_t>("bf16 x1", 64, {5}, T, true);
    Check<float>("f32 x2, SwiGLU pair", 132, {37, 13}, T, true, true);
    Check<std::uint16_t>("bf16 x3, SwiGLU pair", 132, {6, 37, 13}, T, true, true);
    Check<float>("f32 x2, SwiGLU pair, unaligned x", 130, {9, 21}, T, false, true);
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
      EXPECT_TRUE(test::BitwiseEqual(HostCopy(ha, total), HostCopy(hb, total)))
          << where << " residual";
      EXPECT_TRUE(test::BitwiseEqual(HostCopy(ya, total), HostCopy(yb, total)))
          << where << " normed";
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
                                    std::to_string(H) + (shared ? " shared" : "") +
                                    (norm ? " norm" : "");
          const std::size_t th = static_cast<std::size_t>(T) * H,
                            tk = static_cast<std::size_t>(T) * k;
          const std::vector<float> ranked = test::Random(tk * H, 31),
                                   wts = test::Random(tk, 32, 0.0f, 1.0f), x = test::Random(th, 33),
                                   gw = test::Random(static_cast<std::size_t>(H), 34),
                                   sh = test::Random(th, 35), h0 = test::Random(th, 36),
                                   nw = test::Random(static_cast<std::size_t>(H), 37, -0.5f, 0.5f);
          const std::vector<float> zeros(th, 0.0f);
          float *rd = DevCopy(ranked), *wd = DevCopy(wts), *xd = DevCopy(x), *gd = DevCopy(gw),
                *sd = DevCopy(sh), *nd = DevCopy(nw), *ha = DevCopy(h0), *hb = DevCopy(h0),
                *ya = DevCopy(zeros), *yb = DevCopy(zeros), *out = DevCopy(zeros);
          MoeEpilogue(rd, wd, T, k, H, xd, gd, shared ? sd : nullptr, ha, norm ? nd : nullptr,
                      1e-6f, norm ? ya : nullptr, nullptr);
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

// The prep of an attention layer's inputs, fused and as the five ops it replaces.
void CheckAttnPrep(int kv_dtype, int hq, int hkv, int D, int rotary, int T, bool device_pos) {
  const std::string where = "dtype " + std::to_string(kv_dtype) + " hq " + std::to_string(hq) +
                            " hkv " + std::to_string(hkv) + " D " + std::to_string(D) + " rotary " +
                            std::to_string(rotary) + " T " + std::to_string(T) +
                            (device_pos ? " device pos" : "");
  const int p = 7, rows = p + T + 2, half = rotary / 2;
  const std::size_t nq = static_cast<std::size_t>(T) * hq * D,
                    nkv = static_cast<std::size_t>(T) * hkv * D;
  const std::size_t elem = kv_dtype == 0 ? 4 : kv_dtype == 1 ? 2 : 1;
  const std::size_t cache_bytes = static_cast<std::size_t>(rows) * hkv * D * elem,
                    n_scales = static_cast<std::size_t>(rows) * hkv;
  std::vector<float> inv(static_cast<std::size_t>(half > 0 ? half : 1));
  for (int i = 0; i < half; ++i)
    inv[static_cast<std::size_t>(i)] =
        std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(rotary));
  const std::vector<float> qg = test::Random(2 * nq, 51, -2.0f, 2.0f),
                           k = test::Random(nkv, 52, -2.0f, 2.0f), v = test::Random(nkv, 53),
                           qw = test::Random(static_cast<std::size_t>(D), 54, -0.5f, 0.5f),
                           kw = test::Random(static_cast<std::size_t>(D), 55, -0.5f, 0.5f);
  const std::vector<std::uint8_t> cache0(cache_bytes, 0x5a);
  const std::vector<float> scales0(n_scales, -1.0f), q0(nq, 0.0f);
  float *dqg = DevCopy(qg), *dk = DevCopy(k), *dk2 = DevCopy(k), *dv = DevCopy(v),
        *dqw = DevCopy(qw), *dkw = DevCopy(kw), *dinv = DevCopy(inv), *qa = DevCopy(q0),
        *qb = DevCopy(q0), *gb = DevCopy(q0);
  std::uint8_t *kca = DevCopy(cache0), *vca = DevCopy(cache0), *kcb = DevCopy(cache0),
               *vcb = DevCopy(cache0);
  float *ksa = DevCopy(scales0), *vsa = DevCopy(scales0), *ksb = DevCopy(scales0),
        *vsb = DevCopy(scales0);
  int* dpos = DevCopy(std::vector<int>{p - 3});
  const Pos pos = device_pos ? Pos(3, dpos) : Pos(p);
  const bool i8 = kv_dtype == 2;
  AttnPrep(dqg, dk, dv, T, pos, hq, hkv, D, rotary, dinv, dqw, dkw, 1e-6f, kv_dtype, kca, vca,
           i8 ? ksa : nullptr, i8 ? vsa : nullptr, qa, nullptr);
  SplitQGate(dqg, T, hq, D, qb, gb, nullptr);
  RmsNormZc(qb, D, T * hq, D, dqw, 1e-6f, qb, D, nullptr);
  RopeApply(qb, T, hq * D, hq, D, rotary, dinv, pos, nullptr);
  RmsNormZc(dk2, D, T * hkv, D, dkw, 1e-6f, dk2, D, nullptr);
  RopeApply(dk2, T, hkv * D, hkv, D, rotary, dinv, pos, nullptr);
  KvStore(dk2, dv, T, pos, hkv, D, kv_dtype, kcb, vcb, i8 ? ksb : nullptr, i8 ? vsb : nullptr,
          nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;
  const std::vector<float> got_q = HostCopy(qa, nq);
  EXPECT_TRUE(test::BitwiseEqual(got_q, HostCopy(qb, nq))) << where << " q";
  EXPECT_FALSE(test::BitwiseEqual(got_q, q0)) << where << " q written";
  const std::vector<std::uint8_t> got_k = HostCopy(kca, cache_bytes),
                                  got_v = HostCopy(vca, cache_bytes);
  EXPECT_EQ(got_k, HostCopy(kcb, cache_bytes)) << where << " K cache";
  EXPECT_EQ(got_v, HostCopy(vcb, cache_bytes)) << where << " V cache";
  EXPECT_NE(got_k, cache0) << where << " K stored";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(ksa, n_scales), HostCopy(ksb, n_scales)))
      << where << " K scales";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(vsa, n_scales), HostCopy(vsb, n_scales)))
      << where << " V scales";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(dk, nkv), k)) << where << " the input k is left alone";
  for (float* f : {dqg, dk, dk2, dv, dqw, dkw, dinv, qa, qb, gb, ksa, vsa, ksb, vsb}) cudaFree(f);
  for (std::uint8_t* c : {kca, vca, kcb, vcb}) cudaFree(c);
  cudaFree(dpos);
}

TEST(CudaOps, AttnPrepIsBitwiseSplitNormRopeStore) {
  LOCKSTEP_REQUIRE_GPU(1);
  for (int dtype : {0, 1, 2}) {
    for (int T : {1, 9}) {
      CheckAttnPrep(dtype, 4, 2, 64, 16, T, false);  // partial rotation, vector loads
      CheckAttnPrep(dtype, 8, 1, 64, 64, T, true);   // full rotation, one kv head
      CheckAttnPrep(dtype, 2, 2, 30, 10, T, false);  // head_dim % 4 != 0: scalar loads
      CheckAttnPrep(dtype, 6, 2, 128, 32, T, true);  // four elements per lane
    }
  }
}

// Attention's output gate against Attention then MulSigmoid (the gate half of a q_proj output).
void CheckAttentionGate(int kv_dtype, int split, AttnHeads heads, std::size_t scratch_cap) {
  const int hq = 8, hkv = 2, D = 64, p = 70, T = 5, rows = p + T, n_ctx_max = 96;
  const std::string where = "dtype " + std::to_string(kv_dtype) + " split " +
                            std::to_string(split) +
                            (heads == AttnHeads::kGrouped ? " grouped" : " one head") +
                            (scratch_cap > 0 ? " rows in several launches" : "");
  const std::size_t kv_elems = static_cast<std::size_t>(rows) * hkv * D,
                    nq = static_cast<std::size_t>(T) * hq * D;
  const std::vector<float> k = test::Random(kv_elems, 61, -2.0f, 2.0f),
                           v = test::Random(kv_elems, 62),
                           qg = test::Random(2 * nq, 63, -2.0f, 2.0f), zeros(nq, 0.0f);
  float *dk = DevCopy(k), *dv = DevCopy(v), *dqg = DevCopy(qg), *q = DevCopy(zeros),
        *gate = DevCopy(zeros), *oa = DevCopy(zeros), *ob = DevCopy(zeros);
  std::uint8_t *kc = DevCopy(std::vector<std::uint8_t>(kv_elems * 4)),
               *vc = DevCopy(std::vector<std::uint8_t>(kv_elems * 4));
  float *ks = DevCopy(std::vector<float>(static_cast<std::size_t>(rows) * hkv)),
        *vs = DevCopy(std::vector<float>(static_cast<std::size_t>(rows) * hkv));
  const bool i8 = kv_dtype == 2;
  KvStore(dk, dv, rows, 0, hkv, D, kv_dtype, kc, vc, i8 ? ks : nullptr, i8 ? vs : nullptr, nullptr);
  SplitQGate(dqg, T, hq, D, q, gate, nullptr);
  std::size_t n_scratch = AttentionScratchFloats(T, hq, D, n_ctx_max, split);
  if (scratch_cap > 0 && n_scratch > scratch_cap) n_scratch = scratch_cap;
  float* scratch = DevCopy(std::vector<float>(n_scratch > 0 ? n_scratch : 1));
  auto attend = [&](float* o, AttnGate g) {
    Attention(q, T, p, hq, hkv, D, kv_dtype, kc, vc, i8 ? ks : nullptr, i8 ? vs : nullptr, 0.125f,
              n_ctx_max, split, scratch, n_scratch, o, nullptr, heads, g);
  };
  attend(oa, AttnGate{dqg + D, 2 * D});
  attend(ob, AttnGate{});
  MulSigmoid(ob, gate, static_cast<std::int64_t>(nq), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;
  const std::vector<float> got = HostCopy(oa, nq);
  EXPECT_TRUE(test::BitwiseEqual(got, HostCopy(ob, nq))) << where;
  EXPECT_FALSE(test::BitwiseEqual(got, zeros)) << where << " written";
  for (float* f : {dk, dv, dqg, q, gate, oa, ob, ks, vs, scratch}) cudaFree(f);
  for (std::uint8_t* c : {kc, vc}) cudaFree(c);
}

TEST(CudaOps, AttentionGateIsBitwiseMulSigmoid) {
  LOCKSTEP_REQUIRE_GPU(1);
  for (int dtype : {0, 1, 2}) {
    CheckAttentionGate(dtype, 0, AttnHeads::kOne, 0);       // whole rows, scores in global scratch
    CheckAttentionGate(dtype, 32, AttnHeads::kOne, 0);      // split rows: the combine gates them
    CheckAttentionGate(dtype, 32, AttnHeads::kGrouped, 0);  // grouped heads, split
    CheckAttentionGate(dtype, 128, AttnHeads::kGrouped,
                       0);  // grouped heads, whole rows in shared memory
  }
  // Rows in several launches: the gate pointer moves with the rows.
  const std::size_t one_row = AttentionScratchFloats(1, 8, 64, 96, 32);
  ASSERT_GT(one_row, 0u);
  CheckAttentionGate(0, 32, AttnHeads::kOne, 2 * one_row);
}

// The GDN split and causal conv of a verify window, fused and as the two ops it replaces.
void CheckSplitConv(int hk, int hv, int dk, int dv, int K, int T) {
  const std::string where = "hk " + std::to_string(hk) + " hv " + std::to_string(hv) + " dk " +
                            std::to_string(dk) + " dv " + std::to_string(dv) + " K " +
                            std::to_string(K) + " T " + std::to_string(T);
  const int C = 2 * hk * dk + hv * dv, qkvz = 2 * hk * dk + 2 * hv * dv;
  const std::size_t tc = static_cast<std::size_t>(T) * C,
                    nz = static_cast<std::size_t>(T) * hv * dv,
                    nh = static_cast<std::size_t>(T) * hv,
                    n_steps = static_cast<std::size_t>(T) * (K - 1) * C,
                    n_state = static_cast<std::size_t>(K - 1) * C;
  const std::vector<float> P = test::Random(static_cast<std::size_t>(T) * qkvz, 71, -2.0f, 2.0f),
                           B = test::Random(static_cast<std::size_t>(T) * 2 * hv, 72, -3.0f, 3.0f),
                           a_log = test::Random(static_cast<std::size_t>(hv), 73),
                           dt_bias = test::Random(static_cast<std::size_t>(hv), 74),
                           state = test::Random(n_state, 75, -2.0f, 2.0f),
                           weight = test::Random(static_cast<std::size_t>(C) * K, 76);
  float *dP = DevCopy(P), *dB = DevCopy(B), *dal = DevCopy(a_log), *ddt = DevCopy(dt_bias),
        *dst = DevCopy(state), *dw = DevCopy(weight);
  auto zeros = [](std::size_t n) { return DevCopy(std::vector<float>(n, 0.0f)); };
  float *ua = zeros(tc), *ub = zeros(tc), *sa = zeros(n_steps), *sb = zeros(n_steps),
        *za = zeros(nz), *zb = zeros(nz), *ba = zeros(nh), *bb = zeros(nh), *ga = zeros(nh),
        *gb = zeros(nh), *win = zeros(static_cast<std::size_t>(K - 1 + T) * C);
  GdnSplitConv(dP, dB, T, hk, hv, dk, dv, K, dal, ddt, dst, dw, ua, sa, za, ba, ga, nullptr);
  GdnSplit(dP, dB, T, hk, hv, dk, dv, K, dal, ddt, dst, win, zb, bb, gb, nullptr);
  CausalConvSilu(win, T, C, K, dw, ub, nullptr, sb);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;
  const std::vector<float> got_u = HostCopy(ua, tc);
  EXPECT_TRUE(test::BitwiseEqual(got_u, HostCopy(ub, tc))) << where << " U";
  EXPECT_FALSE(test::BitwiseEqual(got_u, std::vector<float>(tc, 0.0f))) << where << " U written";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(sa, n_steps), HostCopy(sb, n_steps)))
      << where << " conv states";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(za, nz), HostCopy(zb, nz))) << where << " Z";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(ba, nh), HostCopy(bb, nh))) << where << " beta";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(ga, nh), HostCopy(gb, nh))) << where << " g";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(dst, n_state), state))
      << where << " the conv state is left alone";
  for (float* f : {dP, dB, dal, ddt, dst, dw, ua, ub, sa, sb, za, zb, ba, bb, ga, gb, win})
    cudaFree(f);
}

TEST(CudaOps, GdnSplitConvIsBitwiseSplitThenConv) {
  LOCKSTEP_REQUIRE_GPU(1);
  for (int T : {1, 9}) {
    CheckSplitConv(2, 4, 16, 16, 4, T);  // two value heads per key head (tiny)
    CheckSplitConv(4, 8, 64, 64, 4, T);  // small
    CheckSplitConv(3, 3, 5, 7, 2, T);    // one per key head, odd widths, a 2-tap conv
  }
}

// The routing and grouping of a window, fused (RouteAndGroup) and as the two launches.
void CheckRouteGroup(int T, int E, int k, bool norm, bool ties) {
  const std::string where = "T " + std::to_string(T) + " E " + std::to_string(E) + " k " +
                            std::to_string(k) + (norm ? " norm" : "") + (ties ? " ties" : "") +
                            (RouteAndGroupFused(T, E, k) ? " (one launch)" : " (two launches)");
  std::vector<float> logits = test::Random(static_cast<std::size_t>(T) * E, 81, -4.0f, 4.0f);
  if (ties)  // the top logits all equal: the lower id must win, in both forms
    for (std::size_t e = 0; e < logits.size(); e += 3) logits[e] = 5.0f;
  const auto ku = static_cast<std::size_t>(T) * static_cast<std::size_t>(k),
             eu = static_cast<std::size_t>(E);
  float* dl = DevCopy(logits);
  auto ints = [](std::size_t n) { return DevCopy(std::vector<int>(n, -7)); };
  int *ia = ints(ku), *ib = ints(ku), *ha = ints(ku), *hb = ints(ku), *sa = ints(ku),
      *sb = ints(ku), *fa = ints(eu + 1), *fb = ints(eu + 1), *aa = ints(ku), *ab = ints(ku),
      *na = ints(1), *nb = ints(1);
  float *wa = DevCopy(std::vector<float>(ku, 0.0f)), *wb = DevCopy(std::vector<float>(ku, 0.0f));
  RouteAndGroup(dl, T, E, k, norm, ia, wa, ha, sa, fa, aa, na, nullptr);
  RouteTopK(dl, T, E, k, norm, ib, wb, hb, nullptr);
  GroupByExpert(ib, T, k, E, sb, fb, ab, nb, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;
  const std::vector<int> got = HostCopy(ia, ku);
  EXPECT_EQ(got, HostCopy(ib, ku)) << where << " ids";
  EXPECT_EQ(HostCopy(ha, ku), got) << where << " host ids";
  EXPECT_EQ(HostCopy(hb, ku), got) << where << " host ids (two launches)";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(wa, ku), HostCopy(wb, ku))) << where << " weights";
  EXPECT_EQ(HostCopy(sa, ku), HostCopy(sb, ku)) << where << " slot_of";
  EXPECT_EQ(HostCopy(fa, eu + 1), HostCopy(fb, eu + 1)) << where << " first";
  EXPECT_EQ(HostCopy(aa, ku), HostCopy(ab, ku)) << where << " active";
  EXPECT_EQ(HostCopy(na, 1), HostCopy(nb, 1)) << where << " n_active";
  EXPECT_GE(HostCopy(na, 1)[0], k) << where << " at least k distinct experts";
  for (int* p : {ia, ib, ha, hb, sa, sb, fa, fb, aa, ab, na, nb}) cudaFree(p);
  for (float* p : {dl, wa, wb}) cudaFree(p);
}

TEST(CudaOps, RouteAndGroupIsBitwiseTheTwoLaunches) {
  LOCKSTEP_REQUIRE_GPU(1);
  ASSERT_TRUE(RouteAndGroupFused(16, 512, 10));
  ASSERT_FALSE(RouteAndGroupFused(17, 512, 10));
  ASSERT_FALSE(RouteAndGroupFused(1, 513, 10));
  for (int T : {1, 5, 16}) {
    CheckRouteGroup(T, 8, 2, true, false);     // tiny
    CheckRouteGroup(T, 32, 4, true, true);     // small
    CheckRouteGroup(T, 512, 10, true, false);  // Qwen3-Next: 16 experts per lane
    CheckRouteGroup(T, 512, 10, false, true);
    CheckRouteGroup(T, 300, 7, true, true);  // not a multiple of the warp
    CheckRouteGroup(T, 5, 5, true, false);   // every expert picked
  }
  CheckRouteGroup(17, 32, 4, true, true);     // past the fused window: the two launches
  CheckRouteGroup(2, 4096, 1, false, false);  // past the fused expert count
}

// The shared expert's down projection riding along ExpertDown, against the two launches.
template <typename WT>
void CheckDenseDown(int T, int k, int E, int H, int I, int I_dense) {
  const std::string where = std::string(sizeof(WT) == 2 ? "bf16" : "f32") + " T " +
                            std::to_string(T) + " k " + std::to_string(k) + " H " +
                            std::to_string(H) + " I " + std::to_string(I) + " dense I " +
                            std::to_string(I_dense);
  const int slots = T * k;
  const auto su = static_cast<std::size_t>(slots), hu = static_cast<std::size_t>(H),
             tu = static_cast<std::size_t>(T);
  // Routing: slot i of token t to expert (t + r) % E, grouped on the device as the engine does.
  std::vector<int> ids(su);
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < k; ++r) ids[static_cast<std::size_t>(t * k + r)] = (t + 2 * r) % E;
  int* idx = DevCopy(ids);
  auto ints = [](std::size_t n) { return DevCopy(std::vector<int>(n, 0)); };
  int *slot_of = ints(su), *first = ints(static_cast<std::size_t>(E) + 1), *active = ints(su),
      *n_active = ints(1);
  GroupByExpert(idx, T, k, E, slot_of, first, active, n_active, nullptr);
  std::vector<WT*> experts;
  for (int e = 0; e < E; ++e)
    experts.push_back(
        DevWeights<WT>(hu * static_cast<std::size_t>(I), 90 + static_cast<std::uint64_t>(e)));
  std::vector<const void*> ptrs(experts.begin(), experts.end());
  const void** dptrs = DevCopy(ptrs);
  WT* wd = DevWeights<WT>(hu * static_cast<std::size_t>(I_dense), 99);
  float *act = DevCopy(test::Random(su * static_cast<std::size_t>(I), 97)),
        *dact = DevCopy(test::Random(tu * static_cast<std::size_t>(I_dense), 98));
  const std::vector<float> zr(su * hu, 0.0f), zd(tu * hu, 0.0f);
  float *ra = DevCopy(zr), *rb = DevCopy(zr), *ya = DevCopy(zd), *yb = DevCopy(zd);
  const bool bf16 = sizeof(WT) == 2;
  const int max_active = std::min(slots, E);
  ExpertDown(act, H, I, slot_of, first, active, n_active, max_active, dptrs, bf16, ra, nullptr,
             DenseDown{dact, T, I_dense, wd, ya});
  ExpertDown(act, H, I, slot_of, first, active, n_active, max_active, dptrs, bf16, rb, nullptr);
  RowsMatmul(dact, T, wd, H, I_dense, yb, H, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;
  const std::vector<float> got = HostCopy(ya, tu * hu);
  EXPECT_TRUE(test::BitwiseEqual(got, HostCopy(yb, tu * hu))) << where << " dense";
  EXPECT_FALSE(test::BitwiseEqual(got, zd)) << where << " dense written";
  EXPECT_TRUE(test::BitwiseEqual(HostCopy(ra, su * hu), HostCopy(rb, su * hu)))
      << where << " routed";
  for (WT* w : experts) cudaFree(w);
  for (int* p : {idx, slot_of, first, active, n_active}) cudaFree(p);
  for (float* p : {act, dact, ra, rb, ya, yb}) cudaFree(p);
  cudaFree(dptrs);
  cudaFree(wd);
}

TEST(CudaOps, ExpertDownWithDenseAlongIsBitwiseTheTwoLaunches) {
  LOCKSTEP_REQUIRE_GPU(1);
  for (int T : {1, 9, 17}) {
    CheckDenseDown<float>(T, 2, 8, 64, 32, 32);  // tiny
    CheckDenseDown<std::uint16_t>(T, 4, 32, 130, 128,
                                  256);          // small's widths, H past the block rows
    CheckDenseDown<float>(T, 3, 5, 33, 30, 18);  // scalar loads (I % 4 != 0)
  }
}
}  // namespace
}  // namespace lockstep::cuda
