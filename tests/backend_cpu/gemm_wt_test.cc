// Tests of the packed GEMM against stored-type weights (cpu::gemm_wt, the prefill route of
// matmul_wt): exact widening of every weight type on every SIMD target, the product against a
// double reference, invariance to threads and M/N blocking, the route matmul_wt takes, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "core/dtype.h"
#include "core/error.h"
#include "hwy/targets.h"
#include "kernel_test_util.h"

namespace tessera::cpu {
namespace {

constexpr DType kTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0,
                            DType::q4_1, DType::q5_0, DType::q5_1, DType::q2_k, DType::q3_k,
                            DType::q4_k, DType::q5_k, DType::q6_k};

// N rows of K weights stored as t, and the same weights widened by core's to_f32.
struct Weights {
  std::vector<uint8_t> stored;
  std::vector<float> wide;
};

Weights make_weights(DType t, int64_t N, int64_t K, uint64_t seed) {
  std::vector<float> src(static_cast<size_t>(N * K));
  test::fill_normal(src.data(), N * K, seed, 0.05f);
  Weights w;
  w.stored.resize(static_cast<size_t>(N * dtype_bytes(t, K)));
  from_f32(t, src.data(), w.stored.data(), N * K);
  w.wide.resize(src.size());
  to_f32(t, w.stored.data(), w.wide.data(), N * K);
  return w;
}

// x = identity (M = K) makes y = W^T: each output is one weight times 1 plus exact zeros, so the
// packed route's widening must equal core's to_f32 value for value, on every target (each has
// its own widening code) and with a depth block that is not a multiple of any block size.
TEST(GemmWt, WidensEveryTypeExactlyOnEveryTarget) {
  const int64_t K = 512, N = 37;
  std::vector<float> eye(static_cast<size_t>(K * K), 0.0f);
  for (int64_t i = 0; i < K; ++i) eye[i * K + i] = 1.0f;
  int tested = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (DType t : kTypes) {
      SCOPED_TRACE(dtype_name(t));
      const Weights w = make_weights(t, N, K, 11);
      for (int64_t kc : {0, 37}) {
        std::vector<float> y(static_cast<size_t>(K * N), -1.0f);
        gemm_wt_blocked(test::pool(2), y.data(), N, eye.data(), K, K, w.stored.data(), t, N,
                        nullptr, GemmBlocking{0, kc, 0});
        int64_t bad = 0;
        for (int64_t k = 0; k < K; ++k)
          for (int64_t n = 0; n < N; ++n) bad += y[k * N + n] != w.wide[n * K + k];
        EXPECT_EQ(bad, 0) << "kc=" << kc;
      }
    }
    ++tested;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(tested, 1);
}

// y = x W^T + bias against a double product of the widened weights (and of x rounded to bf16
// for bf16 weights); the bound is the f32 accumulation error of a K-term sum (K eps sum |x w|),
// far below any widening mistake.
TEST(GemmWt, MatchesDoubleProductOverEdgesAndStrides) {
  struct Shape {
    int64_t M, K, N;
  };
  for (DType t : kTypes) {
    const bool kquant = act_block_elems(t) == kQK_K;
    for (Shape s : {Shape{1, 256, 3}, Shape{7, kquant ? 256 : 96, 17}, Shape{131, 768, 53}}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(t) << " M=" << s.M << " K=" << s.K << " N=" << s.N);
      const Weights w = make_weights(t, s.N, s.K, 21);
      const test::Buf x = test::normal_buf(s.M * s.K, 1, 22);
      std::vector<float> bias(static_cast<size_t>(s.N));
      test::fill_normal(bias.data(), s.N, 23);
      const int64_t ldy = s.N + 3;
      std::vector<float> y(static_cast<size_t>(s.M * ldy), 7.0f);
      gemm_wt(test::pool(2), y.data(), ldy, x.p, s.M, s.K, w.stored.data(), t, s.N, bias.data());
      for (int64_t m = 0; m < s.M; ++m) {
        for (int64_t n = 0; n < s.N; ++n) {
          double ref = bias[n], mag = std::fabs(bias[n]);
          for (int64_t k = 0; k < s.K; ++k) {
            // bf16 weights take x rounded to bf16 (ops::matmul_wt's rule).
            const float xk =
                t == DType::bf16 ? bf16_to_f32(f32_to_bf16(x[m * s.K + k])) : x[m * s.K + k];
            const double p = static_cast<double>(xk) * w.wide[n * s.K + k];
            ref += p, mag += std::fabs(p);
          }
          ASSERT_NEAR(y[m * ldy + n], ref, (s.K + 2) * test::kEpsF * mag) << m << "," << n;
        }
        for (int64_t n = s.N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], 7.0f) << "padding written";
      }
    }
  }
}

// Threads own disjoint rectangles and every output's depth order is fixed by kc alone, so thread
// counts and the M and N blocking leave every bit unchanged.
TEST(GemmWt, BitIdenticalAcrossThreadsAndMnBlocking) {
  const int64_t M = 61, K = 512, N = 45;
  for (DType t : {DType::f16, DType::q4_0, DType::q4_k}) {
    SCOPED_TRACE(dtype_name(t));
    const Weights w = make_weights(t, N, K, 31);
    const test::Buf x = test::normal_buf(M * K, 0, 32);
    std::vector<float> base(static_cast<size_t>(M * N));
    gemm_wt(test::pool(1), base.data(), N, x.p, M, K, w.stored.data(), t, N, nullptr);
    for (int threads : {2, 3})
      for (GemmBlocking blk : {GemmBlocking{}, GemmBlocking{12, 0, 32}, GemmBlocking{6, 0, 16}}) {
        std::vector<float> y(static_cast<size_t>(M * N));
        gemm_wt_blocked(test::pool(threads), y.data(), N, x.p, M, K, w.stored.data(), t, N, nullptr,
                        blk);
        EXPECT_EQ(y, base) << threads << " threads, mc=" << blk.mc << " nc=" << blk.nc;
      }
  }
}

// matmul_wt and matmul_wt_group send large products through gemm_wt (bit for bit; bf16 weights
// through the bf16 kernel where the CPU has one) and small ones through the integer kernels,
// whose rows do not depend on M.
TEST(GemmWt, MatmulWtRoutesLargeProductsHere) {
  const int64_t K = 512, N = 40;
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    int64_t M_packed = 0;
    for (int64_t m : {128, 256, 512})
      if (M_packed == 0 && matmul_wt_takes_packed_gemm(t, m)) M_packed = m;
    EXPECT_FALSE(matmul_wt_takes_packed_gemm(t, 64)) << "decode-sized batches must stay integer";
    // q4_K's integer kernel measured faster than a 256-bit packed GEMM at every M; a 512-bit
    // one (AVX-512 targets) beats it from 128 rows, or 256 against the AVX512-VNNI tiles. Q5_K
    // follows q4_K.
    if ((t == DType::q4_k || t == DType::q5_k) && gemm_tile().nr < 32 &&
        !quant_avx512_vnni_active()) {
      EXPECT_EQ(M_packed, 0);
      continue;
    }
    ASSERT_GT(M_packed, 0) << "no M up to 512 takes the packed route";
    const Weights w = make_weights(t, N, K, 41);
    const test::Buf x = test::normal_buf(M_packed * K, 0, 42);
    std::vector<float> via_route(static_cast<size_t>(M_packed * N)), direct(via_route.size());
    matmul_wt(test::pool(2), via_route.data(), N, x.p, M_packed, K, w.stored.data(), t, N, nullptr);
    if (t == DType::bf16 && gemm_kernel_for(true, M_packed) == GemmKernel::bf16_dot) {
      // bf16 weights take the bf16 dot-product kernel where the CPU has it: x rounded to bf16.
      ops::GemmArgs g;
      g.trans_b = ops::Trans::T, g.m = M_packed, g.n = N, g.k = K;
      g.a = x.p, g.lda = K, g.b = w.stored.data(), g.b_type = DType::bf16, g.ldb = K;
      g.c = direct.data(), g.ldc = N, g.round_bf16 = true;
      gemm_blocked(test::pool(2), g, GemmBlocking{0, 0, 0, GemmKernel::bf16_dot});
    } else {
      gemm_wt(test::pool(2), direct.data(), N, x.p, M_packed, K, w.stored.data(), t, N, nullptr);
    }
    EXPECT_EQ(via_route, direct);
    // A group of two products (one of another type) equals the separate products.
    const Weights w2 = make_weights(DType::q8_0, 24, K, 43);
    std::vector<float> g1(via_route.size()), g2(static_cast<size_t>(M_packed * 24)), s2(g2.size());
    const ops::WtProduct products[2] = {
        {g1.data(), N, w.stored.data(), t, N, nullptr},
        {g2.data(), 24, w2.stored.data(), DType::q8_0, 24, nullptr}};
    matmul_wt_group(test::pool(2), x.p, M_packed, K, products, 2);
    matmul_wt(test::pool(2), s2.data(), 24, x.p, M_packed, K, w2.stored.data(), DType::q8_0, 24,
              nullptr);
    EXPECT_EQ(g1, direct);
    EXPECT_EQ(g2, s2);
  }
}

TEST(GemmWt, RejectsBadArgumentsNamingThem) {
  const Weights w = make_weights(DType::q4_0, 4, 64, 51);
  std::vector<float> x(64 * 2), y(8);
  auto message = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              gemm_wt(test::pool(1), y.data(), 3, x.data(), 2, 64, w.stored.data(), DType::q4_0, 4,
                      nullptr);
            }).find("ldy"),
            std::string::npos);
  EXPECT_NE(message([&] {
              gemm_wt(test::pool(1), y.data(), 4, x.data(), 2, 48, w.stored.data(), DType::q4_0, 4,
                      nullptr);
            }).find("block size"),
            std::string::npos);
  EXPECT_NE(message([&] {
              gemm_wt(test::pool(1), y.data(), 4, nullptr, 2, 64, w.stored.data(), DType::q4_0, 4,
                      nullptr);
            }).find("null"),
            std::string::npos);
  EXPECT_NE(message([&] {
              gemm_wt(test::pool(1), y.data(), 4, x.data(), -1, 64, w.stored.data(), DType::q4_0, 4,
                      nullptr);
            }).find("negative"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::cpu
