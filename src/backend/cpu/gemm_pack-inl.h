// Packing of op(A) and op(B) blocks into the micro-panel layout of the packed GEMM; compiled
// once per SIMD target (included from gemm.cc after hwy/foreach_target.h).
#if defined(TESSERA_BACKEND_CPU_GEMM_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_BACKEND_CPU_GEMM_PACK_INL_H_
#undef TESSERA_BACKEND_CPU_GEMM_PACK_INL_H_
#else
#define TESSERA_BACKEND_CPU_GEMM_PACK_INL_H_
#endif

#include <cstdint>

#include "core/dtype.h"
#include "hwy/highway.h"
#include "ops/ops.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How a source element becomes the f32 the micro-kernel multiplies.
enum class Src { f32, f32_round_bf16, bf16 };

// One GEMM input as stored: op(x)(r, c) = x[r*ld + c] (trans=false) or x[c*ld + r] (trans=true).
struct Operand {
  const void* p = nullptr;
  Src src = Src::f32;
  int64_t ld = 0;
  bool trans = false;
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
