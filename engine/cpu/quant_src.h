// Block-quantised weight rows dequantised in registers, for the invariant product (matmul.cpp).
//
// Each source yields 32 consecutive weights of one row as two 16-float vectors, and every value
// is bitwise what DequantizeChunk32 (quant.h, checked against ggml's to_float) writes for it: the
// same f32 operations on the same operands, one lane per element. So a product over these
// sources is bitwise the product over the dequantised f32 copy, and the accumulation order stays
// DotRows' (batch- and T-invariant). What changes is the cost: a chunk is decoded with a few
// vector instructions instead of a call, a switch and a round trip through a stack buffer, so
// decode streams the file's bytes near the read bandwidth (tests/bench/quant_decode_bench.cpp).
//
// The 4- and 5-bit types (Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, IQ4_NL, IQ4_XS) look their values up:
// a block's (or sub-block's) 16 or 32 possible values are computed once, exactly as the scalar
// code computes each element (e.g. Q4_K's d1 * q - m1 for q = 0..15), and each element is a
// permute of that table by its code. Q8_0 and Q6_K convert their integers and scale them.
//
// f16 scales are widened with the F16C instruction. It differs from our exact f16_to_f32 only on
// signalling NaNs, which it quiets; every dequantised value is a product with its scale, and an
// x86 product quiets a signalling NaN operand the same way, so the values are bitwise the same.
// AVX-512 (F, BW, VL) only; other builds keep the generic BlockSrc path.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "lockstep/engine/quant.h"
#include "lockstep/engine/weights.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LOCKSTEP_QUANT_SRC 1

namespace lockstep::cpu::qsrc {

typedef float v16 __attribute__((vector_size(64)));

inline v16 V(__m512 m) {
  v16 v;
  std::memcpy(&v, &m, sizeof(v));
  return v;
}

// Through vmovd (which zeroes the register's upper bits) rather than _cvtsh_ss: that one compiled
// to a vpinsrw merging into a register left by the previous chunk, a false dependency that chained
// every chunk's scale arithmetic to the last one's (measured: Q4_K 2.6x slower per weight).
inline float Half(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

inline __m128i Load16(const std::byte* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// 0, 1, ..., 15 as floats, and ggml's IQ4_NL values (quant_grids.h kIq4nl) as floats.
inline __m512 Iota() {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
inline __m512 Iq4nlValues() {
  return _mm512_setr_ps(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
}

// The two 16-element halves of a chunk whose byte j holds element j in its low nibble and
// element j + 16 in its high one (Q4_0, Q4_1, IQ4_NL, IQ4_XS), looked up in `table`.
// _mm512_permutexvar_ps reads only the index's low 4 bits, so the low nibble needs no mask.
inline void NibblePairs(const std::byte* q, __m512 table, v16* b) {
  const __m512i lo = _mm512_cvtepu8_epi32(Load16(q));
  b[0] = V(_mm512_permutexvar_ps(lo, table));
  b[1] = V(_mm512_permutexvar_ps(_mm512_srli_epi32(lo, 4), table));
}

// Q8_0: w = d * q.
struct Q8_0Src {
  static constexpr int kChunkBytes = 34;
  const std::byte* p;
  void Load32(int i, v16* b) const {
    const std::byte* blk = p + static_cast<std::size_t>(i / 32) * 34;
    const __m512 d = _mm512_set1_ps(Half(blk));
    for (int h = 0; h < 2; ++h)
      b[h] =
          V(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(Load16(blk + 2 + 16 * h)))));
  }
  void Tail(int, int, float*) const {}
};

// Q4_0: w = (q - 8) * d; Q4_1: w = q * d + m.
template <bool kMin>
struct Q4LegacySrc {
  static constexpr int kChunkBytes = kMin ? 20 : 18;
  const std::byte* p;
  void Load32(int i, v16* b) const {
    const std::byte* blk = p + static_cast<std::size_t>(i / 32) * kChunkBytes;
    const __m512 d = _mm512_set1_ps(Half(blk));
    __m512 t;
    if constexpr (kMin) {
      t = _mm512_add_ps(_mm512_mul_ps(Iota(), d), _mm512_set1_ps(Half(blk + 2)));
    } else {
      t = _mm512_mul_ps(_mm512_sub_ps(Iota(), _mm512_set1_ps(8.0f)), d);
    }
    NibblePairs(blk + (kMin ? 4 : 2), t, b);
  }
  void Tail(int, int, float*) const {}
};

// Q5_0: w = (q - 16) * d, q = nibble | (bit j of qh) << 4: a 32-value table in two registers.
struct Q5_0Src {
  static constexpr int kChunkBytes = 22;
  const std::byte* p;
  void Load32(int i, v16* b) const {
    const std::byte* blk = p + static_cast<std::size_t>(i / 32) * 22;
    const __m512 d = _mm512_set1_ps(Half(blk));
    const __m512 lo = _mm512_mul_ps(_mm512_sub_ps(Iota(), _mm512_set1_ps(16.0f)), d);
    const __m512 hi = _mm512_mul_ps(Iota(), d);  // q - 16 = 0..15 for q = 16..31
    std::uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    const __m512i n = _mm512_cvtepu8_epi32(Load16(blk + 6));
    const __m512i c16 = _mm512_set1_epi32(16), m4 = _mm512_set1_epi32(15);
    const __m512i i0 =
        _mm512_mask_or_epi32(_mm512_and_si512(n, m4), static_cast<__mmask16>(qh & 0xFFFF), n, c16);
    const __m512i n1 = _mm512_srli_epi32(n, 4);
    const __m512i i1 = _mm512_mask_or_epi32(n1, static_cast<__mmask16>(qh >> 16), n1, c16);
    b[0] = V(_mm512_permutex2var_ps(lo, i0, hi));  // reads bits 0-4 of the index only
    b[1] = V(_mm512_permutex2var_ps(lo, i1, hi));
  }
  void Tail(int, int, float*) const {}
};

// IQ4_NL: w = d * kIq4nl[q].
struct Iq4NlSrc {
  static constexpr int kChunkBytes = 18;
  const std::byte* p;
  void Load32(int i, v16* b) const {
    const std::byte* blk = p + static_cast<std::size_t>(i / 32) * 18;
    NibblePairs(blk + 2, _mm512_mul_ps(_mm512_set1_ps(Half(blk)), Iq4nlValues()), b);
  }
  void Tail(int, int, float*) const {}
};

// The 256-element (super-block) types below are read a block at a time (DotRows' block loop,
// matmul.cpp): Prepare computes the block's scales once, then Chunk<c> yields chunk c (0..7) with
// c a constant, so offsets and shifts fold away (kStep chunks at a time where it says so).
// Per-chunk index arithmetic and scale decoding were most of a chunk's instructions when every
// chunk was decoded on its own.

// IQ4_XS: sub-block ib of 32, w = (d * (ls - 32)) * kIq4nl[q].
struct Iq4XsSrc {
  static constexpr std::size_t kBlockBytes = 136;
  const std::byte* p;
  struct Scales {
    float dl[8];
  };
  static Scales Prepare(const std::byte* blk) {
    Scales s;
    std::uint16_t sh;
    std::memcpy(&sh, blk + 2, 2);
    const float d = Half(blk);
    for (int ib = 0; ib < 8; ++ib) {
      const auto sl = static_cast<std::uint8_t>(blk[4 + ib / 2]);
      const int ls = ((sl >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
      s.dl[ib] = d * static_cast<float>(ls - 32);
    }
    return s;
  }
  template <int kC>
  static void Chunk(const std::byte* blk, const Scales& s, v16* b) {
    NibblePairs(blk + 8 + 16 * kC, _mm512_mul_ps(_mm512_set1_ps(s.dl[kC]), Iq4nlValues()), b);
  }
};

// Q4_K: sub-block c, w = (d * sc) * q - (dmin * m), q the low (c even) or high nibbles of bytes
// [32(c/2), 32(c/2) + 32); Q5_K adds 16 where bit c of qh[l] is set.
template <bool kQ5>
struct QkKSrc {
  static constexpr std::size_t kBlockBytes = kQ5 ? 176 : 144;
  const std::byte* p;
  struct Scales {
    float d1[8], m1[8];
  };
  static Scales Prepare(const std::byte* blk) {
    Scales s;
    const float d = Half(blk), dmin = Half(blk + 2);
    for (int j = 0; j < 8; ++j) {
      std::uint8_t sc, m;
      Q4KScaleMin(j, reinterpret_cast<const std::uint8_t*>(blk + 4), &sc, &m);
      s.d1[j] = d * static_cast<float>(sc);
      s.m1[j] = dmin * static_cast<float>(m);
    }
    return s;
  }
  // Chunks kC and kC + 1 (kC even) at once: they are the low and the high nibbles of the same 32
  // bytes, widened once.
  static constexpr int kStep = 2;
  template <int kC>
  static void Chunk(const std::byte* blk, const Scales& s, v16* b) {
    __m512 lo[2], hi[2];
    for (int u = 0; u < 2; ++u) {
      const __m512 d1 = _mm512_set1_ps(s.d1[kC + u]);
      const __m512 m1 = _mm512_set1_ps(s.m1[kC + u]);
      lo[u] = _mm512_sub_ps(_mm512_mul_ps(d1, Iota()), m1);
      if constexpr (kQ5)
        hi[u] = _mm512_sub_ps(_mm512_mul_ps(d1, _mm512_add_ps(Iota(), _mm512_set1_ps(16.0f))), m1);
    }
    const std::byte* q = blk + (kQ5 ? 48 : 16) + 32 * (kC / 2);
    for (int h = 0; h < 2; ++h) {
      const __m512i n = _mm512_cvtepu8_epi32(Load16(q + 16 * h));
      for (int u = 0; u < 2; ++u) {
        const __m512i nu = u == 0 ? n : _mm512_srli_epi32(n, 4);
        if constexpr (kQ5) {
          const __mmask16 bit = _mm_test_epi8_mask(Load16(blk + 16 + 16 * h),
                                                   _mm_set1_epi8(static_cast<char>(1 << (kC + u))));
          const __m512i idx = _mm512_mask_or_epi32(_mm512_and_si512(nu, _mm512_set1_epi32(15)), bit,
                                                   nu, _mm512_set1_epi32(16));
          b[2 * u + h] = V(_mm512_permutex2var_ps(lo[u], idx, hi[u]));
        } else {
          b[2 * u + h] = V(_mm512_permutexvar_ps(nu, lo[u]));
        }
      }
    }
  }
};

// Q6_K: chunk c, half n = c / 4, quarter j = c % 4; q = (ql >> 4(j/2)) & 15 | ((qh >> 2j) & 3)
// << 4, w = (d * scale) * (q - 32), one scale per 16 elements.
struct Q6KSrc {
  static constexpr std::size_t kBlockBytes = 210;
  const std::byte* p;
  struct Scales {
    float ds[16];
  };
  static Scales Prepare(const std::byte* blk) {
    Scales s;
    const float d = Half(blk + 208);
    const auto* sc = reinterpret_cast<const std::int8_t*>(blk + 192);
    for (int k = 0; k < 16; ++k) s.ds[k] = d * static_cast<float>(sc[k]);
    return s;
  }
  template <int kC>
  static void Chunk(const std::byte* blk, const Scales& s, v16* b) {
    constexpr int n = kC / 4, j = kC % 4;
    const __m256i ql =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * n + (j % 2) * 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * n));
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, (j / 2) * 4), _mm256_set1_epi8(15));
    const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), _mm256_set1_epi8(3));
    const __m256i q =
        _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 4)), _mm256_set1_epi8(32));
    for (int h = 0; h < 2; ++h) {
      const __m128i qq = h == 0 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
      const __m512 sc = _mm512_set1_ps(s.ds[8 * n + 2 * j + h]);
      b[h] = V(_mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qq))));
    }
  }
};

}  // namespace lockstep::cpu::qsrc

#endif
