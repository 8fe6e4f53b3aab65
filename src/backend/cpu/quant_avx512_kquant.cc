// AVX512-VNNI tiles for Q4_K, Q5_K and Q6_K weights (super-blocks of 256), taken instead of
// quant_avx2_kquant.cc's where the CPU has AVX512-VNNI. A sub-block pair's 32 quant bytes hold
// sub-block 2c in their low nibbles and 2c + 1 in their high ones, which are the 64 contiguous
// activations 64c..64c+63: one zmm carries both (low nibbles in the lower half, high in the
// upper), vpmaddubsw forms the u8 x s8 pair sums and vpdpwssd multiplies them by the two
// sub-block scales (spread by vpermw) and accumulates in int32, exact. Two instructions per 64
// products and activation row, against three per 32 on AVX2.
#include "backend/cpu/quant_avx512.h"
#include "backend/cpu/quant_kquant_common.h"
#include "core/dtype.h"

#include <type_traits>

// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector (`__m512 __Y = __Y`) as the
// unused merge source of several instructions, and -W(maybe-)uninitialized reports each use
// (here in _mm512_reduce_add_ps's half extraction).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#define TS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace tessera::cpu::avx512 {
namespace {

using avx2::KTileRows;
using avx2::TileArgs;

// Weight rows per tile: MR x NR int32 sums and f32 accumulators, NR quant, scale and
// scale-source vectors within the 32 zmm registers.
constexpr int nr_for(int mr) {
  return mr == 1 ? 4 : 2;
}

// lo in the lower 256 bits, hi in the upper.
TS_AVX512 inline __m512i halves(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Int16 lanes 0-15 set to lo, 16-31 to hi.
TS_AVX512 inline __m512i halves16(int lo, int hi) {
  return halves(_mm256_set1_epi16(static_cast<short>(lo)),
                _mm256_set1_epi16(static_cast<short>(hi)));
}

// The 32 bytes at p in the lower half and the same bytes shifted right by 4 (per 16-bit lane)
// in the upper half.
TS_AVX512 inline __m512i low_high(const uint8_t* p) {
  const __m256i v = avx2::load32(p);
  return halves(v, _mm256_srli_epi16(v, 4));
}

// Q4_K and Q5_K (kFifthBit: element l of sub-block j takes bit j of qh[l] as 16).
template <bool kFifthBit>
struct KTile {
  using Block = std::conditional_t<kFifthBit, BlockQ5K, BlockQ4K>;
  template <int MR, int NR>
  struct Tile {
    static constexpr int kNR = nr_for(MR);
    TS_AVX512 static void run(const TileArgs& t, float* out) {
      const KTileRows<MR, NR> r(t);
      const int64_t nb = t.K / kQK_K;
      const __m512i low4 = _mm512_set1_epi8(0x0f);
      __m512 acc[MR][NR];
      for (int a = 0; a < MR; ++a)
        for (int j = 0; j < NR; ++j) acc[a][j] = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const Block* blk[NR];
        __m512i scales[NR];  // the 8 sub-block scales (int16) in every 128-bit lane
        __m128i mn[NR];
        for (int j = 0; j < NR; ++j) {
          blk[j] = reinterpret_cast<const Block*>(r.w[j]) + b;
          avx2::prefetch_block(blk[j], r.ahead);
          __m128i sc;
          avx2::q4_k_scales(blk[j]->scales, &sc, &mn[j]);
          scales[j] = _mm512_broadcast_i32x4(sc);
        }
        __m512i isum[MR][NR];
        for (int a = 0; a < MR; ++a)
          for (int j = 0; j < NR; ++j) isum[a][j] = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {  // sub-blocks 2c (low nibbles) and 2c + 1 (high)
          // Lanes 0-15 pick int16 lane 2c of a scale vector, lanes 16-31 lane 2c + 1.
          const __m512i pick = halves16(2 * c, 2 * c + 1);
          __m512i wq[NR], scale[NR];
          for (int j = 0; j < NR; ++j) {
            wq[j] = _mm512_and_si512(low_high(blk[j]->qs + 32 * c), low4);
            if constexpr (kFifthBit) {
              // Bits 2c (lower half) and 2c + 1 (upper) of each qh byte, moved to bit 4.
              const __m256i h = avx2::load32(blk[j]->qh);
              const __m512i hh = halves(h, h);
              // pick's lanes are also the shift counts: 2c below, 2c + 1 above.
              const __m512i bit =
                  _mm512_and_si512(_mm512_srlv_epi16(hh, pick), _mm512_set1_epi8(1));
              wq[j] = _mm512_or_si512(wq[j], _mm512_slli_epi16(bit, 4));
            }
            scale[j] = _mm512_permutexvar_epi16(pick, scales[j]);
          }
          for (int a = 0; a < MR; ++a) {
            const __m512i xa = _mm512_loadu_si512(r.xq[a] + b * kQK_K + 64 * c);
            for (int j = 0; j < NR; ++j) {
              // q <= 31: pair sums <= 7874 (no saturation); times a 6-bit scale, exact in int32.
              const __m512i p = _mm512_maddubs_epi16(wq[j], xa);
              isum[a][j] = _mm512_dpwssd_epi32(isum[a][j], p, scale[j]);
            }
          }
        }
        for (int a = 0; a < MR; ++a) {
          const __m128i xs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.sum32[a] + 8 * b));
          const float dxa = r.dx[a][b];
          for (int j = 0; j < NR; ++j) {
            const float d = avx2::load_f16(reinterpret_cast<const uint8_t*>(&blk[j]->d));
            const float dmin = avx2::load_f16(reinterpret_cast<const uint8_t*>(&blk[j]->dmin));
            acc[a][j] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[a][j]), _mm512_set1_ps(d * dxa), acc[a][j]);
            // The mins: dmin * sum_j m_j sum32_j, as 4 exact int32 lanes in the low quarter.
            const __m128 m = _mm_cvtepi32_ps(_mm_madd_epi16(mn[j], xs));
            acc[a][j] = _mm512_fnmadd_ps(_mm512_insertf32x4(_mm512_setzero_ps(), m, 0),
                                         _mm512_set1_ps(dmin * dxa), acc[a][j]);
          }
        }
      }
      for (int a = 0; a < MR; ++a)
        for (int j = 0; j < NR; ++j) out[a * NR + j] = _mm512_reduce_add_ps(acc[a][j]);
    }
  };
};

// Q6_K: quarter-pairs (r, r + 1) of each half h cover 64 contiguous elements: their low bits
// are the low (r = 0, 1) or high (r = 2, 3) nibbles of ql bytes 64h.. and 64h + 32.., their high
// two bits bits 2r.. and 2r + 2.. of the same 32 qh bytes; q in 0..63 stands for q - 32, and
// the -32 is applied per 16-group as 32 sc_g sum16_g, in integers (as on AVX2). vpermw spreads
// the four 16-element group scales of the pair over the int16 pair sums.
template <int MR, int NR>
struct TileQ6K {
  static constexpr int kNR = nr_for(MR);
  TS_AVX512 static void run(const TileArgs& t, float* out) {
    const KTileRows<MR, NR> r(t);
    const int64_t nb = t.K / kQK_K;
    const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(0x03);
    // Int16 lane L of a pair's products belongs to 16-group L / 8 of the pair.
    const __m512i group_of_lane =  // int32 lane k holds int16 lanes 2k, 2k + 1: group k / 4
        _mm512_setr_epi32(0, 0, 0, 0, 0x10001, 0x10001, 0x10001, 0x10001, 0x20002, 0x20002, 0x20002,
                          0x20002, 0x30003, 0x30003, 0x30003, 0x30003);
    __m512 acc[MR][NR];
    for (int a = 0; a < MR; ++a)
      for (int j = 0; j < NR; ++j) acc[a][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ6K* blk[NR];
      __m512i sc16[NR];  // the 16 group scales as int16 (lower half)
      __m512i isum[MR][NR];
      for (int j = 0; j < NR; ++j) {
        blk[j] = reinterpret_cast<const BlockQ6K*>(r.w[j]) + b;
        avx2::prefetch_block(blk[j], r.ahead);
        const __m256i s =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[j]->scales)));
        sc16[j] = _mm512_castsi256_si512(s);
        for (int a = 0; a < MR; ++a) {
          const __m256i xs = avx2::load32(r.sum16[a] + 16 * b);
          const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(s, xs), 5);
          isum[a][j] = _mm512_inserti64x4(_mm512_setzero_si512(),
                                          _mm256_sub_epi32(_mm256_setzero_si256(), off), 0);
        }
      }
      for (int p = 0; p < 4; ++p) {  // elements 64p..: half h = p / 2, quarters 2 (p % 2), + 1
        const int h = p / 2, r0 = 2 * (p % 2);
        const __m512i pick = _mm512_add_epi16(group_of_lane, _mm512_set1_epi16(4 * p));
        const __m512i shift = halves16(2 * r0, 2 * r0 + 2);
        __m512i wq[NR], scale[NR];
        for (int j = 0; j < NR; ++j) {
          const __m512i lo_bytes =
              halves(avx2::load32(blk[j]->ql + 64 * h), avx2::load32(blk[j]->ql + 64 * h + 32));
          const __m512i lo =
              _mm512_and_si512(r0 == 0 ? lo_bytes : _mm512_srli_epi16(lo_bytes, 4), low4);
          const __m256i hb = avx2::load32(blk[j]->qh + 32 * h);
          const __m512i hh = halves(hb, hb);
          const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(hh, shift), low2);
          wq[j] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
          scale[j] = _mm512_permutexvar_epi16(pick, sc16[j]);
        }
        for (int a = 0; a < MR; ++a) {
          const __m512i xa = _mm512_loadu_si512(r.xq[a] + b * kQK_K + 64 * p);
          for (int j = 0; j < NR; ++j) {
            // q <= 63: pair sums <= 16002; times an int8 scale, exact in int32.
            const __m512i prod = _mm512_maddubs_epi16(wq[j], xa);
            isum[a][j] = _mm512_dpwssd_epi32(isum[a][j], prod, scale[j]);
          }
        }
      }
      for (int j = 0; j < NR; ++j) {
        const float d = avx2::load_f16(reinterpret_cast<const uint8_t*>(&blk[j]->d));
        for (int a = 0; a < MR; ++a)
          acc[a][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[a][j]),
                                      _mm512_set1_ps(d * r.dx[a][b]), acc[a][j]);
      }
    }
    for (int a = 0; a < MR; ++a)
      for (int j = 0; j < NR; ++j) out[a * NR + j] = _mm512_reduce_add_ps(acc[a][j]);
  }
};

TS_AVX512 void rows_q6_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0,
                         int64_t n1, const TileArgs& args) {
  avx2::run_tiles<TileQ6K>(y, ldy, M, bias, n0, n1, args);
}
TS_AVX512 void rows_q4_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0,
                         int64_t n1, const TileArgs& args) {
  avx2::run_tiles<KTile<false>::Tile>(y, ldy, M, bias, n0, n1, args);
}
TS_AVX512 void rows_q5_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0,
                         int64_t n1, const TileArgs& args) {
  avx2::run_tiles<KTile<true>::Tile>(y, ldy, M, bias, n0, n1, args);
}

}  // namespace

KQuantRowsFn kquant_rows_fn(DType t) {
  switch (t) {
    case DType::q4_k:
      return rows_q4_k;
    case DType::q5_k:
      return rows_q5_k;
    case DType::q6_k:
      return rows_q6_k;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::avx512
