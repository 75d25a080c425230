// The 8-bit products of `quant_dot = ggml` (matmul_q8.h has the arithmetic). Written here rather
// than taken from ggml: ggml's vec_dot kernels sum in an order that depends on the build's
// instruction set, and ours must be one fixed order on every machine (the portable form below is
// the definition; the AVX-512 form computes the same integers and the same f32 operations).
#include "cpu/matmul_q8.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu/quant_src.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/engine/quant.h"
#include "model/quant_grids.h"
#include "util/check.h"

namespace lockstep::cpu::q8 {

namespace {

using iq_grids::kIq4nl;

using U8 = std::uint8_t;

inline U8 Byte(const std::byte* p, std::size_t i) { return static_cast<U8>(p[i]); }

inline float HalfAt(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// One row of x in one format: pointers into QuantRows.
struct XRow {
  const std::int8_t* q;
  const std::int32_t* n;
  const float* d;
  const std::int32_t* bsum;
};

XRow RowOf(const QuantRows::Format& f, int cols, int t, int block) {
  const std::size_t c = static_cast<std::size_t>(cols), r = static_cast<std::size_t>(t);
  return XRow{f.q.data() + r * c, f.n.data() + r * c / (block == 256 ? 16 : 4),
              f.d.data() + r * c / static_cast<std::size_t>(block),
              f.bsum.empty() ? nullptr : f.bsum.data() + r * c / 32};
}

// ---- the weight types: integers per block (portable and AVX-512 forms) ----

// 32-element types: 32 signed integers and the f16 scale d at byte 0.
struct Q8_0B {
  static constexpr std::size_t kBytes = 34;
  static void Ints(const std::byte* b, int* v) {
    for (int j = 0; j < 32; ++j) v[j] = static_cast<std::int8_t>(Byte(b, 2 + j));
  }
#if defined(LOCKSTEP_Q8_SIMD)
  static __m256i Ints256(const std::byte* b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  }
#endif
};

#if defined(LOCKSTEP_Q8_SIMD)
// Byte j of the 16 at p: its low nibble as element j, its high nibble as element j + 16.
inline __m256i Nibbles32(const std::byte* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}
#endif

struct Q4_0B {
  static constexpr std::size_t kBytes = 18;
  static void Ints(const std::byte* b, int* v) {
    for (int j = 0; j < 16; ++j) {
      v[j] = (Byte(b, 2 + j) & 15) - 8;
      v[j + 16] = (Byte(b, 2 + j) >> 4) - 8;
    }
  }
#if defined(LOCKSTEP_Q8_SIMD)
  static __m256i Ints256(const std::byte* b) {
    return _mm256_sub_epi8(Nibbles32(b + 2), _mm256_set1_epi8(8));
  }
#endif
};

struct Q5_0B {
  static constexpr std::size_t kBytes = 22;
  static std::uint32_t Qh(const std::byte* b) {
    std::uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    return qh;
  }
  static void Ints(const std::byte* b, int* v) {
    const std::uint32_t qh = Qh(b);
    for (int j = 0; j < 16; ++j) {
      v[j] = ((Byte(b, 6 + j) & 15) | static_cast<int>(((qh >> j) & 1) << 4)) - 16;
      v[j + 16] = ((Byte(b, 6 + j) >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4)) - 16;
    }
  }
#if defined(LOCKSTEP_Q8_SIMD)
  static __m256i Ints256(const std::byte* b) {
    const __m256i u = Nibbles32(b + 6);
    const __m256i h = _mm256_mask_add_epi8(u, Qh(b), u, _mm256_set1_epi8(16));
    return _mm256_sub_epi8(h, _mm256_set1_epi8(16));
  }
#endif
};

struct Iq4NlB {
  static constexpr std::size_t kBytes = 18;
  static void Ints(const std::byte* b, int* v) {
    for (int j = 0; j < 16; ++j) {
      v[j] = kIq4nl[Byte(b, 2 + j) & 15];
      v[j + 16] = kIq4nl[Byte(b, 2 + j) >> 4];
    }
  }
#if defined(LOCKSTEP_Q8_SIMD)
  static __m256i Ints256(const std::byte* b) {
    const __m256i t = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const void*>(kIq4nl))));
    return _mm256_shuffle_epi8(t, Nibbles32(b + 2));
  }
#endif
};

// K types (256 elements): integers v[256] as the formula multiplies them (Q6_K's q - 32, IQ4_XS's
// table value), the scale of each sub-block (8 of 32, or Q6_K's 16 of 16), d, and the mins.
struct KBlock {
  int v[256];
  int sc[16];
  int n_sc = 8;
  int m[8];
  float d = 0.0f, dmin = 0.0f;
};

inline void Q45KScales(const std::byte* b, KBlock& k) {
  const auto* s = reinterpret_cast<const U8*>(b + 4);
  for (int j = 0; j < 8; ++j) {
    U8 sc, m;
    Q4KScaleMin(j, s, &sc, &m);
    k.sc[j] = sc;
    k.m[j] = m;
  }
  k.d = HalfAt(b);
  k.dmin = HalfAt(b + 2);
}

// Q4_K (kFive false) and Q5_K: element 64c + l (l < 32) is the low nibble of byte 32c + l of
// the codes, element 64c + 32 + l its high nibble; Q5_K adds bit 2c (or 2c + 1) of qh[l] as 16.
template <bool kFive>
struct QkKB {
  static constexpr std::size_t kBytes = kFive ? 176 : 144;
  static constexpr std::size_t kCodes = kFive ? 48 : 16;  // where the nibbles start
  static constexpr bool kMins = true;
  static void Decode(const std::byte* b, KBlock& k) {
    Q45KScales(b, k);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const U8 q = Byte(b, kCodes + 32 * static_cast<std::size_t>(c) + l);
        const int h = kFive ? Byte(b, 16 + static_cast<std::size_t>(l)) : 0;
        k.v[64 * c + l] = (q & 15) | (((h >> (2 * c)) & 1) << 4);
        k.v[64 * c + 32 + l] = (q >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
      }
  }
};
using Q4KB = QkKB<false>;
using Q5KB = QkKB<true>;

struct Q6KB {
  static constexpr std::size_t kBytes = 210;
  static constexpr bool kMins = false;
  static void Decode(const std::byte* b, KBlock& k) {
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const U8 a = Byte(b, 64 * h + l), c = Byte(b, 64 * h + l + 32),
                 e = Byte(b, 128 + 32 * h + l);
        int* v = k.v + 128 * h;
        v[l] = ((a & 15) | ((e & 3) << 4)) - 32;
        v[l + 32] = ((c & 15) | (((e >> 2) & 3) << 4)) - 32;
        v[l + 64] = ((a >> 4) | (((e >> 4) & 3) << 4)) - 32;
        v[l + 96] = ((c >> 4) | (((e >> 6) & 3) << 4)) - 32;
      }
    for (int j = 0; j < 16; ++j) k.sc[j] = static_cast<std::int8_t>(Byte(b, 192 + j));
    k.n_sc = 16;
    k.d = HalfAt(b + 208);
  }
};

struct Iq4XsB {
  static constexpr std::size_t kBytes = 136;
  static constexpr bool kMins = false;
  static int Ls(const std::byte* b, int ib) {
    std::uint16_t sh;
    std::memcpy(&sh, b + 2, 2);
    return ((Byte(b, 4 + ib / 2) >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
  }
  static void Decode(const std::byte* b, KBlock& k) {
    for (int ib = 0; ib < 8; ++ib) {
      k.sc[ib] = Ls(b, ib) - 32;
      for (int j = 0; j < 16; ++j) {
        const U8 q = Byte(b, 8 + 16 * ib + j);
        k.v[32 * ib + j] = kIq4nl[q & 15];
        k.v[32 * ib + 16 + j] = kIq4nl[q >> 4];
      }
    }
    k.d = HalfAt(b);
  }
};

// Whether K's lanes follow IQ4_XS's own order (x in the bx format, Iq4XsElement) rather than the
// 256 format's.
template <class K>
constexpr bool kBxLanes = std::is_same_v<K, Iq4XsB>;

// The fixed 16-lane tree (matmul_q8.h): a[i] + a[i+8], then + 4, + 2, + 1.
float Reduce16(const float* a) {
  float s[8], u[4];
  for (int i = 0; i < 8; ++i) s[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = s[i] + s[i + 4];
  const float w0 = u[0] + u[2], w1 = u[1] + u[3];
  return w0 + w1;
}

// The 8-lane tree of the mins' lanes: a[i] + a[i+4], then + 2, + 1.
float Reduce8(const float* a) {
  float s[4];
  for (int i = 0; i < 4; ++i) s[i] = a[i] + a[i + 4];
  const float w0 = s[0] + s[2], w1 = s[1] + s[3];
  return w0 + w1;
}

// ---- the portable form (the definition) ----

template <class B>
float Dot32Portable(const std::byte* row, int nb, const XRow& x) {
  float acc[16] = {0};
  int v[32];
  for (int b = 0; b < nb; ++b) {
    const std::byte* blk = row + static_cast<std::size_t>(b) * B::kBytes;
    B::Ints(blk, v);
    const float s = HalfAt(blk) * x.d[b];
    const std::int8_t* xq = x.q + 32 * b;
    for (int j = 0; j < 8; ++j) {
      int isum = 0;
      for (int k = 0; k < 4; ++k) isum += v[4 * j + k] * xq[4 * j + k];
      acc[8 * (b % 2) + j] = std::fma(static_cast<float>(isum), s, acc[8 * (b % 2) + j]);
    }
  }
  return Reduce16(acc);
}

template <class K>
float DotKPortable(const std::byte* row, int nsb, const XRow& x) {
  float acc[16] = {0};
  float accm[8] = {0};
  KBlock k;
  for (int sb = 0; sb < nsb; ++sb) {
    K::Decode(row + static_cast<std::size_t>(sb) * K::kBytes, k);
    const std::int8_t* xq = x.q + 256 * sb;  // lane order (QuantRows; IQ4_XS: bx)
    const float s = k.d * x.d[sb];
    constexpr bool kIq4 = kBxLanes<K>;
    for (int l = 0; l < 16; ++l) {
      int s16 = 0;
      for (int c = 0; c < 4; ++c)
        for (int j = 0; j < 4; ++j)
          s16 += k.v[kIq4 ? Iq4XsElement(l, c, j) : 16 * l + 4 * c + j] * xq[64 * c + 4 * l + j];
      const int sc = k.sc[kIq4 ? Iq4XsSub(l) : k.n_sc == 16 ? l : l / 2];
      acc[l] = std::fma(static_cast<float>(sc * s16), s, acc[l]);
    }
    if constexpr (K::kMins)
      for (int j = 0; j < 8; ++j)
        accm[j] =
            std::fma(static_cast<float>(k.m[j] * x.bsum[8 * sb + j]), k.dmin * x.d[sb], accm[j]);
  }
  return Reduce16(acc) - Reduce8(accm);
}

// ---- the AVX-512 VNNI form (the same integers, the same f32 operations per lane) ----

#if defined(LOCKSTEP_Q8_SIMD)

// GCC 12's extract intrinsics pass an uninitialised merge source (_mm512_undefined_*), and
// -Wuninitialized fires once they are inlined (the false positive matmul_q8_x.cpp silences too).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// Reduce16 and Reduce8 on registers: the same additions in the same order (a[i] + a[i+8] is the
// two halves' sum, and so on down), without a trip through memory; a 512-column row has only 2
// super-blocks, so the row's end costs as much as its blocks.
float Reduce8(__m256 a) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 w = _mm_add_ps(s, _mm_movehl_ps(s, s));           // w0, w1
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));  // w0 + w1
}
float Reduce16(__m512 a) {
  return Reduce8(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

inline __m512i Load64(const void* p) { return _mm512_loadu_si512(p); }

// Software prefetch this far ahead in a weight row: the kernels need about as long per byte as
// memory takes to bring it (2 cores), so the hardware prefetcher alone left them waiting; 2 KiB
// ahead took a 2-thread streamed product from ~0.67 to ~0.8 of the read bandwidth
// (q8_kernel_bench; 1 and 4 KiB measured within noise of it).
constexpr std::size_t kPrefetch = 2048;
inline void Prefetch(const std::byte* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
}

// Lanes 0-7 = p, lanes 8-15 = p + 1 (p = 2i): the scales of a pair of 32-element blocks.
inline __m512i PairIndex(int i) {
  alignas(64) static constexpr auto kPairs = [] {
    std::array<std::array<std::int32_t, 16>, 8> a{};
    for (std::size_t j = 0; j < 8; ++j)
      for (std::size_t l = 0; l < 16; ++l) a[j][l] = static_cast<std::int32_t>(2 * j + l / 8);
    return a;
  }();
  return _mm512_load_si512(kPairs[static_cast<std::size_t>(i)].data());
}

// R rows of x against one weight row of a 32-element type, two blocks per step: blocks 2i, 2i+1
// of a group of 16 fill lanes 0-7 and 8-15 (b % 2, as the portable form), their scales
// d_w(b) * d_x(b) computed 16 at a time. vpdpbusd multiplies unsigned by signed bytes, so the
// weights go as w + 128 (an xor) and the sums start from x's -128 * sum (n).
template <int R, class B>
void Dot32Simd(const std::byte* row, int nb, const XRow* x, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
  // The 16 blocks' f16 scales by one gather (dword b at byte b * kBytes, its low half the scale):
  // a group's scales took ~40 scalar operations, a third of a Q8_0 row's; 1.3x the weights per
  // second on one core (q8_kernel_bench). The K types' per-super-block d and dmin measured
  // slower gathered (a gather per 2-8 super-blocks costs more than their scalar loads).
  const __m512i at =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(B::kBytes)));
  for (int g = 0; g < nb; g += 16) {
    const int n = std::min(16, nb - g);
    const __mmask16 m16 = n == 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
    const __m512i words = _mm512_mask_i32gather_epi32(
        _mm512_setzero_si512(), m16, at, row + static_cast<std::size_t>(g) * B::kBytes, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
    __m512 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(m16, x[r].d + g));
    for (int p = 0; p < n; p += 2) {
      const std::byte* b0 = row + static_cast<std::size_t>(g + p) * B::kBytes;
      Prefetch(b0);  // the pair's first and last lines (a middle one is the neighbours')
      Prefetch(b0 + 2 * B::kBytes - 1);
      const bool two = p + 1 < n;
      const __m256i w1 = two ? B::Ints256(b0 + B::kBytes) : _mm256_setzero_si256();
      const __m512i w =
          _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(B::Ints256(b0)), w1, 1), k80);
      const __m512i idx = PairIndex(p / 2);
      const std::size_t e = static_cast<std::size_t>(g + p) * 32;
      for (int r = 0; r < R; ++r) {
        const __m512 dp =
            _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(Load64(x[r].n + e / 4), w, Load64(x[r].q + e)));
        const __m512 sc = _mm512_permutexvar_ps(idx, s[r]);
        acc[r] =
            two ? _mm512_fmadd_ps(dp, sc, acc[r]) : _mm512_mask3_fmadd_ps(dp, sc, acc[r], 0x00FF);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = Reduce16(acc[r]);
}

// Per K type: Load (the block's code bytes in registers), Prepare (the scale of each of the 16
// lanes, d, dmin, the mins), Chunk<C> (chunk C of the block in lane order as unsigned bytes: byte
// k of lane l is element 16l + 4C + k, QuantRows) and Init (the sums' start: 0, or x's offset for
// the types stored with one). The chunks gather each lane's 4 bytes as a dword (vpermt2d over
// the codes) and pick its nibble and high bits with GFNI bit-field moves (Fields; IQ4_XS with a
// masked shift and vpermb's table).
struct KScales {
  __m512i s;
  __m128 dd;  // lane 0 d; lane 1 dmin for the types with mins (Q4_K, Q5_K), else 0
  __m256i m;  // the mins as 8 int32 lanes (Q4_K, Q5_K)
};

// f16 scales through F16C: quant_src.h's Half (f16_to_f32's value, a signalling NaN quieted as
// the products below would quiet it).
using qsrc::Half;

// 16 int32 lanes f(0) .. f(15), made at compile time.
template <class F>
constexpr std::array<std::int32_t, 16> MakeLanes(F f) {
  std::array<std::int32_t, 16> a{};
  for (int l = 0; l < 16; ++l) a[static_cast<std::size_t>(l)] = f(l);
  return a;
}
inline __m512i Lanes(const std::array<std::int32_t, 16>& a) { return Load64(a.data()); }

// Bit fields of bytes moved by vgf2p8affineqb (GFNI): per 64-bit group an 8 x 8 bit matrix, row
// i (byte 7 - i of the group) the input bits whose parity is output bit i. Field(from, width, to)
// moves bits from .. from + width - 1 of each byte to bits to .., the others zero: one
// instruction for a shift and a mask, and the matrix may differ per group (two lanes).
constexpr std::uint64_t Field(int from, int width, int to) {
  std::uint64_t m = 0;
  for (int i = 0; i < width; ++i)
    m |= static_cast<std::uint64_t>(1u << (from + i)) << (8 * (7 - (to + i)));
  return m;
}
// 8 groups g(0) .. g(7) (group q = lanes 2q, 2q + 1), made at compile time.
template <class F>
constexpr std::array<std::uint64_t, 8> MakeGroups(F f) {
  std::array<std::uint64_t, 8> a{};
  for (int q = 0; q < 8; ++q) a[static_cast<std::size_t>(q)] = f(q);
  return a;
}
inline __m512i Fields(__m512i v, const std::array<std::uint64_t, 8>& m) {
  return _mm512_gf2p8affine_epi64_epi8(v, Load64(m.data()), 0);
}

// Two 64-byte halves of a block's codes (and Q5_K / Q6_K's high bits).
struct Codes {
  __m512i a, b, h;
};

struct Q4KSimd : Q4KB {
  // Two weight rows per decode row on short rows (DotKSimd's W, RowsOf): 512-column rows (an
  // expert's down product) ~1.15x faster L2-resident and streamed (q8_kernel_bench, medians).
  static constexpr bool kPair = true;
  // Q4KScaleMin for all 8 sub-blocks at once, on the 12 bytes as three words (ggml's own
  // arrangement): bytes 0-7 of w the scales, 8-15 the mins. Lanes 2s and 2s + 1 are sub-block s.
  // With the words u0, u1, u2 as dwords: w = [u0 & k1, (u2 & k2) | ((u0 >> 6) & k3) << 4,
  // u1 & k1, ((u2 >> 4) & k2) | ((u1 >> 6) & k3) << 4] in 8 vector operations.
  static KScales Prepare(const std::byte* b) {
    const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));  // u0 u1 u2 -
    const __m128i lo = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
        _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(
        _mm_slli_epi32(_mm_srli_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)), 6), 4),
        _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    const __m128i sc = _mm_or_si128(lo, hi);  // 8 scales, then 8 mins
    KScales s;
    s.s = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sc, sc));
    s.m = _mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8));
    std::uint32_t dm;  // d and dmin, converted together
    std::memcpy(&dm, b, 4);
    s.dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm)));
    return s;
  }
  static Codes Load(const std::byte* b) {
    return {Load64(b + 16), Load64(b + 80), _mm512_setzero_si512()};
  }
  // Element 16l + 4C + k: byte 32 (l / 4) + 16 (l % 2) + 4C + k of the codes, its high nibble
  // where l % 4 >= 2.
  template <int C>
  static __m512i Nibbles(const Codes& k) {
    static constexpr auto kIdx = MakeLanes([](int l) { return 8 * (l >> 2) + 4 * (l & 1) + C; });
    static constexpr auto kNibble =  // lanes with l % 4 >= 2 (odd groups) take the high one
        MakeGroups([](int q) { return q % 2 == 1 ? Field(4, 4, 0) : Field(0, 4, 0); });
    return Fields(_mm512_permutex2var_epi32(k.a, Lanes(kIdx), k.b), kNibble);
  }
  template <int C>
  static __m512i Chunk(const Codes& k) {
    return Nibbles<C>(k);
  }
  static __m512i Init(const std::int32_t*) { return _mm512_setzero_si512(); }
};

struct Q5KSimd : Q5KB {
  static constexpr bool kPair = false;  // its extra registers spill paired (~1.7x slower)
  static KScales Prepare(const std::byte* b) { return Q4KSimd::Prepare(b); }
  static Codes Load(const std::byte* b) {
    return {Load64(b + 48), Load64(b + 112),
            _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)))};
  }
  // Q4_K's nibbles plus bit l / 2 of qh byte 16 (l % 2) + 4C + k as 16.
  template <int C>
  static __m512i Chunk(const Codes& k) {
    static constexpr auto kIdx = MakeLanes([](int l) { return 4 * (l & 1) + C; });
    static constexpr auto kBit = MakeGroups([](int q) { return Field(q, 1, 4); });  // l / 2 = q
    const __m512i h = _mm512_permutexvar_epi32(Lanes(kIdx), k.h);
    return _mm512_or_si512(Q4KSimd::Nibbles<C>(k), Fields(h, kBit));
  }
  static __m512i Init(const std::int32_t*) { return _mm512_setzero_si512(); }
};

struct Q6KSimd : Q6KB {
  static constexpr bool kPair = false;  // measured no faster paired (IQ4_XS: ~7% slower)
  static KScales Prepare(const std::byte* b) {
    KScales s;
    s.s = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    s.dd = _mm_set_ss(Half(b + 208));
    return s;
  }
  static Codes Load(const std::byte* b) { return {Load64(b), Load64(b + 64), Load64(b + 128)}; }
  // Stored as q in 0..63 (the formula's q - 32 is the Init below: -32 * x's sum per lane).
  // Element 16l + 4C + k (h = l / 8, quarter q = (l % 8) / 2, j = 16 (l % 2) + 4C + k): the low
  // (q < 2) or high nibble of ql[64h + 32 (q % 2) + j], bits 2q, 2q + 1 of qh[32h + j] above.
  template <int C>
  static __m512i Chunk(const Codes& k) {
    static constexpr auto kQl =
        MakeLanes([](int l) { return 16 * (l >> 3) + 8 * ((l >> 1) & 1) + 4 * (l & 1) + C; });
    static constexpr auto kQh = MakeLanes([](int l) { return 8 * (l >> 3) + 4 * (l & 1) + C; });
    static constexpr auto kLo =  // the high nibble where l % 8 >= 4 (q % 4 >= 2)
        MakeGroups([](int q) { return q % 4 >= 2 ? Field(4, 4, 0) : Field(0, 4, 0); });
    static constexpr auto kHi = MakeGroups([](int q) { return Field(2 * (q % 4), 2, 4); });
    const __m512i lo = Fields(_mm512_permutex2var_epi32(k.a, Lanes(kQl), k.b), kLo);
    const __m512i h = _mm512_permutexvar_epi32(Lanes(kQh), k.h);
    return _mm512_or_si512(lo, Fields(h, kHi));
  }
  static __m512i Init(const std::int32_t* n16) { return _mm512_srai_epi32(Load64(n16), 2); }
};

struct Iq4XsSimd : Iq4XsB {
  static constexpr bool kPair = false;
  // Ls of sub-block Iq4XsSub(l) in lane l: the 8 scales as bytes in a word by two pdep (nibble i
  // to byte i, bit pair i to bits 4-5 of byte i), picked per lane and widened.
  static KScales Prepare(const std::byte* b) {
    std::uint32_t sl;
    std::uint16_t sh;
    std::memcpy(&sl, b + 4, 4);
    std::memcpy(&sh, b + 2, 2);
    const std::uint64_t ls =
        _pdep_u64(sl, 0x0F0F0F0F0F0F0F0Full) | _pdep_u64(sh, 0x3030303030303030ull);
    const __m128i sc = _mm_sub_epi8(_mm_cvtsi64_si128(static_cast<long long>(ls)),
                                    _mm_set1_epi8(32));  // -32 .. 31
    const __m128i pick = _mm_setr_epi8(0, 0, 4, 4, 1, 1, 5, 5, 2, 2, 6, 6, 3, 3, 7, 7);
    KScales s;
    s.s = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc, pick));
    s.dd = _mm_set_ss(Half(b));
    return s;
  }
  // The even dwords of each 128-bit lane of both code halves ([a0 a2 b0 b2] per lane, chunks 0
  // and 1) and the odd ones (chunks 2 and 3): lane l gets bytes 8 (l % 2) .. + 3 and + 4 .. + 7
  // of sub-block Iq4XsSub(l). An in-lane shuffle each, where the earlier lane order needed a
  // two-source permutation per chunk (q8_kernel_bench, one core L2-resident: 2048 columns ~1.05x,
  // 512 columns ~1.1x).
  static Codes Load(const std::byte* b) {
    const __m512 a = _mm512_castsi512_ps(Load64(b + 8)), c = _mm512_castsi512_ps(Load64(b + 72));
    return {_mm512_castps_si512(_mm512_shuffle_ps(a, c, _MM_SHUFFLE(2, 0, 2, 0))),
            _mm512_castps_si512(_mm512_shuffle_ps(a, c, _MM_SHUFFLE(3, 1, 3, 1))),
            _mm512_setzero_si512()};
  }
  // Chunk C: the low (C even) or high nibbles of those dwords, as table value + 128 (unsigned;
  // Init takes the 128 back off: n = -128 * x's sum per lane). The table repeats 4 times, so
  // vpermb's index bits 4 and 5 (the neighbour's bits a 16-bit shift brings in) do not matter.
  template <int C>
  static __m512i Chunk(const Codes& k) {
    alignas(64) static const U8 kShifted[64] = {
        1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241,
        1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241,
        1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241,
        1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
    const __m512i v = C / 2 == 0 ? k.a : k.b;
    return _mm512_permutexvar_epi8(C % 2 == 0 ? v : _mm512_srli_epi16(v, 4), Load64(kShifted));
  }
  static __m512i Init(const std::int32_t* n16) { return Load64(n16); }
};

// R rows of x against one weight row of a K type: per super-block each lane's 16 products in
// one chain of 4 vpdpbusd from Init, times the lane's scale, then one fma per row.
// W weight rows (rows[w]) at once share x's loads and interleave W independent chains (W = 2 for
// one x row, where a 512-column row's two super-blocks left the core waiting on one chain); out
// [w * R + r]. Each (x row, weight row) pair gets the same operations whatever W.
template <int R, class K, int W = 1>
void DotKSimd(const std::byte* const* rows, int nsb, const XRow* x, float* out) {
  __m512 acc[W][R];
  __m256 accm[W][R];
  for (int w = 0; w < W; ++w)
    for (int r = 0; r < R; ++r) {
      acc[w][r] = _mm512_setzero_ps();
      accm[w][r] = _mm256_setzero_ps();
    }
  for (int sb = 0; sb < nsb; ++sb) {
    const std::size_t e = static_cast<std::size_t>(sb) * 256;
    for (int w = 0; w < W; ++w) {
      const std::byte* blk = rows[w] + static_cast<std::size_t>(sb) * K::kBytes;
      for (std::size_t off = 0; off < K::kBytes; off += 64) Prefetch(blk + off);
      const KScales ks = K::Prepare(blk);
      const Codes codes = K::Load(blk);
      const __m512i q[4] = {K::template Chunk<0>(codes), K::template Chunk<1>(codes),
                            K::template Chunk<2>(codes), K::template Chunk<3>(codes)};
      for (int r = 0; r < R; ++r) {
        __m512i dp = K::Init(x[r].n + e / 16);
        for (int c = 0; c < 4; ++c) dp = _mm512_dpbusd_epi32(dp, q[c], Load64(x[r].q + e + 64 * c));
        // Lanes 0, 1: d * dx, dmin * dx (the types with mins convert both f16 at once).
        const __m128 sd = _mm_mul_ps(ks.dd, _mm_set1_ps(x[r].d[sb]));
        acc[w][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(dp, ks.s)),
                                    _mm512_broadcastss_ps(sd), acc[w][r]);
        if constexpr (K::kMins) {
          const __m256i mb = _mm256_mullo_epi32(
              ks.m, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].bsum + 8 * sb)));
          accm[w][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mb),
                                       _mm256_broadcastss_ps(_mm_movehdup_ps(sd)), accm[w][r]);
        }
      }
    }
  }
  for (int w = 0; w < W; ++w)
    for (int r = 0; r < R; ++r) out[w * R + r] = Reduce16(acc[w][r]) - Reduce8(accm[w][r]);
}

#endif  // LOCKSTEP_Q8_SIMD

// ---- rows ----

// Calls f(std::integral_constant<int, R>{}, t) for the row blocks of n_rows: 8 at a time (AVX-512),
// then one block of the rest. Every row's bits are the same whatever its block.
template <class F>
void ForRowBlocks(int n_rows, F&& f) {
  int t = 0;
#if defined(LOCKSTEP_Q8_SIMD)
  for (; t + 8 <= n_rows; t += 8) f(std::integral_constant<int, 8>{}, t);
  switch (n_rows - t) {
    case 1:
      return f(std::integral_constant<int, 1>{}, t);
    case 2:
      return f(std::integral_constant<int, 2>{}, t);
    case 3:
      return f(std::integral_constant<int, 3>{}, t);
    case 4:
      return f(std::integral_constant<int, 4>{}, t);
    case 5:
      return f(std::integral_constant<int, 5>{}, t);
    case 6:
      return f(std::integral_constant<int, 6>{}, t);
    case 7:
      return f(std::integral_constant<int, 7>{}, t);
    default:
      return;
  }
#else
  for (; t < n_rows; ++t) f(std::integral_constant<int, 1>{}, t);
#endif
}

// Rows [o_begin, o_end) of one (unstacked) matrix of a 32-element type B or a K type (Simd S).
template <class B, bool kK, class S = B>
void RowsOf(const QuantRows& q, int n_rows, const Mat& w, int o_begin, int o_end, float* y,
            std::size_t ldy, int y_col0) {
  const QuantRows::Format& f = !kK ? q.b32 : kBxLanes<B> ? q.bx : q.b256;
  const int block = kK ? 256 : 32;
  const int nb = w.cols / block;
  const std::size_t row_bytes = static_cast<std::size_t>(nb) * B::kBytes;  // S derives from B
  const std::byte* base = static_cast<const std::byte*>(w.data);
  for (int o = o_begin; o < o_end; ++o) {
    const std::byte* row = base + static_cast<std::size_t>(o) * row_bytes;
    float* yc = y + (o - y_col0);
#if defined(LOCKSTEP_Q8_SIMD)
    if (!detail::g_portable) {
      if constexpr (kK) {
        // A decode row of short weight rows (<= 4 super-blocks): two weight rows at once. Longer
        // rows streamed slower paired (two streams a row apart: 0.6x on 2048 columns).
        if (S::kPair && n_rows == 1 && nb <= 4 && o + 1 < o_end) {
          const XRow xr = RowOf(f, q.cols, 0, block);
          const std::byte* two[2] = {row, row + row_bytes};
          DotKSimd<1, S, 2>(two, nb, &xr, yc);  // yc[0], yc[1]: columns o, o + 1
          ++o;
          continue;
        }
      }
      ForRowBlocks(n_rows, [&](auto rc, int t) {
        constexpr int R = decltype(rc)::value;
        XRow xr[R];
        float out[R];
        for (int r = 0; r < R; ++r) xr[r] = RowOf(f, q.cols, t + r, block);
        if constexpr (kK)
          DotKSimd<R, S>(&row, nb, xr, out);
        else
          Dot32Simd<R, B>(row, nb, xr, out);
        for (int r = 0; r < R; ++r) yc[static_cast<std::size_t>(t + r) * ldy] = out[r];
      });
      continue;
    }
#endif
    for (int t = 0; t < n_rows; ++t) {
      const XRow xr = RowOf(f, q.cols, t, block);
      if constexpr (kK)
        yc[static_cast<std::size_t>(t) * ldy] = DotKPortable<B>(row, nb, xr);
      else
        yc[static_cast<std::size_t>(t) * ldy] = Dot32Portable<B>(row, nb, xr);
    }
  }
}

// The K types' vector forms (RowsOf's S; the portable form where they are not built).
#if defined(LOCKSTEP_Q8_SIMD)
using Q4KV = Q4KSimd;
using Q5KV = Q5KSimd;
using Q6KV = Q6KSimd;
using Iq4XsV = Iq4XsSimd;
#else
using Q4KV = Q4KB;
using Q5KV = Q5KB;
using Q6KV = Q6KB;
using Iq4XsV = Iq4XsB;
#endif

}  // namespace

bool HasKernel(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:
    case WeightType::kQ5_0:
    case WeightType::kIQ4_NL:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K:
    case WeightType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

bool HasKernel(const Mat& w) {
  if (w.parts == nullptr) return HasKernel(w.type);
  for (int i = 0; i < w.n_parts; ++i)
    if (!HasKernel(w.parts[i].m)) return false;
  return true;
}

void Rows(const QuantRows& q, int n_rows, const Mat& w, int o_begin, int o_end, float* y, int ldy,
          int y_col0) {
  if (w.parts != nullptr)
    return ForEachPartRows(w, o_begin, o_end, [&](const MatPart& p, int lo, int hi) {
      Rows(q, n_rows, p.m, lo, hi, y, ldy, y_col0 - p.row0);
    });
  LOCKSTEP_CHECK(q.cols == w.cols && q.rows >= n_rows) << "x quantised for another product";
  const std::size_t sy = static_cast<std::size_t>(ldy);
  switch (w.type) {
    case WeightType::kQ8_0:
      return RowsOf<Q8_0B, false>(q, n_rows, w, o_begin, o_end, y, sy, y_col0);
    case WeightType::kQ4_0:
      return RowsOf<Q4_0B, false>(q, n_rows, w, o_begin, o_end, y, sy, y_col0);
    case WeightType::kQ5_0:
      return RowsOf<Q5_0B, false>(q, n_rows, w, o_begin, o_end, y, sy, y_col0);
    case WeightType::kIQ4_NL:
      return RowsOf<Iq4NlB, false>(q, n_rows, w, o_begin, o_end, y, sy, y_col0);
    case WeightType::kQ4_K:
      return RowsOf<Q4KB, true, Q4KV>(q, n_rows, w, o_begin, o_end, y, sy, y_col0);
    case WeightType::kQ5_K:
      return RowsOf<Q5KB, true, Q5KV>(q, n_rows, w, o_begin, o_end, y, sy, y_col0);
    case WeightType::kQ6_K:
      return RowsOf<Q6KB, true, Q6KV>(q, n_rows, w, o_begin, o_end, y, sy, y_col0);
    case WeightType::kIQ4_XS:
      return RowsOf<Iq4XsB, true, Iq4XsV>(q, n_rows, w, o_begin, o_end, y, sy, y_col0);
    default:
      LOCKSTEP_CHECK(false) << "no 8-bit kernel for " << weight_type_name(w.type);
  }
}

namespace detail {
bool g_portable = false;
}  // namespace detail

void UsePortableForTest(bool on) { detail::g_portable = on; }

}  // namespace lockstep::cpu::q8
