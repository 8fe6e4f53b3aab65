// The matmul against row-interleaved q4_0x8 / q4_1x8 / q8_0x8 weights: each kernel set (AVX2, and
// AVX512-VNNI where the CPU has it) against the reference on the plain rows (within a rounding
// bound), the packed-GEMM route equal to the plain layout's bit for bit, results independent of
// batch size and thread count, NaN propagation, the integer edges, and one-line refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
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

// W (N,K) of plain type t from Gaussian data, and the same matrix interleaved.
struct Pair {
  DType plain, x8;
  std::vector<uint8_t> p, i;
  std::vector<float> deq, mins;  // W as f32, and each element's block min (q4_1; else 0)
  Pair(DType t, int64_t N, int64_t K, uint64_t seed) : plain(t), x8(interleaved_type(t)) {
    const Buf src = normal_buf(N * K, 0, seed);
    p.resize(static_cast<size_t>(dtype_bytes(t, N * K)));
    from_f32(t, src.p, p.data(), N * K);
    i = p;
    interleave_rows(t, i.data(), N, K);
    deq.resize(static_cast<size_t>(N * K));
    to_f32(t, p.data(), deq.data(), N * K);
    mins.assign(deq.size(), 0.0f);
    if (t == DType::q4_1)
      for (int64_t b = 0; b < N * K / 32; ++b) {
        uint16_t m;
        std::memcpy(&m, p.data() + b * sizeof(BlockQ4_1) + 2, 2);
        for (int j = 0; j < 32; ++j) mins[static_cast<size_t>(b * 32 + j)] = f16_to_f32(m);
      }
  }
};

// The kernel and the reference add the same exact block sums times the same scales, in block
// order, and differ only in where f32 rounds (an FMA against a product then an add): at most
// (2 nb + 8) eps times the sum of |term|, and |term| <= sum (|w| + 2 |min|) |xhat|.
std::vector<double> bound(const Pair& w, const float* x, int64_t M, int64_t K, int64_t N) {
  std::vector<int16_t> q(static_cast<size_t>(M * K));
  std::vector<float> d(static_cast<size_t>(M * K / 32));
  std::vector<int32_t> s(static_cast<size_t>(M * K / 32));
  cpu::QuantizedActs qa;
  qa.M = M, qa.K = K, qa.block = 32, qa.q = q.data(), qa.d = d.data(), qa.sum32 = s.data();
  cpu::quantize_act_rows(x, qa, 0, M);
  std::vector<double> tol(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double xhat = d[(m * K + k) / 32] * q[m * K + k];
        sum += (std::fabs(w.deq[n * K + k]) + 2 * std::fabs(w.mins[n * K + k])) * std::fabs(xhat);
      }
      tol[m * N + n] = (2.0 * K / 32 + 8) * kEpsF * sum + 1e-30;
    }
  return tol;
}

// fn once per kernel set this CPU has for the interleaved layouts (kernel_sets.h).
template <class Fn>
void for_each_kernel_set(Fn fn) {
  test::for_each_kernel_set("AVX2 kernels", "AVX512-VNNI kernels", fn);
}

TEST(QuantInterleaved, KernelsMatchReferenceOnPlainRows) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2: interleaved layouts are not made";
  for_each_kernel_set([] {
    for (DType t : {DType::q4_0, DType::q4_1, DType::q8_0})
      for (int64_t M : {1, 2, 3, 4, 5, 9, 70, 300})  // 70, 300: row blocks of 64; prefill sizes
        for (int64_t K : {32, 96, 576})
          for (int64_t N : {8, 24, 72}) {
            if (M > 9 && (K != 96 || N != 24)) continue;
            const Pair w(t, N, K, 11 + M + K + N);
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
            // The reference reads the interleaved matrix too (row by row, back in plain form).
            std::vector<float> yi(y.size(), -7.0f);
            cpu::ref::matmul_wt(yi.data(), ldy, x.p, M, K, w.i.data(), w.x8, N, bias.p);
            ASSERT_EQ(0, std::memcmp(yi.data(), yr.data(), yr.size() * 4)) << dtype_name(w.x8);
          }
  });
}

TEST(QuantInterleaved, Avx512VnniKernelsAreTakenWherePresent) {
  cpu::set_quant_avx512_vnni_allowed(true);
  if (!cpu::quant_avx512_vnni_active()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  // The two kernel sets round in different places (per-lane f32 sums against per-block ones),
  // so on random data some outputs differ in their last bits: the switch reaches the kernels.
  const int64_t M = 5, K = 576, N = 72;
  for (DType t : {DType::q4_0, DType::q4_1, DType::q8_0}) {
    const Pair w(t, N, K, 3);
    const Buf x = normal_buf(M * K, 1, 4);
    std::vector<float> y(static_cast<size_t>(M * N)), y2(y);
    cpu::matmul_wt(pool(1), y.data(), N, x.p, M, K, w.i.data(), w.x8, N, nullptr);
    cpu::set_quant_avx512_vnni_allowed(false);
    cpu::matmul_wt(pool(1), y2.data(), N, x.p, M, K, w.i.data(), w.x8, N, nullptr);
    cpu::set_quant_avx512_vnni_allowed(true);
    EXPECT_NE(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << dtype_name(t);
  }
}

TEST(QuantInterleaved, PackedRouteEqualsPlainLayoutBitForBit) {
  // The packed GEMM (which cpu::matmul_wt no longer picks for these layouts, but which stays
  // callable) widens W while packing; the interleaved rows widen to the same values, so the GEMM
  // gives the same bits.
  const int64_t K = 320, N = 48;
  for (DType t : {DType::q4_0, DType::q4_1, DType::q8_0})
    for (int64_t M : {7, 300}) {
      const Pair w(t, N, K, 5 + M);
      const Buf x = normal_buf(M * K, 0, 6);
      std::vector<float> y(static_cast<size_t>(M * N)), yp(y);
      cpu::gemm_wt(pool(2), y.data(), N, x.p, M, K, w.i.data(), w.x8, N, nullptr);
      cpu::gemm_wt(pool(2), yp.data(), N, x.p, M, K, w.p.data(), t, N, nullptr);
      ASSERT_EQ(0, std::memcmp(y.data(), yp.data(), y.size() * 4)) << dtype_name(t) << " M=" << M;
    }
}

TEST(QuantInterleaved, ResultsDoNotDependOnBatchOrThreads) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  for_each_kernel_set([] {
    const int64_t M = 11, K = 512, N = 40;  // 11: a full VNNI tile of 8 rows and a tail of 3
    for (DType t : {DType::q4_0, DType::q4_1, DType::q8_0}) {
      const Pair w(t, N, K, 91);
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
      // Grouped with another product (q/k/v style): the same bits as alone.
      std::vector<float> g(y.size()), g2(static_cast<size_t>(M * 16));
      const Pair w2(t, 16, K, 93);
      const ops::WtProduct products[] = {{g.data(), N, w.i.data(), w.x8, N, nullptr},
                                         {g2.data(), 16, w2.i.data(), w2.x8, 16, nullptr}};
      cpu::matmul_wt_group(pool(2), x.p, M, K, products, 2);
      ASSERT_EQ(0, std::memcmp(g.data(), y.data(), y.size() * 4)) << dtype_name(t);
    }
  });
}

TEST(QuantInterleaved, NonFiniteActivationsPropagateAndQuantsDoNotOverflow) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  for_each_kernel_set([] {
    const int64_t K = 128, N = 8;
    for (DType t : {DType::q4_0, DType::q4_1, DType::q8_0}) {
      // Every q4 quant 15, scales (and mins) 1: with x = 127 the pair sums reach 2 * 2 * 15 * 127.
      // Every q8_0 quant -128 (a file may hold it; the sign trick must not negate it): pair sums
      // 2 * 128 * 127 = 32512, the int16 edge.
      const int64_t bb = traits(t).block_bytes;
      std::vector<uint8_t> w(static_cast<size_t>(dtype_bytes(t, N * K)),
                             t == DType::q8_0 ? 0x80 : 0xff);
      for (int64_t b = 0; b < N * K / 32; ++b) {
        const uint16_t one = 0x3c00;
        std::memcpy(w.data() + b * bb, &one, 2);
        if (t == DType::q4_1) std::memcpy(w.data() + b * bb + 2, &one, 2);
      }
      std::vector<uint8_t> wi = w;
      interleave_rows(t, wi.data(), N, K);
      std::vector<float> x(static_cast<size_t>(2 * K), 127.0f), y(2 * N), yr(2 * N);
      x[K + 5] = std::numeric_limits<float>::quiet_NaN();
      cpu::matmul_wt(pool(1), y.data(), N, x.data(), 2, K, wi.data(), interleaved_type(t), N,
                     nullptr);
      cpu::ref::matmul_wt(yr.data(), N, x.data(), 2, K, w.data(), t, N, nullptr);
      const float want = t == DType::q4_0   ? 7.0f * 127 * K
                         : t == DType::q4_1 ? 16.0f * 127 * K
                                            : -128.0f * 127 * K;
      for (int64_t n = 0; n < N; ++n) {
        EXPECT_EQ(y[n], want) << dtype_name(t);
        EXPECT_EQ(y[n], yr[n]);
        EXPECT_TRUE(std::isnan(y[N + n])) << dtype_name(t) << " n=" << n;
      }
    }
  });
}

TEST(QuantInterleaved, BadShapesAndKernelsAreRefused) {
  std::vector<uint8_t> w(static_cast<size_t>(dtype_bytes(DType::q4_0, 12 * 64)));
  std::vector<float> x(64), y(12);
  test::expect_error(
      [&] {
        cpu::matmul_wt(pool(1), y.data(), 12, x.data(), 1, 64, w.data(), DType::q4_0x8, 12,
                       nullptr);
      },
      "N=12");
  test::expect_error(
      [&] {
        cpu::gemm_wt(pool(1), y.data(), 12, x.data(), 1, 64, w.data(), DType::q4_1x8, 12, nullptr);
      },
      "N=12");
  test::expect_error(
      [&] {
        cpu::matmul_wt_highway(pool(1), y.data(), 8, x.data(), 1, 64, w.data(), DType::q4_0x8, 8,
                               nullptr);
      },
      "AVX2");
  // Rows not a whole number of groups: 12 of q8_0x8 (groups of 8), 24 of f16x16 (groups of 16);
  // the buffer holds 24 rows of either.
  std::vector<uint8_t> w8(static_cast<size_t>(dtype_bytes(DType::f16, 24 * 64)));
  std::vector<float> y24(24);
  for (auto [t, N] : {std::pair{DType::q8_0x8, 12}, std::pair{DType::f16x16, 24}}) {
    const std::string want = "N=" + std::to_string(N);
    test::expect_error(
        [&] { cpu::matmul_wt(pool(1), y24.data(), N, x.data(), 1, 64, w8.data(), t, N, nullptr); },
        want);
    test::expect_error(
        [&] { cpu::gemm_wt(pool(1), y24.data(), N, x.data(), 1, 64, w8.data(), t, N, nullptr); },
        want);
  }
}

}  // namespace
}  // namespace tessera
