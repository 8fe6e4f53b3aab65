// AVX512-VNNI kernels for the row-interleaved q4_0x8 / q4_1x8 / q8_0x8 layouts (core/interleave.h),
// taken instead of quant_avx2_x8.cc's where the CPU has them. One 64-byte load holds 16 quant
// bytes of each of four rows, and vpdpbusd multiplies them against the block's activations
// broadcast to all four 128-bit lanes, summing 4 products into each int32 lane: 4 lanes per row,
// whose sums stay apart (scaled per block in f32) until the end of the row: no horizontal sums
// per block, where the AVX2 kernel needs vpmaddubsw + vpmaddwd and a horizontal-add tree per
// block and activation row. One Xeon core, 512 x 2048 x 2048: 23.4 / 25.1 / 24.8 ms for q4_0x8
// / q4_1x8 / q8_0x8 against the AVX2 kernels' 38.8 / 36.9 / 55.9 (MatmulWt/route).
#include "backend/cpu/quant_avx2_common.h"
#include "backend/cpu/quant_avx512.h"
#include "backend/cpu/quant_avx512_lanes.h"
#include "backend/cpu/quant_x8_common.h"

// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector (`__m512 __Y = __Y`) as the
// unused merge source of several instructions, and -Wmaybe-uninitialized reports each use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tessera::cpu::avx512 {
namespace {

using avx2::TileArgs;

using x8::kChunkBytes;
using x8::kScaleBytes;
using x8::X8;

// The most activation rows one pass over a group serves: 2 accumulators each, plus the group's
// 4 quant vectors, 2 scale vectors and temporaries, within the 32 zmm registers.
constexpr int kMaxRows = 8;

using lanes::broadcast16;
using lanes::lane_rows;

TS_AVX512 inline __m512i load64(const uint8_t* p) {
  return _mm512_loadu_si512(p);
}

// A chunk's quants as vpdpbusd's unsigned operand, q[half][part]: half 0 rows (0,4,1,5), half 1
// rows (2,6,3,7); part 0 against elements 0-15 (q4: low nibbles; q8_0: bytes 0-15), part 1
// against 16-31. q8_0 bytes are stored as int8; adding 128 (xor of the top bit) makes them u8,
// and the activations' 128 * sum is taken off again in int32 (see GroupTile).
template <X8 F>
TS_AVX512 inline void load_quants(const uint8_t* c, __m512i q[2][2]) {
  const uint8_t* p = c + kScaleBytes<F>;
  if constexpr (F == X8::q8_0) {
    const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int h = 0; h < 2; ++h)
      for (int part = 0; part < 2; ++part)
        q[h][part] = _mm512_xor_si512(load64(p + 128 * part + 64 * h), top);
  } else {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    for (int h = 0; h < 2; ++h) {
      const __m512i w = load64(p + 64 * h);
      q[h][0] = _mm512_and_si512(w, low4);
      q[h][1] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
    }
  }
}

// out[a * 8 + r] = dot(weight row r of the group at g, activation row m0 + a), MR rows.
// Per block and activation row, each int32 lane gets the exact sum over its 8 elements (4 from
// each part) of (q - offset) * x: the offset (q4_0: 8, q8_0: 128 from the u8 shift) times the
// same elements' activations is a vpdpbusd of a constant against x, subtracted first. The lane
// sums are scaled by d_w * d_x in f32 into per-lane accumulators (one FMA per lane and block,
// blocks in order); a row's 4 lanes are added at the end in a fixed order, then q4_1's min
// terms. Nothing depends on MR, so a row computed alone equals the row in a batch.
template <X8 F, int MR>
struct GroupTile {
  TS_AVX512 static void run(const uint8_t* g, const TileArgs& t, int64_t m0, float* out) {
    constexpr int64_t kChunk = kChunkBytes<F>;
    constexpr int64_t kAheadBytes = (int64_t{32} << 10) / kChunk * kChunk;
    const int64_t nb = t.K / 32;
    const x8::ActRows<MR> xr(*t.acts, m0);
    const __m512i rows0 = lane_rows(0), rows1 = lane_rows(1);
    const __m512i offset = _mm512_set1_epi8(F == X8::q4_0 ? 8 : F == X8::q8_0 ? -128 : 0);
    __m512 acc[MR][2];
    __m256 mins[MR];
    for (int a = 0; a < MR; ++a) {
      acc[a][0] = acc[a][1] = _mm512_setzero_ps();
      mins[a] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* c = g + b * kChunk;
      // One stream per group, asked for about 32 KiB ahead into L2. On the third Xeon VM (model
      // 167), 1.1B decode, one / two threads, into L1 (T0): q4_0x8 15.8-16.1 / 28.7-30.0
      // tokens/s at 32 chunks ahead (4.6 KiB, the AVX2 kernel's distance), 18.0-18.2 /
      // 34.0-34.2 at 128 (18 KiB), 17.3-17.7 at 256; q8_0x8 11.1-11.6 at 32 chunks (8.5 KiB),
      // 11.6 at 64 (17 KiB), 11.0 at 128 (34 KiB). Into L2 (T1) at 32 KiB, alternated with T0 at
      // 16 KiB in one window (same VM, 1 Dec 23:50 UTC): q4_0 18.3 / 34.4 against 15.8 / 29.7
      // and 15.3 / 29.2 against 14.2 / 27.2, q8_0 10.1-10.8 / 19.5-19.6 against 9.3-10.2
      // / 18.4-19.4: far prefetches held L1 fill buffers the kernel's loads wait for.
      for (int64_t o = 0; o < kChunk; o += 64) avx2::prefetch_ahead_l2(c + o, kAheadBytes);
      __m512i q[2][2];
      load_quants<F>(c, q);
      const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
      const __m512 d16 = _mm512_zextps256_ps512(d8);
      const __m512 dw0 = _mm512_permutexvar_ps(rows0, d16), dw1 = _mm512_permutexvar_ps(rows1, d16);
      __m256 m8 = _mm256_setzero_ps();
      if constexpr (F == X8::q4_1)
        m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16)));
      for (int a = 0; a < MR; ++a) {
        const int8_t* x = xr.q[a] + 32 * b;
        const __m512i xlo = broadcast16(x), xhi = broadcast16(x + 16);
        __m512i init = _mm512_setzero_si512();
        if constexpr (F != X8::q4_1) {
          // q8_0's offset byte is 0x80 = 128 as u8; q4_0's is 8.
          const __m512i off = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, xlo), offset, xhi);
          init = _mm512_sub_epi32(init, off);
        }
        const __m512i s0 =
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, q[0][0], xlo), q[0][1], xhi);
        const __m512i s1 =
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, q[1][0], xlo), q[1][1], xhi);
        const __m512 sx = _mm512_set1_ps(xr.d[a][b]);
        acc[a][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw0, sx), acc[a][0]);
        acc[a][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw1, sx), acc[a][1]);
        if constexpr (F == X8::q4_1)
          mins[a] = _mm256_fmadd_ps(m8, _mm256_broadcast_ss(xr.dsum[a] + b), mins[a]);
      }
    }
    for (int a = 0; a < MR; ++a) {
      lanes::sum_rows(acc[a][0], acc[a][1], out + 8 * a);
      alignas(32) float m[8];
      _mm256_store_ps(m, mins[a]);
      for (int r = 0; r < 8; ++r) out[a * 8 + r] += m[r];
    }
  }
};

}  // namespace

x8::RowsFn<TileArgs> x8_rows_fn(DType t) {
  return x8::rows_for<GroupTile, kMaxRows, TileArgs>(t);
}

}  // namespace tessera::cpu::avx512
