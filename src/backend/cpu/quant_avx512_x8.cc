// AVX512-VNNI kernels for the row-interleaved q4_0x8 / q4_1x8 / q8_0x8 layouts (core/interleave.h),
// taken instead of quant_avx2_x8.cc's where the CPU has them. One 64-byte load holds 16 quant
// bytes of each of four rows, and vpdpbusd multiplies them against the block's activations
// broadcast to all four 128-bit lanes, summing 4 products into each int32 lane: 4 lanes per row,
// whose sums stay apart (scaled per block in f32) until the end of the row. No horizontal sums
// per block, so a block costs about half the AVX2 kernel's instructions (the AVX2 one needs
// vpmaddubsw + vpmaddwd and a horizontal-add tree per block and activation row).
#include <algorithm>

#include "backend/cpu/quant_avx2_common.h"
#include "backend/cpu/quant_avx512.h"
#include "core/error.h"
#include "core/interleave.h"

// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector (`__m512 __Y = __Y`) as the
// unused merge source of several instructions, and -Wmaybe-uninitialized reports each use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define TS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace tessera::cpu::avx512 {
namespace {

using avx2::TileArgs;

enum class X8 { q4_0, q4_1, q8_0 };

template <X8 F>
constexpr int64_t kScaleBytes = F == X8::q4_1 ? 32 : 16;  // d (and m) of 8 rows
template <X8 F>
constexpr int64_t kChunkBytes = kScaleBytes<F> + (F == X8::q8_0 ? 256 : 128);  // 8 rows x 1 block

// The most activation rows one pass over a group serves: 2 accumulators each, plus the group's
// 4 quant vectors, 2 scale vectors and temporaries, within the 32 zmm registers.
constexpr int kMaxRows = 8;

// Within a chunk the rows' 16-byte slots run 0, 4, 1, 5, 2, 6, 3, 7 (kInterleaveSlotRow), so
// the first 64 bytes hold rows 0, 4, 1, 5 and the next 64 rows 2, 6, 3, 7. Lane l of a vpdpbusd
// result belongs to the row of slot l / 4; these spread the 8 row scales (row order) that way.
TS_AVX512 inline __m512i lane_rows(int half) {
  return half == 0 ? _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5)
                   : _mm512_setr_epi32(2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7);
}

// The 16 bytes at p in all four 128-bit lanes.
TS_AVX512 inline __m512i broadcast16(const int8_t* p) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

TS_AVX512 inline __m512i load64(const uint8_t* p) {
  return _mm512_loadu_si512(p);
}

// A chunk's quants as vpdpbusd's unsigned operand, q[half][part]: half 0 rows (0,4,1,5), half 1
// rows (2,6,3,7); part 0 against elements 0-15 (q4: low nibbles; q8_0: bytes 0-15), part 1
// against 16-31. q8_0 bytes are stored as int8; adding 128 (xor of the top bit) makes them u8,
// and the activations' 128 * sum is taken off again in int32 (see group_tile).
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

// out[a * 8 + r] = dot(weight row r of the group at g, activation row t.m0 + a), MR rows.
// Per block and activation row, each int32 lane gets the exact sum over its 8 elements (4 from
// each part) of (q - offset) * x: the offset (q4_0: 8, q8_0: 128 from the u8 shift) times the
// same elements' activations is a vpdpbusd of a constant against x, subtracted first. The lane
// sums are scaled by d_w * d_x in f32 into per-lane accumulators (one FMA per lane and block,
// blocks in order); a row's 4 lanes are added at the end in a fixed order, then q4_1's min
// terms. Nothing depends on MR, so a row computed alone equals the row in a batch.
template <X8 F, int MR>
TS_AVX512 void group_tile(const uint8_t* g, const TileArgs& t, float* out) {
  constexpr int64_t kChunk = kChunkBytes<F>;
  const int64_t nb = t.K / 32;
  const int8_t* xq[MR];
  const float* dx[MR];
  const float* ds[MR];
  for (int a = 0; a < MR; ++a) {
    xq[a] = t.acts->row_q(t.m0 + a), dx[a] = t.acts->row_d(t.m0 + a);
    ds[a] = t.acts->row_dsum(t.m0 + a);
  }
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
    // One stream per group: 32 chunks ahead, as the AVX2 kernel (measured there).
    for (int64_t o = 0; o < kChunk; o += 64) avx2::prefetch_ahead(c + o, 32 * kChunk);
    __m512i q[2][2];
    load_quants<F>(c, q);
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    const __m512 d16 = _mm512_zextps256_ps512(d8);
    const __m512 dw0 = _mm512_permutexvar_ps(rows0, d16), dw1 = _mm512_permutexvar_ps(rows1, d16);
    __m256 m8 = _mm256_setzero_ps();
    if constexpr (F == X8::q4_1)
      m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16)));
    for (int a = 0; a < MR; ++a) {
      const int8_t* x = xq[a] + 32 * b;
      const __m512i xlo = broadcast16(x), xhi = broadcast16(x + 16);
      __m512i init = _mm512_setzero_si512();
      if constexpr (F != X8::q4_1) {
        // q8_0's offset byte is 0x80 = 128 as u8; q4_0's is 8.
        const __m512i off = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, xlo), offset, xhi);
        init = _mm512_sub_epi32(init, off);
      }
      const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, q[0][0], xlo), q[0][1], xhi);
      const __m512i s1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, q[1][0], xlo), q[1][1], xhi);
      const __m512 sx = _mm512_set1_ps(dx[a][b]);
      acc[a][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw0, sx), acc[a][0]);
      acc[a][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw1, sx), acc[a][1]);
      if constexpr (F == X8::q4_1)
        mins[a] = _mm256_fmadd_ps(m8, _mm256_broadcast_ss(ds[a] + b), mins[a]);
    }
  }
  for (int a = 0; a < MR; ++a) {
    alignas(64) float lanes[32];
    _mm512_store_ps(lanes, acc[a][0]);
    _mm512_store_ps(lanes + 16, acc[a][1]);
    alignas(32) float m[8];
    _mm256_store_ps(m, mins[a]);
    for (int slot = 0; slot < 8; ++slot) {
      const float* l = lanes + 4 * slot;
      const int r = kInterleaveSlotRow[slot];
      out[a * 8 + r] = ((l[0] + l[1]) + (l[2] + l[3])) + m[r];
    }
  }
}

template <X8 F, int MR>
TS_AVX512 void group_rows(float* y, int64_t ldy, const float* bias, int64_t n, const uint8_t* g,
                          const TileArgs& t) {
  float out[MR * 8];
  group_tile<F, MR>(g, t, out);
  for (int a = 0; a < MR; ++a)
    for (int r = 0; r < 8; ++r) {
      const float v = out[8 * a + r];
      y[(t.m0 + a) * ldy + n + r] = bias ? v + bias[n + r] : v;
    }
}

// MR = rows (1..kMaxRows) as a template argument.
template <X8 F>
TS_AVX512 void group_rows_n(int rows, float* y, int64_t ldy, const float* bias, int64_t n,
                            const uint8_t* g, const TileArgs& t) {
  switch (rows) {
    case 1:
      return group_rows<F, 1>(y, ldy, bias, n, g, t);
    case 2:
      return group_rows<F, 2>(y, ldy, bias, n, g, t);
    case 3:
      return group_rows<F, 3>(y, ldy, bias, n, g, t);
    case 4:
      return group_rows<F, 4>(y, ldy, bias, n, g, t);
    case 5:
      return group_rows<F, 5>(y, ldy, bias, n, g, t);
    case 6:
      return group_rows<F, 6>(y, ldy, bias, n, g, t);
    case 7:
      return group_rows<F, 7>(y, ldy, bias, n, g, t);
    default:
      return group_rows<F, kMaxRows>(y, ldy, bias, n, g, t);
  }
}

// Weight rows [n0, n1) (whole groups of 8) against all M activation rows, blocked as the AVX2
// kernel: activation rows in blocks of 64 so the block and the task's weight rows stay in L2,
// each group's rows in L1 while the block's rows pass over them, kMaxRows at a time.
template <X8 F>
TS_AVX512 void rows_x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       TileArgs t) {
  TS_CHECK(n0 % kInterleaveRows == 0 && n1 % kInterleaveRows == 0,
           "[matmul_wt] interleaved rows must be split on groups of 8 (got ", n0, "..", n1, ")");
  constexpr int64_t kRowBlock = 64;
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = M - m0 < kRowBlock ? M : m0 + kRowBlock;
    for (int64_t n = n0; n < n1; n += kInterleaveRows) {
      const uint8_t* g = t.w + n * t.row_bytes;
      for (int64_t m = m0; m < m1; m += kMaxRows) {
        t.m0 = m;
        group_rows_n<F>(static_cast<int>(std::min<int64_t>(kMaxRows, m1 - m)), y, ldy, bias, n, g,
                        t);
      }
    }
  }
}

}  // namespace

void rows_q4_0x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const TileArgs& args) {
  rows_x8<X8::q4_0>(y, ldy, M, bias, n0, n1, args);
}
void rows_q4_1x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const TileArgs& args) {
  rows_x8<X8::q4_1>(y, ldy, M, bias, n0, n1, args);
}
void rows_q8_0x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const TileArgs& args) {
  rows_x8<X8::q8_0>(y, ldy, M, bias, n0, n1, args);
}

}  // namespace tessera::cpu::avx512
