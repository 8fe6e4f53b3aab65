// Packed GEMM on AVX512-BF16 dot products (vdpbf16ps): c (M,N) = op(a) (M,K) * op(b) (K,N)
// [+ bias] [+ c], with every operand seen as bf16 (f32 inputs rounded to nearest even while
// packed, bf16 inputs as stored) and f32 accumulation. The loops are gemm.cc's (Goto: B block
// in L3, A block in L2, micro-panels in L1; threads own disjoint rectangles of C); what differs
// is the panel format and the micro-kernel. Highway 1.0.3 has no bf16 dot product, so this file
// is intrinsics under a target attribute, reached only where cpu_features() reports the
// instruction (gemm_bf16_supported).
//
// Panel format: depth runs in pairs q = (p, p+1), one 32-bit word per (pair, row or column)
// holding the two bf16 (low half: depth p). An A micro-panel is kMR rows, a[q*kMR + r]; a B
// micro-panel kNR columns, b[q*kNR + j]. One vdpbf16ps multiplies 16 such words of B by one
// word of A broadcast, adding both products of each pair to 16 f32 lanes. Odd depths and rows or
// columns past the edge are packed as zeros.
//
// Numerics: bf16 x bf16 products are exact in f32; vdpbf16ps adds the two products of a pair to
// the accumulator in turn, each addition rounded to nearest even, with bf16 subnormal inputs
// and f32 subnormal results flushed to zero (DAZ/FTZ, not settable). Each output is one chain
// over depth pairs in order within a depth block of kc, so, as in gemm.cc, results depend on kc
// alone, never on the thread count or the M/N blocking.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm.h"
#include "core/error.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers pass a self-initialized _mm512_undefined_* vector as the unused merge
// source of the unpack and shuffle intrinsics, and -Wmaybe-uninitialized reports each use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define TS_BF16_KERNEL 1
#define TS_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#else
#define TS_BF16_KERNEL 0
#endif

namespace tessera::cpu {

bool gemm_bf16_supported() {
  const CpuFeatures& f = cpu_features();
  return TS_BF16_KERNEL && f.avx512_bf16 && f.avx512f && f.avx512bw && f.avx512vl;
}

#if TS_BF16_KERNEL
namespace {

// Micro-tile 8 x 32: 16 zmm accumulators + 2 B vectors + 1 broadcast A word = 19 of 32 zmm.
// Per depth pair it issues 16 vdpbf16ps against 2 B loads and 8 broadcasts: Zen 4 retires one
// 512-bit vdpbf16ps per cycle (64 flops, the probe's bf16 peak) and 10 loads fit in its 16
// cycles; 16 independent accumulators cover the instruction's latency. 8 rows divide the
// training shapes' M (B*T, and 768/2304/3072 for weight gradients) with no edge tiles.
constexpr int kMR = 8;
constexpr int kNR = 32;

// kc = 256 depths (128 pairs): the B micro-panel (128 x 32 words = 16 KiB) stays in L1 across
// the ir loop. mc = 192: the A block (192 x 256 x 2 B = 96 KiB) stays in L2. nc = 3072: the B
// block (256 x 3072 x 2 B = 1.5 MiB) stays in L3.
constexpr int64_t kDefaultKc = 256;
constexpr int64_t kDefaultMc = 192;
constexpr int64_t kDefaultNc = 3072;

// One operand as the packing sees it: X(x, p) for x along M (A) or N (B) and depth p, either
// contiguous along depth (x_major: X(x,p) = base[x*ld + p]) or along x (base[p*ld + x]).
struct View {
  const void* base = nullptr;
  bool bf16 = false;  // else f32, rounded to bf16 while packed
  int64_t ld = 0;
  bool x_major = false;
};

// The first n lanes (none for n <= 0, all for n >= the width).
TS_BF16 inline __mmask16 mask16(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}
TS_BF16 inline __mmask32 mask32(int64_t n) {
  if (n <= 0) return 0;
  return n >= 32 ? static_cast<__mmask32>(0xffffffffu) : static_cast<__mmask32>((1u << n) - 1);
}

// 16 elements X(x0 + i, p) for i < n (zeros beyond) as bf16 in the low half of 16 32-bit lanes.
// The x-contiguous form only (base[p*ld + x]).
TS_BF16 inline __m512i load16_as_words(const View& v, int64_t p, int64_t x0, int64_t n) {
  if (v.bf16) {
    const uint16_t* s = static_cast<const uint16_t*>(v.base) + p * v.ld + x0;
    return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask16(n), s));
  }
  const float* s = static_cast<const float*>(v.base) + p * v.ld + x0;
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask16(n), s));
  return _mm512_cvtepu16_epi32(h);
}

// 32 consecutive depths X(x, p0 .. p0+n) (zeros beyond n) as 16 pair words. Depth-contiguous
// form only (base[x*ld + p]): bf16 in memory order already is the pair layout.
TS_BF16 inline __m512i load_pairs(const View& v, int64_t x, int64_t p0, int64_t n) {
  if (v.bf16) {
    const uint16_t* s = static_cast<const uint16_t*>(v.base) + x * v.ld + p0;
    return _mm512_maskz_loadu_epi16(mask32(n), s);
  }
  const float* s = static_cast<const float*>(v.base) + x * v.ld + p0;
  const __m512 lo = _mm512_maskz_loadu_ps(mask16(n), s);
  const __m512 hi = _mm512_maskz_loadu_ps(mask16(n - 16), s + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lo's 16 bf16 first, then hi's
}

// In place: r[i] lane j becomes r[j] lane i, for 16 vectors of 16 32-bit lanes. Unpacking
// 32-bit then 64-bit pairs leaves s[4i+j] lane L = rows 4i..4i+3 of column 4L+j; two rounds of
// 128-bit lane shuffles then gather column c = 4L+j from lane L of s[j], s[4+j], s[8+j], s[12+j].
TS_BF16 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i u0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
    const __m512i v0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
    const __m512i u1 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    t[j] = _mm512_shuffle_i32x4(u0, u1, 0x88);
    t[8 + j] = _mm512_shuffle_i32x4(u0, u1, 0xdd);
    t[4 + j] = _mm512_shuffle_i32x4(v0, v1, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(v0, v1, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Stores the pair words of slots s0 .. s0+15 (s0 a multiple of 16) for pair q into panels of
// kW slots (panel s / kW at dst + (s / kW) * kp * kW), skipping slots >= slots.
template <int kW>
TS_BF16 inline void store16(uint32_t* dst, int64_t kp, int64_t q, int64_t s0, int64_t slots,
                            __m512i v) {
  if constexpr (kW >= 16) {
    _mm512_storeu_si512(dst + (s0 / kW) * kp * kW + q * kW + s0 % kW, v);
  } else {
    static_assert(kW == 8, "panels of 8 or of a multiple of 16 slots");
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (s0 / 8) * kp * 8 + q * 8),
                        _mm512_castsi512_si256(v));
    if (s0 + 8 < slots)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (s0 / 8 + 1) * kp * 8 + q * 8),
                          _mm512_extracti64x4_epi64(v, 1));
  }
}

// Packs X(x0 .. x0+nx, p0 .. p0+kc) into ceil(nx / kW) micro-panels of kW slots and
// kp = ceil(kc / 2) pairs (layout in the file comment), zeros past nx and kc.
template <int kW>
TS_BF16 void pack(const View& v, int64_t x0, int64_t nx, int64_t p0, int64_t kc, uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2;
  const int64_t slots = (nx + kW - 1) / kW * kW;
  if (v.x_major) {
    // 16 slots x 16 pairs at a time: 16 loads of 32 depths, one 16x16 word transpose.
    for (int64_t s0 = 0; s0 < slots; s0 += 16)
      for (int64_t q0 = 0; q0 < kp; q0 += 16) {
        __m512i r[16];
        for (int64_t i = 0; i < 16; ++i)
          r[i] = s0 + i < nx ? load_pairs(v, x0 + s0 + i, p0 + 2 * q0, kc - 2 * q0)
                             : _mm512_setzero_si512();
        transpose16(r);
        const int64_t nq = std::min<int64_t>(16, kp - q0);
        for (int64_t i = 0; i < nq; ++i) store16<kW>(dst, kp, q0 + i, s0, slots, r[i]);
      }
    return;
  }
  // x-contiguous: each pair of depth rows is read once and interleaved 16 slots at a time.
  for (int64_t q = 0; q < kp; ++q) {
    const int64_t p = p0 + 2 * q;
    const bool second = 2 * q + 1 < kc;
    for (int64_t s0 = 0; s0 < slots; s0 += 16) {
      const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, nx - s0));
      const __m512i lo = load16_as_words(v, p, x0 + s0, n);
      const __m512i hi = second ? load16_as_words(v, p + 1, x0 + s0, n) : _mm512_setzero_si512();
      store16<kW>(dst, kp, q, s0, slots, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

// C tile (kMR x kNR at c, leading dimension ldc) = sum + (load_c ? C : 0) + (bias ? bias : 0),
// sum = the kp pair steps of a and b in order from zero (gemm.cc's micro-kernel contract).
TS_BF16 void micro_kernel(int64_t kp, const uint32_t* __restrict a, const uint32_t* __restrict b,
                          float* __restrict c, int64_t ldc, bool load_c,
                          const float* __restrict bias) {
  for (int r = 0; r < kMR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 31), _MM_HINT_T0);
  }
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00;
  __m512 c70 = c00, c71 = c00;
#define TS_BF16_ROW(R)                                                                        \
  {                                                                                           \
    const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[R]));                  \
    c##R##0 = _mm512_dpbf16_ps(c##R##0, av, b0), c##R##1 = _mm512_dpbf16_ps(c##R##1, av, b1); \
  }
  for (int64_t q = 0; q < kp; ++q, a += kMR, b += kNR) {
    _mm_prefetch(reinterpret_cast<const char*>(a + 16 * kMR), _MM_HINT_T0);  // A from L2
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + 16);
    TS_BF16_ROW(0)
    TS_BF16_ROW(1)
    TS_BF16_ROW(2) TS_BF16_ROW(3) TS_BF16_ROW(4) TS_BF16_ROW(5) TS_BF16_ROW(6) TS_BF16_ROW(7)
  }
#undef TS_BF16_ROW
#define TS_BF16_OUT(R)                                                 \
  {                                                                    \
    float* cr = c + (R)*ldc;                                           \
    if (load_c)                                                        \
      c##R##0 = _mm512_add_ps(c##R##0, _mm512_loadu_ps(cr)),           \
      c##R##1 = _mm512_add_ps(c##R##1, _mm512_loadu_ps(cr + 16));      \
    if (bias)                                                          \
      c##R##0 = _mm512_add_ps(c##R##0, _mm512_loadu_ps(bias)),         \
      c##R##1 = _mm512_add_ps(c##R##1, _mm512_loadu_ps(bias + 16));    \
    _mm512_storeu_ps(cr, c##R##0), _mm512_storeu_ps(cr + 16, c##R##1); \
  }
  TS_BF16_OUT(0)
  TS_BF16_OUT(1)
  TS_BF16_OUT(2) TS_BF16_OUT(3) TS_BF16_OUT(4) TS_BF16_OUT(5) TS_BF16_OUT(6) TS_BF16_OUT(7)
#undef TS_BF16_OUT
}

struct Problem {
  View a, b;  // a: x = row of C; b: x = column of C
  int64_t m, n, k;
  float* c;
  int64_t ldc;
  const float* bias;
  bool accumulate;
  int64_t mc, kc, nc;
};

uint32_t* words(int slot, int64_t n) {
  return reinterpret_cast<uint32_t*>(gemm_detail::pack_buffer(slot, static_cast<size_t>(n)));
}

// The rectangle C[m0:m1, n0:n1] with this thread's pack buffers (gemm_detail::goto_loops).
TS_BF16 void gemm_rect(const Problem& pr, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m0 >= m1 || n0 >= n1) return;
  const int64_t kp_max = (std::min(pr.kc, pr.k) + 1) / 2;
  uint32_t* abuf = words(0, std::min(pr.mc, (m1 - m0 + kMR - 1) / kMR * kMR) * kp_max);
  uint32_t* bbuf = words(1, std::min(pr.nc, (n1 - n0 + kNR - 1) / kNR * kNR) * kp_max);
  auto pack_b = [&](int64_t jc, int64_t nc, int64_t pc, int64_t kc) {
    pack<kNR>(pr.b, jc, nc, pc, kc, bbuf);
  };
  auto pack_a = [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc) {
    pack<kMR>(pr.a, ic, mc, pc, kc, abuf);
  };
  // The lambda takes the kernel's target too: GCC does not pass it on to lambdas.
  auto tile = [&](int64_t i, int64_t ir, int64_t j, int64_t jr, int64_t, int64_t kc, int64_t rows,
                  int64_t cols, bool load_c, const float* bias) TS_BF16 {
    const int64_t kp = (kc + 1) / 2;
    const uint32_t* ap = abuf + ir * kp;
    const uint32_t* bp = bbuf + jr * kp;
    float* cp = pr.c + i * pr.ldc + j;
    if (rows == kMR && cols == kNR) {
      micro_kernel(kp, ap, bp, cp, pr.ldc, load_c, bias);
      return;
    }
    gemm_detail::edge_tile<kMR, kNR>(
        [&](float* t, int64_t ld, bool lc, const float* b) {
          micro_kernel(kp, ap, bp, t, ld, lc, b);
        },
        cp, pr.ldc, rows, cols, load_c, bias);
  };
  gemm_detail::goto_loops<kMR, kNR>(m0, m1, n0, n1, pr.k, pr.mc, pr.kc, pr.nc, pr.accumulate,
                                    pr.bias, pack_b, pack_a, tile);
}

}  // namespace

void gemm_bf16(ThreadPool& pool, const ops::GemmArgs& g, const GemmBlocking& blk) {
  TS_CHECK(gemm_bf16_supported(),
           "[gemm] the bf16 dot-product kernel needs AVX512-BF16, which this CPU (", simd_summary(),
           ") lacks");
  auto round_up = [](int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; };
  Problem pr;
  // op(A)(i, p) = a[i*lda + p] (N) is depth-contiguous; op(B)(p, j) = b[j*ldb + p] (T) is.
  pr.a = View{g.a, g.a_type == DType::bf16, g.lda, g.trans_a == ops::Trans::N};
  pr.b = View{g.b, g.b_type == DType::bf16, g.ldb, g.trans_b == ops::Trans::T};
  pr.m = g.m, pr.n = g.n, pr.k = g.k;
  pr.c = g.c, pr.ldc = g.ldc, pr.bias = g.bias, pr.accumulate = g.accumulate;
  pr.mc = round_up(blk.mc > 0 ? blk.mc : kDefaultMc, kMR);
  pr.kc = round_up(blk.kc > 0 ? blk.kc : kDefaultKc, 2);
  pr.nc = round_up(blk.nc > 0 ? blk.nc : kDefaultNc, kNR);
  // 32 multiply-adds per cycle (one vdpbf16ps: 16 lanes x 2) against ~1 packed element per
  // cycle; packing A or B costs about the same per element.
  gemm_detail::run_grid(
      pool, pr.m, pr.n, pr.k, kMR, kNR, pr.nc, 1.0, 32.0,
      [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) { gemm_rect(pr, m0, m1, n0, n1); });
}

#else  // !TS_BF16_KERNEL

void gemm_bf16(ThreadPool&, const ops::GemmArgs&, const GemmBlocking&) {
  TS_CHECK(false, "[gemm] the bf16 dot-product kernel is built for x86-64 only");
}

#endif

}  // namespace tessera::cpu
