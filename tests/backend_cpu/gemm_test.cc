// Tests of the packed CPU GEMM against the double-accumulating reference, over transposes,
// dtypes, odd sizes, strides, misalignment, blockings, thread counts and SIMD targets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "hwy/targets.h"

namespace tessera::cpu {
namespace {

using ops::GemmArgs;
using ops::Trans;

struct Case {
  Trans ta = Trans::N, tb = Trans::N;
  int64_t m = 0, n = 0, k = 0;
  DType a_type = DType::f32, b_type = DType::f32;
  bool round_bf16 = false, bias = false, accumulate = false;
  int64_t pad = 0;     // extra elements on every leading dimension
  int64_t offset = 0;  // start every matrix this many elements into its buffer (misalignment)
  int threads = 1;
  GemmBlocking blocking;
};

std::string describe(const Case& c) {
  return cat("ta=", c.ta == Trans::T ? "T" : "N", " tb=", c.tb == Trans::T ? "T" : "N", " m=", c.m,
             " n=", c.n, " k=", c.k, " a=", dtype_name(c.a_type), " b=", dtype_name(c.b_type),
             " round=", c.round_bf16, " bias=", c.bias, " acc=", c.accumulate, " pad=", c.pad,
             " off=", c.offset, " threads=", c.threads, " mc/kc/nc=", c.blocking.mc, "/",
             c.blocking.kc, "/", c.blocking.nc);
}

// Inputs of one case, stored as f32 and (for bf16 operands) as bf16 bits.
struct Operands {
  int64_t lda, ldb, ldc;
  std::vector<float> a32, b32, c0, bias;
  std::vector<uint16_t> a16, b16;
};

Operands make_operands(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Operands o;
  const int64_t a_rows = c.ta == Trans::N ? c.m : c.k, a_cols = c.ta == Trans::N ? c.k : c.m;
  const int64_t b_rows = c.tb == Trans::N ? c.k : c.n, b_cols = c.tb == Trans::N ? c.n : c.k;
  o.lda = a_cols + c.pad, o.ldb = b_cols + c.pad, o.ldc = c.n + c.pad;
  auto fill = [&](std::vector<float>& v, int64_t n) {
    v.resize(n);
    for (auto& x : v) x = u(rng);
  };
  fill(o.a32, c.offset + a_rows * o.lda + 1);
  fill(o.b32, c.offset + b_rows * o.ldb + 1);
  fill(o.c0, c.offset + c.m * o.ldc + 1);
  fill(o.bias, c.offset + c.n + 1);
  for (float x : o.a32) o.a16.push_back(f32_to_bf16(x));
  for (float x : o.b32) o.b16.push_back(f32_to_bf16(x));
  return o;
}

GemmArgs make_args(const Case& c, const Operands& o, float* out) {
  GemmArgs g;
  g.trans_a = c.ta, g.trans_b = c.tb, g.m = c.m, g.n = c.n, g.k = c.k;
  g.a_type = c.a_type, g.b_type = c.b_type;
  g.a = c.a_type == DType::bf16 ? static_cast<const void*>(o.a16.data() + c.offset)
                                : static_cast<const void*>(o.a32.data() + c.offset);
  g.b = c.b_type == DType::bf16 ? static_cast<const void*>(o.b16.data() + c.offset)
                                : static_cast<const void*>(o.b32.data() + c.offset);
  g.lda = o.lda, g.ldb = o.ldb, g.ldc = o.ldc;
  g.c = out + c.offset;
  g.bias = c.bias ? o.bias.data() + c.offset : nullptr;
  g.accumulate = c.accumulate;
  g.round_bf16 = c.round_bf16;
  return g;
}

// The value of op(x)(r, col) that the product sees (after bf16 rounding where it applies).
float seen(const Operands& o, bool is_a, const Case& c, int64_t r, int64_t col) {
  const bool trans = (is_a ? c.ta : c.tb) == Trans::T;
  const int64_t ld = is_a ? o.lda : o.ldb;
  const int64_t i = c.offset + (trans ? col * ld + r : r * ld + col);
  const DType t = is_a ? c.a_type : c.b_type;
  if (t == DType::bf16) return bf16_to_f32((is_a ? o.a16 : o.b16)[i]);
  const float v = (is_a ? o.a32 : o.b32)[i];
  return c.round_bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
}

// Runs the case through the packed GEMM and the reference and compares every element of C,
// including the padding between rows (which must be untouched).
//
// Tolerance: the packed GEMM forms init = C0 + bias (one rounding) and then k FMAs, each one
// rounding, so by the standard dot-product bound (Higham, Thm 3.1 with gamma_{k+1})
//   |fast - exact| <= (k + 1) u / (1 - (k + 1) u) * S,   S = |C0| + |bias| + sum_p |a_ip||b_pj|,
// with unit roundoff u = 2^-24. The reference accumulates in double (error ~k 2^-53 S) and then
// rounds once to f32 (u |exact| <= u S). Hence |fast - ref| <= (k + 3) u S covers both for any
// k we test; we allow (k + 3) * eps_f32 * S with eps_f32 = 2u, a factor-2 margin for the
// (1 - (k+1)u) denominator, and never a fixed absolute slack.
void check_case(const Case& c, uint32_t seed = 1) {
  SCOPED_TRACE(describe(c));
  const Operands o = make_operands(c, seed);
  std::vector<float> fast = o.c0, want = o.c0;
  ThreadPool pool(c.threads);
  gemm_blocked(pool, make_args(c, o, fast.data()), c.blocking);
  ref::gemm(make_args(c, o, want.data()));
  const double eps = std::ldexp(1.0, -23);
  int64_t bad = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < c.k; ++p)
        s += std::fabs(static_cast<double>(seen(o, true, c, i, p)) * seen(o, false, c, p, j));
      if (c.accumulate) s += std::fabs(o.c0[c.offset + i * o.ldc + j]);
      if (c.bias) s += std::fabs(o.bias[c.offset + j]);
      const double tol = (c.k + 3) * eps * s;
      const int64_t idx = c.offset + i * o.ldc + j;
      const double err = std::fabs(static_cast<double>(fast[idx]) - want[idx]);
      if (!(err <= tol) && bad++ < 5) {
        ADD_FAILURE() << "C(" << i << "," << j << ") fast=" << fast[idx] << " ref=" << want[idx]
                      << " err=" << err << " tol=" << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  // Everything outside the m x n window (padding, prefix, suffix) is untouched.
  for (size_t idx = 0; idx < fast.size(); ++idx) {
    const int64_t rel = static_cast<int64_t>(idx) - c.offset;
    const bool inside = rel >= 0 && rel < c.m * o.ldc && rel % o.ldc < c.n;
    if (!inside) {
      ASSERT_EQ(fast[idx], o.c0[idx]) << "wrote outside C at " << idx;
    }
  }
}

TEST(Gemm, AllTransposesOddSizes) {
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (int64_t s : {1, 3, 17, 65, 127}) {
        Case c;
        c.ta = ta, c.tb = tb, c.m = s, c.n = s + 2, c.k = s + 1;
        check_case(c);
      }
}

TEST(Gemm, LargerThanOneBlockInEveryDimension) {
  // 257 crosses the default kc = 256 and the micro-tile edges; the small blockings force many
  // mc/kc/nc blocks (with partial last blocks) at sizes the reference handles quickly.
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      Case c;
      c.ta = ta, c.tb = tb, c.m = 131, c.n = 97, c.k = 257, c.threads = 2;
      check_case(c);
      c.blocking = GemmBlocking{12, 37, 48};
      check_case(c);
    }
}

TEST(Gemm, Bf16InputsAndRounding) {
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      Case c;
      c.ta = ta, c.tb = tb, c.m = 37, c.n = 41, c.k = 70;
      c.a_type = DType::bf16, c.b_type = DType::bf16;
      check_case(c);
      c.a_type = DType::f32;  // mixed f32 x bf16
      check_case(c);
      c.b_type = DType::f32, c.round_bf16 = true;
      check_case(c);
    }
}

TEST(Gemm, BiasAccumulateStridesMisalignment) {
  for (bool bias : {false, true})
    for (bool acc : {false, true})
      for (int64_t pad : {0, 5})
        for (int64_t offset : {0, 1}) {
          Case c;
          c.ta = Trans::N, c.tb = Trans::T, c.m = 23, c.n = 35, c.k = 29;
          c.bias = bias, c.accumulate = acc, c.pad = pad, c.offset = offset;
          check_case(c);
          c.ta = Trans::T, c.tb = Trans::N, c.a_type = DType::bf16;
          check_case(c);
        }
}

TEST(Gemm, ThreadCounts) {
  for (int threads : {1, 2, 3})
    for (int64_t m : {1, 7, 200}) {
      Case c;
      c.tb = Trans::T, c.m = m, c.n = 150, c.k = 64, c.threads = threads, c.bias = true;
      check_case(c);
    }
}

TEST(Gemm, DegenerateSizes) {
  for (int64_t m : {0, 1})
    for (int64_t n : {0, 1})
      for (int64_t k : {0, 1, 5}) {
        Case c;
        c.m = m, c.n = n, c.k = k, c.bias = true, c.accumulate = true;
        check_case(c);
        c.accumulate = false;
        check_case(c);
      }
}

// m <= 4 takes the unpacked small-M path (decode); cover it for every transpose and dtype, with
// enough work (2 m n k >= 1e6) that it runs threaded.
TEST(Gemm, SmallMPath) {
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (int64_t m : {1, 2, 3, 4, 5})
        for (DType bt : {DType::f32, DType::bf16}) {
          Case c;
          c.ta = ta, c.tb = tb, c.m = m, c.n = 1037, c.k = 301, c.b_type = bt, c.threads = 3;
          c.bias = m % 2 == 1, c.accumulate = m >= 3, c.pad = 3, c.offset = 1;
          check_case(c);
        }
  Case c;
  c.m = 2, c.n = 40, c.k = 600, c.round_bf16 = true, c.blocking = GemmBlocking{0, 128, 0};
  check_case(c);
}

// For op(B) = B the small-M path performs the packed path's arithmetic exactly: the first four
// rows of a 5-row product (packed) equal the 4-row product (small path) bit for bit.
TEST(Gemm, SmallMPathMatchesPackedBits) {
  Case c;
  c.m = 5, c.n = 300, c.k = 700, c.bias = true, c.accumulate = true;
  const Operands o = make_operands(c, 11);
  std::vector<float> five = o.c0, four = o.c0;
  ThreadPool pool(2);
  gemm(pool, make_args(c, o, five.data()));
  c.m = 4;
  gemm(pool, make_args(c, o, four.data()));
  for (int64_t i = 0; i < 4 * o.ldc; ++i) ASSERT_EQ(five[i], four[i]) << i;
}

// Bit-identical results whatever the thread count and the mc/nc blocking: each output's sum is
// one FMA chain in depth order, fixed by kc alone, and threads own disjoint tiles of C.
// Runs a 101 x 203 x 300 product with bias on 1-4 threads under each of `blockings` (same kc)
// and expects every result to equal the first bit for bit.
void expect_bit_identical(bool round_bf16, const std::vector<GemmBlocking>& blockings) {
  Case c;
  c.ta = Trans::N, c.tb = Trans::T, c.m = 101, c.n = 203, c.k = 300, c.bias = true;
  c.round_bf16 = round_bf16;
  const Operands o = make_operands(c, 7);
  std::vector<float> first;
  for (int threads : {1, 2, 3, 4})
    for (const GemmBlocking& blk : blockings) {
      std::vector<float> out = o.c0;
      ThreadPool pool(threads);
      gemm_blocked(pool, make_args(c, o, out.data()), blk);
      if (first.empty()) {
        first = out;
      } else {
        ASSERT_EQ(out, first) << "threads=" << threads << " mc=" << blk.mc << " nc=" << blk.nc;
      }
    }
}

TEST(Gemm, BitIdenticalAcrossThreadsAndBlocking) {
  expect_bit_identical(false, {GemmBlocking{}, GemmBlocking{6, 0, 16}, GemmBlocking{60, 0, 96}});
}

// round_bf16 on f32 inputs must give exactly the bits of the same GEMM on bf16 inputs, and
// agree with the reference run on the bf16-rounded values.
TEST(Gemm, RoundBf16EqualsBf16Inputs) {
  for (Trans tb : {Trans::N, Trans::T}) {
    Case c;
    c.tb = tb, c.m = 45, c.n = 77, c.k = 130, c.bias = true;
    const Operands o = make_operands(c, 3);
    std::vector<float> rounded(o.c0.size()), bf(o.c0.size());
    ThreadPool pool(2);
    Case cr = c;
    cr.round_bf16 = true;
    gemm(pool, make_args(cr, o, rounded.data()));
    Case cb = c;
    cb.a_type = cb.b_type = DType::bf16;
    gemm(pool, make_args(cb, o, bf.data()));
    EXPECT_EQ(rounded, bf);
    check_case(cr, 3);
  }
}

// Every compiled SIMD target this CPU supports (AVX2, SSE4, EMU128 ... ) gives correct results;
// the micro-tile width differs per target, so this also covers other edge-tile shapes.
TEST(Gemm, EverySupportedTarget) {
  int tested = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    const GemmTile tile = gemm_tile();
    EXPECT_EQ(tile.mr, 6);
    EXPECT_GE(tile.nr, 2);
    std::printf("target %s: micro-tile %lldx%lld\n", hwy::TargetName(target),
                static_cast<long long>(tile.mr), static_cast<long long>(tile.nr));
    for (Trans tb : {Trans::N, Trans::T}) {
      Case c;
      c.tb = tb, c.m = 29, c.n = 53, c.k = 41, c.bias = true, c.accumulate = true, c.threads = 2;
      check_case(c);
    }
    ++tested;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(tested, 1);
}

// On targets whose MulAdd is a fused multiply-add (AVX2 and its hand-scheduled micro-kernel,
// AVX-512), every output is exactly this chain: per depth block of kc, s = fma(a, b, s) from
// zero with p ascending; the first block gives (s + C0 if accumulating) + bias, later blocks
// s + C. The model uses std::fma and plain f32 additions, so equality is exact (no tolerance):
// a kernel that reorders, splits or unfuses any step changes some bits. kc = 37 leaves k-loop
// remainders of 1 and 2 after the unrolled steps; m and n leave partial (edge) tiles.
TEST(Gemm, FmaTargetsComputeOneFmaChainPerDepthBlock) {
  int tested = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if ((target & (HWY_AVX2 | HWY_AVX3 | HWY_AVX3_DL)) == 0) continue;
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (Trans tb : {Trans::N, Trans::T})
      for (int64_t kc : {0, 37})
        for (bool acc : {false, true}) {
          Case c;
          c.tb = tb, c.m = 13, c.n = 37, c.k = 100, c.bias = true, c.accumulate = acc;
          c.threads = 2, c.blocking = GemmBlocking{0, kc, 0};
          const Operands o = make_operands(c, 9);
          std::vector<float> out = o.c0;
          ThreadPool pool(c.threads);
          gemm_blocked(pool, make_args(c, o, out.data()), c.blocking);
          const int64_t block = kc > 0 ? kc : c.k;
          for (int64_t i = 0; i < c.m; ++i)
            for (int64_t j = 0; j < c.n; ++j) {
              float want = o.c0[i * o.ldc + j];
              for (int64_t p0 = 0; p0 < c.k; p0 += block) {
                float s = 0.0f;
                for (int64_t p = p0; p < std::min(c.k, p0 + block); ++p)
                  s = std::fma(seen(o, true, c, i, p), seen(o, false, c, p, j), s);
                if (p0 > 0) {
                  want = s + want;
                } else {
                  want = acc ? s + want : s;
                  want = want + o.bias[j];
                }
              }
              ASSERT_EQ(out[i * o.ldc + j], want)
                  << "C(" << i << "," << j << ") kc=" << kc << " acc=" << acc;
            }
        }
    ++tested;
  }
  hwy::SetSupportedTargetsForTest(0);
  if (tested == 0) GTEST_SKIP() << "no FMA target (AVX2/AVX-512) on this CPU";
}

// ---- The AVX512-BF16 kernel (gemm_bf16.cc), forced through GemmBlocking::kernel ----

#define SKIP_WITHOUT_BF16()                                         \
  if (!gemm_bf16_supported())                                       \
  GTEST_SKIP() << "this CPU has no AVX512-BF16 (" << simd_summary() \
               << "): the bf16 dot-product kernel cannot run here"

// Every way an operand reaches the kernel: bf16 in memory, f32 rounded while packed, each
// transpose (depth-contiguous or not: the two packing routes), odd depths (a half-empty last
// pair), sizes around the 8 x 32 tile and the 16-wide packing groups.
TEST(GemmBf16, AllTransposesTypesOddSizes) {
  SKIP_WITHOUT_BF16();
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (int64_t s : {1, 3, 8, 17, 33, 65})
        for (int form = 0; form < 3; ++form) {
          Case c;
          c.ta = ta, c.tb = tb, c.m = s, c.n = s + 2, c.k = s + 1;
          c.blocking.kernel = GemmKernel::bf16_dot;
          if (form == 0) c.a_type = c.b_type = DType::bf16;
          if (form == 1) c.round_bf16 = true;
          if (form == 2) c.a_type = DType::bf16, c.round_bf16 = true;
          check_case(c);
        }
}

TEST(GemmBf16, BlocksThreadsBiasAccumulateStrides) {
  SKIP_WITHOUT_BF16();
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (int threads : {1, 2, 3}) {
        Case c;
        c.ta = ta, c.tb = tb, c.m = 131, c.n = 97, c.k = 257, c.threads = threads;
        c.round_bf16 = true, c.bias = threads != 2, c.accumulate = threads != 1;
        c.pad = threads == 3 ? 5 : 0, c.offset = threads == 2 ? 1 : 0;
        c.blocking.kernel = GemmKernel::bf16_dot;
        check_case(c);
        c.blocking = GemmBlocking{12, 37, 48, GemmKernel::bf16_dot};  // kc rounds up to 38
        check_case(c);
      }
}

TEST(GemmBf16, BitIdenticalAcrossThreadsAndBlocking) {
  SKIP_WITHOUT_BF16();
  expect_bit_identical(true, {GemmBlocking{0, 0, 0, GemmKernel::bf16_dot},
                              GemmBlocking{8, 0, 32, GemmKernel::bf16_dot},
                              GemmBlocking{64, 0, 96, GemmKernel::bf16_dot}});
}

// The automatic choice: bf16 compute above the small-M rows takes the bf16 kernel exactly where
// the CPU has it, and then gives the forced kernel's bits.
TEST(GemmBf16, AutomaticChoice) {
  EXPECT_EQ(gemm_kernel_for(false, 256), GemmKernel::f32_fma);
  EXPECT_EQ(gemm_kernel_for(true, 4), GemmKernel::f32_fma);
  EXPECT_EQ(gemm_kernel_for(true, 256),
            gemm_bf16_supported() ? GemmKernel::bf16_dot : GemmKernel::f32_fma);
  EXPECT_NE(gemm_kernel_name(GemmKernel::f32_fma).find("f32 FMA"), std::string::npos);
  SKIP_WITHOUT_BF16();
  Case c;
  c.tb = Trans::T, c.m = 40, c.n = 70, c.k = 90, c.round_bf16 = true, c.threads = 2;
  const Operands o = make_operands(c, 4);
  std::vector<float> automatic = o.c0, forced = o.c0;
  ThreadPool pool(2);
  gemm(pool, make_args(c, o, automatic.data()));
  gemm_blocked(pool, make_args(c, o, forced.data()), GemmBlocking{0, 0, 0, GemmKernel::bf16_dot});
  EXPECT_EQ(automatic, forced);
}

TEST(GemmBf16, RefusesWhatItCannotCompute) {
  Case c;
  c.m = c.n = c.k = 8;
  const Operands o = make_operands(c, 2);
  std::vector<float> out = o.c0;
  ThreadPool pool(1);
  // f32 operands without round_bf16 must not be rounded silently.
  EXPECT_THROW(
      gemm_blocked(pool, make_args(c, o, out.data()), GemmBlocking{0, 0, 0, GemmKernel::bf16_dot}),
      Error);
  c.round_bf16 = true;
  if (gemm_bf16_supported()) return;
  try {
    gemm_blocked(pool, make_args(c, o, out.data()), GemmBlocking{0, 0, 0, GemmKernel::bf16_dot});
    ADD_FAILURE() << "forcing the bf16 kernel on a CPU without AVX512-BF16 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AVX512-BF16"), std::string::npos) << e.what();
  }
}

TEST(Gemm, RejectsBadInput) {
  ThreadPool pool(1);
  float a = 1, b = 1, c = 0;
  GemmArgs g;
  g.m = g.n = g.k = 1, g.a = &a, g.b = &b, g.c = &c, g.lda = g.ldb = g.ldc = 1;
  g.a_type = DType::q8_0;
  EXPECT_THROW(gemm(pool, g), Error);
  EXPECT_THROW(ref::gemm(g), Error);
  g.a_type = DType::f32, g.m = -1;
  EXPECT_THROW(gemm(pool, g), Error);
  g.m = 1, g.c = nullptr;
  EXPECT_THROW(gemm(pool, g), Error);
}

TEST(ConvertBf16, MatchesScalarConversion) {
  std::vector<float> src;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int i = 0; i < 300001; ++i) src.push_back(u(rng));
  // Ties (bit 16 set or clear with exactly 0x8000 below), infinities, NaN and zero.
  src.push_back(bf16_to_f32(0x3f81) + std::ldexp(1.0f, -8) * 0.5f);
  src.push_back(1.0f + std::ldexp(1.0f, -8));
  src.push_back(INFINITY), src.push_back(-INFINITY), src.push_back(NAN), src.push_back(-0.0f);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<uint16_t> dst(src.size() + 1, 0xdead);
    convert_f32_to_bf16(pool, dst.data(), src.data(), static_cast<int64_t>(src.size()));
    for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(dst[i], f32_to_bf16(src[i])) << i;
    EXPECT_EQ(dst.back(), 0xdead);
  }
}

}  // namespace
}  // namespace tessera::cpu
