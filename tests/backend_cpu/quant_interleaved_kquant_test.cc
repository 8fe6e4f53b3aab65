// The row-interleaved q4_kx8 layout: conversion both ways, its AVX512-VNNI kernel (and the plain
// q4_K tiles it falls back to when those are off) against the reference on the plain rows within
// a rounding bound, results independent of batch size, threads and grouping, the integer edges,
// NaN propagation (the loader's choice of layout: tests/model/cpu_layout_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_act.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/interleave.h"
#include "kernel_test_util.h"
#include "test_util/expect_error.h"

namespace tessera {
namespace {

using test::Buf;
using test::kEpsF;
using test::normal_buf;
using test::pool;

// W (N, K) as q4_K from Gaussian data, the same matrix as q4_kx8, W as f32 and each element's
// min term dmin * m_j (what a kernel subtracts apart from d * sc_j * q).
struct Q4KPair {
  std::vector<uint8_t> p, i;
  std::vector<float> deq, mins;
  Q4KPair(int64_t N, int64_t K, uint64_t seed) {
    const Buf src = normal_buf(N * K, 0, seed);
    p.resize(static_cast<size_t>(dtype_bytes(DType::q4_k, N * K)));
    from_f32(DType::q4_k, src.p, p.data(), N * K);
    i = p;
    interleave_rows(DType::q4_k, i.data(), N, K);
    deq.resize(static_cast<size_t>(N * K));
    to_f32(DType::q4_k, p.data(), deq.data(), N * K);
    mins.resize(deq.size());
    const auto* blocks = reinterpret_cast<const BlockQ4K*>(p.data());
    for (int64_t b = 0; b < N * K / kQK_K; ++b)
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        q4_k_scale_min(blocks[b].scales, j, &sc, &m);
        for (int e = 0; e < 32; ++e)
          mins[static_cast<size_t>(b * kQK_K + 32 * j + e)] = f16_to_f32(blocks[b].dmin) * m;
      }
  }
};

// Kernel and reference add the same exact integer sums times the same scales and differ only in
// where f32 rounds (per-lane sums of two terms per super-block, then 4 lanes): at most
// (4 nb + 16) eps times the sum of |term|, |term| <= sum (|w| + 2 |min|) |xhat|.
std::vector<double> bound(const Q4KPair& w, const float* x, int64_t M, int64_t K, int64_t N) {
  std::vector<int16_t> q(static_cast<size_t>(M * K));
  std::vector<float> d(static_cast<size_t>(M * K / kQK_K));
  std::vector<int32_t> s(static_cast<size_t>(M * K / 32));
  cpu::QuantizedActs qa;
  qa.M = M, qa.K = K, qa.block = kQK_K, qa.q = q.data(), qa.d = d.data(), qa.sum32 = s.data();
  cpu::quantize_act_rows(x, qa, 0, M);
  std::vector<double> tol(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double xhat = d[(m * K + k) / kQK_K] * q[m * K + k];
        sum += (std::fabs(w.deq[n * K + k]) + 2 * std::fabs(w.mins[n * K + k])) * std::fabs(xhat);
      }
      tol[m * N + n] = (4.0 * K / kQK_K + 16) * kEpsF * sum + 1e-30;
    }
  return tol;
}

// fn once with the plain-tile fallback (AVX512-VNNI switched off), then with the VNNI kernel
// where the CPU has it.
template <class Fn>
void for_each_kernel_set(Fn fn) {
  cpu::set_quant_avx512_vnni_allowed(false);
  {
    SCOPED_TRACE("q4_K tiles on plain copies");
    fn();
  }
  cpu::set_quant_avx512_vnni_allowed(true);
  if (cpu::quant_avx512_vnni_active()) {
    SCOPED_TRACE("AVX512-VNNI q4_kx8 kernel");
    fn();
  }
}

TEST(QuantInterleavedQ4K, LayoutRoundTripsRowByRow) {
  const int64_t N = 16, K = 512;
  const Q4KPair w(N, K, 7);
  const int64_t row_bytes = dtype_bytes(DType::q4_k, K);
  ASSERT_NE(0, std::memcmp(w.p.data(), w.i.data(), w.p.size())) << "nothing was rearranged";
  std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
  for (int64_t n = 0; n < N; ++n) {
    deinterleave_row(DType::q4_kx8, w.i.data(), K, n, row.data());
    ASSERT_EQ(0, std::memcmp(row.data(), w.p.data() + n * row_bytes, row.size())) << "row " << n;
    // One super-block, the second of the row.
    deinterleave_blocks(DType::q4_kx8, w.i.data(), K, n, 1, 1, row.data());
    ASSERT_EQ(0, std::memcmp(row.data(), w.p.data() + n * row_bytes + sizeof(BlockQ4K),
                             sizeof(BlockQ4K)));
  }
  EXPECT_EQ(plain_type(DType::q4_kx8), DType::q4_k);
  EXPECT_EQ(interleaved_type(DType::q4_k), DType::q4_kx8);
  std::vector<uint8_t> odd(static_cast<size_t>(dtype_bytes(DType::q4_k, 12 * K)));
  test::expect_error([&] { interleave_rows(DType::q4_k, odd.data(), 12, K); }, "12 rows");
  test::expect_error([&] { interleave_rows(DType::q4_k, odd.data(), 8, 300); }, "300");
}

TEST(QuantInterleavedQ4K, KernelsMatchReferenceOnPlainRows) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  for_each_kernel_set([] {
    for (int64_t M : {1, 2, 3, 4, 5, 9, 70})  // 70: a row block of 64 and a tail
      for (int64_t K : {256, 768})
        for (int64_t N : {8, 24}) {
          const Q4KPair w(N, K, 11 + M + K + N);
          const Buf x = normal_buf(M * K, 1, 40 + M), bias = normal_buf(N, 0, 41);
          const int64_t ldy = N + 3;
          std::vector<float> y(static_cast<size_t>(M * ldy), -7.0f), yr(y);
          cpu::matmul_wt(pool(2), y.data(), ldy, x.p, M, K, w.i.data(), DType::q4_kx8, N, bias.p);
          cpu::ref::matmul_wt(yr.data(), ldy, x.p, M, K, w.p.data(), DType::q4_k, N, bias.p);
          const auto tol = bound(w, x.p, M, K, N);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n)
              ASSERT_NEAR(y[m * ldy + n], yr[m * ldy + n],
                          tol[m * N + n] + 4 * kEpsF * std::fabs(bias[n]))
                  << "M=" << M << " K=" << K << " N=" << N << " m=" << m << " n=" << n;
            for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -7.0f) << "padding";
          }
        }
  });
}

TEST(QuantInterleavedQ4K, Avx512KernelIsTakenWherePresent) {
  cpu::set_quant_avx512_vnni_allowed(true);
  if (!cpu::quant_avx512_vnni_active()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  // The kernel sums per lane, the plain tiles per row: on random data some outputs differ in
  // their last bits, so the switch reaches the kernel.
  const int64_t M = 5, K = 512, N = 32;
  const Q4KPair w(N, K, 3);
  const Buf x = normal_buf(M * K, 1, 4);
  std::vector<float> y(static_cast<size_t>(M * N)), y2(y);
  cpu::matmul_wt(pool(1), y.data(), N, x.p, M, K, w.i.data(), DType::q4_kx8, N, nullptr);
  cpu::set_quant_avx512_vnni_allowed(false);
  cpu::matmul_wt(pool(1), y2.data(), N, x.p, M, K, w.i.data(), DType::q4_kx8, N, nullptr);
  cpu::set_quant_avx512_vnni_allowed(true);
  EXPECT_NE(0, std::memcmp(y.data(), y2.data(), y.size() * 4));
}

TEST(QuantInterleavedQ4K, ResultsDoNotDependOnBatchThreadsOrGrouping) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  for_each_kernel_set([] {
    const int64_t M = 11, K = 512, N = 40;  // 11: two full passes of 4 rows and a tail of 3
    const Q4KPair w(N, K, 91), w2(16, K, 93);
    const Buf x = normal_buf(M * K, 0, 92);
    std::vector<float> y(static_cast<size_t>(M * N)), y1(static_cast<size_t>(N)), y3(y);
    cpu::matmul_wt(pool(2), y.data(), N, x.p, M, K, w.i.data(), DType::q4_kx8, N, nullptr);
    cpu::matmul_wt(pool(3), y3.data(), N, x.p, M, K, w.i.data(), DType::q4_kx8, N, nullptr);
    ASSERT_EQ(0, std::memcmp(y.data(), y3.data(), y.size() * 4));
    for (int64_t m = 0; m < M; ++m) {
      cpu::matmul_wt(pool(1), y1.data(), N, x.p + m * K, 1, K, w.i.data(), DType::q4_kx8, N,
                     nullptr);
      ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + m * N, N * 4)) << "m=" << m;
    }
    // Decode-sized rows grouped with another product (q/k/v style): the same bits as alone.
    for (int64_t rows : {int64_t{1}, M}) {
      std::vector<float> g(static_cast<size_t>(rows * N)), g2(static_cast<size_t>(rows * 16));
      const cpu::WtProduct products[] = {{g.data(), N, w.i.data(), DType::q4_kx8, N, nullptr},
                                         {g2.data(), 16, w2.i.data(), DType::q4_kx8, 16, nullptr}};
      cpu::matmul_wt_group(pool(2), x.p, rows, K, products, 2);
      ASSERT_EQ(0, std::memcmp(g.data(), y.data(), g.size() * 4)) << "rows=" << rows;
    }
  });
}

TEST(QuantInterleavedQ4K, IntegerEdgesAreExactAndNaNPropagates) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  for_each_kernel_set([] {
    // Every quant 15, every scale and min 63 (all scale bytes 0xff), d = dmin = 1: each weight is
    // 63 * 15 - 63 = 882; with x = 127 the int16 sums of two runs reach 2 * 2 * 15 * 127 = 7620.
    const int64_t K = kQK_K, N = 8;
    std::vector<uint8_t> w(static_cast<size_t>(dtype_bytes(DType::q4_k, N * K)), 0xff);
    auto* blocks = reinterpret_cast<BlockQ4K*>(w.data());
    for (int64_t b = 0; b < N; ++b) blocks[b].d = blocks[b].dmin = 0x3c00;
    std::vector<uint8_t> wi = w;
    interleave_rows(DType::q4_k, wi.data(), N, K);
    std::vector<float> x(static_cast<size_t>(2 * K), 127.0f), y(2 * N), yr(2 * N);
    x[K + 5] = std::numeric_limits<float>::quiet_NaN();
    cpu::matmul_wt(pool(1), y.data(), N, x.data(), 2, K, wi.data(), DType::q4_kx8, N, nullptr);
    cpu::ref::matmul_wt(yr.data(), N, x.data(), 2, K, w.data(), DType::q4_k, N, nullptr);
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_EQ(y[n], 882.0f * 127 * K) << "n=" << n;
      EXPECT_EQ(y[n], yr[n]);
      EXPECT_TRUE(std::isnan(y[N + n])) << "n=" << n;
    }
  });
}

TEST(QuantInterleavedQ4K, PackedRouteEqualsPlainLayoutBitForBit) {
  // cpu::matmul_wt keeps q4_kx8 on its kernel, but the packed GEMM stays callable: it widens the
  // interleaved rows to the same values as the plain ones.
  const int64_t K = 768, N = 24;
  for (int64_t M : {7, 130}) {
    const Q4KPair w(N, K, 5 + M);
    const Buf x = normal_buf(M * K, 0, 6);
    std::vector<float> y(static_cast<size_t>(M * N)), yp(y);
    cpu::gemm_wt(pool(2), y.data(), N, x.p, M, K, w.i.data(), DType::q4_kx8, N, nullptr);
    cpu::gemm_wt(pool(2), yp.data(), N, x.p, M, K, w.p.data(), DType::q4_k, N, nullptr);
    ASSERT_EQ(0, std::memcmp(y.data(), yp.data(), y.size() * 4)) << "M=" << M;
  }
}

}  // namespace
}  // namespace tessera
