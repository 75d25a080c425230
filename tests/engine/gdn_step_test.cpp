// The decode recurrence's kernel (cpu::GatedDeltaStepFrom) against its documented f32 operation
// order written out in scalars: the register-blocked form used for Dv % 64 == 0 (every preset but
// `tiny`) and the loop form for the other widths must both give exactly these bits, from a
// separate entering state and in place (GatedDeltaStep). The tolerance test of the arithmetic
// against f64 is OpReference.GatedDeltaStep; this one pins the rounding.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/gdn.h"

namespace lockstep {
namespace {

using FVec = std::vector<float>;

FVec Rand(std::size_t n, std::uint64_t seed, float lo, float hi) {
  FVec v(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = lo + (hi - lo) * static_cast<float>(s >> 40) / static_cast<float>(1u << 24);
  }
  return v;
}

// gdn.h's order: S <- alpha S and m[j] += S[kk][j] k[kk] over kk ascending; delta = beta (v - m);
// S[kk][j] += k[kk] delta[j] and o[j] += S[kk][j] q[kk] over kk ascending; f32, no contraction.
void ScalarStep(const FVec& S_in, FVec& S, const FVec& q, const FVec& k, const FVec& v, float alpha,
                float beta, int dk, int dv, FVec& o) {
  const auto at = [dv](int kk, int j) { return static_cast<std::size_t>(kk * dv + j); };
  FVec m(static_cast<std::size_t>(dv), 0.0f), delta(static_cast<std::size_t>(dv));
  o.assign(static_cast<std::size_t>(dv), 0.0f);
  for (int kk = 0; kk < dk; ++kk)
    for (int j = 0; j < dv; ++j) {
      const float r = S_in[at(kk, j)] * alpha;
      S[at(kk, j)] = r;
      m[static_cast<std::size_t>(j)] =
          m[static_cast<std::size_t>(j)] + r * k[static_cast<std::size_t>(kk)];
    }
  for (int j = 0; j < dv; ++j)
    delta[static_cast<std::size_t>(j)] =
        beta * (v[static_cast<std::size_t>(j)] - m[static_cast<std::size_t>(j)]);
  for (int kk = 0; kk < dk; ++kk)
    for (int j = 0; j < dv; ++j) {
      const float r =
          S[at(kk, j)] + k[static_cast<std::size_t>(kk)] * delta[static_cast<std::size_t>(j)];
      S[at(kk, j)] = r;
      o[static_cast<std::size_t>(j)] =
          o[static_cast<std::size_t>(j)] + r * q[static_cast<std::size_t>(kk)];
    }
}

bool SameBits(const FVec& a, const FVec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(GdnStep, BothFormsFollowTheScalarOrderBitwise) {
  std::uint64_t seed = 7;
  for (auto [dk, dv] :
       {std::pair{64, 64}, std::pair{32, 128}, std::pair{16, 24}, std::pair{8, 16}}) {
    const std::size_t ns = static_cast<std::size_t>(dk) * static_cast<std::size_t>(dv);
    FVec S_in = Rand(ns, seed++, -0.5f, 0.5f);
    for (int step = 0; step < 4; ++step) {
      const FVec q = Rand(static_cast<std::size_t>(dk), seed++, -1.0f, 1.0f);
      const FVec k = Rand(static_cast<std::size_t>(dk), seed++, -0.3f, 0.3f);
      const FVec v = Rand(static_cast<std::size_t>(dv), seed++, -2.0f, 2.0f);
      const float alpha = 0.3f + 0.1f * static_cast<float>(step), beta = 0.7f;
      FVec S_ref(ns), o_ref, S_got(ns, -1.0f), o_got(static_cast<std::size_t>(dv));
      ScalarStep(S_in, S_ref, q, k, v, alpha, beta, dk, dv, o_ref);
      cpu::GatedDeltaStepFrom(S_in.data(), S_got.data(), q.data(), k.data(), v.data(), alpha, beta,
                              dk, dv, o_got.data());
      const std::string tag = "dk=" + std::to_string(dk) + " dv=" + std::to_string(dv);
      EXPECT_TRUE(SameBits(S_ref, S_got)) << tag;
      EXPECT_TRUE(SameBits(o_ref, o_got)) << tag;
      FVec S_inplace = S_in, o_inplace(static_cast<std::size_t>(dv));
      cpu::GatedDeltaStep(S_inplace.data(), q.data(), k.data(), v.data(), alpha, beta, dk, dv,
                          o_inplace.data());
      EXPECT_TRUE(SameBits(S_ref, S_inplace)) << tag << " in place";
      EXPECT_TRUE(SameBits(o_ref, o_inplace)) << tag << " in place";
      // Streamed (non-temporal) stores into 64-byte-aligned storage, as the last step of a
      // window writes: the same bits.
      std::vector<float, Align64<float>> S_stream(ns, -1.0f);
      FVec o_stream(static_cast<std::size_t>(dv));
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(S_stream.data()) % 64, 0u);
      cpu::GatedDeltaStepFrom(S_in.data(), S_stream.data(), q.data(), k.data(), v.data(), alpha,
                              beta, dk, dv, o_stream.data(), true);
      EXPECT_TRUE(std::memcmp(S_ref.data(), S_stream.data(), ns * sizeof(float)) == 0)
          << tag << " streamed";
      EXPECT_TRUE(SameBits(o_ref, o_stream)) << tag << " streamed";
      S_in = S_ref;  // the next step starts from this one's state
    }
  }
}

}  // namespace
}  // namespace lockstep
