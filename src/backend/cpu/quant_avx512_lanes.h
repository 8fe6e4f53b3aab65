// What the AVX512-VNNI kernels of the 8-row interleaved layouts share (quant_avx512_x8.cc,
// quant_avx512_kquant_x8.cc): the target attribute, how a group's rows map onto 128-bit lanes,
// the activation broadcast, and the final sum of each row's lanes.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/interleave.h"

#define TS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace tessera::cpu::avx512::lanes {

// Within a chunk the rows' 16-byte slots run 0, 4, 1, 5, 2, 6, 3, 7 (kInterleaveSlotRow), so
// the first 64 bytes hold rows 0, 4, 1, 5 and the next 64 rows 2, 6, 3, 7. Lane l of a product
// of one such half belongs to the row of slot 4 * half + l / 4; these spread the 8 row scales
// (row order) that way.
TS_AVX512 inline __m512i lane_rows(int half) {
  return half == 0 ? _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5)
                   : _mm512_setr_epi32(2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7);
}

// The 16 bytes at p in all four 128-bit lanes.
TS_AVX512 inline __m512i broadcast16(const int8_t* p) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// out[r] (row order) for the 8 rows of a group from the per-lane sums of its two halves: a row's
// 4 lanes added in a fixed order, the same whatever the tile shape.
TS_AVX512 inline void sum_rows(__m512 half0, __m512 half1, float* out) {
  alignas(64) float lanes[32];
  _mm512_store_ps(lanes, half0);
  _mm512_store_ps(lanes + 16, half1);
  for (int slot = 0; slot < 8; ++slot) {
    const float* l = lanes + 4 * slot;
    out[kInterleaveSlotRow[slot]] = (l[0] + l[1]) + (l[2] + l[3]);
  }
}

}  // namespace tessera::cpu::avx512::lanes
