// Tests of matmul_w (dx = dy W against weights in their stored type, the backward of matmul_wt
// through its input): the SIMD kernel and the reference against a double product of the widened
// weights, for every weight type, panel edges, strides and accumulation; an interleaved CPU
// layout gives the plain layout's result; bad arguments are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/interleave.h"
#include "kernel_test_util.h"
#include "ops/quant.h"
#include "test_util/expect_error.h"

namespace tessera::cpu {
namespace {

constexpr DType kTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0,
                            DType::q4_1, DType::q5_0, DType::q4_k, DType::q6_k};

struct Case {
  int64_t M, N, K, ldx;
};

// dx (M,K) = [dx +] dy (M,N) W (N,K) in double over the widened weights.
std::vector<double> oracle(const std::vector<float>& dy, const std::vector<float>& w,
                           const std::vector<float>& dx0, const Case& c, bool acc) {
  std::vector<double> out(static_cast<size_t>(c.M * c.K));
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t k = 0; k < c.K; ++k) {
      double s = acc ? dx0[static_cast<size_t>(i * c.ldx + k)] : 0.0;
      for (int64_t j = 0; j < c.N; ++j) s += double{dy[i * c.N + j]} * w[j * c.K + k];
      out[static_cast<size_t>(i * c.K + k)] = s;
    }
  return out;
}

TEST(MatmulW, MatchesDoubleProductForEveryTypeOverPanelsStridesAndAccumulation) {
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t block = traits(t).block_elems;
    // N past one panel of 256 rows with a ragged last panel; K a few blocks; ldx > K.
    for (Case c : {Case{1, 3, block, block}, Case{5, 300, 2 * std::max<int64_t>(block, 32), 80},
                   Case{67, 513, std::max<int64_t>(block, 64), 300}}) {
      c.ldx = std::max(c.ldx, c.K);
      SCOPED_TRACE(testing::Message() << "M=" << c.M << " N=" << c.N << " K=" << c.K);
      std::vector<float> src(static_cast<size_t>(c.N * c.K)), wide(src.size());
      test::fill_normal(src.data(), c.N * c.K, 3, 0.05f);
      std::vector<uint8_t> stored(static_cast<size_t>(c.N * dtype_bytes(t, c.K)));
      from_f32(t, src.data(), stored.data(), c.N * c.K);
      to_f32(t, stored.data(), wide.data(), c.N * c.K);
      std::vector<float> dy(static_cast<size_t>(c.M * c.N)), dx0(static_cast<size_t>(c.M * c.ldx));
      test::fill_normal(dy.data(), c.M * c.N, 5, 1.0f);
      test::fill_normal(dx0.data(), c.M * c.ldx, 7, 1.0f);
      for (bool acc : {false, true}) {
        const std::vector<double> want = oracle(dy, wide, dx0, c, acc);
        std::vector<float> fast = dx0, ref_out = dx0;
        matmul_w(test::pool(2), fast.data(), c.ldx, dy.data(), c.M, c.N, stored.data(), t, c.K,
                 acc);
        ref::matmul_w(ref_out.data(), c.ldx, dy.data(), c.M, c.N, stored.data(), t, c.K, acc);
        double worst = 0;
        for (int64_t i = 0; i < c.M; ++i)
          for (int64_t k = 0; k < c.K; ++k) {
            const double w = want[static_cast<size_t>(i * c.K + k)];
            // f32 accumulation of N terms of size ~0.05: N eps bounds the error.
            const double tol = 1e-6 * static_cast<double>(c.N) + 1e-5 * std::abs(w);
            const size_t at = static_cast<size_t>(i * c.ldx + k);
            worst = std::max(worst, std::abs(fast[at] - w) / tol);
            worst = std::max(worst, std::abs(ref_out[at] - w) / tol);
          }
        EXPECT_LE(worst, 1.0) << "accumulate=" << acc;
        // Past K in each row: untouched.
        int64_t touched = 0;
        for (int64_t i = 0; i < c.M; ++i)
          for (int64_t k = c.K; k < c.ldx; ++k)
            touched +=
                fast[static_cast<size_t>(i * c.ldx + k)] != dx0[static_cast<size_t>(i * c.ldx + k)];
        EXPECT_EQ(touched, 0);
      }
    }
  }
}

// The interleaved layout the CPU engine keeps (q4_0x8) reads as its plain layout.
TEST(MatmulW, InterleavedLayoutGivesThePlainResult) {
  const int64_t M = 9, N = 64, K = 128;
  std::vector<float> src(static_cast<size_t>(N * K));
  test::fill_normal(src.data(), N * K, 9, 0.05f);
  std::vector<uint8_t> plain(static_cast<size_t>(N * dtype_bytes(DType::q4_0, K)));
  from_f32(DType::q4_0, src.data(), plain.data(), N * K);
  std::vector<uint8_t> inter = plain;
  interleave_rows(DType::q4_0, inter.data(), N, K);
  std::vector<float> dy(static_cast<size_t>(M * N));
  test::fill_normal(dy.data(), M * N, 1, 1.0f);
  std::vector<float> a(static_cast<size_t>(M * K)), b(a.size());
  matmul_w(test::pool(2), a.data(), K, dy.data(), M, N, plain.data(), DType::q4_0, K, false);
  matmul_w(test::pool(2), b.data(), K, dy.data(), M, N, inter.data(), DType::q4_0x8, K, false);
  EXPECT_EQ(a, b);
}

TEST(MatmulW, RefusesBadArgumentsByName) {
  std::vector<float> dx(64), dy(64);
  std::vector<uint8_t> w(1024);
  const ops::Context ctx;
  test::expect_error(
      [&] { ops::matmul_w(ctx, dx.data(), 16, dy.data(), 1, 2, w.data(), DType::f32, 32, false); },
      "ldx=16 is smaller than K=32");
  test::expect_error(
      [&] { ops::matmul_w(ctx, dx.data(), 40, dy.data(), 1, 2, w.data(), DType::q4_0, 40, false); },
      "not a multiple of the q4_0 block size");
}

}  // namespace
}  // namespace tessera::cpu
