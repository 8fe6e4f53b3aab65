// AVX2 tiles for the k-quant formats (Q4_K, Q5_K, Q6_K; super-blocks of 256) against int8
// activations:
// vpmaddubsw on unpacked quants, vpmaddwd with the sub-block scales (exact int32 sums per
// super-block), the mins and Q6_K's -32 offset from per-16/32 activation sums, in integers.
#include <type_traits>

#include "backend/cpu/quant_avx2_common.h"
#include "backend/cpu/quant_kquant_common.h"
#include "core/dtype.h"

namespace tessera::cpu::avx2 {
namespace {

// Weight rows per tile: a super-block's int32 sums (MR x NR) and unpacked quants (NR) must fit
// the 16 ymm registers next to the activation vector and the scales.
constexpr int nr_for(int mr) {
  return mr == 1 ? 4 : mr == 2 ? 2 : 1;
}

// Adds d_x (d_w isum - dmin_w msum) of one super-block to acc, with isum as 8 int32 lanes and
// msum as 4 (both exact).
TS_AVX2 inline __m256 add_block(__m256 acc, __m256i isum, __m128i msum, float dxd, float dxdmin) {
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dxd), acc);
  const __m256 m = _mm256_cvtepi32_ps(_mm256_zextsi128_si256(msum));
  return _mm256_fnmadd_ps(m, _mm256_set1_ps(dxdmin), acc);
}

// Q4_K, and Q5_K (the same scales and nibbles) with the fifth bit of element l of sub-block s in
// bit s of qh[l], moved to bit 4 by one 16-bit shift (bits the shift drags across bytes land
// outside bit 4 and are masked off). qh is reloaded per sub-block from L1: kept in registers it
// would spill the 1 x 4 tile.
template <class Block>
struct KTile {
  template <int MR, int NR>
  struct Tile {
    static constexpr int kNR = nr_for(MR);
    static constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5K>;
    TS_AVX2 static void run(const TileArgs& t, float* out) {
      const KTileRows<MR, NR> r(t);
      const int64_t nb = t.K / kQK_K;
      const __m256i low4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
      __m256 acc[MR][NR];
      for (int a = 0; a < MR; ++a)
        for (int j = 0; j < NR; ++j) acc[a][j] = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const Block* blk[NR];
        alignas(16) int16_t sc[NR][8];
        __m128i mn[NR];
        for (int j = 0; j < NR; ++j) {
          blk[j] = reinterpret_cast<const Block*>(r.w[j]) + b;
          prefetch_block(blk[j], r.ahead);
          __m128i s;
          q4_k_scales(blk[j]->scales, &s, &mn[j]);
          _mm_store_si128(reinterpret_cast<__m128i*>(sc[j]), s);
        }
        __m256i isum[MR][NR];
        for (int a = 0; a < MR; ++a)
          for (int j = 0; j < NR; ++j) isum[a][j] = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) {  // sub-block s: nibbles (s % 2) of bytes 32 (s / 2) ..
          __m256i wq[NR], scale[NR];
          for (int j = 0; j < NR; ++j) {
            const __m256i bytes = load32(blk[j]->qs + 32 * (s / 2));
            wq[j] = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(bytes, 4) : bytes, low4);
            if constexpr (kFifthBit) {
              const __m256i hb = load32(blk[j]->qh);
              const __m256i at4 = s < 4    ? _mm256_slli_epi16(hb, 4 - s)
                                  : s == 4 ? hb
                                           : _mm256_srli_epi16(hb, s - 4);
              wq[j] = _mm256_or_si256(wq[j], _mm256_and_si256(at4, bit4));
            }
            scale[j] = _mm256_set1_epi16(sc[j][s]);
          }
          for (int a = 0; a < MR; ++a) {
            const __m256i xa = load32(r.xq[a] + b * kQK_K + 32 * s);
            for (int j = 0; j < NR; ++j) {
              // q <= 31: pair sums <= 7874; times a 6-bit scale, still exact in int32.
              const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq[j], xa), scale[j]);
              isum[a][j] = _mm256_add_epi32(isum[a][j], p);
            }
          }
        }
        for (int a = 0; a < MR; ++a) {
          const __m128i xs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.sum32[a] + 8 * b));
          const float dxa = r.dx[a][b];
          for (int j = 0; j < NR; ++j) {
            const float d = load_f16(reinterpret_cast<const uint8_t*>(&blk[j]->d));
            const float dmin = load_f16(reinterpret_cast<const uint8_t*>(&blk[j]->dmin));
            acc[a][j] =
                add_block(acc[a][j], isum[a][j], _mm_madd_epi16(mn[j], xs), d * dxa, dmin * dxa);
          }
        }
      }
      for (int a = 0; a < MR; ++a)
        for (int j = 0; j < NR; ++j) out[a * NR + j] = hsum(acc[a][j]);
    }
  };
};

// Q6_K: q = low 4 bits (ql) | high 2 bits (qh) << 4 in 0..63 stands for q - 32; the -32 is
// applied per 16-group as 32 sc_g sum16_g, in integers.
template <int MR, int NR>
struct TileQ6K {
  static constexpr int kNR = nr_for(MR);
  TS_AVX2 static void run(const TileArgs& t, float* out) {
    const KTileRows<MR, NR> r(t);
    const int64_t nb = t.K / kQK_K;
    const __m256i low4 = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30);
    __m256 acc[MR][NR];
    for (int a = 0; a < MR; ++a)
      for (int j = 0; j < NR; ++j) acc[a][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ6K* blk[NR];
      __m128i sc8[NR];
      __m256i isum[MR][NR];
      for (int j = 0; j < NR; ++j) {
        blk[j] = reinterpret_cast<const BlockQ6K*>(r.w[j]) + b;
        prefetch_block(blk[j], r.ahead);
        sc8[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[j]->scales));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8[j]);
        for (int a = 0; a < MR; ++a) {
          const __m256i xs = load32(r.sum16[a] + 16 * b);
          isum[a][j] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_slli_epi32(_mm256_madd_epi16(sc16, xs), 5));
        }
      }
      for (int s = 0; s < 8; ++s) {  // elements 32 s ..: half h, quarter r of the half
        const int h = s / 4, q = s % 4;
        // Scales of groups 2s (elements 0-15) and 2s+1 (16-31) as int16 lanes.
        const __m128i pick = _mm_setr_epi8(2 * s, 2 * s, 2 * s, 2 * s, 2 * s, 2 * s, 2 * s, 2 * s,
                                           2 * s + 1, 2 * s + 1, 2 * s + 1, 2 * s + 1, 2 * s + 1,
                                           2 * s + 1, 2 * s + 1, 2 * s + 1);
        __m256i wq[NR], scale[NR];
        for (int j = 0; j < NR; ++j) {
          const __m256i lo_bytes = load32(blk[j]->ql + 64 * h + 32 * (q & 1));
          const __m256i lo =
              _mm256_and_si256(q < 2 ? lo_bytes : _mm256_srli_epi16(lo_bytes, 4), low4);
          const __m256i hb = load32(blk[j]->qh + 32 * h);
          const __m256i hs = q == 0   ? _mm256_slli_epi16(hb, 4)
                             : q == 1 ? _mm256_slli_epi16(hb, 2)
                             : q == 2 ? hb
                                      : _mm256_srli_epi16(hb, 2);
          wq[j] = _mm256_or_si256(lo, _mm256_and_si256(hs, bits45));
          scale[j] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8[j], pick));
        }
        for (int a = 0; a < MR; ++a) {
          const __m256i xa = load32(r.xq[a] + b * kQK_K + 32 * s);
          for (int j = 0; j < NR; ++j) {
            // q <= 63: pair sums <= 16002; times an int8 scale, exact in int32.
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq[j], xa), scale[j]);
            isum[a][j] = _mm256_add_epi32(isum[a][j], p);
          }
        }
      }
      for (int j = 0; j < NR; ++j) {
        const float d = load_f16(reinterpret_cast<const uint8_t*>(&blk[j]->d));
        for (int a = 0; a < MR; ++a)
          acc[a][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[a][j]),
                                      _mm256_set1_ps(d * r.dx[a][b]), acc[a][j]);
      }
    }
    for (int a = 0; a < MR; ++a)
      for (int j = 0; j < NR; ++j) out[a * NR + j] = hsum(acc[a][j]);
  }
};

}  // namespace

void rows_q4_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<KTile<BlockQ4K>::Tile>(y, ldy, M, bias, n0, n1, args);
}
void rows_q5_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<KTile<BlockQ5K>::Tile>(y, ldy, M, bias, n0, n1, args);
}
void rows_q6_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<TileQ6K>(y, ldy, M, bias, n0, n1, args);
}

}  // namespace tessera::cpu::avx2
