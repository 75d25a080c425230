// CudaOps.GdnChunkedMatchesCpuChunkedAndRecurrent: the chunked GDN prefill (cuda::GdnChunked)
// against cpu::GatedDeltaChunked (same algorithm, other summation orders: NRMSE < 1e-6) and
// against the device's recurrent form (cuda::GdnRecurrent, prefill form: NRMSE < 1e-5), on random
// l2-normalised q / k, for T = 1, 5, 64, 65, 150 (empty, partial, exactly one and 1 + 1 chunks,
// several chunks with a short tail) and Hv / Hk = 2, plus other head dims. Also: two runs give
// the same bits, and T = 150 in one call equals 64 then 86 rows with the state handed over (the
// chunk boundaries coincide, so the bits must too), and kAuto's value-column slices give the bits
// of one block per head.
//
// One file, two binaries: cuda_tests runs it on a real GPU (it skips without a device) and
// tests/cuda_emu/CMakeLists.txt compiles it into the emulator binary (four devices by default).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/gdn.h"
#include "cuda/ops.h"
#include "gpu/require_gpu.h"
#include "test_util.h"

namespace lockstep::cuda {
namespace gdn_chunked_test {

using FVec = std::vector<float>;
inline std::size_t Sz(int x) { return static_cast<std::size_t>(x); }

// Device array of n floats; freed on scope exit.
class DevF {
 public:
  explicit DevF(std::size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(float)) != cudaSuccess)
      ADD_FAILURE() << "cudaMalloc";
  }
  explicit DevF(const FVec& h) : DevF(h.size()) { Up(h); }
  DevF(const DevF&) = delete;
  DevF& operator=(const DevF&) = delete;
  ~DevF() { cudaFree(p_); }
  float* get() const { return p_; }
  void Up(const FVec& h) {
    if (n_ > 0) cudaMemcpy(p_, h.data(), n_ * sizeof(float), cudaMemcpyHostToDevice);
  }
  FVec Down() const {
    FVec h(n_);
    if (n_ > 0) cudaMemcpy(h.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  float* p_ = nullptr;
  std::size_t n_;
};

::testing::AssertionResult SyncOk() {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

FVec Uniform(std::mt19937& rng, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  FVec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Rows of `dim` floats scaled to l2 norm `norm` (as GdnQkNorm's outputs: k unit, q 1/sqrt(Dk)).
void NormaliseRows(FVec& x, int dim, float norm) {
  for (std::size_t r = 0; r < x.size() / Sz(dim); ++r) {
    float* row = x.data() + r * Sz(dim);
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(row[i]) * static_cast<double>(row[i]);
    const float f = norm / static_cast<float>(std::sqrt(ss));
    for (int i = 0; i < dim; ++i) row[i] *= f;
  }
}

struct Inputs {
  int hk, hv, dk, dv, T, conv_dim;
  FVec qh, kh, U, g, beta, S0;
};

Inputs MakeInputs(int hk, int hv, int dk, int dv, int T, unsigned seed) {
  std::mt19937 rng(seed);
  Inputs in{hk, hv, dk, dv, T, 2 * hk * dk + hv * dv, {}, {}, {}, {}, {}, {}};
  in.qh = Uniform(rng, Sz(T) * Sz(hk) * Sz(dk), -1.0f, 1.0f);
  in.kh = Uniform(rng, Sz(T) * Sz(hk) * Sz(dk), -1.0f, 1.0f);
  NormaliseRows(in.qh, dk, 1.0f / std::sqrt(static_cast<float>(dk)));
  NormaliseRows(in.kh, dk, 1.0f);
  in.U = Uniform(rng, Sz(T) * Sz(in.conv_dim), -1.0f, 1.0f);
  // Log decays: most in [-1, 0), every third value head slow ([-0.02, 0): long memory, the
  // chunk's cumulative decay stays near 1).
  in.g = Uniform(rng, Sz(T) * Sz(hv), -1.0f, 0.0f);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < hv; j += 3) in.g[Sz(t * hv + j)] *= 0.02f;
  in.beta = Uniform(rng, Sz(T) * Sz(hv), 0.0f, 1.0f);
  in.S0 = Uniform(rng, Sz(hv) * Sz(dk) * Sz(dv), -0.5f, 0.5f);
  return in;
}

// cpu::GatedDeltaChunked per value head (the gather of cpu::GdnForward's prefill branch):
// O [T, Hv, Dv], S [Hv, Dk, Dv].
void CpuChunked(const Inputs& in, FVec* O, FVec* S) {
  const int T = in.T, hk = in.hk, hv = in.hv, dk = in.dk, dv = in.dv, r = hv / hk;
  const std::size_t s_head = Sz(dk) * Sz(dv);
  *S = in.S0;
  O->assign(Sz(T) * Sz(hv) * Sz(dv), 0.0f);
  FVec Q(Sz(T) * Sz(dk)), K(Sz(T) * Sz(dk)), V(Sz(T) * Sz(dv)), g(Sz(T)), b(Sz(T)),
      Oj(Sz(T) * Sz(dv));
  for (int j = 0; j < hv; ++j) {
    const int gi = j / r;
    for (int t = 0; t < T; ++t) {
      const std::size_t tg = (Sz(t) * Sz(hk) + Sz(gi)) * Sz(dk);
      std::memcpy(Q.data() + Sz(t) * Sz(dk), in.qh.data() + tg, Sz(dk) * sizeof(float));
      std::memcpy(K.data() + Sz(t) * Sz(dk), in.kh.data() + tg, Sz(dk) * sizeof(float));
      std::memcpy(V.data() + Sz(t) * Sz(dv),
                  in.U.data() + Sz(t) * Sz(in.conv_dim) + Sz(2 * hk * dk) + Sz(j) * Sz(dv),
                  Sz(dv) * sizeof(float));
      g[Sz(t)] = in.g[Sz(t * hv + j)];
      b[Sz(t)] = in.beta[Sz(t * hv + j)];
    }
    cpu::GatedDeltaChunked(S->data() + Sz(j) * s_head, Q.data(), K.data(), V.data(), g.data(),
                           b.data(), T, dk, dv, Oj.data(), 64);
    for (int t = 0; t < T; ++t)
      std::memcpy(O->data() + (Sz(t) * Sz(hv) + Sz(j)) * Sz(dv), Oj.data() + Sz(t) * Sz(dv),
                  Sz(dv) * sizeof(float));
  }
}

// The device inputs of one case.
struct DevInputs {
  explicit DevInputs(const Inputs& in) : qh(in.qh), kh(in.kh), U(in.U), g(in.g), beta(in.beta) {}
  DevF qh, kh, U, g, beta;
};

// One GdnChunked call over rows [t0, t0 + T) of the inputs, the state in S (in place), outputs to
// O rows [t0, t0 + T).
void RunChunked(const Inputs& in, const DevInputs& d, int t0, int T, DevF& S, DevF& O,
                DevF& scratch, GdnBlocks blocks = GdnBlocks::kAuto) {
  const std::size_t qk_row = Sz(in.hk) * Sz(in.dk), gb_row = Sz(in.hv);
  GdnChunked(S.get(), d.qh.get() + Sz(t0) * qk_row, d.kh.get() + Sz(t0) * qk_row,
             d.U.get() + Sz(t0) * Sz(in.conv_dim), d.g.get() + Sz(t0) * gb_row,
             d.beta.get() + Sz(t0) * gb_row, T, in.hk, in.hv, in.dk, in.dv, in.conv_dim,
             kGdnPrefillChunk, scratch.get(), O.get() + Sz(t0) * Sz(in.hv) * Sz(in.dv), nullptr,
             blocks);
}

TEST(CudaOps, GdnChunkedMatchesCpuChunkedAndRecurrent) {
  LOCKSTEP_REQUIRE_GPU(1);
  struct Case {
    int hk, hv, dk, dv, T;
  };
  const Case cases[] = {
      {2, 4, 128, 128, 1},   {2, 4, 128, 128, 5},  {2, 4, 128, 128, 64}, {2, 4, 128, 128, 65},
      {2, 4, 128, 128, 150}, {1, 2, 256, 256, 70}, {3, 6, 48, 40, 100},  {2, 4, 16, 16, 129},
  };
  unsigned seed = 100;
  for (const Case& cs : cases) {
    const std::string where = "hk=" + std::to_string(cs.hk) + " hv=" + std::to_string(cs.hv) +
                              " dk=" + std::to_string(cs.dk) + " dv=" + std::to_string(cs.dv) +
                              " T=" + std::to_string(cs.T);
    SCOPED_TRACE(where);
    const Inputs in = MakeInputs(cs.hk, cs.hv, cs.dk, cs.dv, cs.T, seed++);
    const DevInputs d(in);
    const std::size_t n_o = Sz(cs.T) * Sz(cs.hv) * Sz(cs.dv);
    DevF S1(in.S0), S2(in.S0), S3(in.S0), S4(in.S0), Sr(in.S0), O1(n_o), O2(n_o), O3(n_o), O4(n_o),
        Or(n_o), scratch(GdnChunkedScratchFloats(cs.hv, cs.dk, cs.dv, kGdnPrefillChunk));
    RunChunked(in, d, 0, cs.T, S1, O1, scratch);
    RunChunked(in, d, 0, cs.T, S2, O2, scratch);  // again, scratch holding the first run's data
    // One block per head: the same elements, each by one thread in the same order, so the same bits
    // as kAuto's column slices (GdnChunkedSlices(dv) blocks per head; 1 for dv <= 32).
    RunChunked(in, d, 0, cs.T, S4, O4, scratch, GdnBlocks::kOnePerHead);
    GdnRecurrent(Sr.get(), nullptr, d.qh.get(), d.kh.get(), d.U.get(), d.g.get(), d.beta.get(),
                 cs.T, cs.hk, cs.hv, cs.dk, cs.dv, in.conv_dim, Or.get(), nullptr);
    ASSERT_TRUE(SyncOk());
    const FVec o1 = O1.Down(), o2 = O2.Down(), s1 = S1.Down(), s2 = S2.Down(), orec = Or.Down(),
               srec = Sr.Down();
    EXPECT_TRUE(test::BitwiseEqual(o1, o2)) << "outputs differ between two runs";
    EXPECT_TRUE(test::BitwiseEqual(s1, s2)) << "states differ between two runs";
    EXPECT_EQ(GdnChunkedSlices(cs.dv), (cs.dv + 31) / 32);
    EXPECT_TRUE(test::BitwiseEqual(O4.Down(), o1))
        << "one block per head vs column slices: outputs";
    EXPECT_TRUE(test::BitwiseEqual(S4.Down(), s1)) << "one block per head vs column slices: state";
    FVec oc, sc;
    CpuChunked(in, &oc, &sc);
    const double o_cpu = test::Nrmse(oc, o1), s_cpu = test::Nrmse(sc, s1);
    const double o_rec = test::Nrmse(orec, o1), s_rec = test::Nrmse(srec, s1);
    std::printf(
        "[ gdn chunked ] %-32s NRMSE vs cpu chunked: O %.3e S %.3e; vs device recurrent: O %.3e S "
        "%.3e\n",
        where.c_str(), o_cpu, s_cpu, o_rec, s_rec);
    EXPECT_LT(o_cpu, 1e-6);
    EXPECT_LT(s_cpu, 1e-6);
    EXPECT_LT(o_rec, 1e-5);
    EXPECT_LT(s_rec, 1e-5);
    // The state really moved (a kernel that left S0 alone would fail the comparisons above too;
    // this names the failure).
    EXPECT_GT(test::Nrmse(in.S0, s1), 1e-2);
    if (cs.T > kGdnPrefillChunk) {
      // Split at a chunk boundary, the state handed over: the same chunks, the same bits.
      RunChunked(in, d, 0, kGdnPrefillChunk, S3, O3, scratch);
      RunChunked(in, d, kGdnPrefillChunk, cs.T - kGdnPrefillChunk, S3, O3, scratch);
      ASSERT_TRUE(SyncOk());
      EXPECT_TRUE(test::BitwiseEqual(O3.Down(), o1)) << "64 + rest vs one call: outputs";
      EXPECT_TRUE(test::BitwiseEqual(S3.Down(), s1)) << "64 + rest vs one call: state";
    }
  }
}

}  // namespace gdn_chunked_test
}  // namespace lockstep::cuda
