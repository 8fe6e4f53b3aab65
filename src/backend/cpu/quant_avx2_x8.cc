// AVX2 kernels for the row-interleaved q4_0x8 / q4_1x8 layouts (core/interleave.h): one 32-byte
// load carries two rows' quants of a block, so vpmaddubsw works on full vectors for every row,
// the 8 rows' block sums come out of a horizontal-add tree as one vector in row order, and one
// conversion, one multiply and one FMA handle the scales of all 8 rows together.
#include "backend/cpu/quant_avx2_common.h"
#include "core/error.h"
#include "core/interleave.h"

namespace tessera::cpu::avx2 {
namespace {

// out[a][r] = dot(weight row r of the group at g, activation row m0 + a) for MR activation
// rows. Each output's arithmetic (exact integer block sums, then one FMA per block in block
// order) does not depend on MR, so a row computed alone equals the row in a batch.
template <bool kHasMin, int MR>
TS_AVX2 void group_tile(const uint8_t* g, const TileArgs& t, float* out) {
  constexpr int64_t kScales = kHasMin ? 32 : 16;  // d (and m) of 8 rows before the quants
  constexpr int64_t kChunk = kScales + 128;       // one block of 8 rows
  const int64_t nb = t.K / 32;
  const int8_t* xq[MR];
  const float* dx[MR];
  const int16_t* s32[MR];
  const float* ds[MR];
  for (int a = 0; a < MR; ++a) {
    xq[a] = t.acts->row_q(t.m0 + a), dx[a] = t.acts->row_d(t.m0 + a);
    s32[a] = t.acts->row_sum32(t.m0 + a), ds[a] = t.acts->row_dsum(t.m0 + a);
  }
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int a = 0; a < MR; ++a) acc[a] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* c = g + b * kChunk;
    // The rows are one contiguous stream; asking 32 chunks (4.5-5 KiB) ahead keeps enough
    // misses in flight for DRAM latency. Measured on the q4_0x8 32000 x 2048 matvec, one thread
    // (medians of 5, three runs per distance): 8.5-9.0 GB/s at 4 chunks ahead, 9.2-10.4 at 32,
    // 8.0 with no prefetch.
    const char* ahead = reinterpret_cast<const char*>(c + 32 * kChunk);
    _mm_prefetch(ahead, _MM_HINT_T0);
    _mm_prefetch(ahead + 64, _MM_HINT_T0);
    _mm_prefetch(ahead + 128, _MM_HINT_T0);
    __m256i lo[4], hi[4];
    for (int i = 0; i < 4; ++i) {
      const __m256i v = load32(c + kScales + 32 * i);  // rows kInterleaveSlotRow[2i], [2i+1]
      lo[i] = _mm256_and_si256(v, low4);               // elements 0-15 of both rows
      hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // elements 16-31
    }
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    __m256 m8 = _mm256_setzero_ps();
    if constexpr (kHasMin)
      m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16)));
    for (int a = 0; a < MR; ++a) {
      const int8_t* x = xq[a] + 32 * b;
      const __m256i xlo =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
      const __m256i xhi =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)));
      __m256i s[4];
      // Pair sums: |15 * 127 * 2| per product pair, twice that after the add: inside int16.
      for (int i = 0; i < 4; ++i)
        s[i] = _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], xlo), _mm256_maddubs_epi16(hi[i], xhi)),
            ones);
      // s[i] holds rows (i, i + 4) as 4 + 4 partial sums; two rounds of hadd leave row r's
      // block sum in lane r.
      __m256i r = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
      if constexpr (!kHasMin) r = _mm256_sub_epi32(r, _mm256_set1_epi32(8 * s32[a][b]));
      acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r),
                               _mm256_mul_ps(d8, _mm256_broadcast_ss(dx[a] + b)), acc[a]);
      if constexpr (kHasMin) acc[a] = _mm256_fmadd_ps(m8, _mm256_broadcast_ss(ds[a] + b), acc[a]);
    }
  }
  for (int a = 0; a < MR; ++a) _mm256_storeu_ps(out + 8 * a, acc[a]);
}

template <bool kHasMin, int MR>
TS_AVX2 void group_rows(float* y, int64_t ldy, const float* bias, int64_t n, const uint8_t* g,
                        const TileArgs& t) {
  float out[MR * 8];
  group_tile<kHasMin, MR>(g, t, out);
  for (int a = 0; a < MR; ++a)
    for (int r = 0; r < 8; ++r) {
      const float v = out[8 * a + r];
      y[(t.m0 + a) * ldy + n + r] = bias ? v + bias[n + r] : v;
    }
}

// Weight rows [n0, n1) (whole groups of 8) against all M activation rows. Activation rows go in
// blocks of 64 (128 KiB of int8 at K = 2048) so that a block and the task's weight rows both
// stay in L2; inside a block each group's 8 rows (under 10 KiB at K = 4096) stay in L1 while the
// block's rows pass over them, 4 at a time.
template <bool kHasMin>
TS_AVX2 void rows_x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                     TileArgs t) {
  TS_CHECK(n0 % kInterleaveRows == 0 && n1 % kInterleaveRows == 0,
           "[matmul_wt] interleaved rows must be split on groups of 8 (got ", n0, "..", n1, ")");
  constexpr int64_t kRowBlock = 64;
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = M - m0 < kRowBlock ? M : m0 + kRowBlock;
    for (int64_t n = n0; n < n1; n += kInterleaveRows) {
      const uint8_t* g = t.w + n * t.row_bytes;
      for_row_groups(m0, m1, [&](int64_t m, auto mr) {
        t.m0 = m;
        group_rows<kHasMin, decltype(mr)::value>(y, ldy, bias, n, g, t);
      });
    }
  }
}

}  // namespace

void rows_q4_0x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const TileArgs& args) {
  rows_x8<false>(y, ldy, M, bias, n0, n1, args);
}
void rows_q4_1x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const TileArgs& args) {
  rows_x8<true>(y, ldy, M, bias, n0, n1, args);
}

}  // namespace tessera::cpu::avx2
