// AVX2 tiles for the 32-element block formats (q8_0, q4_0, q4_1, q5_0, q5_1) against int8
// activations: vpmaddubsw (u8 x i8 -> i16 pair sums) then vpmaddwd with ones (-> i32), one f32
// FMA per block.
#include "backend/cpu/quant_avx2_common.h"
#include "core/dtype.h"

namespace tessera::cpu::avx2 {
namespace {

// Row pointers of one tile: MR activation rows, NR weight rows. A tile reads NR short rows
// (under 1 KiB each for K = 576) as interleaved streams, too short for the hardware prefetcher
// to ramp up, so its loops ask for the next tile's bytes (prefetch_ahead by `ahead`): without
// that, decode from DRAM runs at a fraction of its bandwidth.
template <int MR, int NR>
struct TileRows {
  const int8_t* xq[MR];
  const float* dx[MR];
  const uint8_t* w[NR];
  int64_t ahead;  // bytes from a weight row to the same row of the next tile
  TS_AVX2 explicit TileRows(const TileArgs& t) : ahead(NR * t.row_bytes) {
    for (int a = 0; a < MR; ++a) xq[a] = t.acts->row_q(t.m0 + a), dx[a] = t.acts->row_d(t.m0 + a);
    for (int j = 0; j < NR; ++j) w[j] = t.w + j * t.row_bytes;
  }
};

// Weight rows per tile: with few activation rows, more weight rows keep several independent FMA
// chains in flight; with 3-4, two weight rows already give 6-8 accumulators (16 ymm registers).
constexpr int nr_for(int mr) {
  return mr <= 2 ? 4 : 2;
}

// q8_0: i8 x i8 through the sign trick: |w| as u8 times x carrying w's sign; pair sums are at
// most 2 * 128 * 127 = 32512, inside int16.
template <int MR, int NR>
struct TileQ8_0 {
  static constexpr int kNR = nr_for(MR);
  TS_AVX2 static void run(const TileArgs& t, float* out) {
    const TileRows<MR, NR> r(t);
    const int64_t nb = t.K / 32;
    __m256 acc[MR][NR];
    for (int a = 0; a < MR; ++a)
      for (int j = 0; j < NR; ++j) acc[a][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i wq[NR];
      __m256 dw[NR];
      for (int j = 0; j < NR; ++j) {
        const uint8_t* blk = r.w[j] + b * sizeof(BlockQ8_0);
        prefetch_ahead(blk, r.ahead);
        wq[j] = load32(blk + 2);
        dw[j] = broadcast_f16(blk);
      }
      for (int a = 0; a < MR; ++a) {
        const __m256i xa = load32(r.xq[a] + 32 * b);
        const __m256 dxa = _mm256_broadcast_ss(r.dx[a] + b);
        for (int j = 0; j < NR; ++j) {
          const __m256i s = dot_u8_i8(_mm256_abs_epi8(wq[j]), _mm256_sign_epi8(xa, wq[j]));
          acc[a][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[j], dxa), acc[a][j]);
        }
      }
    }
    for (int a = 0; a < MR; ++a)
      for (int j = 0; j < NR; ++j) out[a * NR + j] = hsum(acc[a][j]);
  }
};

// q4_0 (kHasMin false: quants 0..15 stand for q - 8) and q4_1 (quants 0..15 plus a min m); with
// kFifthBit, q5_0 (0..31 for q - 16) and q5_1 (0..31 plus a min), whose fifth bits come from the
// 32-bit word before the nibbles. The offset stays in integers: sum (q - o) x = sum q x - o sum x,
// subtracted as i16 pair sums (|q x pairs| <= 7874, |16 x pairs| <= 4064). The min adds
// m * d_x * sum(x) per block, accumulated separately (min_terms).
template <bool kHasMin, bool kFifthBit>
struct Q32Tile {
  template <int MR, int NR>
  struct Tile {
    static constexpr int kNR = nr_for(MR);
    static constexpr int64_t kQsOffset = (kHasMin ? 4 : 2) + (kFifthBit ? 4 : 0);
    static constexpr int64_t kBlockBytes = kQsOffset + 16;
    static constexpr int kOffset = kHasMin ? 0 : kFifthBit ? 16 : 8;
    TS_AVX2 static void run(const TileArgs& t, float* out) {
      const TileRows<MR, NR> r(t);
      const int64_t nb = t.K / 32;
      __m256 acc[MR][NR];
      for (int a = 0; a < MR; ++a)
        for (int j = 0; j < NR; ++j) acc[a][j] = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        __m256i wq[NR];
        __m256 dw[NR];
        for (int j = 0; j < NR; ++j) {
          const uint8_t* blk = r.w[j] + b * kBlockBytes;
          if (b % 2 == 0) prefetch_ahead(blk, r.ahead);
          wq[j] = unpack_nibbles16(blk + kQsOffset);
          if constexpr (kFifthBit) {
            uint32_t qh;
            std::memcpy(&qh, blk + kQsOffset - 4, 4);
            wq[j] = _mm256_or_si256(wq[j], expand_high_bits(qh));
          }
          dw[j] = broadcast_f16(blk);
        }
        for (int a = 0; a < MR; ++a) {
          const __m256i xa = load32(r.xq[a] + 32 * b);
          const __m256 dxa = _mm256_broadcast_ss(r.dx[a] + b);
          __m256i xo;
          if constexpr (kOffset != 0) xo = _mm256_maddubs_epi16(_mm256_set1_epi8(kOffset), xa);
          for (int j = 0; j < NR; ++j) {
            __m256i pairs = _mm256_maddubs_epi16(wq[j], xa);
            if constexpr (kOffset != 0) pairs = _mm256_sub_epi16(pairs, xo);
            const __m256i s = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            acc[a][j] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[j], dxa), acc[a][j]);
          }
        }
      }
      for (int a = 0; a < MR; ++a)
        for (int j = 0; j < NR; ++j) out[a * NR + j] = hsum(acc[a][j]);
      if constexpr (kHasMin) add_min_terms(t, r, nb, out);
    }

    // out[a][j] += sum_b m_jb * dsum_ab: 8 blocks per vector (the mins gathered from the block
    // headers, still in L1 from the main loop), then the tail in order.
    TS_AVX2 static void add_min_terms(const TileArgs& t, const TileRows<MR, NR>& r, int64_t nb,
                                      float* out) {
      const float* ds[MR];
      for (int a = 0; a < MR; ++a) ds[a] = t.acts->row_dsum(t.m0 + a);
      for (int j = 0; j < NR; ++j) {
        const uint8_t* mp = r.w[j] + 2;  // the min's offset in a block
        __m256 acc[MR];
        for (int a = 0; a < MR; ++a) acc[a] = _mm256_setzero_ps();
        int64_t b = 0;
        for (; b + 8 <= nb; b += 8) {
          uint16_t h[8];
          for (int i = 0; i < 8; ++i) std::memcpy(&h[i], mp + (b + i) * kBlockBytes, 2);
          const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
          for (int a = 0; a < MR; ++a)
            acc[a] = _mm256_fmadd_ps(m8, _mm256_loadu_ps(ds[a] + b), acc[a]);
        }
        for (int a = 0; a < MR; ++a) {
          float s = hsum(acc[a]);
          for (int64_t i = b; i < nb; ++i) s += load_f16(mp + i * kBlockBytes) * ds[a][i];
          out[a * NR + j] += s;
        }
      }
    }
  };
};

}  // namespace

void rows_q8_0(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<TileQ8_0>(y, ldy, M, bias, n0, n1, args);
}
void rows_q4_0(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<Q32Tile<false, false>::Tile>(y, ldy, M, bias, n0, n1, args);
}
void rows_q4_1(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<Q32Tile<true, false>::Tile>(y, ldy, M, bias, n0, n1, args);
}
void rows_q5_0(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<Q32Tile<false, true>::Tile>(y, ldy, M, bias, n0, n1, args);
}
void rows_q5_1(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<Q32Tile<true, true>::Tile>(y, ldy, M, bias, n0, n1, args);
}

}  // namespace tessera::cpu::avx2
