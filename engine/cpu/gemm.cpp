#include "cpu/gemm.h"

#include <immintrin.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/quant.h"

namespace lockstep::cpu {

namespace {

namespace ei = Eigen::internal;
using Eigen::Index;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Traits = ei::gebp_traits<float, float>;
using Packet = Traits::LhsPacket;
using LhsMapper = ei::const_blas_data_mapper<float, Index, Eigen::RowMajor>;
using RhsMapper = ei::const_blas_data_mapper<float, Index, Eigen::ColMajor>;
using ResMapper = ei::blas_data_mapper<float, Index, Eigen::ColMajor, Eigen::Unaligned, 1>;
using Buffer = std::vector<float, Eigen::aligned_allocator<float>>;

// Grows `b` to at least n floats and never shrinks it: the buffers are thread_local scratch that
// is written before it is read, and a resize down then up (the 3- then 2-packet panels of one
// product ask for different sizes) value-initialised the regrown part on every call (measured: a
// 2-row product of a 128 x 512 bf16 expert spent 16% of its time in that memset).
inline float* Ensure(Buffer& b, std::size_t n) {
  if (b.size() < n) b.resize(n);
  return b.data();
}

std::atomic<GemmImpl> g_impl{GemmImpl::kOwn};

// ---- widening ----

// 16 bf16 / f16 values widened to f32 (exact), where the CPU converts 16 at once.
#if defined(__AVX512F__)
inline __m512 WidenBf16x16(const std::uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 WidenF16x16(const std::uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

// W[r][c0, c0 + n) as f32 into dst: exact widening, or the chunks' dequantised values.
void WidenSegment(const Mat& w, int r, int c0, int n, float* dst) {
  const std::byte* row = w.row_ptr(r);
  const auto* u16 = reinterpret_cast<const std::uint16_t*>(row) + c0;
  int j = 0;
  switch (w.type) {
    case WeightType::kF32:
      std::memcpy(dst, row + static_cast<std::size_t>(c0) * sizeof(float),
                  static_cast<std::size_t>(n) * sizeof(float));
      return;
    case WeightType::kBF16:
#if defined(__AVX512F__)
      for (; j + 16 <= n; j += 16) _mm512_storeu_ps(dst + j, WidenBf16x16(u16 + j));
#endif
      for (; j < n; ++j) dst[j] = bf16_to_f32(u16[j]);
      return;
    case WeightType::kF16:
#if defined(__AVX512F__)
      for (; j + 16 <= n; j += 16) _mm512_storeu_ps(dst + j, WidenF16x16(u16 + j));
#endif
      for (; j < n; ++j) dst[j] = f16_to_f32(u16[j]);
      return;
    default:
      break;
  }
  const int be = weight_block_elems(w.type);
  const std::size_t bb = weight_block_bytes(w.type);
  alignas(32) float tb[32];
  for (int c = c0 / 32 * 32; c < c0 + n; c += 32) {
    DequantizeChunk32(w.type, row + static_cast<std::size_t>(c / be) * bb, (c % be) / 32, tb);
    const int lo = std::max(c, c0), hi = std::min(c + 32, c0 + n);
    std::memcpy(dst + (lo - c0), tb + (lo - c), static_cast<std::size_t>(hi - lo) * sizeof(float));
  }
}

// Rows [r0, r0 + m) of W, columns [c0, c0 + n), widened into dst (row-major, stride n).
void WidenRows(const Mat& w, int r0, int m, int c0, int n, float* dst) {
  for (int r = 0; r < m; ++r)
    WidenSegment(w, r0 + r, c0, n, dst + static_cast<std::size_t>(r) * static_cast<std::size_t>(n));
}

// ---- Eigen's own product (the reference, and the shapes Eigen does not send to its GEMM) ----

// The f32 product of rows [0, n) of a row-major W, as Eigen evaluates `Y = X * W^T`.
void EigenGemmF32(const float* x, Index T, const float* wr, Index n, Index k, float* y, Index ldy) {
  Eigen::Map<const RowMat> X(x, T, k);
  Eigen::Map<const RowMat> W(wr, n, k);
  Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y, T, n, Eigen::OuterStride<>(ldy));
  Y.noalias() = X * W.transpose();
}

// Eigen's product on a widened copy of the range.
//
// One row of X (T == 1: the prefill's last-token head) is Eigen's row-major matrix-vector
// product, which runs W's rows in groups of 8 and computes each row alone within its group: on
// blocks of a multiple of 8 rows every row meets the same code path as in one call over the
// whole range, so the range is widened and multiplied 64 rows at a time (the block stays in L2
// instead of a widened copy of the whole head going through memory twice). The last block keeps
// the rows left over, so the final rows also meet the paths they meet in one call.
void EigenGemmWidened(const float* x, int T, const Mat& w, int ob, int oe, float* y, int ldy) {
  static thread_local Buffer wide;
  const int N = oe - ob;
  if (w.type == WeightType::kF32) return EigenGemmF32(x, T, w.row(ob), N, w.cols, y, ldy);
  const int step = T == 1 ? 64 : N;
  const std::size_t K = static_cast<std::size_t>(w.cols);
  Ensure(wide, static_cast<std::size_t>(std::min(2 * step, N)) * K);
  for (int r = 0, n = 0; r < N; r += n) {
    // The last block takes the rows left over (a block of one row would be an inner product).
    n = r + 2 * step > N ? N - r : step;
    WidenRows(w, ob + r, n, 0, w.cols, wide.data());
    EigenGemmF32(x, T, wide.data(), n, w.cols, y + r, ldy);
  }
}

// The blocking Eigen 3.4 picks for the row-major product Y [T, N] = X [T, K] * W^T [K, N]
// (general_matrix_matrix_product after the transposition to Y^T = W * X^T): kc splits the
// reduction, mc W's rows, nc X's rows. Depends on the shape and the CPU's cache sizes.
struct Blocking {
  Index kc, mc, nc;
};
Blocking EigenBlocking(Index T, Index N, Index K) {
  ei::gemm_blocking_space<Eigen::RowMajor, float, float, Eigen::Dynamic, Eigen::Dynamic,
                          Eigen::Dynamic>
      b(T, N, K, 1, true);
  return {b.kc(), std::min(N, b.mc()), std::min(T, b.nc())};
}

// Eigen's sequential GEMM on blocks of W widened right before Eigen packs them: the packed
// block, every gebp call and every bit are what Eigen computes on the widened matrix.
void EigenGemmBlocks(const float* x, Index T, const Mat& w, Index ob, Index N, float* y,
                     Index ldy) {
  const Index K = w.cols;
  const Blocking bl = EigenBlocking(T, N, K);
  Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y, T, N, Eigen::OuterStride<>(ldy));
  Y.setZero();  // as generic_product_impl::evalTo
  ei::gemm_pack_lhs<float, Index, LhsMapper, Traits::mr, Traits::LhsProgress,
                    typename Traits::LhsPacket4Packing, Eigen::RowMajor>
      pack_lhs;
  ei::gemm_pack_rhs<float, Index, RhsMapper, Traits::nr, Eigen::ColMajor> pack_rhs;
  ei::gebp_kernel<float, float, Index, ResMapper, Traits::mr, Traits::nr, false, false> gebp;
  static thread_local Buffer wide, blk_a, blk_b;
  const RhsMapper rhs(x, K);
  const ResMapper res(y, ldy, 1);
  Ensure(wide, static_cast<std::size_t>(bl.kc * bl.mc));
  Ensure(blk_a, static_cast<std::size_t>(bl.kc * bl.mc));
  Ensure(blk_b, static_cast<std::size_t>(bl.kc * bl.nc));
  const bool pack_rhs_once = bl.mc != N && bl.kc == K && bl.nc == T;
  for (Index i2 = 0; i2 < N; i2 += bl.mc) {
    const Index amc = std::min(i2 + bl.mc, N) - i2;
    for (Index k2 = 0; k2 < K; k2 += bl.kc) {
      const Index akc = std::min(k2 + bl.kc, K) - k2;
      WidenRows(w, static_cast<int>(ob + i2), static_cast<int>(amc), static_cast<int>(k2),
                static_cast<int>(akc), wide.data());
      pack_lhs(blk_a.data(), LhsMapper(wide.data(), akc), akc, amc);
      for (Index j2 = 0; j2 < T; j2 += bl.nc) {
        const Index anc = std::min(j2 + bl.nc, T) - j2;
        if (!pack_rhs_once || i2 == 0) pack_rhs(blk_b.data(), rhs.getSubMapper(k2, j2), akc, anc);
        gebp(res.getSubMapper(i2, j2), blk_a.data(), blk_b.data(), amc, akc, anc, 1.0f);
      }
    }
  }
}

// Eigen sends a product to its GEMM unless it is tiny (coefficient-based) or a matrix-vector one.
bool EigenUsesGemm(Index T, Index N, Index K) {
  return K + T + N >= EIGEN_GEMM_TO_COEFFBASED_THRESHOLD && T != 1 && N != 1;
}

void GemmEigen(const float* x, int T, const Mat& w, int ob, int oe, float* y, int ldy) {
  if (w.type == WeightType::kF32 || !EigenUsesGemm(T, oe - ob, w.cols))
    return EigenGemmWidened(x, T, w, ob, oe, y, ldy);
  EigenGemmBlocks(x, T, w, ob, oe - ob, y, ldy);
}

// ---- the own matrix-vector product (T == 1 on bf16 / f16 weights) ----

#if defined(__AVX512F__)
// Eigen 3.4's row-major matrix-vector product (general_matrix_vector_product<RowMajor>, which
// `Y = X * W^T` with one row of X reaches after Eigen zeroes Y), with W widened in registers
// instead of into a buffer first (the buffer's writes and reads cost 4x the product itself on the
// single rows a prefill chunk routes to an expert). Eigen's arithmetic per row i of N:
//   acc = 0; acc = pmadd(W[i][j..j+16), x[j..j+16), acc) over the whole packets, in order;
//   cc = predux(acc);
//   only the last row when N is odd (Eigen's single-row loop): then half packets and quarter
//     packets the same way, each predux-ed and added to cc;
//   cc = cc + W[i][j] * x[j] over the columns left; y[i] = 0 + 1 * cc.
// Eigen interleaves 8, 4 or 2 rows; that changes no row's arithmetic (rows share only x), so this
// runs 8 rows at a time for the same reason (independent chains). Eigen's own pmadd and predux
// are called, so the bits are its bits.
struct GemvBf16 {
  static __m512 W16(const std::uint16_t* p) { return WidenBf16x16(p); }
  static __m256 W8(const std::uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static __m128 W4(const std::uint16_t* p) {
    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
  }
  static float W1(std::uint16_t v) { return bf16_to_f32(v); }
};
struct GemvF16 {
  static __m512 W16(const std::uint16_t* p) { return WidenF16x16(p); }
  static __m256 W8(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m128 W4(const std::uint16_t* p) {
    return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static float W1(std::uint16_t v) { return f16_to_f32(v); }
};

// Rows [i, i + G) of the product (all of Eigen's multi-row loops), or the single last row (G 1,
// single): see above.
template <class L, int G, bool kSingle = false>
inline void GemvRows(const float* x, const Mat& w, int r0, int K, float* y) {
  const std::uint16_t* p[G];
  ei::Packet16f c[G];
  for (int g = 0; g < G; ++g) {
    p[g] = reinterpret_cast<const std::uint16_t*>(w.row_ptr(r0 + g));
    c[g] = ei::pset1<ei::Packet16f>(0.0f);
  }
  int j = 0;
  for (; j + 16 <= K; j += 16) {
    const ei::Packet16f b = ei::ploadu<ei::Packet16f>(x + j);
    for (int g = 0; g < G; ++g) c[g] = ei::pmadd(L::W16(p[g] + j), b, c[g]);
  }
  for (int g = 0; g < G; ++g) {
    float cc = ei::predux(c[g]);
    int k = j;
    if constexpr (kSingle) {
      ei::Packet8f ch = ei::pset1<ei::Packet8f>(0.0f);
      for (; k + 8 <= K; k += 8)
        ch = ei::pmadd(L::W8(p[g] + k), ei::ploadu<ei::Packet8f>(x + k), ch);
      cc += ei::predux(ch);
      ei::Packet4f cq = ei::pset1<ei::Packet4f>(0.0f);
      for (; k + 4 <= K; k += 4)
        cq = ei::pmadd(L::W4(p[g] + k), ei::ploadu<ei::Packet4f>(x + k), cq);
      cc += ei::predux(cq);
    }
    for (; k < K; ++k) cc += L::W1(p[g][k]) * x[k];
    y[g] = 0.0f + 1.0f * cc;
  }
}

template <class L>
void GemvOwn(const float* x, const Mat& w, int ob, int N, float* y) {
  const int K = w.cols, grouped = N - N % 2;
  int i = 0;
  for (; i + 8 <= grouped; i += 8) GemvRows<L, 8>(x, w, ob + i, K, y + i);
  for (; i < grouped; ++i) GemvRows<L, 1>(x, w, ob + i, K, y + i);
  if (grouped < N) GemvRows<L, 1, true>(x, w, ob + grouped, K, y + grouped);
}
#endif

// ---- the own kernel ----

// Eigen's register panel: kMr rows of W (kPanels packets of kP lanes) against 4 columns of X.
constexpr int kP = Traits::LhsProgress;
constexpr int kMr = Traits::mr;
constexpr int kPanels = kMr / kP;
// The own path reproduces the 3-packet micro-kernels only (the FMA targets: AVX2 + FMA, AVX-512);
// elsewhere GemmRows is Eigen's product.
constexpr bool kOwnKernel = kPanels == 3;
// Columns per tile: 8 (two of Eigen's 4-column panels) where there are 32 vector registers
// (24 accumulators + 3 of W + 1 broadcast), else Eigen's 4.
constexpr int kPanelsPerTile = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS >= 32 ? 2 : 1;

// One tile: NP packets of rows (a: NP * kP floats per k, k-major) x 4 * NQ columns of X (column j
// read straight from X's row: xc[j][k]; X needs no packing), with Eigen's arithmetic for that row
// panel against one of its 4-column rhs panels:
//   NP = 3, 2 (its 3pX4 / 2pX4 kernels): each element one pmadd chain over k from zero;
//   NP = 1 with kSplit (its 1pX4 kernel): over the first depth & ~7 steps even k accumulate in
//     one chain and odd k in another, the two are added, then the remaining k continue the first.
// Then the chain is added to the result. `first` (the first kc block) stores it instead of adding
// it to the zeroed result Eigen starts from: 0 + c is c bitwise, because a chain that starts at
// +0 never ends at -0 (x + (+0) is +0 for x = -0, and exact cancellation rounds to +0), so the
// result needs no zeroing pass.
// (Not inlined: a tile is thousands of cycles, and profiles then show the tiles apart from the
// packing.)
template <int NP, int NQ, bool kSplit>
__attribute__((noinline)) void TileRows(const float* a, const float* const* xc, Index depth,
                                        float* res, Index ldr, bool first) {
  constexpr int kRows = NP * kP, kCols = 4 * NQ;
  Packet c[NP][kCols], d[kSplit ? NP : 1][kSplit ? kCols : 1];
  for (int p = 0; p < NP; ++p)
    for (int j = 0; j < kCols; ++j) c[p][j] = ei::pset1<Packet>(0.0f);
  if constexpr (kSplit)
    for (int p = 0; p < NP; ++p)
      for (int j = 0; j < kCols; ++j) d[p][j] = ei::pset1<Packet>(0.0f);
  const float* b[kCols];
  for (int j = 0; j < kCols; ++j) b[j] = xc[j];
  // One k step into accumulators acc; W's packed panel streams from L2 (the tile's X rows stay
  // in L1): prefetch every line ~16 steps ahead.
  auto step = [&](Packet(*acc)[kCols]) {
    Packet av[NP];
    for (int p = 0; p < NP; ++p) av[p] = ei::ploadu<Packet>(a + p * kP);
    for (int p = 0; p < NP; ++p) __builtin_prefetch(a + 16 * kRows + p * kP);
    for (int j = 0; j < kCols; ++j) {
      const Packet bb = ei::pset1<Packet>(*b[j]++);
      for (int p = 0; p < NP; ++p) acc[p][j] = ei::pmadd(av[p], bb, acc[p][j]);
    }
    a += kRows;
  };
  Index k = 0;
  if constexpr (kSplit) {
    for (const Index peeled = depth & ~Index{7}; k < peeled; k += 2) {
      step(c);
      step(d);
    }
    for (int p = 0; p < NP; ++p)
      for (int j = 0; j < kCols; ++j) c[p][j] = ei::padd(c[p][j], d[p][j]);
  }
  for (; k < depth; ++k) step(c);
  for (int j = 0; j < kCols; ++j) {
    float* r = res + j * ldr;
    for (int p = 0; p < NP; ++p)
      ei::pstoreu(r + p * kP, first ? c[p][j] : ei::padd(c[p][j], ei::ploadu<Packet>(r + p * kP)));
  }
}

// NC single columns (Eigen's 3pX1, 2pX1 and 1pX1 kernels: one chain for every row panel; column j
// read as xc[j][k]). Up to 3 columns at once, so that a 1-packet panel still has enough
// independent chains to fill the FMA pipes.
template <int NP, int NC>
inline void TileColumns(const float* a, const float* const* xc, Index depth, float* res, Index ldr,
                        bool first) {
  Packet c[NC][NP];
  for (int j = 0; j < NC; ++j)
    for (int p = 0; p < NP; ++p) c[j][p] = ei::pset1<Packet>(0.0f);
  for (Index k = 0; k < depth; ++k, a += NP * kP) {
    Packet av[NP];
    for (int p = 0; p < NP; ++p) av[p] = ei::ploadu<Packet>(a + p * kP);
    for (int j = 0; j < NC; ++j) {
      const Packet bb = ei::pset1<Packet>(xc[j][k]);
      for (int p = 0; p < NP; ++p) c[j][p] = ei::pmadd(av[p], bb, c[j][p]);
    }
  }
  for (int j = 0; j < NC; ++j)
    for (int p = 0; p < NP; ++p) {
      float* r = res + j * ldr + p * kP;
      ei::pstoreu(r, first ? c[j][p] : ei::padd(c[j][p], ei::ploadu<Packet>(r)));
    }
}

// rows (a multiple of NP * kP) of packed W, in panels of NP packets, against one of Eigen's nc
// blocks of X: cols rows of X from xb (row stride ldx, the block's kc columns), split as Eigen's
// rhs packing splits them (4-column panels, then the last cols % 4 one by one: the split decides
// which arithmetic a 1-packet panel uses). Column groups outside, W's panels inside, so the group's
// X rows stay in L1 while W's block streams from L2.
template <int NP>
void KernelBlock(const float* apack, Index rows, const float* xb, Index ldx, Index depth,
                 Index cols, float* res, Index ldr, bool first) {
  constexpr bool kSplit = NP == 1;  // Eigen's 1pX4 kernel splits its chains
  constexpr int kRows = NP * kP;
  const Index pc4 = cols / 4 * 4;
  const float* xc[4 * kPanelsPerTile];
  auto columns = [&](Index j, int n) {
    for (int c = 0; c < n; ++c) xc[c] = xb + (j + c) * ldx;
  };
  Index j = 0;
  for (; j + 4 * kPanelsPerTile <= pc4; j += 4 * kPanelsPerTile) {
    columns(j, 4 * kPanelsPerTile);
    for (Index i = 0; i < rows; i += kRows)
      TileRows<NP, kPanelsPerTile, kSplit>(apack + i * depth, xc, depth, res + i + j * ldr, ldr,
                                           first);
  }
  for (; j < pc4; j += 4) {
    columns(j, 4);
    for (Index i = 0; i < rows; i += kRows)
      TileRows<NP, 1, kSplit>(apack + i * depth, xc, depth, res + i + j * ldr, ldr, first);
  }
  if (j == cols) return;
  const int n = static_cast<int>(cols - j);  // 1 to 3
  columns(j, n);
  for (Index i = 0; i < rows; i += kRows) {
    const float* a = apack + i * depth;
    float* r = res + i + j * ldr;
    if (n == 3) TileColumns<NP, 3>(a, xc, depth, r, ldr, first);
    if (n == 2) TileColumns<NP, 2>(a, xc, depth, r, ldr, first);
    if (n == 1) TileColumns<NP, 1>(a, xc, depth, r, ldr, first);
  }
}

#if defined(__AVX512F__)
// 16 x 16 f32 transpose in registers: r[i] = row i in, r[j] = column j out.
inline void Transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xDD);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
  }
}

// Loaders of 16 consecutive values of a row, widened to f32 (exact).
struct LoadF32 {
  static __m512 At(const std::byte* row, int c) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
};
struct LoadBf16 {
  static __m512 At(const std::byte* row, int c) {
    return WidenBf16x16(reinterpret_cast<const std::uint16_t*>(row) + c);
  }
};
struct LoadF16 {
  static __m512 At(const std::byte* row, int c) {
    return WidenF16x16(reinterpret_cast<const std::uint16_t*>(row) + c);
  }
};

// PackW's AVX-512 body: 16 x 16 blocks widened and transposed in registers.
template <class Load>
__attribute__((noinline)) void PackW16(const Mat& w, int r0, int m, int ph, int c0, int n,
                                       float* apack) {
  const int n16 = n / 16 * 16;
  for (int p = 0; p < m / ph; ++p) {
    float* panel = apack + static_cast<std::size_t>(p) * ph * n;
    for (int g = 0; g < ph / 16; ++g) {
      const std::byte* rows[16];
      for (int i = 0; i < 16; ++i) rows[i] = w.row_ptr(r0 + p * ph + g * 16 + i);
      int k = 0;
      if constexpr (std::is_same_v<Load, LoadBf16>) {
        // bf16: 32 columns at a time as 16 pairs. Row i's 32 bf16 are 16 dwords (columns
        // c, c + 1 in the low and high half); transposing the dwords puts pair j of all 16 rows in
        // one register, and the pair's columns widen by a shift (low half) and a mask (high half,
        // already in place). Half the shuffles of widening first and transposing floats.
        for (; k + 32 <= n16; k += 32) {
          __m512 r[16];
          for (int i = 0; i < 16; ++i)
            r[i] = _mm512_castsi512_ps(
                _mm512_loadu_si512(reinterpret_cast<const std::uint16_t*>(rows[i]) + c0 + k));
          Transpose16(r);
          for (int j = 0; j < 16; ++j) {
            const __m512i d = _mm512_castps_si512(r[j]);
            float* dst = panel + static_cast<std::size_t>(k + 2 * j) * ph + g * 16;
            _mm512_storeu_ps(dst, _mm512_castsi512_ps(_mm512_slli_epi32(d, 16)));
            _mm512_storeu_ps(dst + ph, _mm512_castsi512_ps(_mm512_and_si512(
                                           d, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)))));
          }
        }
      }
      for (; k < n16; k += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = Load::At(rows[i], c0 + k);
        Transpose16(r);
        for (int j = 0; j < 16; ++j)
          _mm512_storeu_ps(panel + static_cast<std::size_t>(k + j) * ph + g * 16, r[j]);
      }
      if (n16 == n) continue;
      alignas(64) float tail[16];
      for (int i = 0; i < 16; ++i) {
        WidenSegment(w, r0 + p * ph + g * 16 + i, c0 + n16, n - n16, tail);
        for (int kt = n16; kt < n; ++kt)
          panel[static_cast<std::size_t>(kt) * ph + g * 16 + i] = tail[kt - n16];
      }
    }
  }
}
#endif

// W's rows [r0, r0 + m) (m a multiple of the panel height ph), columns [c0, c0 + n), into the
// own kernel's layout: panel p of ph rows at apack + p * ph * n, ph floats per k (row i of the
// panel at offset i). The values are the widened weights: packing copies, so it touches no result
// bit. f32 / bf16 / f16 on AVX-512: 16 x 16 blocks widened and transposed in registers (one pass
// over the weights instead of widening into a buffer and letting Eigen pack it).
void PackW(const Mat& w, int r0, int m, int ph, int c0, int n, float* apack, Buffer* scratch) {
#if defined(__AVX512F__)
  if constexpr (kP == 16) {
    switch (w.type) {
      case WeightType::kF32:
        return PackW16<LoadF32>(w, r0, m, ph, c0, n, apack);
      case WeightType::kBF16:
        return PackW16<LoadBf16>(w, r0, m, ph, c0, n, apack);
      case WeightType::kF16:
        return PackW16<LoadF16>(w, r0, m, ph, c0, n, apack);
      default:
        break;
    }
  }
#endif
  Ensure(*scratch, static_cast<std::size_t>(n));
  for (int i = 0; i < m; ++i) {
    WidenSegment(w, r0 + i, c0, n, scratch->data());
    float* panel = apack + static_cast<std::size_t>(i / ph) * ph * n + i % ph;
    for (int k = 0; k < n; ++k) panel[static_cast<std::size_t>(k) * ph] = (*scratch)[k];
  }
}

// Rows of W per packed block of the own kernel: ~768 KB of f32 (the block and X's rows for one kc
// block stay in the 2 MB L2 of the machines we measure on).
Index RowsPerBlock(Index depth) {
  return (768 * 1024 / static_cast<Index>(sizeof(float))) / std::max<Index>(1, depth);
}

struct OwnBuffers {
  Buffer xpack, apack, wide, blk_a, scratch;
};

// The operands of one kc block [k2, k2 + akc) of the range's product.
struct KBlock {
  const float* x;  // X [T, K], row-major
  Index T, K, k2, akc, nc;
};

// Rows [r, r + rows) of the range (a multiple of NP packets) through the own kernel with NP-packet
// panels, in packed blocks of about `step` rows.
template <int NP>
void OwnRows(const Mat& w, Index ob, Index r, Index rows, const KBlock& kb, OwnBuffers* b, float* y,
             Index ldy) {
  constexpr int kRows = NP * kP;
  const Index step = std::max<Index>(kRows, RowsPerBlock(kb.akc) / kRows * kRows);
  Ensure(b->apack, static_cast<std::size_t>(std::min(step, rows) * kb.akc));
  for (Index i3 = 0; i3 < rows; i3 += step) {
    const Index m = std::min(step, rows - i3);
    PackW(w, static_cast<int>(ob + r + i3), static_cast<int>(m), kRows, static_cast<int>(kb.k2),
          static_cast<int>(kb.akc), b->apack.data(), &b->scratch);
    for (Index j2 = 0; j2 < kb.T; j2 += kb.nc)
      KernelBlock<NP>(b->apack.data(), m, kb.x + j2 * kb.K + kb.k2, kb.K, kb.akc,
                      std::min(j2 + kb.nc, kb.T) - j2, y + (r + i3) + j2 * ldy, ldy, kb.k2 == 0);
  }
}

// One kc block of the reduction for Eigen's row block [i2, i2 + amc) of the range, split as
// Eigen's gebp splits it: rows in 3-, 2- and 1-packet panels through the own kernel (each with
// that panel's arithmetic), the last rows (fewer than a packet: Eigen's half-, quarter-packet and
// scalar paths) through Eigen's packing and gebp kernel.
void OwnRowBlock(const Mat& w, Index ob, Index i2, Index amc, const KBlock& kb, OwnBuffers* b,
                 float* y, Index ldy) {
  const Index r3 = amc / (3 * kP) * (3 * kP);
  const Index r2 = r3 + (amc - r3) / (2 * kP) * (2 * kP);
  const Index r1 = r2 + (amc - r2) / kP * kP;
  if (r3 > 0) OwnRows<3>(w, ob, i2, r3, kb, b, y, ldy);
  if (r2 > r3) OwnRows<2>(w, ob, i2 + r3, r2 - r3, kb, b, y, ldy);
  if (r1 > r2) OwnRows<1>(w, ob, i2 + r2, r1 - r2, kb, b, y, ldy);
  const Index rem = amc - r1;
  if (rem == 0) return;
  const Index T = kb.T, nc = kb.nc, k2 = kb.k2, akc = kb.akc;
  // X's block in Eigen's packed rhs layout, per nc block, for gebp.
  ei::gemm_pack_rhs<float, Index, RhsMapper, Traits::nr, Eigen::ColMajor> pack_rhs;
  const RhsMapper rhs(kb.x, kb.K);
  Ensure(b->xpack, static_cast<std::size_t>(akc * T));
  for (Index j2 = 0; j2 < T; j2 += nc)
    pack_rhs(b->xpack.data() + j2 * akc, rhs.getSubMapper(k2, j2), akc, std::min(j2 + nc, T) - j2);
  ei::gemm_pack_lhs<float, Index, LhsMapper, Traits::mr, Traits::LhsProgress,
                    typename Traits::LhsPacket4Packing, Eigen::RowMajor>
      pack_lhs;
  ei::gebp_kernel<float, float, Index, ResMapper, Traits::mr, Traits::nr, false, false> gebp;
  Ensure(b->wide, static_cast<std::size_t>(rem * akc));
  Ensure(b->blk_a, static_cast<std::size_t>(rem * akc));
  WidenRows(w, static_cast<int>(ob + i2 + r1), static_cast<int>(rem), static_cast<int>(k2),
            static_cast<int>(akc), b->wide.data());
  pack_lhs(b->blk_a.data(), LhsMapper(b->wide.data(), akc), akc, rem);
  if (k2 == 0)  // gebp adds to the result: these rows start from Eigen's zeros
    for (Index t = 0; t < T; ++t)
      std::memset(y + t * ldy + i2 + r1, 0, static_cast<std::size_t>(rem) * sizeof(float));
  const ResMapper res(y, ldy, 1);
  for (Index j2 = 0; j2 < T; j2 += nc)
    gebp(res.getSubMapper(i2 + r1, j2), b->blk_a.data(), b->xpack.data() + j2 * akc, rem, akc,
         std::min(j2 + nc, T) - j2, 1.0f);
}

void GemmOwn(const float* x, Index T, const Mat& w, Index ob, Index N, float* y, Index ldy) {
  const Index K = w.cols;
  const Blocking bl = EigenBlocking(T, N, K);
  static thread_local OwnBuffers b;
  for (Index k2 = 0; k2 < K; k2 += bl.kc) {
    const KBlock kb{x, T, K, k2, std::min(k2 + bl.kc, K) - k2, bl.nc};
    for (Index i2 = 0; i2 < N; i2 += bl.mc)
      OwnRowBlock(w, ob, i2, std::min(i2 + bl.mc, N) - i2, kb, &b, y, ldy);
  }
}

}  // namespace

void SetGemmImpl(GemmImpl impl) { g_impl.store(impl, std::memory_order_relaxed); }
GemmImpl CurrentGemmImpl() { return g_impl.load(std::memory_order_relaxed); }
int GemmColumnPanel() { return 4; }
int GemmColumnTile() { return 4 * kPanelsPerTile; }

void GemmRows(const float* x, int T, const Mat& w, int ob, int oe, float* y, int ldy) {
  const int N = oe - ob;
#if defined(__AVX512F__)
  // One row of X on bf16 / f16 (f32 needs no widening: Eigen's own product reads it in place).
  if (T == 1 && N != 1 && CurrentGemmImpl() == GemmImpl::kOwn &&
      N + 1 + w.cols >= EIGEN_GEMM_TO_COEFFBASED_THRESHOLD) {
    if (w.type == WeightType::kBF16) return GemvOwn<GemvBf16>(x, w, ob, N, y);
    if (w.type == WeightType::kF16) return GemvOwn<GemvF16>(x, w, ob, N, y);
  }
#endif
  if (!kOwnKernel || CurrentGemmImpl() == GemmImpl::kEigen || !EigenUsesGemm(T, N, w.cols))
    return GemmEigen(x, T, w, ob, oe, y, ldy);
  GemmOwn(x, T, w, ob, N, y, ldy);
}

}  // namespace lockstep::cpu
