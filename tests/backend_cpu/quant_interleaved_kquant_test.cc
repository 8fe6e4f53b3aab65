// The row-interleaved q4_kx8, q5_kx8 and q6_kx8 layouts: conversion both ways, their AVX512-VNNI
// kernels (and the plain k-quant tiles they fall back to when those are off) against the reference
// on the plain rows within a rounding bound, results independent of batch size, threads and
// grouping, the integer edges, NaN propagation (the loader's choice of layout:
// tests/model/cpu_layout_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_act.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/interleave.h"
#include "kernel_sets.h"
#include "kernel_test_util.h"
#include "test_util/expect_error.h"

namespace tessera {
namespace {

using test::Buf;
using test::kEpsF;
using test::normal_buf;
using test::pool;

constexpr DType kPlainTypes[] = {DType::q4_k, DType::q5_k, DType::q6_k};

// W (N, K) of plain type t (q4_K, Q5_K or Q6_K) from Gaussian data, the same matrix interleaved,
// W as f32 and each element's offset term (what a kernel subtracts apart from d * sc_j * q):
// dmin * m_j, or Q6_K's d * sc_g * 32.
struct KPair {
  DType plain, x8;
  std::vector<uint8_t> p, i;
  std::vector<float> deq, mins;
  KPair(DType t, int64_t N, int64_t K, uint64_t seed) : plain(t), x8(interleaved_type(t)) {
    const Buf src = normal_buf(N * K, 0, seed);
    p.resize(static_cast<size_t>(dtype_bytes(t, N * K)));
    from_f32(t, src.p, p.data(), N * K);
    i = p;
    interleave_rows(t, i.data(), N, K);
    deq.resize(static_cast<size_t>(N * K));
    to_f32(t, p.data(), deq.data(), N * K);
    mins.resize(deq.size());
    const int64_t bb = traits(t).block_bytes;
    if (t == DType::q6_k) {
      const auto* blocks = reinterpret_cast<const BlockQ6K*>(p.data());
      for (int64_t b = 0; b < N * K / kQK_K; ++b)
        for (int e = 0; e < kQK_K; ++e)
          mins[static_cast<size_t>(b * kQK_K + e)] =
              32.0f * f16_to_f32(blocks[b].d) * static_cast<float>(blocks[b].scales[e / 16]);
      return;
    }
    // q4_K and Q5_K blocks both start d, dmin, scales[12].
    for (int64_t b = 0; b < N * K / kQK_K; ++b) {
      const uint8_t* blk = p.data() + b * bb;
      uint16_t dmin;
      std::memcpy(&dmin, blk + 2, 2);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        q4_k_scale_min(blk + 4, j, &sc, &m);
        for (int e = 0; e < 32; ++e)
          mins[static_cast<size_t>(b * kQK_K + 32 * j + e)] = f16_to_f32(dmin) * m;
      }
    }
  }
};

// Kernel and reference add the same exact integer sums times the same scales and differ only in
// where f32 rounds (per-lane sums of two terms per super-block, then 4 lanes): at most
// (4 nb + 16) eps times the sum of |term|, |term| <= sum (|w| + 2 |min|) |xhat|.
std::vector<double> bound(const KPair& w, const float* x, int64_t M, int64_t K, int64_t N) {
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

// fn once with the plain-tile fallback (AVX512-VNNI switched off), then with the VNNI kernels
// where the CPU has them (kernel_sets.h).
template <class Fn>
void for_each_kernel_set(Fn fn) {
  test::for_each_kernel_set("plain tiles on plain copies", "AVX512-VNNI interleaved kernels", fn);
}

TEST(QuantInterleavedKQuant, LayoutRoundTripsRowByRow) {
  for (DType t : kPlainTypes) {
    const int64_t N = 16, K = 512;
    const KPair w(t, N, K, 7);
    const int64_t row_bytes = dtype_bytes(t, K), bb = traits(t).block_bytes;
    ASSERT_NE(0, std::memcmp(w.p.data(), w.i.data(), w.p.size())) << "nothing was rearranged";
    std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
    for (int64_t n = 0; n < N; ++n) {
      deinterleave_row(w.x8, w.i.data(), K, n, row.data());
      ASSERT_EQ(0, std::memcmp(row.data(), w.p.data() + n * row_bytes, row.size()))
          << dtype_name(t) << " row " << n;
      // One super-block, the second of the row.
      deinterleave_blocks(w.x8, w.i.data(), K, n, 1, 1, row.data());
      ASSERT_EQ(0, std::memcmp(row.data(), w.p.data() + n * row_bytes + bb, bb)) << dtype_name(t);
    }
    EXPECT_EQ(plain_type(w.x8), t);
    std::vector<uint8_t> odd(static_cast<size_t>(dtype_bytes(t, 12 * K)));
    test::expect_error([&] { interleave_rows(t, odd.data(), 12, K); }, "12 rows");
    test::expect_error([&] { interleave_rows(t, odd.data(), 8, 300); }, "300");
  }
  EXPECT_EQ(interleaved_type(DType::q4_k), DType::q4_kx8);
  EXPECT_EQ(interleaved_type(DType::q5_k), DType::q5_kx8);
  EXPECT_EQ(interleaved_type(DType::q6_k), DType::q6_kx8);
}

TEST(QuantInterleavedKQuant, KernelsMatchReferenceOnPlainRows) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  for_each_kernel_set([] {
    for (DType t : kPlainTypes)
      for (int64_t M : {1, 2, 3, 4, 5, 9, 70})  // 70: a row block of 64 and a tail
        for (int64_t K : {256, 768})
          for (int64_t N : {8, 24}) {
            const KPair w(t, N, K, 11 + M + K + N);
            const Buf x = normal_buf(M * K, 1, 40 + M), bias = normal_buf(N, 0, 41);
            const int64_t ldy = N + 3;
            std::vector<float> y(static_cast<size_t>(M * ldy), -7.0f), yr(y);
            cpu::matmul_wt(pool(2), y.data(), ldy, x.p, M, K, w.i.data(), w.x8, N, bias.p);
            cpu::ref::matmul_wt(yr.data(), ldy, x.p, M, K, w.p.data(), t, N, bias.p);
            const auto tol = bound(w, x.p, M, K, N);
            for (int64_t m = 0; m < M; ++m) {
              for (int64_t n = 0; n < N; ++n)
                ASSERT_NEAR(y[m * ldy + n], yr[m * ldy + n],
                            tol[m * N + n] + 4 * kEpsF * std::fabs(bias[n]))
                    << dtype_name(w.x8) << " M=" << M << " K=" << K << " N=" << N << " m=" << m
                    << " n=" << n;
              for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -7.0f) << "padding";
            }
          }
  });
}

TEST(QuantInterleavedKQuant, Avx512KernelIsTakenWherePresent) {
  cpu::set_quant_avx512_vnni_allowed(true);
  if (!cpu::quant_avx512_vnni_active()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  // The kernel sums per lane, the plain tiles per row: on random data some outputs differ in
  // their last bits, so the switch reaches the kernel.
  const int64_t M = 5, K = 512, N = 32;
  for (DType t : kPlainTypes) {
    const KPair w(t, N, K, 3);
    const Buf x = normal_buf(M * K, 1, 4);
    std::vector<float> y(static_cast<size_t>(M * N)), y2(y);
    cpu::matmul_wt(pool(1), y.data(), N, x.p, M, K, w.i.data(), w.x8, N, nullptr);
    cpu::set_quant_avx512_vnni_allowed(false);
    cpu::matmul_wt(pool(1), y2.data(), N, x.p, M, K, w.i.data(), w.x8, N, nullptr);
    cpu::set_quant_avx512_vnni_allowed(true);
    EXPECT_NE(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << dtype_name(t);
  }
}

TEST(QuantInterleavedKQuant, ResultsDoNotDependOnBatchThreadsOrGrouping) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  for_each_kernel_set([] {
    const int64_t M = 11, K = 512, N = 40;  // 11: a full pass of 8 rows and a tail of 3
    for (DType t : kPlainTypes) {
      const KPair w(t, N, K, 91), w2(t, 16, K, 93);
      const Buf x = normal_buf(M * K, 0, 92);
      std::vector<float> y(static_cast<size_t>(M * N)), y1(static_cast<size_t>(N)), y3(y);
      cpu::matmul_wt(pool(2), y.data(), N, x.p, M, K, w.i.data(), w.x8, N, nullptr);
      cpu::matmul_wt(pool(3), y3.data(), N, x.p, M, K, w.i.data(), w.x8, N, nullptr);
      ASSERT_EQ(0, std::memcmp(y.data(), y3.data(), y.size() * 4)) << dtype_name(t);
      for (int64_t m = 0; m < M; ++m) {
        cpu::matmul_wt(pool(1), y1.data(), N, x.p + m * K, 1, K, w.i.data(), w.x8, N, nullptr);
        ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + m * N, N * 4))
            << dtype_name(t) << " m=" << m;
      }
      // Decode-sized rows grouped with another product (q/k/v style): the same bits as alone.
      for (int64_t rows : {int64_t{1}, M}) {
        std::vector<float> g(static_cast<size_t>(rows * N)), g2(static_cast<size_t>(rows * 16));
        const ops::WtProduct products[] = {{g.data(), N, w.i.data(), w.x8, N, nullptr},
                                           {g2.data(), 16, w2.i.data(), w2.x8, 16, nullptr}};
        cpu::matmul_wt_group(pool(2), x.p, rows, K, products, 2);
        ASSERT_EQ(0, std::memcmp(g.data(), y.data(), g.size() * 4))
            << dtype_name(t) << " rows=" << rows;
      }
    }
  });
}

TEST(QuantInterleavedKQuant, IntegerEdgesAreExactAndNaNPropagates) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  for_each_kernel_set([] {
    // Every byte 0xff but d = dmin = 1: every scale and min 63, every quant 15 (Q5_K, with all
    // fifth bits set: 31), so each weight is 63 * 15 - 63 = 882 (63 * 31 - 63 = 1890); with
    // x = 127 the int16 sums of two runs reach 2 * 2 * 15 * 127 = 7620 (15748). Q6_K: every
    // quant 63 (pair sums 2 * 63 * 127 = 16002) and every scale -1: each weight -31.
    const int64_t K = kQK_K, N = 8;
    for (DType t : kPlainTypes) {
      std::vector<uint8_t> w(static_cast<size_t>(dtype_bytes(t, N * K)), 0xff);
      const uint16_t one = 0x3c00;
      for (int64_t b = 0; b < N; ++b) {
        uint8_t* blk = w.data() + b * traits(t).block_bytes;
        if (t == DType::q6_k) {
          std::memcpy(blk + offsetof(BlockQ6K, d), &one, 2);
        } else {
          std::memcpy(blk, &one, 2);
          std::memcpy(blk + 2, &one, 2);
        }
      }
      std::vector<uint8_t> wi = w;
      interleave_rows(t, wi.data(), N, K);
      std::vector<float> x(static_cast<size_t>(2 * K), 127.0f), y(2 * N), yr(2 * N);
      x[K + 5] = std::numeric_limits<float>::quiet_NaN();
      cpu::matmul_wt(pool(1), y.data(), N, x.data(), 2, K, wi.data(), interleaved_type(t), N,
                     nullptr);
      cpu::ref::matmul_wt(yr.data(), N, x.data(), 2, K, w.data(), t, N, nullptr);
      const float weight = t == DType::q4_k ? 882.0f : t == DType::q5_k ? 1890.0f : -31.0f;
      for (int64_t n = 0; n < N; ++n) {
        EXPECT_EQ(y[n], weight * 127 * K) << dtype_name(t) << " n=" << n;
        EXPECT_EQ(y[n], yr[n]);
        EXPECT_TRUE(std::isnan(y[N + n])) << dtype_name(t) << " n=" << n;
      }
    }
  });
}

TEST(QuantInterleavedKQuant, PackedRouteEqualsPlainLayoutBitForBit) {
  // cpu::matmul_wt keeps these layouts on their kernel, but the packed GEMM stays callable: it
  // widens the interleaved rows to the same values as the plain ones.
  const int64_t K = 768, N = 24;
  for (DType t : kPlainTypes)
    for (int64_t M : {7, 130}) {
      const KPair w(t, N, K, 5 + M);
      const Buf x = normal_buf(M * K, 0, 6);
      std::vector<float> y(static_cast<size_t>(M * N)), yp(y);
      cpu::gemm_wt(pool(2), y.data(), N, x.p, M, K, w.i.data(), w.x8, N, nullptr);
      cpu::gemm_wt(pool(2), yp.data(), N, x.p, M, K, w.p.data(), t, N, nullptr);
      ASSERT_EQ(0, std::memcmp(y.data(), yp.data(), y.size() * 4)) << dtype_name(t) << " M=" << M;
    }
}

}  // namespace
}  // namespace tessera
