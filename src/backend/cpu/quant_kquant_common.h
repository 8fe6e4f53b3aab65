// Pieces shared by the AVX2 and AVX-512 k-quant tiles (quant_avx2_kquant.cc,
// quant_avx512_kquant.cc): a tile's row pointers, the next tile's prefetch, Q4_K/Q5_K scale
// unpacking.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cpu/quant_avx2_common.h"

namespace tessera::cpu::avx2 {

// Row pointers of one k-quant tile: MR activation rows (quants, scales, 16- and 32-element sums)
// and NR weight rows.
template <int MR, int NR>
struct KTileRows {
  const int8_t* xq[MR];
  const float* dx[MR];
  const int16_t* sum16[MR];
  const int16_t* sum32[MR];
  const uint8_t* w[NR];
  int64_t ahead;  // bytes from a weight row to the same row of the next tile
  TS_AVX2 explicit KTileRows(const TileArgs& t) : ahead(NR * t.row_bytes) {
    for (int a = 0; a < MR; ++a) {
      const int64_t m = t.m0 + a;
      xq[a] = t.acts->row_q(m), dx[a] = t.acts->row_d(m);
      sum16[a] = t.acts->row_sum16(m), sum32[a] = t.acts->row_sum32(m);
    }
    for (int j = 0; j < NR; ++j) w[j] = t.w + j * t.row_bytes;
  }
};

// Asks for the cache lines of the super-block at `blk` in the next tile's rows (`ahead` bytes on).
// A tile reads NR rows of a few KiB as interleaved streams that end at the tile, too short for
// the hardware prefetcher to ramp up (as in quant_avx2_q32.cc). Decode of a 1.1B Q4_K_M file, one
// thread on a Xeon, alternated: 14.0-15.3 tokens/s with it, 7.1-7.9 without (35% of the
// bandwidth); asking two or four tiles ahead measured the same as one.
template <class Block>
TS_AVX2 inline void prefetch_block(const Block* blk, int64_t ahead) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(blk);
  for (size_t o = 0; o < sizeof(Block); o += 64) prefetch_ahead(p + o, ahead);
  prefetch_ahead(p + sizeof(Block) - 1, ahead);
}

// The 8 six-bit scales and mins of a Q4_K block (layout in core/dtype.h, q4_k_scale_min) as
// 8 int16 lanes each, from three 32-bit words.
TS_AVX2 inline void q4_k_scales(const uint8_t* s, __m128i* sc, __m128i* mn) {
  uint32_t u0, u1, u2;
  std::memcpy(&u0, s, 4);
  std::memcpy(&u1, s + 4, 4);
  std::memcpy(&u2, s + 8, 4);
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, mn_lo = u1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
  *sc = _mm_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), 0, 0));
  *mn = _mm_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(mn_lo), static_cast<int>(mn_hi), 0, 0));
}

}  // namespace tessera::cpu::avx2
