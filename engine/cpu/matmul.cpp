#include "cpu/matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/matmul_q8.h"
#include "cpu/quant_src.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/quant.h"
#include "util/check.h"

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

// Fixed-order reduction shared by every dot product: 32 lanes, lane l accumulates elements i
// with i % 32 == l in increasing i (a tail is zero-padded to 32); then lanes combine as
// (l, l+16), (l, l+8), then 4 + 4, 2 + 2, 1 + 1 within the last 8.
inline float Reduce32(v8f a0, v8f a1, v8f a2, v8f a3) {
  v8f s = (a0 + a2) + (a1 + a3);
  float t[8];
  std::memcpy(t, &s, sizeof(t));
  float u0 = t[0] + t[4], u1 = t[1] + t[5], u2 = t[2] + t[6], u3 = t[3] + t[7];
  float w0 = u0 + u2, w1 = u1 + u3;
  return w0 + w1;
}

// The kernels' vector: kW floats, 16 (one zmm register) where the compiler targets AVX-512, else
// 8 (AVX, or SSE pairs). The 32 accumulation lanes are the same either way (kNV = 32 / kW vectors
// hold lanes [0, 32) in order) and so are their adds and the reduction: the width changes the
// instruction count, never a bit. It matters for bf16 / f16 / block weights, whose widening costs
// instructions per element: with 8-wide vectors a bf16 row is compute-bound (~0.2 ns per weight
// per core) well before it is bandwidth-bound.
#if defined(__AVX512F__)
constexpr int kW = 16;
#else
constexpr int kW = 8;
#endif
constexpr int kNV = 32 / kW;
typedef float vf __attribute__((vector_size(4 * kW)));
typedef std::uint32_t vu __attribute__((vector_size(4 * kW)));
typedef std::uint16_t vh __attribute__((vector_size(2 * kW)));

inline vf LoadW(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Reduce32 on kNV vectors: for kW == 16, v[0] = (a0, a1) and v[1] = (a2, a3), so v[0] + v[1] is
// (a0 + a2, a1 + a3) and its halves' sum is Reduce32's first step. With AVX-512 the steps stay in
// registers (halves extracted and added: the same adds of the same lane pairs, in the same tree);
// the scalar form went through the stack and cost as much as the 16-step loop of a 512-long dot.
inline float ReduceLanes(const vf* v) {
#if defined(__AVX512F__)
  const vf u = v[0] + v[1];
  const v8f lo = __builtin_shufflevector(u, u, 0, 1, 2, 3, 4, 5, 6, 7);
  const v8f hi = __builtin_shufflevector(u, u, 8, 9, 10, 11, 12, 13, 14, 15);
  const v8f sv = lo + hi;  // s[i] = t[i] + t[i + 8]
  __m256 s;
  std::memcpy(&s, &sv, sizeof(s));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // u0..u3
  const __m128 w = _mm_add_ps(q, _mm_movehl_ps(q, q));           // w0 = u0 + u2, w1 = u1 + u3
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));  // w0 + w1
#else
  return Reduce32(v[0], v[1], v[2], v[3]);
#endif
}

// Where DotRows gets its weights: 32 consecutive f32 values at element i (a multiple of 32) of
// one weight row, and the zero-padded tail. Each source yields exactly the f32 values the row
// widens (or dequantises) to, so every source gives the bits of the f32 kernel on widened weights.
// Widening happens in registers, next to the product: a bf16 row streams half the bytes of its
// f32 copy, and decode is bound by those bytes.
struct F32Src {
  static constexpr int kChunkBytes = 128;
  const float* p;
  void Load32(int i, vf* b) const {
    for (int k = 0; k < kNV; ++k) b[k] = LoadW(p + i + kW * k);
  }
  void Tail(int i, int n, float* tb) const {
    std::memcpy(tb, p + i, static_cast<std::size_t>(n) * sizeof(float));
  }
};

// bf16 -> f32 is the 16 bits moved to the top of the word: exact.
struct Bf16Src {
  static constexpr int kChunkBytes = 64;
  const std::uint16_t* p;
  static vf Widen(const std::uint16_t* q) {
    vf f;
#if defined(__AVX512F__)
    // One zero-extending load and one shift (the generic form below compiled to 128-bit pieces
    // and inserts: twice the shuffle-port work per element).
    const __m512i u = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))), 16);
    std::memcpy(&f, &u, sizeof(f));
#else
    vh h;
    std::memcpy(&h, q, sizeof(h));
    const vu u = __builtin_convertvector(h, vu) << 16;
    std::memcpy(&f, &u, sizeof(f));
#endif
    return f;
  }
  void Load32(int i, vf* b) const {
    for (int k = 0; k < kNV; ++k) b[k] = Widen(p + i + kW * k);
  }
  void Tail(int i, int n, float* tb) const {
    for (int j = 0; j < n; ++j) tb[j] = bf16_to_f32(p[i + j]);
  }
};

// f16 -> f32 (exact): the F16C / AVX-512 conversion where the CPU has it, else the exact
// table-free scalar conversion.
struct F16Src {
  static constexpr int kChunkBytes = 64;
  const std::uint16_t* p;
  static vf Widen(const std::uint16_t* q) {
    vf v;
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    std::memcpy(&v, &f, sizeof(v));
#elif defined(__F16C__)
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    std::memcpy(&v, &f, sizeof(v));
#else
    float t[kW];
    for (int j = 0; j < kW; ++j) t[j] = f16_to_f32(q[j]);
    std::memcpy(&v, t, sizeof(v));
#endif
    return v;
  }
  void Load32(int i, vf* b) const {
    for (int k = 0; k < kNV; ++k) b[k] = Widen(p + i + kW * k);
  }
  void Tail(int i, int n, float* tb) const {
    for (int j = 0; j < n; ++j) tb[j] = f16_to_f32(p[i + j]);
  }
};

// Block types: each 32-element chunk is dequantised into a stack buffer (L1) and consumed at
// once; rows of block types have no tail (cols is a multiple of the block).
struct BlockSrc {
  static constexpr int kChunkBytes = 0;  // rows are prefetched whole (InvariantBlockT)
  const std::byte* p;
  WeightType t;
  int elems;
  std::size_t bytes;
  void Load32(int i, vf* b) const {
    alignas(64) float tb[32];
    DequantizeChunk32(t, p + static_cast<std::size_t>(i / elems) * bytes, (i % elems) / 32, tb);
    for (int k = 0; k < kNV; ++k) b[k] = LoadW(tb + kW * k);
  }
  void Tail(int, int, float*) const {}
};

// Software prefetch of the weight stream, issued from inside DotRows (see InvariantBlockT): per
// 32-element chunk, the kChunkBytes at p (then p advances), while p < end. Hints change no result.
struct Prefetch {
  const std::byte* p = nullptr;
  const std::byte* end = nullptr;
};

// R rows of x against one weight row b: R x kNV independent accumulator chains (ILP), each weight
// vector loaded once. Every (row, weight) pair goes through exactly the same per-lane adds, tail
// padding and reduction whatever R is, so results are bitwise independent of how rows are grouped.
#if defined(LOCKSTEP_QUANT_SRC)
// A super-block type (quant_src.h: Prepare / Chunk<c>): DotRows' loop a block at a time, its 8
// chunks unrolled. The same chunks in the same order into the same lanes, so the same bits.
template <class Src>
concept SuperBlockSrc = requires(const std::byte* blk) {
  Src::Prepare(blk);
};

template <class Src>
constexpr int StepOf() {
  if constexpr (requires { Src::kStep; }) return Src::kStep;
  return 1;
}

template <int R, class Src, int kC = 0>
inline void SuperChunks(const float* const* x, int i, const std::byte* blk,
                        const typename Src::Scales& s, vf (&acc)[R][kNV]) {
  constexpr int kStep = StepOf<Src>();
  if constexpr (kC < 8) {
    vf bv[kStep * kNV];
    Src::template Chunk<kC>(blk, s, bv);
    for (int u = 0; u < kStep; ++u)
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < kNV; ++k)
          acc[r][k] += LoadW(x[r] + i + 32 * (kC + u) + kW * k) * bv[u * kNV + k];
    SuperChunks<R, Src, kC + kStep>(x, i, blk, s, acc);
  }
}

template <int R, class Src>
requires SuperBlockSrc<Src>
inline void DotRows(const float* const* x, const Src& b, int n, float* out, Prefetch pf = {}) {
  vf acc[R][kNV];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < kNV; ++k) acc[r][k] = vf{};
  const std::byte* blk = b.p;
  for (int i = 0; i + 256 <= n; i += 256, blk += Src::kBlockBytes) {
    if (pf.p < pf.end) {  // the block's lines, kPrefetchBytes ahead (as the chunked stream)
      for (std::size_t c = 0; c < Src::kBlockBytes; c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf.p + c), _MM_HINT_T2);
      pf.p += Src::kBlockBytes;
    }
    SuperChunks<R, Src>(x, i, blk, Src::Prepare(blk), acc);
  }
  for (int r = 0; r < R; ++r) out[r] = ReduceLanes(acc[r]);
}
#endif

template <int R, class Src>
inline void DotRows(const float* const* x, const Src& b, int n, float* out, Prefetch pf = {}) {
  vf acc[R][kNV];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < kNV; ++k) acc[r][k] = vf{};
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    if (pf.p < pf.end) {
      if constexpr (Src::kChunkBytes % 64 == 0) {
        for (int c = 0; c < Src::kChunkBytes; c += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pf.p + c), _MM_HINT_T2);
        pf.p += Src::kChunkBytes;
      } else {  // chunks of a block type (< 64 bytes): one line each time the stream crosses one
        const auto line = reinterpret_cast<std::uintptr_t>(pf.p) >> 6;
        pf.p += Src::kChunkBytes;
        if ((reinterpret_cast<std::uintptr_t>(pf.p) >> 6) != line)
          _mm_prefetch(reinterpret_cast<const char*>(pf.p), _MM_HINT_T2);
      }
    }
    vf bv[kNV];
    b.Load32(i, bv);
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < kNV; ++k) acc[r][k] += LoadW(x[r] + i + kW * k) * bv[k];
  }
  if (i < n) {
    const std::size_t rem = static_cast<std::size_t>(n - i) * sizeof(float);
    float tb[32] = {0};
    b.Tail(i, n - i, tb);
    for (int r = 0; r < R; ++r) {
      float tx[32] = {0};
      std::memcpy(tx, x[r] + i, rem);
      for (int k = 0; k < kNV; ++k) acc[r][k] += LoadW(tx + kW * k) * LoadW(tb + kW * k);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = ReduceLanes(acc[r]);
}

}  // namespace

float Dot(const float* a, const float* b, int n) {
  float out;
  DotRows<1>(&a, F32Src{b}, n, &out);
  return out;
}

namespace {

// Rows [t, t + R) of x against one weight row: DotRows<R>, results into column yc (stride sy).
template <int R, class Src>
inline void RowBlock(const float* x, int t, std::size_t sx, const Src& src, int in, float* yc,
                     std::size_t sy, Prefetch pf) {
  float r[R];
  const float* rows[R];
  for (int j = 0; j < R; ++j) rows[j] = x + static_cast<std::size_t>(t + j) * sx;
  DotRows<R>(rows, src, in, r, pf);
  for (int j = 0; j < R; ++j) yc[static_cast<std::size_t>(t + j) * sy] = r[j];
}

// Rows per DotRows block: 8 with AVX-512 (8 x 2 accumulators of 32 registers; each weight vector
// loaded and widened once for 8 rows), 4 otherwise (4 x 4 of 16). The remainder goes through one
// DotRows of its own size, so the few rows routed to one expert share each weight load too.
// Identical bits whatever the blocking: every (row, weight) pair runs the same lane adds.
#if defined(__AVX512F__)
constexpr int kMaxRows = 8;
#else
constexpr int kMaxRows = 4;
#endif

// Weight rows stream from memory once per call while the x rows stay in cache; x rows go
// kMaxRows at a time through DotRows and the remainder through one smaller DotRows.
// The weights 4 KiB ahead of the current row are prefetched into L2 (T2 hint) from inside the
// first row block's DotRows, one line per 64 bytes consumed, so the stream's misses are spread
// over the compute. Before (2026-12-01) each row ahead was prefetched whole into L1 (T0) in one
// burst: the burst filled the line fill buffers and the core stalled on the prefetch instructions
// (~80% of this function's samples). Measured on `small`, 16 decoding rows: the step's CPU ~6%
// lower with 1 and with 2 threads; per-line T0 gained 1-2%, 8 KiB ahead no more than 4 KiB, an
// extra prefetch of each range's first 4 KiB nothing. Block types still prefetch rows whole.
template <class MakeSrc>
void InvariantBlockT(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
                     int ldy, int y_col0, const MakeSrc& make) {
  const int in = w.cols;
  const std::size_t sx = static_cast<std::size_t>(in), sy = static_cast<std::size_t>(ldy);
  const std::size_t rb = w.row_bytes();
  constexpr std::size_t kPrefetchBytes = 4096;
  using Src = decltype(make(w.row_ptr(o_begin)));
  constexpr bool kStream = [] {
#if defined(LOCKSTEP_QUANT_SRC)
    if constexpr (SuperBlockSrc<Src>) return true;  // prefetched a block at a time
#endif
    if constexpr (requires { Src::kChunkBytes; }) return Src::kChunkBytes > 0;
    return false;
  }();
  const int ahead =
      static_cast<int>(std::max<std::size_t>(1, kPrefetchBytes / std::max<std::size_t>(1, rb)));
  const std::byte* end = w.row_ptr(o_end);
  for (int o = o_begin; o < o_end; ++o) {
    const auto src = make(w.row_ptr(o));
    Prefetch pf;
    if constexpr (kStream) {
      pf = Prefetch{w.row_ptr(o) + kPrefetchBytes, end};
    } else if (o + ahead < o_end) {
      const std::byte* nx = w.row_ptr(o + ahead);
      for (std::size_t c = 0; c < rb; c += 64) __builtin_prefetch(nx + c);
    }
    float* yc = y + static_cast<std::size_t>(o - y_col0);
    int t = 0;
    for (; t + kMaxRows <= n_rows; t += kMaxRows) {
      RowBlock<kMaxRows>(x, t, sx, src, in, yc, sy, pf);
      pf = Prefetch{};
    }
    switch (n_rows - t) {
      case 0:
        break;
      case 1:
        RowBlock<1>(x, t, sx, src, in, yc, sy, pf);
        break;
      case 2:
        RowBlock<2>(x, t, sx, src, in, yc, sy, pf);
        break;
      case 3:
        RowBlock<3>(x, t, sx, src, in, yc, sy, pf);
        break;
#if defined(__AVX512F__)
      case 4:
        RowBlock<4>(x, t, sx, src, in, yc, sy, pf);
        break;
      case 5:
        RowBlock<5>(x, t, sx, src, in, yc, sy, pf);
        break;
      case 6:
        RowBlock<6>(x, t, sx, src, in, yc, sy, pf);
        break;
      default:
        RowBlock<7>(x, t, sx, src, in, yc, sy, pf);
        break;
#endif
    }
  }
}

void InvariantBlock(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
                    int ldy, int y_col0);

// A stacked matrix (weights.h) part by part: each part's rows are a row range of its own matrix,
// written where the stacked matrix puts them. Every output is still one DotRows of one weight
// row, so the split changes no bit.
void InvariantStacked(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
                      int ldy, int y_col0) {
  ForEachPartRows(w, o_begin, o_end, [&](const MatPart& p, int lo, int hi) {
    InvariantBlock(x, n_rows, p.m, lo, hi, y, ldy, y_col0 - p.row0);
  });
}

void InvariantBlock(const float* x, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
                    int ldy, int y_col0) {
  if (w.parts != nullptr) return InvariantStacked(x, n_rows, w, o_begin, o_end, y, ldy, y_col0);
  auto u16 = [](const std::byte* p) { return reinterpret_cast<const std::uint16_t*>(p); };
  switch (w.type) {
    case WeightType::kF32:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0, [](const std::byte* p) {
        return F32Src{reinterpret_cast<const float*>(p)};
      });
    case WeightType::kBF16:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [&](const std::byte* p) { return Bf16Src{u16(p)}; });
    case WeightType::kF16:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [&](const std::byte* p) { return F16Src{u16(p)}; });
#if defined(LOCKSTEP_QUANT_SRC)
    case WeightType::kQ8_0:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::Q8_0Src{p}; });
    case WeightType::kQ4_0:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::Q4LegacySrc<false>{p}; });
    case WeightType::kQ4_1:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::Q4LegacySrc<true>{p}; });
    case WeightType::kQ5_0:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::Q5_0Src{p}; });
    case WeightType::kQ4_K:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::QkKSrc<false>{p}; });
    case WeightType::kQ5_K:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::QkKSrc<true>{p}; });
    case WeightType::kQ6_K:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::Q6KSrc{p}; });
    case WeightType::kIQ4_NL:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::Iq4NlSrc{p}; });
    case WeightType::kIQ4_XS:
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0,
                             [](const std::byte* p) { return qsrc::Iq4XsSrc{p}; });
#endif
    default: {
      const int be = weight_block_elems(w.type);
      const std::size_t bb = weight_block_bytes(w.type);
      return InvariantBlockT(x, n_rows, w, o_begin, o_end, y, ldy, y_col0, [&](const std::byte* p) {
        return BlockSrc{p, w.type, be, bb};
      });
    }
  }
}

// kGemm on rows [b, e) of W. A stacked matrix's range is widened to f32 first (exact) and goes
// through GemmRows as those rows of an f32 copy would: the same ranges, so the same bits (gemm.h).
// Prefill only; the widening costs a pass over the range's weights per chunk.
void GemmRange(const float* x, int n_rows, const Mat& w, int b, int e, float* y, int ldy) {
  if (w.parts == nullptr) return GemmRows(x, n_rows, w, b, e, y, ldy);
  thread_local std::vector<float> wide;
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  wide.resize(static_cast<std::size_t>(e - b) * cols);
  for (int r = b; r < e; ++r) w.RowToF32(r, wide.data() + static_cast<std::size_t>(r - b) * cols);
  Mat f;
  f.data = wide.data();
  f.rows = e - b;
  f.cols = w.cols;
  GemmRows(x, n_rows, f, 0, e - b, y, ldy);
}

// W's rows split between the pool's threads (the reduction never is), ~16 KiB of weights per
// range at least, so dispatch stays cheap relative to work. The rows go out in shrinking ranges,
// each a 1 / (2 x threads) share of the rows left, to whichever thread is free: a fixed half each
// left one thread waiting whenever the other was slowed (a shared VM's neighbours, the other
// half's heavier part type), ~7% of a quantised decode step, and equal ranges of 1 / 16 still
// left up to one range's time at the end of each product (the waits on both threads measured
// 0.24-0.27 s -> 0.18-0.22 s over a 160-token IQ4_XS decode). Every row's bits are its own, so
// which thread takes it changes nothing.
template <class F>
void SplitRows(const Mat& w, ThreadPool* pool, const F& body) {
  const std::size_t rows = static_cast<std::size_t>(w.rows);
  const std::size_t min_rows = static_cast<std::size_t>(std::max(1, 4096 / std::max(1, w.cols)));
  if (pool == nullptr || pool->size() == 1 || rows < 2 * min_rows) return body(0, rows);
  const std::size_t threads = static_cast<std::size_t>(pool->size());
  std::atomic<std::size_t> next{0};
  pool->ParallelFor(threads, [&](std::size_t, std::size_t) {
    std::size_t b = next.load(std::memory_order_relaxed);
    while (b < rows) {
      const std::size_t e = std::min(rows, b + std::max(min_rows, (rows - b) / (2 * threads)));
      if (next.compare_exchange_weak(b, e, std::memory_order_relaxed)) {
        body(b, e);
        b = next.load(std::memory_order_relaxed);
      }
    }
  });
}

// The 8-bit product (matmul_q8.h): x rounded once on the calling thread, the weight rows split
// between the threads as kInvariant splits them.
void MatmulQ8(const float* x, int n_rows, const Mat& w, float* y, ThreadPool* pool, int ldy) {
  // A reference to the calling thread's buffer: a thread_local named inside the lambda would be
  // each worker's own.
  thread_local q8::QuantRows rows;
  q8::QuantRows& q = rows;
  q8::Quantise(x, n_rows, w, q);
  SplitRows(w, pool, [&](std::size_t b, std::size_t e) {
    q8::Rows(q, n_rows, w, static_cast<int>(b), static_cast<int>(e), y, ldy, 0);
  });
}

}  // namespace

int InvariantRowBlock() { return kMaxRows; }

namespace {

// ggml multiplies a bf16 / f16 weight with x rounded to that type (its vec_dot_type); the products
// of two such values are exact in f32, so the rounding is the whole difference. x itself where w
// is of another type; else x rounded into the calling thread's buffer.
const float* RoundedForQ8(const float* x, int n_rows, const Mat& w) {
  if (w.parts != nullptr || (w.type != WeightType::kBF16 && w.type != WeightType::kF16)) return x;
  thread_local std::vector<float> rounded;
  rounded.resize(static_cast<std::size_t>(n_rows) * static_cast<std::size_t>(w.cols));
  const bool bf = w.type == WeightType::kBF16;
  std::size_t i = 0;
#if defined(__AVX512F__)
  // bf16: f32_to_bf16's integer rounding 16 lanes at a time (a router's x took ~4 us per layer
  // of out-of-line scalar calls): nearest even by adding 0x7fff and the kept half's lsb, a NaN
  // kept with its top bits and the quiet bit. The same bits.
  if (bf) {
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (; i + 16 <= rounded.size(); i += 16) {
      const __m512i u = _mm512_loadu_si512(x + i);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(
          _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      const __m512i near = _mm512_and_si512(
          _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), hi);
      const __m512i quiet = _mm512_or_si512(_mm512_and_si512(u, hi), _mm512_set1_epi32(0x400000));
      _mm512_storeu_si512(rounded.data() + i, _mm512_mask_blend_epi32(nan, near, quiet));
    }
  }
#endif
  for (; i < rounded.size(); ++i)
    rounded[i] = bf ? round_to_bf16(x[i]) : f16_to_f32(f32_to_f16(x[i]));
  return rounded.data();
}

}  // namespace

void MatmulRowsRange(MatmulKind kind, const float* x, int n_rows, const Mat& w, int o_begin,
                     int o_end, float* y, int ldy) {
  LOCKSTEP_CHECK(IsInvariant(kind))
      << "MatmulRowsRange: a row range of kGemm could change its bits";
  if (n_rows <= 0 || o_end <= o_begin) return;
  if (kind == MatmulKind::kInvariantQ8) {
    if (q8::HasKernel(w)) {
      thread_local q8::QuantRows rows;
      q8::Quantise(x, n_rows, w, rows);
      return q8::Rows(rows, n_rows, w, o_begin, o_end, y, ldy, o_begin);
    }
    x = RoundedForQ8(x, n_rows, w);
  }
  InvariantBlock(x, n_rows, w, o_begin, o_end, y, ldy, o_begin);
}

void Matmul(MatmulKind kind, const float* x, int n_rows, const Mat& w, float* y, ThreadPool* pool,
            int ldy) {
  if (ldy < 0) ldy = w.rows;
  if (n_rows <= 0 || w.rows <= 0) return;
  if (kind == MatmulKind::kInvariantQ8 || kind == MatmulKind::kGemmQ8) {
    if (q8::HasKernel(w)) return MatmulQ8(x, n_rows, w, y, pool, ldy);
    kind = kind == MatmulKind::kGemmQ8 ? MatmulKind::kGemm : MatmulKind::kInvariant;
    x = RoundedForQ8(x, n_rows, w);
  }
  if (kind == MatmulKind::kInvariant) {
    SplitRows(w, pool, [&](std::size_t b, std::size_t e) {
      InvariantBlock(x, n_rows, w, static_cast<int>(b), static_cast<int>(e), y, ldy, 0);
    });
    return;
  }
  auto body = [&](std::size_t b, std::size_t e) {
    GemmRange(x, n_rows, w, static_cast<int>(b), static_cast<int>(e), y + b, ldy);
  };
  if (pool) {
    pool->ParallelFor(static_cast<std::size_t>(w.rows), body, 64);
  } else {
    body(0, static_cast<std::size_t>(w.rows));
  }
}

}  // namespace lockstep::cpu
