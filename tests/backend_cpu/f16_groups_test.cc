// The matmul against f16x16 weights (f16 rows interleaved in groups of 16, core/interleave.h):
// the AVX2 kernel and the packed route against the reference on the plain rows (within the f32
// rounding bound), the packed route equal to plain f16's bit for bit on every SIMD target,
// results independent of batch size, threads and grouping (the refusal of rows not in 16s is
// with the other layouts' in quant_interleaved_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/interleave.h"
#include "hwy/targets.h"
#include "kernel_test_util.h"

namespace tessera {
namespace {

using test::Buf;
using test::kEpsF;
using test::normal_buf;
using test::pool;

// W (N,K) in f16 from Gaussian data, the same matrix as f16x16, and W widened.
struct F16Pair {
  std::vector<uint8_t> plain, groups;
  std::vector<float> wide;
  F16Pair(int64_t N, int64_t K, uint64_t seed) {
    const Buf src = normal_buf(N * K, 0, seed, 0.1f);
    plain.resize(static_cast<size_t>(dtype_bytes(DType::f16, N * K)));
    from_f32(DType::f16, src.p, plain.data(), N * K);
    groups = plain;
    interleave_rows(DType::f16, groups.data(), N, K);
    wide.resize(static_cast<size_t>(N * K));
    to_f32(DType::f16, plain.data(), wide.data(), N * K);
  }
};

TEST(F16Groups, KernelAndPackedRouteMatchTheReferenceOnPlainRows) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2: f16x16 is not made";
  for (int64_t M : {1, 2, 3, 4, 5, 9, 63, 64, 200})  // below 64 the kernel, from 64 packed
    for (int64_t K : {1, 7, 96, 576})
      for (int64_t N : {16, 48}) {
        if (M > 9 && K == 1) continue;
        const F16Pair w(N, K, 3 + M + K + N);
        const Buf x = normal_buf(M * K, 1, 40 + M), bias = normal_buf(N, 0, 41);
        const int64_t ldy = N + 3;
        std::vector<float> y(static_cast<size_t>(M * ldy), -7.0f), yr(y), yi(y);
        cpu::matmul_wt(pool(2), y.data(), ldy, x.p, M, K, w.groups.data(), DType::f16x16, N,
                       bias.p);
        cpu::ref::matmul_wt(yr.data(), ldy, x.p, M, K, w.plain.data(), DType::f16, N, bias.p);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            double sum = std::fabs(bias[n]);
            for (int64_t k = 0; k < K; ++k) sum += std::fabs(x[m * K + k] * w.wide[n * K + k]);
            ASSERT_NEAR(y[m * ldy + n], yr[m * ldy + n], (K + 4) * kEpsF * sum + 1e-30)
                << "M=" << M << " K=" << K << " N=" << N << " m=" << m << " n=" << n;
          }
          for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -7.0f) << "padding";
        }
        // The reference reads the groups too (row by row, back in plain form).
        cpu::ref::matmul_wt(yi.data(), ldy, x.p, M, K, w.groups.data(), DType::f16x16, N, bias.p);
        ASSERT_EQ(0, std::memcmp(yi.data(), yr.data(), yr.size() * 4)) << "M=" << M;
      }
}

TEST(F16Groups, RowsDoNotDependOnBatchThreadsOrGrouping) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2: f16x16 is not made";
  const int64_t K = 96, N = 48;
  const F16Pair w(N, K, 17);
  for (int64_t M : {7, 130}) {  // the kernel, the packed route
    const Buf x = normal_buf(M * K, 0, 18);
    std::vector<float> y1(static_cast<size_t>(M * N)), y2(y1), y3(y1);
    cpu::matmul_wt(pool(1), y1.data(), N, x.p, M, K, w.groups.data(), DType::f16x16, N, nullptr);
    cpu::matmul_wt(pool(2), y2.data(), N, x.p, M, K, w.groups.data(), DType::f16x16, N, nullptr);
    cpu::matmul_wt(pool(3), y3.data(), N, x.p, M, K, w.groups.data(), DType::f16x16, N, nullptr);
    ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "M=" << M;
    ASSERT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * 4)) << "M=" << M;
    if (M > 7) continue;
    for (int64_t m = 0; m < M; ++m) {  // each row alone, as a decode step computes it
      std::vector<float> one(static_cast<size_t>(N));
      cpu::matmul_wt(pool(2), one.data(), N, x.p + m * K, 1, K, w.groups.data(), DType::f16x16, N,
                     nullptr);
      ASSERT_EQ(0, std::memcmp(one.data(), y1.data() + m * N, N * 4)) << "row " << m;
    }
  }
  // Grouped with another product of the same x: the same bits as alone.
  const F16Pair w2(32, K, 19);
  const Buf x = normal_buf(3 * K, 0, 20);
  std::vector<float> a(3 * N), b(3 * 32), a1(a), b1(b);
  const ops::WtProduct products[] = {{a.data(), N, w.groups.data(), DType::f16x16, N, nullptr},
                                     {b.data(), 32, w2.groups.data(), DType::f16x16, 32, nullptr}};
  cpu::matmul_wt_group(pool(2), x.p, 3, K, products, 2);
  cpu::matmul_wt(pool(2), a1.data(), N, x.p, 3, K, w.groups.data(), DType::f16x16, N, nullptr);
  cpu::matmul_wt(pool(2), b1.data(), 32, x.p, 3, K, w2.groups.data(), DType::f16x16, 32, nullptr);
  EXPECT_EQ(a, a1);
  EXPECT_EQ(b, b1);
}

// The packed route multiplies the same widened values in the same order as plain f16's: on AVX2
// the micro-kernel reads the groups in place, on other targets they are widened into panels of
// that target's width (80 columns: a partial 32-column panel on AVX-512). Depth blocks of 37
// start mid-group.
TEST(F16Groups, PackedRouteEqualsPlainF16BitForBitOnEveryTarget) {
  const int64_t K = 320;
  int tested = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (int64_t N : {48, 80})
      for (int64_t M : {7, 300})
        for (int64_t kc : {0, 37}) {
          const F16Pair w(N, K, 5 + M + N);
          const Buf x = normal_buf(M * K, 0, 6), bias = normal_buf(N, 0, 7);
          std::vector<float> y(static_cast<size_t>(M * N)), yp(y);
          const cpu::GemmBlocking blk{0, kc, 0};
          cpu::gemm_wt_blocked(pool(2), y.data(), N, x.p, M, K, w.groups.data(), DType::f16x16, N,
                               bias.p, blk);
          cpu::gemm_wt_blocked(pool(2), yp.data(), N, x.p, M, K, w.plain.data(), DType::f16, N,
                               bias.p, blk);
          ASSERT_EQ(0, std::memcmp(y.data(), yp.data(), y.size() * 4))
              << "N=" << N << " M=" << M << " kc=" << kc;
        }
    ++tested;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(tested, 1);
}

}  // namespace
}  // namespace tessera
