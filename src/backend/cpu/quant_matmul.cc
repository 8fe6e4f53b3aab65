// Highway matmul against weights in their stored format (f32/f16/bf16, q8_0, q4_0, q4_1, q5_0,
// q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): y = x W^T, and cpu::matmul_wt's choice between it and the
// AVX2 kernels. Weight blocks are unpacked to int16 in registers and multiplied against int16-held
// 8-bit activations with pairwise multiply-add (vpmaddwd on x86), exact in int32; each block's
// sum is scaled in f32. A weight row is decoded once for up to 4 activation rows.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/fixed_chunks.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_act.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"
#include "core/interleave.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/quant_matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 int16 lanes: 16 divides every scale group (16 or 32 elements), so a vector never
// straddles two scales; wider targets would gain nothing on these memory-bound loops.
using D16 = hn::CappedTag<int16_t, 16>;
using D32 = hn::Repartition<int32_t, D16>;
using DF = hn::Repartition<float, D16>;
using DU8 = hn::Rebind<uint8_t, D16>;
using DI8 = hn::Rebind<int8_t, D16>;
using V16 = hn::Vec<D16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;
constexpr int kL = static_cast<int>(hn::MaxLanes(D16()));
constexpr int kV = 32 / kL;  // int16 vectors per 32 elements

// sum over 32 elements of w * x as int32 lanes (w: kV vectors, x: 32 int16 at xp).
HWY_INLINE V32 Dot32(const V16* w, const int16_t* HWY_RESTRICT xp) {
  const D16 d16;
  const D32 d32;
  V32 s0 = hn::Zero(d32), s1 = hn::Zero(d32);
  for (int v = 0; v < kV; ++v)
    s0 = hn::ReorderWidenMulAccumulate(d32, w[v], hn::LoadU(d16, xp + v * kL), s0, s1);
  return hn::RearrangeToOddPlusEven(s0, s1);
}

// Bytes [off, off + kL) widened to int16 lanes.
HWY_INLINE V16 LoadBytes(const uint8_t* p) {
  return hn::PromoteTo(D16(), hn::LoadU(DU8(), p));
}

// Decoders: the 32 elements of a block (or sub-block) as kV int16 vectors in element order.
// Nibble layouts: q4_0/q4_1 keep element j (< 16) in the low nibble of byte j and j + 16 in the
// high nibble; Q4_K/Q6_K keep sub-block pairs in low/high nibbles of the same 32 bytes.
HWY_INLINE void DecodeQ8(const int8_t* qs, V16* w) {
  for (int v = 0; v < kV; ++v) w[v] = hn::PromoteTo(D16(), hn::LoadU(DI8(), qs + v * kL));
}
HWY_INLINE void DecodeQ4(const uint8_t* qs, int offset, V16* w) {
  const D16 d16;
  for (int v = 0; v < kV; ++v) {
    const V16 bytes = LoadBytes(qs + (v * kL) % 16);
    const V16 q = v * kL < 16 ? hn::And(bytes, hn::Set(d16, 0x0f)) : hn::ShiftRight<4>(bytes);
    w[v] = hn::Sub(q, hn::Set(d16, static_cast<int16_t>(offset)));
  }
}

// q5_0 / q5_1: the nibbles as DecodeQ4, each with its fifth bit from the 32-bit word qh (bit e
// for element e) as 16, less `offset`. kBit[i] selects bit i of a 16-bit half of qh.
alignas(64) constexpr uint16_t kBit[16] = {1,   2,   4,    8,    16,   32,   64,    128,
                                           256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
HWY_INLINE void DecodeQ5(const uint8_t* qs, uint32_t qh, int offset, V16* w) {
  const D16 d16;
  const hn::RebindToUnsigned<D16> du16;
  for (int v = 0; v < kV; ++v) {
    const int e = v * kL;  // first element of this vector
    const V16 bytes = LoadBytes(qs + e % 16);
    const V16 q = e < 16 ? hn::And(bytes, hn::Set(d16, 0x0f)) : hn::ShiftRight<4>(bytes);
    const auto half = hn::Set(du16, static_cast<uint16_t>(e < 16 ? qh : qh >> 16));
    const auto bit = hn::And(half, hn::LoadU(du16, kBit + e % 16));
    const V16 hi =
        hn::IfThenElseZero(hn::RebindMask(d16, hn::Ne(bit, hn::Zero(du16))), hn::Set(d16, 16));
    w[v] = hn::Sub(hn::Or(q, hi), hn::Set(d16, static_cast<int16_t>(offset)));
  }
}

// The per-row accumulators: A activation rows, P = 2 independent f32 chains each (hides the FMA
// latency when only one row is active; the same for every A, so a row's result does not depend
// on how many rows share its pass).
template <int A>
struct Acc {
  static constexpr int P = 2;
  VF v[A][P];
  float corr[A];  // scalar terms (mins) added at the end
  Acc() {
    for (int a = 0; a < A; ++a) {
      for (int p = 0; p < P; ++p) v[a][p] = hn::Zero(DF());
      corr[a] = 0;
    }
  }
  float Sum(int a) const {
    VF s = v[a][0];
    for (int p = 1; p < P; ++p) s = hn::Add(s, v[a][p]);
    return hn::GetLane(hn::SumOfLanes(DF(), s)) + corr[a];
  }
};

// Row pointers into the quantized activations, hoisted out of the block loops.
template <int A>
struct ActRows {
  const int16_t* q[A];
  const float* d[A];
  const int32_t* s32[A];
  ActRows(const QuantizedActs& x, int64_t m0) {
    for (int a = 0; a < A; ++a)
      q[a] = x.row_q(m0 + a), d[a] = x.row_d(m0 + a), s32[a] = x.row_sum32(m0 + a);
  }
};

// Calls fn(b, p) for blocks b = 0..nb-1 with p = b % P a compile-time constant after unrolling,
// so the accumulators stay in registers.
template <int A, class Fn>
HWY_INLINE void ForEachBlock(int64_t nb, const Fn& fn) {
  constexpr int P = Acc<A>::P;
  int64_t b = 0;
  for (; b + P <= nb; b += P) {
    fn(b, 0);
    if constexpr (P > 1) fn(b + 1, 1);
  }
  if (b < nb) fn(b, 0);
}

// One weight row (nb blocks) against activation rows m0..m0+A-1; writes out[a].
template <int A>
void DotRowQ8_0(const uint8_t* row, int64_t nb, const QuantizedActs& qa, int64_t m0, float* out) {
  Acc<A> acc;
  const ActRows<A> x(qa, m0);
  ForEachBlock<A>(nb, [&](int64_t b, int p) HWY_ATTR {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    V16 w[kV];
    DecodeQ8(blk->qs, w);
    const float dw = f16_scale_to_f32(blk->d);
    for (int a = 0; a < A; ++a) {
      const V32 s = Dot32(w, x.q[a] + 32 * b);
      acc.v[a][p] = hn::MulAdd(hn::ConvertTo(DF(), s), hn::Set(DF(), dw * x.d[a][b]), acc.v[a][p]);
    }
  });
  for (int a = 0; a < A; ++a) out[a] = acc.Sum(a);
}

// q4_0 (offset 8, no min) and q4_1 (offset 0, min m times the activation block sum); with
// kFifthBit q5_0 (offset 16) and q5_1, whose qh word sits between the scales and the nibbles.
template <int A, bool kHasMin, bool kFifthBit = false>
void DotRowQ4(const uint8_t* row, int64_t nb, const QuantizedActs& qa, int64_t m0, float* out) {
  Acc<A> acc;
  const ActRows<A> x(qa, m0);
  constexpr int64_t kQs = (kHasMin ? 4 : 2) + (kFifthBit ? 4 : 0);  // byte offset of the nibbles
  constexpr int kOffset = kHasMin ? 0 : kFifthBit ? 16 : 8;
  ForEachBlock<A>(nb, [&](int64_t b, int p) HWY_ATTR {
    const uint8_t* blk = row + b * (kQs + 16);
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    V16 w[kV];
    if constexpr (kFifthBit)
      DecodeQ5(blk + kQs, q5_high_bits(blk + kQs - 4), kOffset, w);
    else
      DecodeQ4(blk + kQs, kOffset, w);
    const float dw = f16_scale_to_f32(dh);
    float mw = 0;
    if constexpr (kHasMin) {
      uint16_t mh;
      std::memcpy(&mh, blk + 2, 2);
      mw = f16_scale_to_f32(mh);
    }
    for (int a = 0; a < A; ++a) {
      const V32 s = Dot32(w, x.q[a] + 32 * b);
      const float dx = x.d[a][b];
      acc.v[a][p] = hn::MulAdd(hn::ConvertTo(DF(), s), hn::Set(DF(), dw * dx), acc.v[a][p]);
      if constexpr (kHasMin) acc.corr[a] += mw * (dx * static_cast<float>(x.s32[a][b]));
    }
  });
  for (int a = 0; a < A; ++a) out[a] = acc.Sum(a);
}

// Q4_K / Q5_K: int32 lanes accumulate sum_j sc_j * (q . x) over the super-block (q * sc_j <=
// 31 * 63 fits int16); the mins contribute dmin * m_j * sum(x) per sub-block, summed as an exact
// integer. Q5_K's fifth bit of element l in sub-block j is bit j of qh[l].
template <int A, class Block>
void DotRowQ4K(const uint8_t* row, int64_t nb, const QuantizedActs& qa, int64_t m0, float* out) {
  constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5K>;
  const D16 d16;
  Acc<A> acc;
  const ActRows<A> x(qa, m0);
  ForEachBlock<A>(nb, [&](int64_t b, int p) HWY_ATTR {
    const auto* blk = reinterpret_cast<const Block*>(row) + b;
    int sc[8], mn[8];
    for (int j = 0; j < 8; ++j) q4_k_scale_min(blk->scales, j, &sc[j], &mn[j]);
    V32 isum[A];
    for (int a = 0; a < A; ++a) isum[a] = hn::Zero(D32());
    for (int j = 0; j < 8; ++j) {
      const uint8_t* qs = blk->qs + 32 * (j / 2);
      const V16 scale = hn::Set(d16, static_cast<int16_t>(sc[j]));
      V16 w[kV];
      for (int v = 0; v < kV; ++v) {
        const V16 bytes = LoadBytes(qs + v * kL);
        V16 q = j % 2 == 0 ? hn::And(bytes, hn::Set(d16, 0x0f)) : hn::ShiftRight<4>(bytes);
        if constexpr (kFifthBit) {
          const V16 hb = LoadBytes(blk->qh + v * kL);
          q = hn::Or(q, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(hb, j), hn::Set(d16, 1))));
        }
        w[v] = hn::Mul(q, scale);
      }
      for (int a = 0; a < A; ++a) isum[a] = hn::Add(isum[a], Dot32(w, x.q[a] + b * kQK_K + 32 * j));
    }
    const float d = f16_scale_to_f32(blk->d), dmin = f16_scale_to_f32(blk->dmin);
    for (int a = 0; a < A; ++a) {
      const float dx = x.d[a][b];
      const int32_t* s32 = x.s32[a] + 8 * b;
      int32_t msum = 0;
      for (int j = 0; j < 8; ++j) msum += mn[j] * s32[j];
      acc.v[a][p] = hn::MulAdd(hn::ConvertTo(DF(), isum[a]), hn::Set(DF(), d * dx), acc.v[a][p]);
      acc.corr[a] -= dmin * dx * static_cast<float>(msum);
    }
  });
  for (int a = 0; a < A; ++a) out[a] = acc.Sum(a);
}

// Q6_K: 32-element group j = 4 h + r of half h; (q - 32) * scale fits int16 (<= 32 * 128).
template <int A>
void DotRowQ6K(const uint8_t* row, int64_t nb, const QuantizedActs& qa, int64_t m0, float* out) {
  const D16 d16;
  Acc<A> acc;
  const ActRows<A> x(qa, m0);
  ForEachBlock<A>(nb, [&](int64_t b, int p) HWY_ATTR {
    const auto* blk = reinterpret_cast<const BlockQ6K*>(row) + b;
    V32 isum[A];
    for (int a = 0; a < A; ++a) isum[a] = hn::Zero(D32());
    for (int j = 0; j < 8; ++j) {
      const int h = j / 4, r = j % 4;
      const uint8_t* ql = blk->ql + 64 * h + 32 * (r & 1);
      const uint8_t* qh = blk->qh + 32 * h;
      V16 w[kV];
      for (int v = 0; v < kV; ++v) {
        const V16 lo_bytes = LoadBytes(ql + v * kL);
        const V16 lo = r < 2 ? hn::And(lo_bytes, hn::Set(d16, 0x0f)) : hn::ShiftRight<4>(lo_bytes);
        const V16 hi = hn::And(hn::ShiftRightSame(LoadBytes(qh + v * kL), 2 * r), hn::Set(d16, 3));
        const V16 q = hn::Sub(hn::Or(lo, hn::ShiftLeft<4>(hi)), hn::Set(d16, 32));
        w[v] = hn::Mul(q, hn::Set(d16, blk->scales[2 * j + (v * kL) / 16]));
      }
      for (int a = 0; a < A; ++a) isum[a] = hn::Add(isum[a], Dot32(w, x.q[a] + b * kQK_K + 32 * j));
    }
    const float d = f16_scale_to_f32(blk->d);
    for (int a = 0; a < A; ++a)
      acc.v[a][p] =
          hn::MulAdd(hn::ConvertTo(DF(), isum[a]), hn::Set(DF(), d * x.d[a][b]), acc.v[a][p]);
  });
  for (int a = 0; a < A; ++a) out[a] = acc.Sum(a);
}

// Q2_K / Q3_K: 32-element chunk c of a super-block is bit plane j = c % 4 of qs bytes
// 32 (c / 4).. (Q3_K: less 4 where bit 4 (c / 4) + j of hmask[l] is clear); each 16-element
// group has its own scale (q * scale fits int16: at most 4 * 32). Q2_K's mins multiply the
// activations' 16-sums, formed as a second dot product against the groups' mins.
template <int A, bool kQ3>
void DotRowLowK(const uint8_t* row, int64_t nb, const QuantizedActs& qa, int64_t m0, float* out) {
  using Block = std::conditional_t<kQ3, BlockQ3K, BlockQ2K>;
  const D16 d16;
  Acc<A> acc;
  const ActRows<A> x(qa, m0);
  ForEachBlock<A>(nb, [&](int64_t b, int p) HWY_ATTR {
    const auto* blk = reinterpret_cast<const Block*>(row) + b;
    int sc[16], mn[16] = {};
    if constexpr (kQ3) {
      q3_k_scales(blk->scales, sc);
    } else {
      for (int g = 0; g < 16; ++g) sc[g] = blk->scales[g] & 15, mn[g] = blk->scales[g] >> 4;
    }
    V32 isum[A], msum[A];
    for (int a = 0; a < A; ++a) isum[a] = msum[a] = hn::Zero(D32());
    for (int c = 0; c < 8; ++c) {
      const int h = c / 4, j = c % 4;
      V16 w[kV], mv[kV];
      for (int v = 0; v < kV; ++v) {
        const int l = v * kL;  // first byte of this vector within the 32
        V16 q =
            hn::And(hn::ShiftRightSame(LoadBytes(blk->qs + 32 * h + l), 2 * j), hn::Set(d16, 3));
        if constexpr (kQ3) {
          const V16 hb =
              hn::And(hn::ShiftRightSame(LoadBytes(blk->hmask + l), 4 * h + j), hn::Set(d16, 1));
          q = hn::Sub(q, hn::ShiftLeft<2>(hn::Xor(hb, hn::Set(d16, 1))));
        }
        const int g = 2 * c + l / 16;
        w[v] = hn::Mul(q, hn::Set(d16, static_cast<int16_t>(sc[g])));
        if constexpr (!kQ3) mv[v] = hn::Set(d16, static_cast<int16_t>(mn[g]));
      }
      for (int a = 0; a < A; ++a) {
        const int16_t* xc = x.q[a] + b * kQK_K + 32 * c;
        isum[a] = hn::Add(isum[a], Dot32(w, xc));
        if constexpr (!kQ3) msum[a] = hn::Add(msum[a], Dot32(mv, xc));
      }
    }
    const float d = f16_scale_to_f32(blk->d);
    float dmin = 0;
    if constexpr (!kQ3) dmin = f16_scale_to_f32(blk->dmin);
    for (int a = 0; a < A; ++a) {
      const float dx = x.d[a][b];
      acc.v[a][p] = hn::MulAdd(hn::ConvertTo(DF(), isum[a]), hn::Set(DF(), d * dx), acc.v[a][p]);
      if constexpr (!kQ3)
        acc.v[a][p] =
            hn::NegMulAdd(hn::ConvertTo(DF(), msum[a]), hn::Set(DF(), dmin * dx), acc.v[a][p]);
    }
  });
  for (int a = 0; a < A; ++a) out[a] = acc.Sum(a);
}

// f32 / f16 / bf16 weights: 8 (or fewer) weights widened to f32 per step, one FMA per row.
template <int A, DType T>
void DotRowFloat(const uint8_t* row, int64_t K, const float* x, int64_t m0, float* out) {
  const DF df;
  constexpr int kF = static_cast<int>(hn::MaxLanes(DF()));
  constexpr int P = A <= 2 ? 2 : 1;
  VF acc[A][P];
  for (int a = 0; a < A; ++a)
    for (int p = 0; p < P; ++p) acc[a][p] = hn::Zero(df);
  auto load_w = [&](int64_t k) {
    if constexpr (T == DType::f32) {
      return hn::LoadU(df, reinterpret_cast<const float*>(row) + k);
    } else if constexpr (T == DType::f16) {
      return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(),
                                         reinterpret_cast<const hwy::float16_t*>(row) + k));
    } else {
      return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::bfloat16_t, DF>(),
                                         reinterpret_cast<const hwy::bfloat16_t*>(row) + k));
    }
  };
  const float* xr[A];
  for (int a = 0; a < A; ++a) xr[a] = x + (m0 + a) * K;
  int64_t k = 0;
  for (; k + P * kF <= K; k += P * kF)
    for (int p = 0; p < P; ++p) {  // constant trip count: unrolled, accumulators in registers
      const VF w = load_w(k + p * kF);
      for (int a = 0; a < A; ++a)
        acc[a][p] = hn::MulAdd(w, hn::LoadU(df, xr[a] + k + p * kF), acc[a][p]);
    }
  for (; k + kF <= K; k += kF) {
    const VF w = load_w(k);
    for (int a = 0; a < A; ++a) acc[a][0] = hn::MulAdd(w, hn::LoadU(df, xr[a] + k), acc[a][0]);
  }
  for (int a = 0; a < A; ++a) {
    VF s = acc[a][0];
    for (int p = 1; p < P; ++p) s = hn::Add(s, acc[a][p]);
    float r = hn::GetLane(hn::SumOfLanes(df, s));
    for (int64_t t = k; t < K; ++t) {
      float wt;
      if constexpr (T == DType::f32) {
        std::memcpy(&wt, row + 4 * t, 4);
      } else {
        uint16_t hb;
        std::memcpy(&hb, row + 2 * t, 2);
        wt = T == DType::f16 ? f16_to_f32(hb) : bf16_to_f32(hb);
      }
      r += wt * xr[a][t];
    }
    out[a] = r;
  }
}

template <int A>
void DotRow(DType t, const uint8_t* row, int64_t K, const float* x, const QuantizedActs& qa,
            int64_t m0, float* out) {
  switch (t) {
    case DType::f32:
      return DotRowFloat<A, DType::f32>(row, K, x, m0, out);
    case DType::f16:
      return DotRowFloat<A, DType::f16>(row, K, x, m0, out);
    case DType::bf16:
      return DotRowFloat<A, DType::bf16>(row, K, x, m0, out);
    case DType::q8_0:
      return DotRowQ8_0<A>(row, K / 32, qa, m0, out);
    case DType::q4_0:
      return DotRowQ4<A, false>(row, K / 32, qa, m0, out);
    case DType::q4_1:
      return DotRowQ4<A, true>(row, K / 32, qa, m0, out);
    case DType::q5_0:
      return DotRowQ4<A, false, true>(row, K / 32, qa, m0, out);
    case DType::q5_1:
      return DotRowQ4<A, true, true>(row, K / 32, qa, m0, out);
    case DType::q4_k:
      return DotRowQ4K<A, BlockQ4K>(row, K / kQK_K, qa, m0, out);
    case DType::q5_k:
      return DotRowQ4K<A, BlockQ5K>(row, K / kQK_K, qa, m0, out);
    case DType::q6_k:
      return DotRowQ6K<A>(row, K / kQK_K, qa, m0, out);
    case DType::q2_k:
      return DotRowLowK<A, false>(row, K / kQK_K, qa, m0, out);
    case DType::q3_k:
      return DotRowLowK<A, true>(row, K / kQK_K, qa, m0, out);
    default:
      break;
  }
}

// Rows [n0, n1) of y for all M activation rows, 4 activation rows at a time so each weight block
// is decoded once per 4 rows; the chunk's weights (<= ~64 KiB) stay in L2 across row groups.
void MatmulRows(float* y, int64_t ldy, const float* x, const QuantizedActs& qa, int64_t M,
                int64_t K, const uint8_t* w, int64_t row_bytes, DType t, const float* bias,
                int64_t n0, int64_t n1) {
  float out[4];
  for (int64_t m = 0; m < M; m += 4) {
    const int64_t A = std::min<int64_t>(4, M - m);
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* row = w + n * row_bytes;
      switch (A) {
        case 1:
          DotRow<1>(t, row, K, x, qa, m, out);
          break;
        case 2:
          DotRow<2>(t, row, K, x, qa, m, out);
          break;
        case 3:
          DotRow<3>(t, row, K, x, qa, m, out);
          break;
        default:
          DotRow<4>(t, row, K, x, qa, m, out);
          break;
      }
      const float bn = bias ? bias[n] : 0.0f;
      for (int64_t a = 0; a < A; ++a) y[(m + a) * ldy + n] = out[a] + bn;
    }
  }
}

// The Highway target this dispatch runs (a table lookup: hwy::SupportedTargets() would run CPUID,
// which traps to the hypervisor on a VM, on every call).
int64_t ChosenTarget() {
  return HWY_TARGET;
}

void MatmulWt(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
              const void* w, DType t, int64_t N, const float* bias, const QuantizedActs& qa,
              int64_t rows_per_chunk) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t row_bytes = dtype_bytes(t, K);
  for_each_chunk(pool, N, rows_per_chunk, [&](int64_t, int64_t n0, int64_t n1) {
    MatmulRows(y, ldy, x, qa, M, K, wb, row_bytes, t, bias, n0, n1);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(MatmulWt);
HWY_EXPORT(ChosenTarget);

void matmul_wt_highway(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M,
                       int64_t K, const void* w, DType w_type, int64_t N, const float* bias) {
  TS_CHECK(!is_interleaved(w_type), "[matmul_wt] ", dtype_name(w_type),
           " weights need the AVX2 kernels, which this CPU or pinned target lacks");
  if (M == 0 || N == 0) return;
  if (w_type == DType::bf16) x = bf16_rounded_acts(x, M, K);
  QuantizedActs qa;
  const int64_t block = act_block_elems(w_type);
  if (block > 0) {
    qa = act_buffer(M, K, block);
    // Rows are independent; 4 rows per chunk keep the hand-off cheap.
    for_each_chunk(pool, M, 4,
                   [&](int64_t, int64_t m0, int64_t m1) { quantize_act_rows(x, qa, m0, m1); });
  }
  const int64_t rows_per_chunk =
      quant_rows_per_task(M, dtype_bytes(w_type, K), N, traits(w_type).interleave_rows);
  HWY_DYNAMIC_DISPATCH(MatmulWt)(pool, y, ldy, x, M, K, w, w_type, N, bias, qa, rows_per_chunk);
}

bool matmul_wt_takes_packed_gemm(DType w_type, int64_t M) {
  // Crossovers measured on one Zen core at N = K = 2048 (bench MatmulWt/route, medians): f16
  // and q8_0 weights are faster through the packed GEMM from ~128 rows, q6_K from 128 (its
  // integer kernel is the slowest), q4_0 and q4_1 from ~256; at 512 rows these run 1.1-1.9x
  // faster packed. q4_K stays on its integer kernel: at 512 rows it measured 59 ms against the
  // packed route's 67 ms (median of 5) on Zen (not on AVX-512: below). The interleaved q4_0x8 /
  // q4_1x8 kernels beat the packed route at every size measured (16-512 rows; 512: 56.5 vs 65.2 ms
  // and 46.8 vs 75.8 ms). q8_0x8's kernel wins up to 256 rows (MatmulWt/route, one thread: 15.8
  // vs 19.4 ms at 128, 31.9 vs 35.4 at 256) and is about even at 512 (70.1 vs 65.1 ms against its
  // packed route in that run; 62.4 vs 69.6 ms and 146 vs 232 ms against plain q8_0 packed in
  // MatmulWt/prefill), so it stays on the kernel too: its prefill rows then equal decoded rows bit
  // for bit. On a Xeon with AVX512-VNNI the interleaved layouts' vpdpbusd kernels widen the gap (M
  // = 512, one thread: q4_0x8 / q4_1x8 / q8_0x8 23.4 / 25.1 / 24.8 ms against 44.5 / 34.5 / 43.2
  // packed).
  // Where the packed GEMM's micro-tile is 512 bits wide (32 f32 columns: Highway's AVX3 targets)
  // while the k-quant kernels stay 256-bit, q4_K crosses too. One Xeon core, MatmulWt/route,
  // integer vs packed: 15.0 vs 10.5 ms at 128 rows, 63.8 vs 33.7 at 512 (7.0 vs 8.1 at 64). q6_K
  // there: 10.0 vs 7.5 ms at 64 rows, but it keeps the 128 of the other types, below which the
  // integer kernels' rows do not depend on the batch. Q5_K there: 13.0 vs 10.7 ms at 128 rows,
  // 51.0 vs 32.7 at 512; on 256-bit targets it stays integer with q4_K (unmeasured there).
  // Where the k-quants run on the AVX512-VNNI tiles (quant_avx512_kquant.cc), their integer
  // kernels win up to about 256 rows. One core of the third VM (model 167), integer vs packed:
  // q4_K 8.83 vs 10.5 ms at 128 rows, 17.3 vs 17.0 at 256, 36.4 vs 33.2 at 512; Q5_K 9.86 vs
  // 10.7, 20.5 vs 18.4, 40.8 vs 33.2; q6_K 8.48 vs 11.2, 17.6 vs 17.7, 35.9 vs 33.9.
  static const bool wide_fma = gemm_tile().nr >= 32;
  const bool kquant_vnni = quant_avx512_vnni_active();
  switch (w_type) {
    case DType::q4_k:
    case DType::q5_k:
      return kquant_vnni ? M >= 256 : wide_fma && M >= 128;
    case DType::q6_k:
      return M >= (kquant_vnni ? 256 : 128);
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::q8_0:
      return M >= 128;
    case DType::q2_k:
    case DType::q3_k:
      return M >= 128;  // Highway kernels only, slower than the AVX2 ones; not measured
    case DType::q5_0:
    case DType::q5_1:
      // Their integer kernels decode a fifth bit per element: one Xeon core, MatmulWt/route,
      // integer vs packed: q5_0 16.6 vs 10.6 ms at 128 rows, 35.4 vs 17.4 at 256, 69.8 vs 31.5
      // at 512 (8.6 vs 6.9 at 64, but below 128 every type stays integer: batch-invariant rows).
      // Not measured where the packed GEMM is 256 bits wide.
      return M >= 128;
    case DType::f16x16:
      // Its kernel reads a 16-row group per pass with vertical sums, and its packed route packs
      // no weights: MatmulWt/route, one thread, kernel vs packed: 2.9-3.1 vs 3.5 ms at 16 rows,
      // 4.7-5.4 vs 5.5-6.6 at 32, 10.1-10.4 vs 8.4-8.6 at 64.
      return M >= 64;
    case DType::q4_0:
    case DType::q4_1:
      return M >= 256;
    default:
      return false;
  }
}

void matmul_wt(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
               const void* w, DType w_type, int64_t N, const float* bias) {
  ops::check_matmul_wt_args(ldy, M, K, w_type, N);
  if (matmul_wt_takes_packed_gemm(w_type, M)) {
    if (w_type == DType::f32) {
      // f32 weights are an f32 GEMM's B operand as they stand: gemm packs their panels directly,
      // where gemm_wt's stored-weights route would go through its row-conversion packing.
      ops::GemmArgs g;
      g.trans_b = ops::Trans::T;
      g.m = M, g.n = N, g.k = K;
      g.a = x, g.lda = K, g.b = w, g.ldb = K;
      g.c = y, g.ldc = ldy, g.bias = bias;
      return gemm(pool, g);
    }
    if (w_type == DType::bf16 && gemm_kernel_for(true, M) == GemmKernel::bf16_dot) {
      // bf16 weights on the bf16 dot-product kernel (twice the f32 kernel's rate): the same
      // rounded x as every other route, rounded while packed.
      ops::GemmArgs g;
      g.trans_b = ops::Trans::T;
      g.m = M, g.n = N, g.k = K;
      g.a = x, g.lda = K, g.b = w, g.b_type = DType::bf16, g.ldb = K;
      g.c = y, g.ldc = ldy, g.bias = bias, g.round_bf16 = true;
      return gemm(pool, g);
    }
    return gemm_wt(pool, y, ldy, x, M, K, w, w_type, N, bias);
  }
  // The AVX2 kernels (int8 vpmaddubsw) where the CPU has them, unless Highway's choice was
  // pinned below AVX2 (tests pin each target to exercise every Highway version). Lower target
  // bits are the wider x86 targets.
  static const bool avx2 = quant_avx2_supported();
  // The interleaved layouts exist only for the AVX2 kernels (the loader makes them only where
  // those run), whatever Highway target a test pinned.
  if (avx2 && (HWY_DYNAMIC_DISPATCH(ChosenTarget)() <= HWY_AVX2 || is_interleaved(w_type)))
    return matmul_wt_avx2(pool, y, ldy, x, M, K, w, w_type, N, bias);
  matmul_wt_highway(pool, y, ldy, x, M, K, w, w_type, N, bias);
}

void matmul_wt_group(ThreadPool& pool, const float* x, int64_t M, int64_t K,
                     const ops::WtProduct* products, int64_t n_products) {
  bool any_packed = false, any_interleaved = false;
  for (int64_t p = 0; p < n_products; ++p) {
    ops::check_matmul_wt_args(products[p].ldy, M, K, products[p].w_type, products[p].N);
    any_packed = any_packed || matmul_wt_takes_packed_gemm(products[p].w_type, M);
    any_interleaved = any_interleaved || is_interleaved(products[p].w_type);
  }
  // Rows enough for the packed GEMM (M >= 128): nothing is shared between products at that size
  // (the integer kernels quantize x per product for M > 4 too), so each goes its own route.
  if (any_packed) {
    for (int64_t p = 0; p < n_products; ++p) {
      const ops::WtProduct& w = products[p];
      matmul_wt(pool, w.y, w.ldy, x, M, K, w.w, w.w_type, w.N, w.bias);
    }
    return;
  }
  static const bool avx2 = quant_avx2_supported();
  if (avx2 && (HWY_DYNAMIC_DISPATCH(ChosenTarget)() <= HWY_AVX2 || any_interleaved))
    return matmul_wt_group_avx2(pool, x, M, K, products, n_products);
  for (int64_t p = 0; p < n_products; ++p) {
    const ops::WtProduct& w = products[p];
    matmul_wt_highway(pool, w.y, w.ldy, x, M, K, w.w, w.w_type, w.N, w.bias);
  }
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
