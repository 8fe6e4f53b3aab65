// AVX2 kernels for the row-interleaved q4_0x8 / q4_1x8 / q8_0x8 layouts (core/interleave.h): one
// 32-byte load carries 16 quant bytes of each of two rows (a q4 block's all, half a q8_0 block's),
// so vpmaddubsw works on full vectors for every row, the 8 rows' block sums come out of a
// horizontal-add tree as one vector in row order, and one conversion, one multiply and one FMA
// handle the scales of all 8 rows together.
#include "backend/cpu/quant_avx2_common.h"
#include "backend/cpu/quant_x8_common.h"

namespace tessera::cpu::avx2 {
namespace {

using x8::kChunkBytes;
using x8::kScaleBytes;
using x8::X8;

// One chunk's quants held in registers, pair i (rows i and i + 4) in v[.][i]: for q8_0 the two
// 16-byte runs (elements 0-15 and 16-31 of both rows), for q4 the low nibbles (elements 0-15)
// and the high nibbles (16-31) of one load.
template <X8 F>
struct ChunkQuants {
  __m256i v[2][4];

  TS_AVX2 explicit ChunkQuants(const uint8_t* c) {
    const uint8_t* q = c + kScaleBytes<F>;
    if constexpr (F == X8::q8_0) {
      for (int run = 0; run < 2; ++run)
        for (int i = 0; i < 4; ++i) v[run][i] = load32(q + 128 * run + 32 * i);
    } else {
      const __m256i low4 = _mm256_set1_epi8(0x0f);
      for (int i = 0; i < 4; ++i) {
        const __m256i w = load32(q + 32 * i);
        v[0][i] = _mm256_and_si256(w, low4);
        v[1][i] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
      }
    }
  }

  // s[i]: 4 partial sums of row i (low half) and of row i + 4 (high half) against the block's
  // activations x (32 int8).
  TS_AVX2 void pair_sums(const int8_t* x, __m256i s[4]) const {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i xlo =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    const __m256i xhi =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)));
    for (int i = 0; i < 4; ++i) {
      if constexpr (F == X8::q8_0) {
        // |w| as u8 times x carrying w's sign (exact for w = -128 too): pair sums at most
        // 2 * 128 * 127 = 32512, inside int16; the two runs add in int32.
        s[i] =
            _mm256_add_epi32(dot_u8_i8(_mm256_abs_epi8(v[0][i]), _mm256_sign_epi8(xlo, v[0][i])),
                             dot_u8_i8(_mm256_abs_epi8(v[1][i]), _mm256_sign_epi8(xhi, v[1][i])));
      } else {
        // Pair sums: |15 * 127 * 2| per product pair, twice that after the add: inside int16.
        s[i] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(v[0][i], xlo),
                                                  _mm256_maddubs_epi16(v[1][i], xhi)),
                                 ones);
      }
    }
  }
};

// out[a][r] = dot(weight row r of the group at g, activation row m0 + a) for MR activation
// rows. Each output's arithmetic (exact integer block sums, then one FMA per block in block
// order) does not depend on MR, so a row computed alone equals the row in a batch.
template <X8 F, int MR>
struct GroupTile {
  TS_AVX2 static void run(const uint8_t* g, const TileArgs& t, int64_t m0, float* out) {
    constexpr int64_t kChunk = kChunkBytes<F>;
    const int64_t nb = t.K / 32;
    const x8::ActRows<MR> x(*t.acts, m0);
    __m256 acc[MR];
    for (int a = 0; a < MR; ++a) acc[a] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* c = g + b * kChunk;
      // The rows are one contiguous stream; asking 32 chunks (4.5-8.5 KiB) ahead keeps enough
      // misses in flight for DRAM latency. Measured on the q4_0x8 32000 x 2048 matvec, one thread
      // (medians of 5, three runs per distance): 8.5-9.0 GB/s at 4 chunks ahead, 9.2-10.4 at 32,
      // 8.0 with no prefetch.
      for (int64_t o = 0; o < kChunk; o += 64) prefetch_ahead(c + o, 32 * kChunk);
      const ChunkQuants<F> q(c);
      const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
      __m256 m8 = _mm256_setzero_ps();
      if constexpr (F == X8::q4_1)
        m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16)));
      for (int a = 0; a < MR; ++a) {
        __m256i s[4];
        q.pair_sums(x.q[a] + 32 * b, s);
        // s[i] holds rows (i, i + 4) as 4 + 4 partial sums; two rounds of hadd leave row r's
        // block sum in lane r.
        __m256i r = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        if constexpr (F == X8::q4_0) r = _mm256_sub_epi32(r, _mm256_set1_epi32(8 * x.sum32[a][b]));
        acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r),
                                 _mm256_mul_ps(d8, _mm256_broadcast_ss(x.d[a] + b)), acc[a]);
        if constexpr (F == X8::q4_1)
          acc[a] = _mm256_fmadd_ps(m8, _mm256_broadcast_ss(x.dsum[a] + b), acc[a]);
      }
    }
    for (int a = 0; a < MR; ++a) _mm256_storeu_ps(out + 8 * a, acc[a]);
  }
};

}  // namespace

// Up to 4 activation rows per pass over a group: their accumulators and a chunk's quants fill
// the 16 ymm registers.
x8::RowsFn<TileArgs> x8_rows_fn(DType t) {
  return x8::rows_for<GroupTile, 4, TileArgs>(t);
}

}  // namespace tessera::cpu::avx2
