// AVX512-VNNI kernels for the row-interleaved q4_kx8, q5_kx8 and q6_kx8 layouts
// (core/interleave.h): q4_K / Q5_K / Q6_K matrices in groups of 8 rows, one super-block of all
// 8 rows per chunk (1152 / 1408 / 1680 bytes). As in q4_0x8, one 64-byte load holds 16 quant
// bytes of four rows, each 128-bit lane one row; the block's activations are broadcast to all
// four lanes. vpmaddubsw forms u8 x s8 pair sums and vpdpwssd multiplies them by the lane's row's
// sub-block scale (spread by vpermw) into int32, exact over the whole super-block (q4_K / Q5_K
// add a sub-block's two runs in int16 first; Q5_K adds each element's fifth bit as 16, Q6_K
// builds its 6-bit quants from a ql and a qh run). Against the plain tiles
// (quant_avx512_kquant.cc), which unpack one row's scales with scalar code and read each row as
// its own stream, a group is one sequential stream and its 8 rows' scales decode in a few vector
// instructions.
#include "backend/cpu/quant_avx2_common.h"
#include "backend/cpu/quant_avx512.h"
#include "backend/cpu/quant_avx512_lanes.h"
#include "backend/cpu/quant_x8_common.h"
#include "core/interleave.h"

// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector (`__m512 __Y = __Y`) as the
// unused merge source of several instructions, and -Wmaybe-uninitialized reports each use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tessera::cpu::avx512 {
namespace {

using avx2::TileArgs;

// The most activation rows one pass over a group serves. Both kernels go over one row half at
// a time (one int32 sum per activation row beside that half's few quant and scale vectors), so
// 8 rows share each unpacking of the quants. One Xeon core, 512 x 2048 x 2048, against 4 rows
// with both halves at once (MatmulWt/route, alternated): q4_kx8 20.6-21.9 against 24.8-26.3 ms,
// q5_kx8 23.5-27.2 against 30.2-32.9, q6_kx8 34.2-41.2 against 40.4-45.1.
constexpr int kMaxRows = 8;

using lanes::broadcast16;
using lanes::lane_rows;

// vpermw indices that give int16 lane i of a scale vector lane (i / 8) * 8, the first of its
// row's 8 scales (each 128-bit lane holds one row's); adding k picks that row's scale k.
TS_AVX512 inline __m512i scale_lane_base() {
  return _mm512_setr_epi64(0, 0, 0x0008000800080008, 0x0008000800080008, 0x0010001000100010,
                           0x0010001000100010, 0x0018001800180018, 0x0018001800180018);
}

// The packed 6-bit scales and mins of four rows (12 bytes each, contiguous at p) as int16: in
// *sc, 128-bit lane L holds the 8 sub-block scales of the p's L-th row, in *mn its 8 mins. The
// bit layout is q4_k_scale_min's (core/dtype.h), for all four rows at once: per lane the words
// u0, u1, u2 give scales 0-3 = u0 & 0x3f.., mins 0-3 = u1 & 0x3f.., scales 4-7 = (u2 & 0x0f..) |
// ((u0 >> 2) & 0x30..), mins 4-7 = ((u2 >> 4) & 0x0f..) | ((u1 >> 2) & 0x30..).
TS_AVX512 inline void decode_scales(const uint8_t* p, __m512i* sc, __m512i* mn) {
  const __m512i raw = _mm512_loadu_si512(p);  // 64 bytes: 48 used, the rest is the chunk's own
  const __m512i words =
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11),
                               raw);                                                // u0 u1 u2 u2
  const __m512i a = _mm512_shuffle_epi32(words, static_cast<_MM_PERM_ENUM>(0x98));  // u0 u2 u1 u2
  const __m512i b = _mm512_shuffle_epi32(words, static_cast<_MM_PERM_ENUM>(0x50));  // u0 u0 u1 u1
  const __m512i low = _mm512_and_si512(a, _mm512_set1_epi32(0x3f3f3f3f));
  const __m512i high = _mm512_or_si512(
      _mm512_and_si512(
          _mm512_srlv_epi32(a, _mm512_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4)),
          _mm512_set1_epi32(0x0f0f0f0f)),
      _mm512_and_si512(_mm512_srli_epi32(b, 2), _mm512_set1_epi32(0x30303030)));
  // Per lane: scales 0-3, 4-7, mins 0-3, 4-7 (bytes).
  const __m512i bytes = _mm512_mask_blend_epi32(0xAAAA, low, high);
  // The scale qwords (0, 2, 4, 6) to the lower half, the min qwords to the upper.
  const __m512i split = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), bytes);
  *sc = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(split));
  *mn = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(split, 1));
}

// out[a * 8 + r] = dot(weight row r of the group at g, activation row m0 + a), MR rows. Per
// super-block, activation row and half, each int32 lane sums its row's sc_j * q * x_q exactly;
// the lanes are scaled by d_w * d_x and the mins' term dmin_w * d_x * sum_j m_j sum32_j taken
// off in f32, super-blocks in order; a row's 4 lanes are added at the end in a fixed order.
// Nothing depends on MR, so a row computed alone equals the row in a batch.
template <bool kFifthBit>
struct KGroup {
  static constexpr int64_t kChunk = kFifthBit ? kQ5KX8ChunkBytes : kQ4KX8ChunkBytes;
  static constexpr int64_t kQuantsAt = kFifthBit ? kQ5KX8QuantsAt : kQ4KX8QuantsAt;

  // q + 16 in the bytes whose qh byte has bit `bit` set (q < 16: the same as setting bit 4). A
  // vptestmb and a byte-masked add: one route, 512 x 2048 x 2048, alternated, 34.5 / 36.2 ms
  // against 36.6 / 37.0 for a shift, an and and an or (both beside q4_kx8's 27.8-29.6).
  TS_AVX512 static __m512i with_fifth_bit(__m512i q, __m512i qh, int bit) {
    const __mmask64 set = _mm512_test_epi8_mask(qh, _mm512_set1_epi8(static_cast<char>(1 << bit)));
    return _mm512_mask_add_epi8(q, set, q, _mm512_set1_epi8(16));
  }

  template <int MR>
  TS_AVX512 static void run(const uint8_t* g, const TileArgs& t, int64_t m0, float* out) {
    // About 32 KiB ahead into L2, as the q4_0x8 kernels (MatmulWt/decode-dram, one / two
    // threads, alternated: 8.5-10.0 / 17.0-18.1 GB/s against 8.2-8.9 / 16.1-17.1 into L1 at 16
    // KiB).
    constexpr int64_t kAheadBytes = (int64_t{32} << 10) / kChunk * kChunk;
    const int64_t nb = t.K / kQK_K;
    const x8::ActRows<MR> xr(*t.acts, m0);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i lane_base = scale_lane_base();
    __m512 acc[MR][2];
    for (int a = 0; a < MR; ++a) acc[a][0] = acc[a][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* c = g + b * kChunk;
      for (int64_t o = 0; o < kChunk; o += 64) avx2::prefetch_ahead_l2(c + o, kAheadBytes);
      const __m512 d16 = _mm512_zextps256_ps512(
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c))));
      const __m512 m16 = _mm512_zextps256_ps512(
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16))));
      // One row half (four rows, a 128-bit lane each) at a time: its quants and scales take 6
      // registers, so up to 8 activation rows keep their int32 sums in registers while the
      // half's quants are unpacked once for all of them.
      for (int h = 0; h < 2; ++h) {
        __m512i sc, mn;
        decode_scales(c + kQ4KX8ScalesAt + 48 * h, &sc, &mn);
        __m512i isum[MR];
        for (int a = 0; a < MR; ++a) isum[a] = _mm512_setzero_si512();
        for (int s = 0; s < 4; ++s) {  // sub-blocks 2s (low nibbles) and 2s + 1 (high)
          const uint8_t* q = c + kQuantsAt + 256 * s;
          __m512i lo[2], hi[2];  // [run]
          for (int run = 0; run < 2; ++run) {
            const __m512i w = _mm512_loadu_si512(q + 128 * run + 64 * h);
            lo[run] = _mm512_and_si512(w, low4);
            hi[run] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
            if constexpr (kFifthBit) {
              // qh run `run` holds the fifth bits of the same elements: bit 2s for the low
              // nibbles' sub-block, 2s + 1 for the high ones'.
              const __m512i qh = _mm512_loadu_si512(c + kQ5KX8HighBitsAt + 128 * run + 64 * h);
              lo[run] = with_fifth_bit(lo[run], qh, 2 * s);
              hi[run] = with_fifth_bit(hi[run], qh, 2 * s + 1);
            }
          }
          const __m512i scale_lo =
              _mm512_permutexvar_epi16(_mm512_add_epi16(lane_base, _mm512_set1_epi16(2 * s)), sc);
          const __m512i scale_hi = _mm512_permutexvar_epi16(
              _mm512_add_epi16(lane_base, _mm512_set1_epi16(2 * s + 1)), sc);
          for (int a = 0; a < MR; ++a) {
            const int8_t* x = xr.q[a] + kQK_K * b + 64 * s;
            // q <= 15 (Q5_K: 31): each pair sum <= 3810 (7874) and two runs' <= 7620 (15748),
            // no int16 saturation; times a 6-bit scale and summed over a super-block, exact in
            // int32.
            const __m512i plo = _mm512_add_epi16(_mm512_maddubs_epi16(lo[0], broadcast16(x)),
                                                 _mm512_maddubs_epi16(lo[1], broadcast16(x + 16)));
            const __m512i phi = _mm512_add_epi16(_mm512_maddubs_epi16(hi[0], broadcast16(x + 32)),
                                                 _mm512_maddubs_epi16(hi[1], broadcast16(x + 48)));
            isum[a] = _mm512_dpwssd_epi32(isum[a], plo, scale_lo);
            isum[a] = _mm512_dpwssd_epi32(isum[a], phi, scale_hi);
          }
        }
        const __m512 dw = _mm512_permutexvar_ps(lane_rows(h), d16);
        const __m512 dm = _mm512_permutexvar_ps(lane_rows(h), m16);
        for (int a = 0; a < MR; ++a) {
          // The 8 sub-block sums of the activations in every lane: the mins' integer dot.
          const __m512i xs = _mm512_broadcast_i32x4(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr.sum32[a] + 8 * b)));
          const __m512 sx = _mm512_set1_ps(xr.d[a][b]);
          const __m512 mins = _mm512_cvtepi32_ps(_mm512_madd_epi16(mn, xs));
          acc[a][h] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[a]), _mm512_mul_ps(dw, sx), acc[a][h]);
          acc[a][h] = _mm512_fnmadd_ps(mins, _mm512_mul_ps(dm, sx), acc[a][h]);
        }
      }
    }
    for (int a = 0; a < MR; ++a) lanes::sum_rows(acc[a][0], acc[a][1], out + 8 * a);
  }
};

// Q6_K in 8-row groups: every 16 elements have their own int8 scale, so each vpmaddubsw result
// (16 elements of four rows) goes to vpdpwssd alone, with its group's scale vector. The 6-bit
// quants are built per 16-byte run: the low 4 bits from a ql run (low nibbles for quarters 0
// and 1 of a half, high for 2 and 3), the high 2 from a qh run (bits 2r, 2r + 1 for quarter
// r). q in 0..63 stands for q - 32: the -32 is taken off per row as 32 sum_g sc_g sum16_g in
// int32 before the products are added, as in the plain tiles. One row half (four rows, one
// 128-bit lane each) at a time.
template <int MR>
struct GroupTileQ6K {
  TS_AVX512 static void run(const uint8_t* g, const TileArgs& t, int64_t m0, float* out) {
    constexpr int64_t kChunk = kQ6KX8ChunkBytes;
    constexpr int64_t kAheadBytes = (int64_t{32} << 10) / kChunk * kChunk;  // as KGroup
    const int64_t nb = t.K / kQK_K;
    const x8::ActRows<MR> xr(*t.acts, m0);
    const __m512i low4 = _mm512_set1_epi8(0x0f), bits45 = _mm512_set1_epi8(0x30);
    const __m512i lane_base = scale_lane_base();
    const int16_t* sum16[MR];
    for (int a = 0; a < MR; ++a) sum16[a] = t.acts->row_sum16(m0 + a);
    __m512 acc[MR][2];
    for (int a = 0; a < MR; ++a) acc[a][0] = acc[a][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* c = g + b * kChunk;
      for (int64_t o = 0; o < kChunk; o += 64) avx2::prefetch_ahead_l2(c + o, kAheadBytes);
      const __m512 d16 = _mm512_zextps256_ps512(
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c))));
      for (int hh = 0; hh < 2; ++hh) {
        // The four rows' 16 scales as int16: groups 0-7 in sc[0], 8-15 in sc[1], lane L for
        // slot 4 hh + L.
        const __m512i raw = _mm512_loadu_si512(c + kQ6KX8ScalesAt + 64 * hh);
        const __m512i split =
            _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), raw);
        const __m512i sc[2] = {_mm512_cvtepi8_epi16(_mm512_castsi512_si256(split)),
                               _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(split, 1))};
        __m512i isum[MR];
        for (int a = 0; a < MR; ++a) {
          const __m512i off = _mm512_add_epi32(
              _mm512_madd_epi16(sc[0], _mm512_broadcast_i32x4(_mm_loadu_si128(
                                           reinterpret_cast<const __m128i*>(sum16[a] + 16 * b)))),
              _mm512_madd_epi16(sc[1],
                                _mm512_broadcast_i32x4(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(sum16[a] + 16 * b + 8)))));
          isum[a] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(off, 5));
        }
        for (int h = 0; h < 2; ++h)
          for (int p = 0; p < 2; ++p) {
            const __m512i qh = _mm512_loadu_si512(c + kQ6KX8HighAt + 128 * (2 * h + p) + 64 * hh);
            for (int rp = 0; rp < 2; ++rp) {
              const __m512i ql =
                  _mm512_loadu_si512(c + kQ6KX8LowAt + 128 * (4 * h + 2 * rp + p) + 64 * hh);
              for (int r = rp; r < 4; r += 2) {
                const __m512i nib = _mm512_and_si512(r < 2 ? ql : _mm512_srli_epi16(ql, 4), low4);
                // Bits 2r, 2r + 1 of each qh byte to bits 4, 5 (16-bit shifts: what lands there
                // comes from the same byte).
                const __m512i high = _mm512_and_si512(
                    r < 3 ? _mm512_slli_epi16(qh, 4 - 2 * r) : _mm512_srli_epi16(qh, 2), bits45);
                const __m512i w = _mm512_or_si512(nib, high);
                const __m512i scale = _mm512_permutexvar_epi16(
                    _mm512_add_epi16(lane_base, _mm512_set1_epi16(2 * r + p)), sc[h]);
                for (int a = 0; a < MR; ++a) {
                  // q <= 63: pair sums <= 16002; times an int8 scale, exact in int32.
                  const int8_t* x = xr.q[a] + kQK_K * b + 128 * h + 32 * r + 16 * p;
                  isum[a] =
                      _mm512_dpwssd_epi32(isum[a], _mm512_maddubs_epi16(w, broadcast16(x)), scale);
                }
              }
            }
          }
        const __m512 dw = _mm512_permutexvar_ps(lane_rows(hh), d16);
        for (int a = 0; a < MR; ++a)
          acc[a][hh] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[a]),
                                       _mm512_mul_ps(dw, _mm512_set1_ps(xr.d[a][b])), acc[a][hh]);
      }
    }
    for (int a = 0; a < MR; ++a) lanes::sum_rows(acc[a][0], acc[a][1], out + 8 * a);
  }
};

void rows_q6_kx8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const TileArgs& args) {
  static constexpr std::array<x8::GroupTile<TileArgs>, kMaxRows> tiles = {
      &GroupTileQ6K<1>::run, &GroupTileQ6K<2>::run, &GroupTileQ6K<3>::run, &GroupTileQ6K<4>::run,
      &GroupTileQ6K<5>::run, &GroupTileQ6K<6>::run, &GroupTileQ6K<7>::run, &GroupTileQ6K<8>::run};
  x8::run_groups(tiles, y, ldy, M, bias, n0, n1, args);
}

template <bool kFifthBit>
void rows_k_x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  using G = KGroup<kFifthBit>;
  static constexpr std::array<x8::GroupTile<TileArgs>, kMaxRows> tiles = {
      &G::template run<1>, &G::template run<2>, &G::template run<3>, &G::template run<4>,
      &G::template run<5>, &G::template run<6>, &G::template run<7>, &G::template run<8>};
  x8::run_groups(tiles, y, ldy, M, bias, n0, n1, args);
}

}  // namespace

KQuantRowsFn kquant_x8_rows_fn(DType t) {
  if (t == DType::q4_kx8) return &rows_k_x8<false>;
  if (t == DType::q5_kx8) return &rows_k_x8<true>;
  if (t == DType::q6_kx8) return &rows_q6_kx8;
  return nullptr;
}

}  // namespace tessera::cpu::avx512
