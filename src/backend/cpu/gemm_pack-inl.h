// Packing of op(A) and op(B) blocks into the micro-panel layout of the packed GEMM; compiled
// once per SIMD target (included from gemm.cc after hwy/foreach_target.h).
#if defined(TESSERA_BACKEND_CPU_GEMM_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_BACKEND_CPU_GEMM_PACK_INL_H_
#undef TESSERA_BACKEND_CPU_GEMM_PACK_INL_H_
#else
#define TESSERA_BACKEND_CPU_GEMM_PACK_INL_H_
#endif

#include <cstdint>

#include "backend/cpu/gemm.h"
#include "core/dtype.h"
#include "core/interleave.h"
#include "hwy/highway.h"
#include "ops/ops.h"
#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How a source element becomes the f32 the micro-kernel multiplies.
enum class Src { f32, f32_round_bf16, bf16 };

// One GEMM input as stored: op(x)(r, c) = x[r*ld + c] (trans=false) or x[c*ld + r] (trans=true).
// Weights in a stored type (B of cpu::gemm_wt only): op(B)(p, j) = element p of row j of W,
// rows of row_bytes bytes of type `stored` (src and ld unused).
struct Operand {
  const void* p = nullptr;
  Src src = Src::f32;
  int64_t ld = 0;
  bool trans = false;
  bool stored_weights = false;
  DType stored = DType::f32;
  int64_t row_bytes = 0;
  int64_t k = 0;  // columns of W (the interleaved layouts locate a row's blocks by it)
};

inline Src operand_src(DType t, bool round_bf16) {
  if (t == DType::bf16) return Src::bf16;
  return round_bf16 ? Src::f32_round_bf16 : Src::f32;
}

template <Src kSrc>
HWY_INLINE float load_elem(const void* base, int64_t i) {
  if constexpr (kSrc == Src::bf16) {
    return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
  } else if constexpr (kSrc == Src::f32_round_bf16) {
    return bf16_to_f32(f32_to_bf16(static_cast<const float*>(base)[i]));
  } else {
    return static_cast<const float*>(base)[i];
  }
}

// Converts n contiguous source elements starting at element i into dst (f32). A plain loop
// (not memcpy) so that the compiler vectorizes it inline for the short rows of a micro-panel.
template <Src kSrc>
HWY_INLINE void load_row(const void* base, int64_t i, int64_t n, float* HWY_RESTRICT dst) {
  for (int64_t t = 0; t < n; ++t) dst[t] = load_elem<kSrc>(base, i + t);
}

// Packs op(A) rows [i0, i0+mc) x depth [p0, p0+kc) into ceil(mc/kMR) micro-panels; panel q holds
// dst[q*kMR*kc + p*kMR + r] = op(A)(i0 + q*kMR + r, p0 + p), rows past mc are zero.
template <int kMR, Src kSrc>
void pack_a_impl(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                 float* HWY_RESTRICT dst) {
  for (int64_t ir = 0; ir < mc; ir += kMR, dst += kMR * kc) {
    const int64_t rows = mc - ir < kMR ? mc - ir : kMR;
    const int64_t row0 = i0 + ir;
    if (a.trans) {
      // op(A)(i, p) = a[p*ld + i]: kMR consecutive rows are contiguous in memory.
      for (int64_t p = 0; p < kc; ++p) {
        const int64_t base = (p0 + p) * a.ld + row0;
        float* d = dst + p * kMR;
        for (int64_t r = 0; r < rows; ++r) d[r] = load_elem<kSrc>(a.p, base + r);
        for (int64_t r = rows; r < kMR; ++r) d[r] = 0.0f;
      }
    } else if (rows == kMR) {
      // op(A)(i, p) = a[i*ld + p]: interleave kMR row streams.
      int64_t base[kMR];
      for (int r = 0; r < kMR; ++r) base[r] = (row0 + r) * a.ld + p0;
      for (int64_t p = 0; p < kc; ++p) {
        float* d = dst + p * kMR;
        for (int r = 0; r < kMR; ++r) d[r] = load_elem<kSrc>(a.p, base[r] + p);
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        float* d = dst + p * kMR;
        for (int64_t r = 0; r < rows; ++r) d[r] = load_elem<kSrc>(a.p, (row0 + r) * a.ld + p0 + p);
        for (int64_t r = rows; r < kMR; ++r) d[r] = 0.0f;
      }
    }
  }
}

// The register transpose below uses AVX2 instructions, which every x86 target from AVX2 up has
// (the AVX-512 targets included, whose panels are 32 columns: four 8-column slices).
#define TS_GEMM_AVX2_TRANSPOSE (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)
#if TS_GEMM_AVX2_TRANSPOSE
// Element types the AVX2 panel transpose reads: f32 and bf16 operands, and f16 weights
// (cpu::gemm_wt's B), all widened to f32 exactly.
enum class PanelSrc { f32, bf16, f16 };

template <PanelSrc kP>
HWY_INLINE float panel_elem(const void* base, int64_t i) {
  constexpr Src kSrc = kP == PanelSrc::bf16 ? Src::bf16 : Src::f32;
  if constexpr (kP == PanelSrc::f16)
    return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
  else
    return load_elem<kSrc>(base, i);
}

// Eight consecutive source elements from element i as f32 (bf16 widens exactly: bits << 16;
// f16 through the F16C conversion, also exact).
template <PanelSrc kP>
HWY_INLINE __m256 load8_avx2(const void* base, int64_t i) {
  if constexpr (kP == PanelSrc::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (kP == PanelSrc::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// One full kW-column B micro-panel (kW = 16 on AVX2, 32 on AVX-512) from B^T whose element
// (c, p) is base[i0 + c*ld + p]: dst[p*kW + c] = that element as f32, for p < kc, c < kW. Eight
// depths of 8 columns are
// loaded as 8 row vectors and transposed in registers (unpack pairs, shuffle quads, swap
// 128-bit halves), so every store is a whole 32-byte slice of a panel row instead of 8 scalar
// stores kW * 4 bytes apart; the kW source rows are each read sequentially (all kW lines stay
// in L1). The depths past the last multiple of 8 are copied one element at a time. On AVX-512
// this replaced the scalar transpose: a 256-row x.W^T product ran 1.8x slower than dy.W before.
template <int kW, PanelSrc kP>
void pack_bt_panel_avx2(const void* base, int64_t i0, int64_t ld, int64_t kc,
                        float* HWY_RESTRICT dst) {
  static_assert(kW % 8 == 0);
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    for (int h = 0; h < kW / 8; ++h) {
      const int64_t s = i0 + h * 8 * ld + p;
      const __m256 v0 = load8_avx2<kP>(base, s), v1 = load8_avx2<kP>(base, s + ld);
      const __m256 v2 = load8_avx2<kP>(base, s + 2 * ld);
      const __m256 v3 = load8_avx2<kP>(base, s + 3 * ld);
      const __m256 v4 = load8_avx2<kP>(base, s + 4 * ld);
      const __m256 v5 = load8_avx2<kP>(base, s + 5 * ld);
      const __m256 v6 = load8_avx2<kP>(base, s + 6 * ld);
      const __m256 v7 = load8_avx2<kP>(base, s + 7 * ld);
      // t0 = (v0[0] v1[0] v0[1] v1[1] | v0[4] v1[4] v0[5] v1[5]), t1 the same for [2,3 | 6,7].
      const __m256 t0 = _mm256_unpacklo_ps(v0, v1), t1 = _mm256_unpackhi_ps(v0, v1);
      const __m256 t2 = _mm256_unpacklo_ps(v2, v3), t3 = _mm256_unpackhi_ps(v2, v3);
      const __m256 t4 = _mm256_unpacklo_ps(v4, v5), t5 = _mm256_unpackhi_ps(v4, v5);
      const __m256 t6 = _mm256_unpacklo_ps(v6, v7), t7 = _mm256_unpackhi_ps(v6, v7);
      // s0 = (v0[0] v1[0] v2[0] v3[0] | v0[4] v1[4] v2[4] v3[4]); s1 depths 1|5, s2 2|6, s3 3|7.
      const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* d = dst + p * kW + h * 8;  // 32-byte aligned: panels are 64-byte aligned
      _mm256_store_ps(d + 0 * kW, _mm256_permute2f128_ps(s0, s4, 0x20));
      _mm256_store_ps(d + 1 * kW, _mm256_permute2f128_ps(s1, s5, 0x20));
      _mm256_store_ps(d + 2 * kW, _mm256_permute2f128_ps(s2, s6, 0x20));
      _mm256_store_ps(d + 3 * kW, _mm256_permute2f128_ps(s3, s7, 0x20));
      _mm256_store_ps(d + 4 * kW, _mm256_permute2f128_ps(s0, s4, 0x31));
      _mm256_store_ps(d + 5 * kW, _mm256_permute2f128_ps(s1, s5, 0x31));
      _mm256_store_ps(d + 6 * kW, _mm256_permute2f128_ps(s2, s6, 0x31));
      _mm256_store_ps(d + 7 * kW, _mm256_permute2f128_ps(s3, s7, 0x31));
    }
  }
  for (; p < kc; ++p)
    for (int64_t c = 0; c < kW; ++c) dst[p * kW + c] = panel_elem<kP>(base, i0 + c * ld + p);
}
#endif  // TS_GEMM_AVX2_TRANSPOSE

// Packs op(B) depth [p0, p0+kc) x columns [j0, j0+nc) into ceil(nc/kNR) micro-panels; panel q
// holds dst[q*kNR*kc + p*kNR + c] = op(B)(p0 + p, j0 + q*kNR + c), columns past nc are zero.
template <int kNR, Src kSrc>
void pack_b_impl(const Operand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                 float* HWY_RESTRICT dst) {
  // Staging for the transposed case: kTile depths of one column at a time, converted to f32.
  constexpr int64_t kTile = 64;
  for (int64_t jr = 0; jr < nc; jr += kNR, dst += kNR * kc) {
    const int64_t cols = nc - jr < kNR ? nc - jr : kNR;
    const int64_t col0 = j0 + jr;
    if (!b.trans) {
      // op(B)(p, j) = b[p*ld + j]: each depth is a contiguous run of columns.
      if (cols == kNR && kSrc == Src::f32) {
        // Explicit vector copy: GCC turns the plain loop into a memmove call per 64 bytes.
        const hn::ScalableTag<float> d;
        const int64_t L = static_cast<int64_t>(hn::Lanes(d));
        for (int64_t p = 0; p < kc; ++p) {
          const float* src = static_cast<const float*>(b.p) + (p0 + p) * b.ld + col0;
          for (int64_t c = 0; c < kNR; c += L)
            hn::Store(hn::LoadU(d, src + c), d, dst + p * kNR + c);
        }
      } else if (cols == kNR) {
        for (int64_t p = 0; p < kc; ++p)
          load_row<kSrc>(b.p, (p0 + p) * b.ld + col0, kNR, dst + p * kNR);
      } else {
        for (int64_t p = 0; p < kc; ++p) {
          float* d = dst + p * kNR;
          load_row<kSrc>(b.p, (p0 + p) * b.ld + col0, cols, d);
          for (int64_t c = cols; c < kNR; ++c) d[c] = 0.0f;
        }
      }
    } else {
#if TS_GEMM_AVX2_TRANSPOSE
      // f32 and bf16 sources (not f32_round_bf16, whose rounding stays scalar).
      if constexpr (kSrc == Src::f32 || kSrc == Src::bf16) {
        if (cols == kNR) {
          constexpr PanelSrc kP = kSrc == Src::bf16 ? PanelSrc::bf16 : PanelSrc::f32;
          pack_bt_panel_avx2<kNR, kP>(b.p, col0 * b.ld + p0, b.ld, kc, dst);
          continue;
        }
      }
#endif
      // op(B)(p, j) = b[j*ld + p]: a transpose. Walk kTile depths of all kNR columns so the
      // kNR source rows are read sequentially and the destination tile stays in L1.
      for (int64_t pt = 0; pt < kc; pt += kTile) {
        const int64_t np = kc - pt < kTile ? kc - pt : kTile;
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t base = (col0 + c) * b.ld + p0 + pt;
          float* d = dst + pt * kNR + c;
          for (int64_t p = 0; p < np; ++p) d[p * kNR] = load_elem<kSrc>(b.p, base + p);
        }
        for (int64_t c = cols; c < kNR; ++c)
          for (int64_t p = 0; p < np; ++p) dst[(pt + p) * kNR + c] = 0.0f;
      }
    }
  }
}

// pack_b_impl's layout from f16x16 weights (core/interleave.h), whose 16-row groups already hold
// each depth's 16 columns side by side: every depth of a panel is one or more contiguous runs of
// f16, widened in place of the transpose. (On AVX2, where a panel is one group, the micro-kernel
// reads the group itself and nothing is packed; this serves the other targets' panel widths.)
template <int kNR>
void pack_b_f16_panels(const Operand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                       float* HWY_RESTRICT dst) {
  const auto* w = static_cast<const uint16_t*>(b.p);
  for (int64_t jr = 0; jr < nc; jr += kNR, dst += kNR * kc) {
    const int64_t cols = nc - jr < kNR ? nc - jr : kNR;
    for (int64_t p = 0; p < kc; ++p) {
      float* d = dst + p * kNR;
      int64_t c = 0;
      while (c < cols) {
        const int64_t col = j0 + jr + c, r = col % kF16PanelRows;
        const int64_t run = kF16PanelRows - r < cols - c ? kF16PanelRows - r : cols - c;
        const uint16_t* src = w + (col - r) * b.k + (p0 + p) * kF16PanelRows + r;
        dequant_detail::widen_half<hwy::float16_t>(src, run, d + c);
        c += run;
      }
      for (; c < kNR; ++c) d[c] = 0.0f;
    }
  }
}

// pack_b_impl's layout for stored-type weights: each micro-panel's kNR rows of W are widened to
// f32 over depths [p0, p0 + kc) into a per-thread staging tile (kNR x kc, 16 KiB on AVX2), then
// transposed into the panel. Widening costs a few instructions per weight, paid once per depth
// block and shared by every row of A, which the micro-kernel multiplies with M/kNR-lane FMAs.
template <int kNR>
void pack_b_stored(const Operand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                   float* HWY_RESTRICT dst) {
  if (b.stored == DType::f16x16) return pack_b_f16_panels<kNR>(b, p0, kc, j0, nc, dst);
  float* stage = gemm_detail::pack_buffer(2, static_cast<size_t>(kNR * kc));
  const auto* w = static_cast<const uint8_t*>(b.p);
  for (int64_t jr = 0; jr < nc; jr += kNR, dst += kNR * kc) {
    const int64_t cols = nc - jr < kNR ? nc - jr : kNR;
#if TS_GEMM_AVX2_TRANSPOSE
    // Float weights need no decoding: a full panel's kNR rows transpose straight from the
    // weights (f16 and bf16 widen exactly on the way), without the staging copy. With the copy,
    // staging and transpose were 6.8% of an f16 product's time at 512 rows of A; without it the
    // product ran 5% faster (MatmulWt/prefill, one thread).
    {
      const DType t = b.stored;
      if (cols == kNR && (t == DType::f32 || t == DType::f16 || t == DType::bf16)) {
        const int64_t i0 = (j0 + jr) * b.k + p0;
        if (t == DType::f16)
          pack_bt_panel_avx2<kNR, PanelSrc::f16>(w, i0, b.k, kc, dst);
        else if (t == DType::bf16)
          pack_bt_panel_avx2<kNR, PanelSrc::bf16>(w, i0, b.k, kc, dst);
        else
          pack_bt_panel_avx2<kNR, PanelSrc::f32>(w, i0, b.k, kc, dst);
        continue;
      }
    }
#endif
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t row = j0 + jr + c;
      if (is_interleaved(b.stored))
        dequant_interleaved_segment(b.stored, w, b.k, row, p0, kc, stage + c * kc);
      else
        dequant_segment(b.stored, w + row * b.row_bytes, p0, kc, stage + c * kc);
    }
    for (int64_t c = cols; c < kNR; ++c)
      for (int64_t p = 0; p < kc; ++p) stage[c * kc + p] = 0.0f;
#if TS_GEMM_AVX2_TRANSPOSE
    pack_bt_panel_avx2<kNR, PanelSrc::f32>(stage, 0, kc, kc, dst);
#else
    for (int64_t c = 0; c < kNR; ++c)
      for (int64_t p = 0; p < kc; ++p) dst[p * kNR + c] = stage[c * kc + p];
#endif
  }
}

template <int kMR>
void pack_a(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* dst) {
  switch (a.src) {
    case Src::f32:
      return pack_a_impl<kMR, Src::f32>(a, i0, mc, p0, kc, dst);
    case Src::f32_round_bf16:
      return pack_a_impl<kMR, Src::f32_round_bf16>(a, i0, mc, p0, kc, dst);
    case Src::bf16:
      return pack_a_impl<kMR, Src::bf16>(a, i0, mc, p0, kc, dst);
  }
}

template <int kNR>
void pack_b(const Operand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* dst) {
  if (b.stored_weights) return pack_b_stored<kNR>(b, p0, kc, j0, nc, dst);
  switch (b.src) {
    case Src::f32:
      return pack_b_impl<kNR, Src::f32>(b, p0, kc, j0, nc, dst);
    case Src::f32_round_bf16:
      return pack_b_impl<kNR, Src::f32_round_bf16>(b, p0, kc, j0, nc, dst);
    case Src::bf16:
      return pack_b_impl<kNR, Src::bf16>(b, p0, kc, j0, nc, dst);
  }
}

}  // namespace tessera::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
