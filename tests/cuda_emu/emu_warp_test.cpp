// EmuWarp.*: the emulator's warp collective (emu::WarpGather), which kernel_math.h's WarpCombine,
// WarpCombineRows and WarpAbsMax use on the emulator instead of five shuffles each: every lane's
// result must be the bits of the shuffle butterfly those helpers run on a GPU, here run with the
// emulator's shuffles in the same kernel; and a lane that is not in the collective is reported,
// like a shuffle from it. Emulator-only.
// clang-format off: include order matters here
#include "cuda_emu.h"  // first, as in a converted kernel file: kernel_math.h's device helpers
// clang-format on

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cuda/kernel_math.h"

namespace lockstep::cuda {
namespace {

constexpr int kRows = 16;  // WarpCombineRows' widest use (RowsMatmul's passes)

// The GPU form of the helpers: the butterfly over __shfl_xor_sync (emu::Shfl here).
template <typename Op>
float ShuffleButterfly(float v, Op op) {
  for (int off = km::kWarp / 2; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Inputs where operand order and lane order show: NaNs with different payloads, signed zeros,
// infinities, subnormals, mixed scales.
std::vector<float> Inputs(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(u(rng), static_cast<int>(rng() % 40) - 20);
  for (std::size_t i = 0; i + 32 <= n; i += 37) {
    v[i] = std::bit_cast<float>(0x7fc00000u | static_cast<std::uint32_t>(i + 1));
    v[i + 5] = -0.0f, v[i + 6] = 0.0f, v[i + 9] = std::numeric_limits<float>::denorm_min();
    v[i + 13] = (i / 37) % 2 ? INFINITY : -INFINITY;
  }
  return v;
}

// One launch of `blocks` blocks of `threads` threads (whole warps); thread t of block b reads
// in[(b * threads + t) * kRows + r] and writes, for each r, the collective's and the shuffles'
// results side by side.
struct Results {
  std::vector<float> combine, combine_ref, rows, rows_ref, absmax, absmax_ref;
};
Results RunHelpers(const std::vector<float>& in, int blocks, int threads) {
  const std::size_t n = static_cast<std::size_t>(blocks) * static_cast<std::size_t>(threads);
  Results r{std::vector<float>(n),         std::vector<float>(n), std::vector<float>(n * kRows),
            std::vector<float>(n * kRows), std::vector<float>(n), std::vector<float>(n)};
  emu::Launch(dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(threads)), 0, nullptr,
              0, "EmuWarpTest", [&] {
                const std::size_t t = blockIdx.x * blockDim.x + threadIdx.x;
                const float* x = in.data() + t * kRows;
                r.combine[t] = km::WarpCombine(x[0]);
                r.combine_ref[t] = ShuffleButterfly(x[0], km::CombineStep);
                km::WarpCombineRows<kRows>(x, r.rows.data() + t * kRows);
                for (int i = 0; i < kRows; ++i)
                  r.rows_ref[t * kRows + i] = ShuffleButterfly(x[i], km::CombineStep);
                const float a = std::fabs(x[1]);
                r.absmax[t] = km::WarpAbsMax(a);
                r.absmax_ref[t] = ShuffleButterfly(a, km::AbsMaxCombine);
              });
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return r;
}

void ExpectBitwise(const std::vector<float>& got, const std::vector<float>& want,
                   const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]) && ++bad <= 3)
      ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs the shuffles' " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

TEST(EmuWarp, GatheredButterfliesAreBitwiseTheShuffles) {
  for (const int threads : {32, 128, 256}) {
    const int blocks = 3;
    const std::vector<float> in = Inputs(static_cast<std::size_t>(blocks * threads * kRows),
                                         7u + static_cast<unsigned>(threads));
    const Results r = RunHelpers(in, blocks, threads);
    ExpectBitwise(r.combine, r.combine_ref, "WarpCombine");
    ExpectBitwise(r.rows, r.rows_ref, "WarpCombineRows<16>");
    ExpectBitwise(r.absmax, r.absmax_ref, "WarpAbsMax");
    // The inputs reach the lanes unevenly: results differ between warps (a collective that
    // read another warp's values, or one lane's values for all, would not).
    EXPECT_NE(std::bit_cast<std::uint32_t>(r.rows[kRows + 2]),
              std::bit_cast<std::uint32_t>(r.rows[32 * kRows + 2]));
  }
}

// A lane that returned before the collective is reported (a GPU shuffle from it reads garbage).
TEST(EmuWarp, ALaneMissingFromTheCollectiveIsReported) {
  std::vector<float> out(32);
  emu::ExpectWarnings w;
  emu::Launch(dim3(1), dim3(32), 0, nullptr, 0, "EmuWarpExit", [&] {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = km::WarpCombine(1.0f);
  });
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_GE(w.Count(), 1);
  EXPECT_TRUE(w.Saw(
      "EmuWarpExit: warp collective of lane 0 reads lane 31, which is not in the same collective"));
}

}  // namespace
}  // namespace lockstep::cuda
