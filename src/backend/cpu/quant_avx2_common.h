// Shared pieces of the AVX2 quantized-matmul kernels (quant_avx2_*.cc): the target attribute,
// small vector helpers and the tile loop that every weight format plugs into.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/quant_act.h"
#include "backend/cpu/quant_x8_common.h"

// Every function that uses AVX2 intrinsics carries this; the files are compiled without -mavx2
// and the functions run only after a CPU feature check.
#define TS_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tessera::cpu::avx2 {

// Sum of the 8 lanes in a fixed order (the same for every tile shape: results do not depend on
// how outputs are grouped into tiles).
TS_AVX2 inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// f16 bits at p (unaligned) to f32, exact (F16C).
TS_AVX2 inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

// 32 nibbles of 16 bytes as 32 u8 in element order: low nibbles (elements 0-15) then high
// nibbles (16-31), the q4_0/q4_1 layout.
// The 16 bytes go to both halves (one broadcast load); the upper half's 32-bit lanes shift
// right by 4, which brings each byte's high nibble down (the neighbour's bits the shift drags in
// are masked off).
TS_AVX2 inline __m256i unpack_nibbles16(const uint8_t* p) {
  const __m256i both =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f));
}

// The fifth bits of a q5_0 / q5_1 block (bit e of qh belongs to element e) as 0x10 in byte e:
// byte e takes byte e / 8 of qh (a shuffle within each 128-bit half, which both hold qh), keeps
// bit e % 8, and turns it into 16.
TS_AVX2 inline __m256i expand_high_bits(uint32_t qh) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// The f16 at p (unaligned) in all 8 lanes as f32, exact: a 16-bit broadcast load and one
// conversion, no trip through a scalar register.
TS_AVX2 inline __m256 broadcast_f16(const uint8_t* p) {
  int16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

// sum over 32 elements of u8 w * i8 x as 8 int32 lanes; pair sums must fit int16 (callers
// keep |w| * |x| * 2 <= 32767).
TS_AVX2 inline __m256i dot_u8_i8(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

// Asks for the cache line `ahead` bytes past p (the bytes a weight stream reads next). The
// address is formed as an integer: it may lie past the weights' end, where a prefetch is
// harmless (it never faults) but pointer arithmetic would not be.
TS_AVX2 inline void prefetch_ahead(const void* p, int64_t ahead) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + ahead), _MM_HINT_T0);
}
// The same into L2 only (_MM_HINT_T1): a distant prefetch then holds an L2 miss slot instead of
// one of L1's fewer fill buffers, which the kernel's own loads need.
TS_AVX2 inline void prefetch_ahead_l2(const void* p, int64_t ahead) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + ahead), _MM_HINT_T1);
}

TS_AVX2 inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// What a tile kernel sees: MR activation rows starting at m0 and NR weight rows.
struct TileArgs {
  const uint8_t* w;    // first weight row of the tile
  int64_t row_bytes;   // weight row stride
  const ActsQ8* acts;  // quantized activations (block types)
  const float* x;      // f32 activations (float types), row stride K
  int64_t K;
  int64_t m0;
};

// One group of MR activation rows (starting at args.m0) against weight rows [n0, n1): tiles of
// Tile<MR, 1>::kNR weight rows, the tail one row at a time.
template <template <int, int> class Tile, int MR>
TS_AVX2 void run_row_group(float* y, int64_t ldy, const float* bias, int64_t n0, int64_t n1,
                           TileArgs args) {
  constexpr int NR = Tile<MR, 1>::kNR;
  const uint8_t* w = args.w;
  float out[MR * NR];
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    args.w = w + n * args.row_bytes;
    Tile<MR, NR>::run(args, out);
    for (int a = 0; a < MR; ++a)
      for (int j = 0; j < NR; ++j) {
        const float v = out[a * NR + j];
        y[(args.m0 + a) * ldy + n + j] = bias ? v + bias[n + j] : v;
      }
  }
  for (; n < n1; ++n) {
    args.w = w + n * args.row_bytes;
    Tile<MR, 1>::run(args, out);
    for (int a = 0; a < MR; ++a) y[(args.m0 + a) * ldy + n] = bias ? out[a] + bias[n] : out[a];
  }
}

// Activation rows [m0, m1) in groups of 4 (a tail of 1-3): fn(m, std::integral_constant<int,
// MR>) for each group starting at m, MR = its size.
template <class Fn>
TS_AVX2 inline void for_row_groups(int64_t m0, int64_t m1, Fn&& fn) {
  for (int64_t m = m0; m < m1; m += 4) {
    switch (m1 - m) {
      case 1:
        fn(m, std::integral_constant<int, 1>{});
        break;
      case 2:
        fn(m, std::integral_constant<int, 2>{});
        break;
      case 3:
        fn(m, std::integral_constant<int, 3>{});
        break;
      default:
        fn(m, std::integral_constant<int, 4>{});
        break;
    }
  }
}

// Activation rows [0, M) in groups of 4 (a tail of 1-3) against weight rows [n0, n1) of args.w.
// Each output's arithmetic is the same in every tile shape, so results depend neither on M nor
// on how N is chunked.
template <template <int, int> class Tile>
TS_AVX2 void run_tiles(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       TileArgs args) {
  for_row_groups(0, M, [&](int64_t m, auto mr) {
    args.m0 = m;
    run_row_group<Tile, decltype(mr)::value>(y, ldy, bias, n0, n1, args);
  });
}

// Per-format entries (weight rows [n0, n1) of w, all M activation rows).
TS_AVX2 void rows_q8_0(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);
TS_AVX2 void rows_q4_0(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);
TS_AVX2 void rows_q4_1(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);
TS_AVX2 void rows_q5_0(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);
TS_AVX2 void rows_q5_1(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);
// Row-interleaved q4_0x8 / q4_1x8 / q8_0x8 (quant_avx2_x8.cc): the entry of type t (n0 and n1
// multiples of 8), nullptr for other types.
x8::RowsFn<TileArgs> x8_rows_fn(DType t);
TS_AVX2 void rows_q4_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);
TS_AVX2 void rows_q5_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);
TS_AVX2 void rows_q6_k(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);
TS_AVX2 void rows_f32(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                      const TileArgs& args);
TS_AVX2 void rows_f16(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                      const TileArgs& args);
// f16x16 groups (quant_avx2_float.cc): n0 and n1 multiples of 16.
TS_AVX2 void rows_f16x16(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0,
                         int64_t n1, const TileArgs& args);
TS_AVX2 void rows_bf16(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                       const TileArgs& args);

}  // namespace tessera::cpu::avx2
