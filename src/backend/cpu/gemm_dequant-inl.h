// Widening of one weight-row segment (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K,
// q6_K) to f32 for
// the packed GEMM against stored-type weights (cpu::gemm_wt); compiled once per SIMD target
// (included from gemm.cc after hwy/foreach_target.h).
#if defined(TESSERA_BACKEND_CPU_GEMM_DEQUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_BACKEND_CPU_GEMM_DEQUANT_INL_H_
#undef TESSERA_BACKEND_CPU_GEMM_DEQUANT_INL_H_
#else
#define TESSERA_BACKEND_CPU_GEMM_DEQUANT_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/interleave.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Every value equals core's to_f32 of the same element, bit for bit (the products are exact in
// f32: a scale times a small integer; q4_1 adds its min after one rounded product, as to_f32).
namespace dequant_detail {

using DF = hn::ScalableTag<float>;

// f16 / bf16: n elements from element 0 of src.
template <typename Half>
HWY_INLINE void widen_half(const uint16_t* src, int64_t n, float* HWY_RESTRICT dst) {
  const DF df;
  const hn::Rebind<Half, DF> dh;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const Half* s = reinterpret_cast<const Half*>(src);
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s + i)), df, dst + i);
  for (; i < n; ++i)
    dst[i] = std::is_same_v<Half, hwy::float16_t> ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
}

// Whole 32-element blocks of q8_0 / q4_0 / q4_1. The vector paths need 16 % lanes == 0 (every
// x86 target: 4, 8 or 16 f32 lanes); other widths take the scalar path.
HWY_INLINE void widen_q8_0(const BlockQ8_0* b, int64_t n_blocks, float* HWY_RESTRICT dst) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i = 0; i < n_blocks; ++i, dst += kQK8_0) {
    const float d = f16_to_f32(b[i].d);
    if (kQK8_0 % L != 0) {
      for (int j = 0; j < kQK8_0; ++j) dst[j] = d * b[i].qs[j];
      continue;
    }
    const auto vd = hn::Set(df, d);
    for (int64_t j = 0; j < kQK8_0; j += L) {
      const auto q = hn::PromoteTo(di, hn::LoadU(d8, b[i].qs + j));
      hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, q)), df, dst + j);
    }
  }
}

// q4_0 (kMin = false: d * (q - 8)) and q4_1 (kMin = true: d * q + m). Element j of a block is
// the low nibble of qs[j], element j + 16 the high nibble.
template <bool kMin, typename Block>
HWY_INLINE void widen_q4(const Block* b, int64_t n_blocks, float* HWY_RESTRICT dst) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const auto mask = hn::Set(di, 15), eight = hn::Set(di, 8);
  for (int64_t i = 0; i < n_blocks; ++i, dst += 32) {
    const float d = f16_to_f32(b[i].d);
    float m = 0.0f;
    if constexpr (kMin) m = f16_to_f32(b[i].m);
    if (16 % L != 0) {
      for (int j = 0; j < 16; ++j) {
        const int lo = b[i].qs[j] & 0x0f, hi = b[i].qs[j] >> 4;
        if constexpr (kMin) {
          dst[j] = d * lo + m, dst[j + 16] = d * hi + m;
        } else {
          dst[j] = d * (lo - 8), dst[j + 16] = d * (hi - 8);
        }
      }
      continue;
    }
    const auto vd = hn::Set(df, d), vm = hn::Set(df, m);
    for (int64_t j = 0; j < 16; j += L) {
      const auto q = hn::PromoteTo(di, hn::LoadU(d8, b[i].qs + j));
      auto lo = hn::And(q, mask), hi = hn::ShiftRight<4>(q);
      if constexpr (kMin) {
        hn::StoreU(hn::Add(hn::Mul(vd, hn::ConvertTo(df, lo)), vm), df, dst + j);
        hn::StoreU(hn::Add(hn::Mul(vd, hn::ConvertTo(df, hi)), vm), df, dst + j + 16);
      } else {
        lo = hn::Sub(lo, eight), hi = hn::Sub(hi, eight);
        hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, lo)), df, dst + j);
        hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, hi)), df, dst + j + 16);
      }
    }
  }
}

// q5_0 (kMin = false: d * (q - 16)) and q5_1 (kMin = true: d * q + m): q4's nibbles with bit e
// of the 32-bit qh word as element e's fifth bit. kBit32[e] selects that bit.
alignas(64) constexpr int32_t kBit32[32] = {
    1 << 0,  1 << 1,  1 << 2,  1 << 3,  1 << 4,  1 << 5,  1 << 6,  1 << 7,
    1 << 8,  1 << 9,  1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14, 1 << 15,
    1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20, 1 << 21, 1 << 22, 1 << 23,
    1 << 24, 1 << 25, 1 << 26, 1 << 27, 1 << 28, 1 << 29, 1 << 30, INT32_MIN};
template <bool kMin, typename Block>
HWY_INLINE void widen_q5(const Block* b, int64_t n_blocks, float* HWY_RESTRICT dst) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if (16 % L != 0) return to_f32(kMin ? DType::q5_1 : DType::q5_0, b, dst, n_blocks * 32);
  const auto mask = hn::Set(di, 15), sixteen = hn::Set(di, 16);
  for (int64_t i = 0; i < n_blocks; ++i, dst += 32) {
    const float d = f16_to_f32(b[i].d);
    float m = 0.0f;
    if constexpr (kMin) m = f16_to_f32(b[i].m);
    const auto qh = hn::Set(di, static_cast<int32_t>(q5_high_bits(b[i].qh)));
    const auto vd = hn::Set(df, d), vm = hn::Set(df, m);
    for (int64_t j = 0; j < 16; j += L) {
      const auto q = hn::PromoteTo(di, hn::LoadU(d8, b[i].qs + j));
      const auto lo_bit = hn::Ne(hn::And(qh, hn::LoadU(di, kBit32 + j)), hn::Zero(di));
      const auto hi_bit = hn::Ne(hn::And(qh, hn::LoadU(di, kBit32 + 16 + j)), hn::Zero(di));
      auto lo = hn::Or(hn::And(q, mask), hn::IfThenElseZero(lo_bit, sixteen));
      auto hi = hn::Or(hn::ShiftRight<4>(q), hn::IfThenElseZero(hi_bit, sixteen));
      if constexpr (kMin) {
        hn::StoreU(hn::Add(hn::Mul(vd, hn::ConvertTo(df, lo)), vm), df, dst + j);
        hn::StoreU(hn::Add(hn::Mul(vd, hn::ConvertTo(df, hi)), vm), df, dst + j + 16);
      } else {
        lo = hn::Sub(lo, sixteen), hi = hn::Sub(hi, sixteen);
        hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, lo)), df, dst + j);
        hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, hi)), df, dst + j + 16);
      }
    }
  }
}

// Whole Q4_K / Q5_K super-blocks: sub-block j is scale_j * q - offset_j (one rounded product,
// then the subtraction, as core's decoder), q the low (j even) or high (j odd) nibbles of 32
// bytes, and for Q5_K bit j of qh[l] as 16.
template <typename Block>
HWY_INLINE void widen_q4_k(const Block* b, int64_t n_blocks, float* HWY_RESTRICT dst) {
  constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5K>;
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if (32 % L != 0) return to_f32(kFifthBit ? DType::q5_k : DType::q4_k, b, dst, n_blocks * kQK_K);
  const auto mask = hn::Set(di, 15), one = hn::Set(di, 1);
  for (int64_t i = 0; i < n_blocks; ++i, dst += kQK_K) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      q4_k_scale_min(b[i].scales, j, &sc, &m);
      const auto vs = hn::Set(df, d * static_cast<float>(sc));
      const auto vo = hn::Set(df, dmin * static_cast<float>(m));
      const uint8_t* q = b[i].qs + 32 * (j / 2);
      for (int64_t l = 0; l < 32; l += L) {
        const auto v = hn::PromoteTo(di, hn::LoadU(d8, q + l));
        auto nib = (j & 1) ? hn::ShiftRight<4>(v) : hn::And(v, mask);
        if constexpr (kFifthBit) {
          const auto hb = hn::PromoteTo(di, hn::LoadU(d8, b[i].qh + l));
          nib = hn::Or(nib, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(hb, j), one)));
        }
        hn::StoreU(hn::Sub(hn::Mul(vs, hn::ConvertTo(df, nib)), vo), df, dst + 32 * j + l);
      }
    }
  }
}

// Whole Q6_K super-blocks: element i = (d * scales[i / 16]) * (q - 32), q 6 bits from a ql
// nibble and a qh bit pair (layout as core's decoder). Needs 16 % lanes == 0 so a vector never
// straddles two 16-element scale groups.
HWY_INLINE void widen_q6_k(const BlockQ6K* b, int64_t n_blocks, float* HWY_RESTRICT dst) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if (16 % L != 0) return dequantize_q6_k_blocks(b, dst, n_blocks);
  const auto mask4 = hn::Set(di, 15), mask2 = hn::Set(di, 3), bias = hn::Set(di, 32);
  for (int64_t i = 0; i < n_blocks; ++i, dst += kQK_K) {
    const float d = f16_to_f32(b[i].d);
    for (int h = 0; h < 2; ++h)
      for (int r = 0; r < 4; ++r)
        for (int64_t l = 0; l < 32; l += L) {
          const int64_t e = 128 * h + 32 * r + l;
          const auto lo_bytes =
              hn::PromoteTo(di, hn::LoadU(d8, b[i].ql + 64 * h + 32 * (r & 1) + l));
          const auto lo = r < 2 ? hn::And(lo_bytes, mask4) : hn::ShiftRight<4>(lo_bytes);
          const auto hb = hn::PromoteTo(di, hn::LoadU(d8, b[i].qh + 32 * h + l));
          const auto hi = hn::And(hn::ShiftRightSame(hb, 2 * r), mask2);
          const auto q = hn::Sub(hn::Or(lo, hn::ShiftLeft<4>(hi)), bias);
          const auto ds = hn::Set(df, d * static_cast<float>(b[i].scales[e / 16]));
          hn::StoreU(hn::Mul(ds, hn::ConvertTo(df, q)), df, dst + e);
        }
  }
}

}  // namespace dequant_detail

// dst[0, n) = elements [p0, p0 + n) of the weight row at `row` (type t) as f32. p0 and n are
// multiples of t's block size (the caller's depth blocks are); n may be any count for f32/f16/
// bf16.
HWY_INLINE void dequant_segment(DType t, const uint8_t* row, int64_t p0, int64_t n,
                                float* HWY_RESTRICT dst) {
  namespace dd = dequant_detail;
  const uint8_t* src = row + dtype_bytes(t, p0);
  switch (t) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::f16:
      return dd::widen_half<hwy::float16_t>(reinterpret_cast<const uint16_t*>(src), n, dst);
    case DType::bf16:
      return dd::widen_half<hwy::bfloat16_t>(reinterpret_cast<const uint16_t*>(src), n, dst);
    case DType::q8_0:
      return dd::widen_q8_0(reinterpret_cast<const BlockQ8_0*>(src), n / kQK8_0, dst);
    case DType::q4_0:
      return dd::widen_q4<false>(reinterpret_cast<const BlockQ4_0*>(src), n / kQK4_0, dst);
    case DType::q4_1:
      return dd::widen_q4<true>(reinterpret_cast<const BlockQ4_1*>(src), n / kQK4_1, dst);
    case DType::q5_0:
      return dd::widen_q5<false>(reinterpret_cast<const BlockQ5_0*>(src), n / kQK5_0, dst);
    case DType::q5_1:
      return dd::widen_q5<true>(reinterpret_cast<const BlockQ5_1*>(src), n / kQK5_1, dst);
    case DType::q4_k:
      return dd::widen_q4_k(reinterpret_cast<const BlockQ4K*>(src), n / kQK_K, dst);
    case DType::q5_k:
      return dd::widen_q4_k(reinterpret_cast<const BlockQ5K*>(src), n / kQK_K, dst);
    case DType::q6_k:
      return dd::widen_q6_k(reinterpret_cast<const BlockQ6K*>(src), n / kQK_K, dst);
    default:
      return to_f32(t, src, dst, n);
  }
}

// dequant_segment for row `row` of an interleaved matrix (q4_0x8 / q4_1x8 / q8_0x8 / q4_kx8 /
// q5_kx8 / q6_kx8, K columns): its blocks are gathered into the plain layout 16 (q4_kx8: 2) at a
// time, then widened as the plain type (so every value equals the plain matrix's, bit for bit).
HWY_INLINE void dequant_interleaved_segment(DType t, const uint8_t* w, int64_t K, int64_t row,
                                            int64_t p0, int64_t n, float* HWY_RESTRICT dst) {
  alignas(64) uint8_t plain[2 * sizeof(BlockQ4K)];  // 16 q8_0 blocks (544 bytes), 1 Q5_K / Q6_K fit
  const DType p = plain_type(t);
  const int64_t block = traits(p).block_elems;
  const int64_t batch = static_cast<int64_t>(sizeof plain) / traits(p).block_bytes;
  for (int64_t b = p0 / block, end = (p0 + n) / block; b < end; b += batch, dst += batch * block) {
    const int64_t nb = end - b < batch ? end - b : batch;
    deinterleave_blocks(t, w, K, row, b, nb, plain);
    dequant_segment(p, plain, 0, nb * block, dst);
  }
}

}  // namespace tessera::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
