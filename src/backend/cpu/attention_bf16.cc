// AVX512-BF16 packing and products for the CPU attention kernel (see attention_bf16.h).
// Intrinsics under a target attribute: Highway 1.0.3 has no bf16 dot product. The packers run
// once per tile of 64 x 64 scores (P, dS) or once per task (Q, K, V, dO), so they convert 16 or
// 32 floats per instruction (vcvtne2ps2bf16: round to nearest even) rather than one at a time:
// a scalar conversion of a score tile costs more than its products.
#include "backend/cpu/attention_bf16.h"

#include "backend/cpu/gemm.h"
#include "core/error.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // see gemm_bf16.cc
#include <immintrin.h>
#define TS_ATT_BF16_KERNEL 1
#define TS_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#else
#define TS_ATT_BF16_KERNEL 0
#endif

namespace tessera::cpu::attention_bf16 {

bool supported() {
  return TS_ATT_BF16_KERNEL && gemm_bf16_supported();
}

#if TS_ATT_BF16_KERNEL
namespace {

// The first n lanes (none for n <= 0, all for n >= 16).
TS_BF16 inline __mmask16 mask16(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// 16 words from x[0 .. 32) (n valid, zeros beyond), times mul: word i = (x[2i], x[2i+1]).
TS_BF16 inline __m512i pairs32(const float* x, int64_t n, __m512 mul) {
  const __m512 lo = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask16(n), x), mul);
  const __m512 hi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask16(n - 16), x + 16), mul);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// 16 words from two rows at 16 columns (n valid, zeros beyond; r1 may be null: zeros), times
// mul: word i = (r0[i], r1[i]).
TS_BF16 inline __m512i rows16(const float* r0, const float* r1, int64_t n, __m512 mul) {
  const __m256i a =
      (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask16(n), r0), mul));
  const __m512i lo = _mm512_cvtepu16_epi32(a);
  if (r1 == nullptr) return lo;
  const __m256i b =
      (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask16(n), r1), mul));
  return _mm512_or_si512(lo, _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

}  // namespace

TS_BF16 void pack_rows_along_d(uint32_t* dst, size_t Dh, const float* src, size_t ld, size_t n,
                               size_t D, float mul) {
  const __m512 m = _mm512_set1_ps(mul);
  const auto D64 = static_cast<int64_t>(D);
  for (size_t r = 0; r < n; ++r)
    for (size_t p = 0; p < Dh; p += 16) {
      const int64_t d = static_cast<int64_t>(2 * p);
      const __m512i w = pairs32(src + r * ld + d, D64 - d, m);
      _mm512_mask_storeu_epi32(dst + r * Dh + p, mask16(static_cast<int64_t>(Dh - p)), w);
    }
}

TS_BF16 void pack_tiles_along_d(uint32_t* dst, size_t Dh, size_t kc, const float* src, size_t ld,
                                size_t n, size_t D) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const auto D64 = static_cast<int64_t>(D);
  // Word p of key c goes to (p, c) of its tile: 16 words of a key at stride kc (a scatter).
  const __m512i stride =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int>(kc)));
  const size_t tiles = (n + kc - 1) / kc;
  for (size_t j = 0; j < tiles * kc; ++j) {
    uint32_t* col = dst + (j / kc) * Dh * kc + j % kc;
    for (size_t p = 0; p < Dh; p += 16) {
      const __mmask16 keep = mask16(static_cast<int64_t>(Dh - p));
      const int64_t d = static_cast<int64_t>(2 * p);
      const __m512i w = j < n ? pairs32(src + j * ld + d, D64 - d, one) : _mm512_setzero_si512();
      _mm512_mask_i32scatter_epi32(col + p * kc, keep, stride, w, 4);
    }
  }
}

TS_BF16 void pack_row_pairs(uint32_t* dst, size_t Dp, const float* src, size_t ld, size_t n,
                            size_t D, float mul) {
  const __m512 m = _mm512_set1_ps(mul);
  const auto D64 = static_cast<int64_t>(D);
  for (size_t q = 0; 2 * q < n; ++q) {
    const float* r0 = src + 2 * q * ld;
    const float* r1 = 2 * q + 1 < n ? r0 + ld : nullptr;
    for (size_t c = 0; c < Dp; c += 16) {
      const int64_t valid = D64 - static_cast<int64_t>(c);
      const __m512i w = rows16(r0 + c, r1 ? r1 + c : nullptr, valid, m);
      _mm512_storeu_si512(dst + q * Dp + c, w);
    }
  }
}

TS_BF16 void pairs_along_columns(uint32_t* dst, size_t ldd, const float* src, size_t ld,
                                 size_t rows, size_t cols) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const auto cols64 = static_cast<int64_t>(cols);
  for (size_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols64; c += 32) {
      const __m512i w = pairs32(src + r * ld + c, cols64 - c, one);
      _mm512_mask_storeu_epi32(dst + r * ldd + c / 2, mask16((cols64 - c) / 2), w);
    }
}

namespace {

// kR rows x kV vectors of 16 columns: up to 6 x 4 = 24 accumulators, kV loads and one broadcast
// of 32 zmm registers. Per word of depth, kR broadcasts and kV loads feed kR * kV vdpbf16ps.
template <int kR, int kV>
TS_BF16 void dot_block(float* c, size_t ldc, const uint32_t* a, size_t a_rs, size_t a_ps,
                       const uint32_t* b, size_t ldb, size_t P, bool accumulate) {
  __m512 acc[kR][kV];
  for (int r = 0; r < kR; ++r)
    for (int v = 0; v < kV; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (size_t p = 0; p < P; ++p) {
    __m512bh bv[kV];
    for (int v = 0; v < kV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * ldb + 16 * v);
    for (int r = 0; r < kR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * a_rs + p * a_ps]));
      for (int v = 0; v < kV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int v = 0; v < kV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

template <int kR>
TS_BF16 void dot_rows(float* c, size_t ldc, const uint32_t* a, size_t a_rs, size_t a_ps,
                      const uint32_t* b, size_t ldb, size_t P, size_t ncols, bool accumulate) {
  size_t col = 0;
  for (; col + 64 <= ncols; col += 64)
    dot_block<kR, 4>(c + col, ldc, a, a_rs, a_ps, b + col, ldb, P, accumulate);
  switch ((ncols - col) / 16) {
    case 3:
      dot_block<kR, 3>(c + col, ldc, a, a_rs, a_ps, b + col, ldb, P, accumulate);
      break;
    case 2:
      dot_block<kR, 2>(c + col, ldc, a, a_rs, a_ps, b + col, ldb, P, accumulate);
      break;
    case 1:
      dot_block<kR, 1>(c + col, ldc, a, a_rs, a_ps, b + col, ldb, P, accumulate);
      break;
    default:
      break;
  }
}

}  // namespace

TS_BF16 void dot(float* c, size_t ldc, const uint32_t* a, size_t a_rs, size_t a_ps, size_t rows,
                 const uint32_t* b, size_t ldb, size_t P, size_t ncols, bool accumulate) {
  size_t r = 0;
  for (; r + 6 <= rows; r += 6)
    dot_rows<6>(c + r * ldc, ldc, a + r * a_rs, a_rs, a_ps, b, ldb, P, ncols, accumulate);
  c += r * ldc;
  a += r * a_rs;
  switch (rows - r) {
    case 5:
      return dot_rows<5>(c, ldc, a, a_rs, a_ps, b, ldb, P, ncols, accumulate);
    case 4:
      return dot_rows<4>(c, ldc, a, a_rs, a_ps, b, ldb, P, ncols, accumulate);
    case 3:
      return dot_rows<3>(c, ldc, a, a_rs, a_ps, b, ldb, P, ncols, accumulate);
    case 2:
      return dot_rows<2>(c, ldc, a, a_rs, a_ps, b, ldb, P, ncols, accumulate);
    case 1:
      return dot_rows<1>(c, ldc, a, a_rs, a_ps, b, ldb, P, ncols, accumulate);
    default:
      return;
  }
}

#else  // !TS_ATT_BF16_KERNEL: supported() is false, so nothing calls these.

void pack_rows_along_d(uint32_t*, size_t, const float*, size_t, size_t, size_t, float) {
  fail("[attention] the bf16 products are built for x86-64 only");
}
void pack_tiles_along_d(uint32_t*, size_t, size_t, const float*, size_t, size_t, size_t) {
  fail("[attention] the bf16 products are built for x86-64 only");
}
void pack_row_pairs(uint32_t*, size_t, const float*, size_t, size_t, size_t, float) {
  fail("[attention] the bf16 products are built for x86-64 only");
}
void pairs_along_columns(uint32_t*, size_t, const float*, size_t, size_t, size_t) {
  fail("[attention] the bf16 products are built for x86-64 only");
}
void dot(float*, size_t, const uint32_t*, size_t, size_t, size_t, const uint32_t*, size_t, size_t,
         size_t, bool) {
  fail("[attention] the bf16 products are built for x86-64 only");
}

#endif

}  // namespace tessera::cpu::attention_bf16
