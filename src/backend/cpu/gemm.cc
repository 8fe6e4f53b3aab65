// Packed GEMM in the Goto/BLIS style: op(A) and op(B) blocks are packed into contiguous
// micro-panels, a register-tiled micro-kernel (Highway; inline assembly on AVX2) computes
// kMR x kNR tiles of C, and threads own disjoint rectangles of C. bf16 inputs are converted to f32
// while packing (exact), so the kernel is an f32 FMA kernel: this CPU family (AVX2, no AVX512-BF16)
// has no bf16 dot product (an AVX512-BF16 `vdpbf16ps` kernel chosen by cpu_features() would be the
// place to add one). m <= 4 (decode) takes the unpacked small-M path of gemm_small-inl.h instead.
// gemm_wt runs the same loops with B = weights in a stored type (f16, q8_0, q4_0, ...), widened
// to f32 while packing (gemm_dequant-inl.h): matmul_wt's route for prefill-sized products. f16x16
// weights (16-row groups, core/interleave.h) are B panels already: the AVX2 micro-kernel reads
// them in place, widening on the load, and nothing of B is packed.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "core/error.h"
#include "core/interleave.h"
#include "ops/gemm_check.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/gemm.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#if HWY_ARCH_X86
#include <immintrin.h>
#endif

#include "backend/cpu/gemm_dequant-inl.h"
#include "backend/cpu/gemm_pack-inl.h"
#include "backend/cpu/gemm_small-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Micro-tile: 6 rows x 2 vectors. On AVX2 that is 6x16 f32: 12 accumulators + 2 B vectors + 1
// broadcast A value = 15 of 16 ymm registers, and 12 FMAs per 2 loads + 6 broadcasts keeps both
// FMA pipes busy. On AVX-512 the same shape is 6x32 in zmm; on SSE4 6x8 in xmm.
constexpr int kMR = 6;
constexpr int kNR = static_cast<int>(2 * hn::MaxLanes(DF()));

// Default blocking for a 32 KiB L1d / 512 KiB L2 core (Zen 3), in elements.
// kc = 256: the B micro-panel (256 x kNR x 4 B = 16 KiB on AVX2) stays in L1 across the ir loop.
// mc = 144 (24 micro-panels): the A block (144 x 256 x 4 B = 144 KiB) stays in L2.
// nc = 3072: the B block (256 x 3072 x 4 B = 3 MiB) stays in L3 and amortizes A packing.
constexpr int64_t kDefaultKc = 256;
constexpr int64_t kDefaultMc = 144;
constexpr int64_t kDefaultNc = 3072;

// C tile (kMR x kNR at c, leading dimension ldc) = sum + (load_c ? C : 0) + (bias ? bias : 0),
// where sum = sum_p a_panel[p] * b_panel[p] runs p = 0..kc-1 in order, one FMA per step, from
// zero. Every output's rounding sequence is therefore fixed by kc alone. C is read only after
// the loop (prefetched before it), so its cache misses overlap the FMAs.
HWY_INLINE void micro_kernel_hwy(int64_t kc, const float* HWY_RESTRICT a,
                                 const float* HWY_RESTRICT b, float* HWY_RESTRICT c, int64_t ldc,
                                 bool load_c, const float* HWY_RESTRICT bias) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (int r = 0; r < kMR; ++r) {
    hwy::Prefetch(c + r * ldc);
    hwy::Prefetch(c + r * ldc + 2 * L - 1);
  }
  VF c00 = hn::Zero(d), c01 = hn::Zero(d), c10 = hn::Zero(d), c11 = hn::Zero(d);
  VF c20 = hn::Zero(d), c21 = hn::Zero(d), c30 = hn::Zero(d), c31 = hn::Zero(d);
  VF c40 = hn::Zero(d), c41 = hn::Zero(d), c50 = hn::Zero(d), c51 = hn::Zero(d);
#define TS_GEMM_STEP(P)                                                            \
  {                                                                                \
    const VF b0 = hn::Load(d, b + (P)*2 * L), b1 = hn::Load(d, b + (P)*2 * L + L); \
    const float* ap = a + (P)*kMR;                                                 \
    VF av = hn::Set(d, ap[0]);                                                     \
    c00 = hn::MulAdd(av, b0, c00), c01 = hn::MulAdd(av, b1, c01);                  \
    av = hn::Set(d, ap[1]);                                                        \
    c10 = hn::MulAdd(av, b0, c10), c11 = hn::MulAdd(av, b1, c11);                  \
    av = hn::Set(d, ap[2]);                                                        \
    c20 = hn::MulAdd(av, b0, c20), c21 = hn::MulAdd(av, b1, c21);                  \
    av = hn::Set(d, ap[3]);                                                        \
    c30 = hn::MulAdd(av, b0, c30), c31 = hn::MulAdd(av, b1, c31);                  \
    av = hn::Set(d, ap[4]);                                                        \
    c40 = hn::MulAdd(av, b0, c40), c41 = hn::MulAdd(av, b1, c41);                  \
    av = hn::Set(d, ap[5]);                                                        \
    c50 = hn::MulAdd(av, b0, c50), c51 = hn::MulAdd(av, b1, c51);                  \
  }
  // Not unrolled by hand: with 15 of 16 registers live, GCC's scheduling of an unrolled body
  // spills accumulators (measured); the loop overhead is 3 cheap integer ops per 12 FMAs.
  for (int64_t p = 0; p < kc; ++p, a += kMR, b += 2 * L) {
    hwy::Prefetch(a + 16 * kMR);  // A streams from L2: fetch 16 steps (384 B) ahead
    TS_GEMM_STEP(0)
  }
#undef TS_GEMM_STEP
#define TS_GEMM_ROW(R)                                          \
  {                                                             \
    float* cr = c + (R)*ldc;                                    \
    if (load_c)                                                 \
      c##R##0 = hn::Add(c##R##0, hn::LoadU(d, cr)),             \
      c##R##1 = hn::Add(c##R##1, hn::LoadU(d, cr + L));         \
    if (bias)                                                   \
      c##R##0 = hn::Add(c##R##0, hn::LoadU(d, bias)),           \
      c##R##1 = hn::Add(c##R##1, hn::LoadU(d, bias + L));       \
    hn::StoreU(c##R##0, d, cr), hn::StoreU(c##R##1, d, cr + L); \
  }
  TS_GEMM_ROW(0) TS_GEMM_ROW(1) TS_GEMM_ROW(2) TS_GEMM_ROW(3) TS_GEMM_ROW(4) TS_GEMM_ROW(5)
#undef TS_GEMM_ROW
}

#if HWY_TARGET == HWY_AVX2
// The same 6x16 tile and contract as micro_kernel_hwy, for AVX2+FMA (compiled for and reached
// only through the AVX2 dispatch). Per output it issues the same FMA sequence (p ascending from
// zero, then + C, then + bias), so its bits are identical to micro_kernel_hwy's. What differs
// is the schedule, which GCC does not keep when given intrinsics (it hoists broadcasts and
// spills accumulators in an unrolled body): the k loop is inline assembly with the 12
// accumulators, 2 B vectors and 2 A broadcasts pinned in the 16 ymm registers, unrolled by 4
// with constant offsets from two pointers bumped once per iteration, and A (streaming from L2)
// prefetched 16 steps ahead.
// clang-format off
#define TS_AVX2_ROW_FMA(P, R, AREG)                                   \
  "vbroadcastss " #P "*24+" #R "*4(%[a]), %[" AREG "]\n\t"            \
  "vfmadd231ps %[b0], %[" AREG "], %[c" #R "0]\n\t"                   \
  "vfmadd231ps %[b1], %[" AREG "], %[c" #R "1]\n\t"
#define TS_AVX2_FMAS(P)                                               \
  TS_AVX2_ROW_FMA(P, 0, "a0") TS_AVX2_ROW_FMA(P, 1, "a1")             \
  TS_AVX2_ROW_FMA(P, 2, "a0") TS_AVX2_ROW_FMA(P, 3, "a1")             \
  TS_AVX2_ROW_FMA(P, 4, "a0") TS_AVX2_ROW_FMA(P, 5, "a1")
// B as packed f32 (64 bytes per step) or as an f16x16 group (32 bytes per step, widened by the
// load: vcvtph2ps runs beside the FMAs on Zen, so the f16 kernel runs at the f32 kernel's rate
// in a micro-benchmark with the panels in L1 or L2).
#define TS_AVX2_STEP(P)                                               \
  "vmovaps " #P "*64(%[b]), %[b0]\n\t"                                \
  "vmovaps " #P "*64+32(%[b]), %[b1]\n\t"                             \
  TS_AVX2_FMAS(P)
#define TS_AVX2_STEP_F16(P)                                           \
  "vcvtph2ps " #P "*32(%[b]), %[b0]\n\t"                              \
  "vcvtph2ps " #P "*32+16(%[b]), %[b1]\n\t"                           \
  TS_AVX2_FMAS(P)
#define TS_AVX2_ZERO(R)                                               \
  "vxorps %[c" #R "0], %[c" #R "0], %[c" #R "0]\n\t"                   \
  "vxorps %[c" #R "1], %[c" #R "1], %[c" #R "1]\n\t"
// clang-format on
// BT = uint16_t: B is an f16x16 group (16 f16 per step), read where it lies; the FMAs and hence
// the bits are those of the f32 kernel on the same values widened.
template <typename BT>
HWY_INLINE void micro_kernel_avx2(int64_t kc, const float* HWY_RESTRICT a, const BT* HWY_RESTRICT b,
                                  float* HWY_RESTRICT c, int64_t ldc, bool load_c,
                                  const float* HWY_RESTRICT bias) {
  for (int r = 0; r < kMR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 15), _MM_HINT_T0);
  }
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, b0, b1, a0, a1;
  int64_t n4 = kc / 4, n1 = kc % 4;
  // A panel: 6 floats (24 B) per step; B panel: 16 floats (64 B, aligned) or 16 f16 (32 B) per
  // step.
  // Accumulators are zeroed inside the asm: as outputs only they stay within GCC's 30-operand
  // limit (an in-out operand counts twice).
  // clang-format off
#define TS_AVX2_KLOOP(STEP, B4, B1)                                   \
  asm volatile(                                                       \
      TS_AVX2_ZERO(0) TS_AVX2_ZERO(1) TS_AVX2_ZERO(2)                 \
      TS_AVX2_ZERO(3) TS_AVX2_ZERO(4) TS_AVX2_ZERO(5)                 \
      "test %[n4], %[n4]\n\t"                                         \
      "jz 2f\n\t"                                                     \
      ".p2align 5\n"                                                  \
      "1:\n\t"                                                        \
      "prefetcht0 384(%[a])\n\t"                                      \
      "prefetcht0 448(%[a])\n\t"                                      \
      STEP(0) STEP(1) STEP(2) STEP(3)                                 \
      "add $96, %[a]\n\t"                                             \
      "add $" #B4 ", %[b]\n\t"                                        \
      "dec %[n4]\n\t"                                                 \
      "jnz 1b\n"                                                      \
      "2:\n\t"                                                        \
      "test %[n1], %[n1]\n\t"                                         \
      "jz 4f\n"                                                       \
      "3:\n\t"                                                        \
      STEP(0)                                                         \
      "add $24, %[a]\n\t"                                             \
      "add $" #B1 ", %[b]\n\t"                                        \
      "dec %[n1]\n\t"                                                 \
      "jnz 3b\n"                                                      \
      "4:\n\t"                                                        \
      : [a] "+r"(a), [b] "+r"(b), [n4] "+r"(n4), [n1] "+r"(n1),       \
        [c00] "=&x"(c00), [c01] "=&x"(c01), [c10] "=&x"(c10), [c11] "=&x"(c11), \
        [c20] "=&x"(c20), [c21] "=&x"(c21), [c30] "=&x"(c30), [c31] "=&x"(c31), \
        [c40] "=&x"(c40), [c41] "=&x"(c41), [c50] "=&x"(c50), [c51] "=&x"(c51), \
        [b0] "=&x"(b0), [b1] "=&x"(b1), [a0] "=&x"(a0), [a1] "=&x"(a1) \
      :                                                               \
      : "cc", "memory")
  // clang-format on
  if constexpr (std::is_same_v<BT, uint16_t>)
    TS_AVX2_KLOOP(TS_AVX2_STEP_F16, 128, 32);
  else
    TS_AVX2_KLOOP(TS_AVX2_STEP, 256, 64);
#undef TS_AVX2_KLOOP
#define TS_AVX2_ROW(R)                                                \
  {                                                                   \
    float* cr = c + (R)*ldc;                                          \
    if (load_c)                                                       \
      c##R##0 = _mm256_add_ps(c##R##0, _mm256_loadu_ps(cr)),          \
      c##R##1 = _mm256_add_ps(c##R##1, _mm256_loadu_ps(cr + 8));      \
    if (bias)                                                         \
      c##R##0 = _mm256_add_ps(c##R##0, _mm256_loadu_ps(bias)),        \
      c##R##1 = _mm256_add_ps(c##R##1, _mm256_loadu_ps(bias + 8));    \
    _mm256_storeu_ps(cr, c##R##0), _mm256_storeu_ps(cr + 8, c##R##1); \
  }
  TS_AVX2_ROW(0) TS_AVX2_ROW(1) TS_AVX2_ROW(2) TS_AVX2_ROW(3) TS_AVX2_ROW(4) TS_AVX2_ROW(5)
#undef TS_AVX2_ROW
}
#undef TS_AVX2_ZERO
#undef TS_AVX2_STEP
#undef TS_AVX2_STEP_F16
#undef TS_AVX2_FMAS
#undef TS_AVX2_ROW_FMA
#endif  // HWY_TARGET == HWY_AVX2

// The micro-kernel of the compiled target; every target's has micro_kernel_hwy's contract.
// BT = uint16_t (B read from an f16x16 group) exists on AVX2 only.
template <typename BT>
HWY_INLINE void micro_kernel(int64_t kc, const float* HWY_RESTRICT a, const BT* HWY_RESTRICT b,
                             float* HWY_RESTRICT c, int64_t ldc, bool load_c,
                             const float* HWY_RESTRICT bias) {
#if HWY_TARGET == HWY_AVX2
  micro_kernel_avx2<BT>(kc, a, b, c, ldc, load_c, bias);
#else
  static_assert(std::is_same_v<BT, float>, "f16 B panels are read by the AVX2 kernel only");
  micro_kernel_hwy(kc, a, b, c, ldc, load_c, bias);
#endif
}

struct Problem {
  Operand a, b;
  int64_t m, n, k;
  float* c;
  int64_t ldc;
  const float* bias;
  bool accumulate;
  int64_t mc, kc, nc;
  // Packing cost of one B element relative to one A element: widening stored-type weights
  // costs several instructions per element, so their products split N over threads (each
  // thread widens only its own columns) unless M is far larger.
  double b_pack_cost = 1.0;
};

// True where the micro-kernel reads B straight from f16x16 weights: on AVX2 a B micro-panel is
// 16 columns, exactly one group, whose depths [pc, pc + kc) are one contiguous run of f16.
HWY_INLINE bool reads_f16_groups(const Operand& b) {
  return HWY_TARGET == HWY_AVX2 && kNR == kF16PanelRows && b.stored_weights &&
         b.stored == DType::f16x16;
}

// Computes the rectangle C[m0:m1, n0:n1] with private pack buffers (Goto's five loops).
void gemm_rect(const Problem& pr, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m0 >= m1 || n0 >= n1) return;
  const bool f16_groups = reads_f16_groups(pr.b);
  const int64_t mc_max = std::min(pr.mc, (m1 - m0 + kMR - 1) / kMR * kMR);
  const int64_t nc_max = std::min(pr.nc, (n1 - n0 + kNR - 1) / kNR * kNR);
  const int64_t kc_max = std::min(pr.kc, pr.k);
  float* abuf = gemm_detail::pack_buffer(0, static_cast<size_t>(mc_max * kc_max));
  float* bbuf =
      f16_groups ? nullptr : gemm_detail::pack_buffer(1, static_cast<size_t>(nc_max * kc_max));
  auto pack_b_block = [&](int64_t jc, int64_t nc, int64_t pc, int64_t kc) {
    if (!f16_groups) pack_b<kNR>(pr.b, pc, kc, jc, nc, bbuf);
  };
  auto pack_a_block = [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc) {
    pack_a<kMR>(pr.a, ic, mc, pc, kc, abuf);
  };
  auto tile = [&](int64_t i, int64_t ir, int64_t j, int64_t jr, int64_t pc, int64_t kc,
                  int64_t rows, int64_t cols, bool load_c, const float* bias) {
    float* cp = pr.c + i * pr.ldc + j;
    const float* ap = abuf + ir * kc;
    auto run = [&](const auto* bp) {
      if (rows == kMR && cols == kNR) {
        micro_kernel(kc, ap, bp, cp, pr.ldc, load_c, bias);
        return;
      }
      gemm_detail::edge_tile<kMR, kNR>(
          [&](float* t, int64_t ld, bool lc, const float* b) {
            micro_kernel(kc, ap, bp, t, ld, lc, b);
          },
          cp, pr.ldc, rows, cols, load_c, bias);
    };
#if HWY_TARGET == HWY_AVX2
    if (f16_groups) {
      // Group j / 16 starts at half j * K; depth pc at 16 * pc within it.
      run(static_cast<const uint16_t*>(pr.b.p) + j * pr.k + pc * kNR);
      return;
    }
#endif
    (void)pc;
    run(bbuf + jr * kc);
  };
  gemm_detail::goto_loops<kMR, kNR>(m0, m1, n0, n1, pr.k, pr.mc, pr.kc, pr.nc, pr.accumulate,
                                    pr.bias, pack_b_block, pack_a_block, tile);
}

void run_packed(ThreadPool& pool, const Problem& pr);

void gemm_target(ThreadPool& pool, const ops::GemmArgs& g, const GemmBlocking& blk) {
  Problem pr;
  pr.a = Operand{g.a, operand_src(g.a_type, g.round_bf16), g.lda, g.trans_a == ops::Trans::T};
  pr.b = Operand{g.b, operand_src(g.b_type, g.round_bf16), g.ldb, g.trans_b == ops::Trans::T};
  pr.m = g.m, pr.n = g.n, pr.k = g.k;
  pr.c = g.c, pr.ldc = g.ldc, pr.bias = g.bias, pr.accumulate = g.accumulate;
  auto round_up = [](int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; };
  pr.mc = round_up(blk.mc > 0 ? blk.mc : kDefaultMc, kMR);
  pr.kc = blk.kc > 0 ? blk.kc : kDefaultKc;
  pr.nc = round_up(blk.nc > 0 ? blk.nc : kDefaultNc, kNR);

  if (pr.m <= kSmallM) {
    gemm_small_m(pool, pr.a, pr.b, pr.m, pr.n, pr.k, pr.kc, pr.c, pr.ldc, pr.bias, pr.accumulate);
    return;
  }
  run_packed(pool, pr);
}

// y (M,N) = x (M,K) W^T [+ bias] with W (N,K) stored as w_type, through the packed kernel:
// W is widened to f32 while its panels are packed (f16x16 on AVX2: read in place), x rounded to
// bf16 while packed for bf16 weights (ops::matmul_wt's rule). kc is rounded up to whole blocks of
// w_type so every depth block starts on a block boundary.
void gemm_wt_target(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
                    const void* w, DType w_type, int64_t N, const float* bias,
                    const GemmBlocking& blk) {
  Problem pr;
  pr.a = Operand{x, w_type == DType::bf16 ? Src::f32_round_bf16 : Src::f32, K, false};
  pr.b.p = w, pr.b.stored_weights = true, pr.b.stored = w_type;
  pr.b.row_bytes = dtype_bytes(w_type, K);
  pr.b.k = K;
  pr.m = M, pr.n = N, pr.k = K;
  pr.c = y, pr.ldc = ldy, pr.bias = bias, pr.accumulate = false;
  auto round_up = [](int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; };
  pr.mc = round_up(blk.mc > 0 ? blk.mc : kDefaultMc, kMR);
  pr.kc = round_up(blk.kc > 0 ? blk.kc : kDefaultKc, traits(w_type).block_elems);
  pr.nc = round_up(blk.nc > 0 ? blk.nc : kDefaultNc, kNR);
  // f16x16 on AVX2 packs nothing: B costs only its reads, so the grid may split M, each thread
  // then packing only its own rows of A. (Splitting N instead, each thread packing all of A,
  // measured the same: 1.1B f16 prefill on two threads, 55.7-56.8 vs 52.0-57.1 tokens/s.)
  pr.b_pack_cost = reads_f16_groups(pr.b) ? 0.0 : 4.0;
  run_packed(pool, pr);
}

// Goto's loops over a thread grid; any m (no small-M shortcut). The compute term counts 16 FMAs
// per cycle (two AVX2 FMA pipes); only its ratio to the packing terms matters.
void run_packed(ThreadPool& pool, const Problem& pr) {
  gemm_detail::run_grid(
      pool, pr.m, pr.n, pr.k, kMR, kNR, pr.nc, pr.b_pack_cost, 16.0,
      [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) { gemm_rect(pr, m0, m1, n0, n1); });
}

GemmTile tile_target() {
  return GemmTile{kMR, kNR};
}

}  // namespace tessera::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(gemm_target);
HWY_EXPORT(gemm_wt_target);
HWY_EXPORT(tile_target);

namespace gemm_detail {
namespace {
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
struct PackSlot {
  std::unique_ptr<float, FreeDeleter> data;
  size_t floats = 0;
};
}  // namespace

float* pack_buffer(int slot, size_t floats) {
  // Pool threads are persistent, so thread_local buffers are allocated once per thread and
  // reused by every later GEMM; they grow only when a larger block is needed.
  thread_local PackSlot slots[3];
  PackSlot& s = slots[slot];
  if (s.floats < floats) {
    const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
    TS_CHECK(p != nullptr, "[gemm] cannot allocate a pack buffer of ", bytes, " bytes");
    s.data.reset(p);
    s.floats = floats;
  }
  return s.data.get();
}
}  // namespace gemm_detail

GemmTile gemm_tile() {
  return HWY_DYNAMIC_DISPATCH(tile_target)();
}

void gemm_blocked(ThreadPool& pool, const ops::GemmArgs& g, const GemmBlocking& blocking) {
  TS_CHECK(blocking.mc >= 0 && blocking.kc >= 0 && blocking.nc >= 0,
           "[gemm] negative blocking mc=", blocking.mc, " kc=", blocking.kc, " nc=", blocking.nc);
  if (!ops::validate_gemm_args(g)) return;
  if (g.k == 0) {
    // Empty sum: C = bias (+ C), nothing to pack.
    for (int64_t i = 0; i < g.m; ++i) {
      float* row = g.c + i * g.ldc;
      for (int64_t j = 0; j < g.n; ++j)
        row[j] = (g.accumulate ? row[j] : 0.0f) + (g.bias ? g.bias[j] : 0.0f);
    }
    return;
  }
  const bool bf16_compute = g.round_bf16 || (g.a_type == DType::bf16 && g.b_type == DType::bf16);
  GemmKernel kernel = blocking.kernel;
  if (kernel == GemmKernel::automatic) kernel = gemm_kernel_for(bf16_compute, g.m);
  TS_CHECK(kernel != GemmKernel::bf16_dot || bf16_compute,
           "[gemm] the bf16 dot-product kernel rounds its inputs: it needs round_bf16 or bf16 "
           "operands");
  if (kernel == GemmKernel::bf16_dot) {
    gemm_bf16(pool, g, blocking);
    return;
  }
  HWY_DYNAMIC_DISPATCH(gemm_target)(pool, g, blocking);
}

GemmKernel gemm_kernel_for(bool bf16_compute, int64_t m) {
  // m <= 4 (decode) streams B once through the small-M path: memory bound, no kernel to win.
  return bf16_compute && m > 4 && gemm_bf16_supported() ? GemmKernel::bf16_dot
                                                        : GemmKernel::f32_fma;
}

std::string gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::bf16_dot:
      return "bf16 dot (avx512-bf16 vdpbf16ps)";
    case GemmKernel::f32_fma:
      return cat("f32 FMA (", highway_target(), ")");
    case GemmKernel::automatic:
      break;
  }
  return "automatic";
}

void gemm(ThreadPool& pool, const ops::GemmArgs& g) {
  gemm_blocked(pool, g, GemmBlocking{});
}

void gemm_wt_blocked(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
                     const void* w, DType w_type, int64_t N, const float* bias,
                     const GemmBlocking& blocking) {
  TS_CHECK(blocking.mc >= 0 && blocking.kc >= 0 && blocking.nc >= 0,
           "[gemm_wt] negative blocking mc=", blocking.mc, " kc=", blocking.kc,
           " nc=", blocking.nc);
  TS_CHECK(M >= 0 && K >= 0 && N >= 0, "[gemm_wt] negative size M=", M, " K=", K, " N=", N);
  TS_CHECK(ldy >= N, "[gemm_wt] ldy=", ldy, " is less than N=", N);
  TS_CHECK(w_type != DType::i32, "[gemm_wt] weights cannot be i32");
  TS_CHECK(N % traits(w_type).interleave_rows == 0, "[gemm_wt] N=", N,
           " is not a multiple of the rows a ", dtype_name(w_type), " group interleaves");
  if (M == 0 || N == 0) return;
  TS_CHECK(y != nullptr && x != nullptr && w != nullptr, "[gemm_wt] null y, x or w");
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) y[i * ldy + j] = bias ? bias[j] : 0.0f;
    return;
  }
  dtype_bytes(w_type, K);  // throws unless K is a whole number of blocks
  HWY_DYNAMIC_DISPATCH(gemm_wt_target)(pool, y, ldy, x, M, K, w, w_type, N, bias, blocking);
}

void gemm_wt(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
             const void* w, DType w_type, int64_t N, const float* bias) {
  gemm_wt_blocked(pool, y, ldy, x, M, K, w, w_type, N, bias, GemmBlocking{});
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
