// Quantized-weight formats and the matmul against them: quantizer error bands, SIMD vs the
// reference (every Highway target and the AVX2 kernels), vs a dequantized f32 product,
// thread-count and batch-size invariance, int16 saturation edges.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_act.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/dtype.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernel_test_util.h"
#include "test_util/expect_error.h"

namespace tessera {
namespace {

using test::Buf;
using test::kEpsF;
using test::normal_buf;
using test::pool;

const DType kBlockTypes[] = {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1,
                             DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k};
const DType kAllTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0,
                           DType::q4_1, DType::q5_0, DType::q5_1, DType::q2_k, DType::q3_k,
                           DType::q4_k, DType::q5_k, DType::q6_k};

struct TargetMock {
  explicit TargetMock(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~TargetMock() { hwy::SetSupportedTargetsForTest(0); }
};

// W (N,K) of type t from Gaussian data, stored `offset` bytes into its buffer (2: rows are not
// 4- or 32-byte aligned, as in a GGUF file read into an arbitrary buffer).
struct Weights {
  std::vector<uint8_t> storage;
  const uint8_t* p;
  std::vector<float> deq;     // W as f32 after the round trip
  std::vector<float> offset;  // per element: the value with every quant 0 (bounds |d q| terms)
  Weights(DType t, int64_t N, int64_t K, uint64_t seed, int offset_bytes = 2) {
    const Buf src = normal_buf(N * K, 0, seed);
    const int64_t bytes = dtype_bytes(t, N * K);
    storage.assign(static_cast<size_t>(bytes + offset_bytes), 0);
    uint8_t* dst = storage.data() + offset_bytes;
    from_f32(t, src.p, dst, N * K);
    p = dst;
    deq.resize(static_cast<size_t>(N * K));
    to_f32(t, dst, deq.data(), N * K);
    offset.assign(deq.size(), 0.0f);
    if (traits(t).block_elems > 1) {
      // Zero every quant byte, keep scales: dequantizing gives each element's offset term.
      std::vector<uint8_t> z(dst, dst + bytes);
      const int64_t bb = traits(t).block_bytes;
      for (int64_t b = 0; b < bytes / bb; ++b) {
        uint8_t* blk = z.data() + b * bb;
        switch (t) {
          case DType::q8_0:
            std::memset(blk + 2, 0, 32);
            break;
          case DType::q4_0:
            std::memset(blk + 2, 0, 16);
            break;
          case DType::q4_1:
            std::memset(blk + 4, 0, 16);
            break;
          case DType::q5_0:
            std::memset(blk + 2, 0, 20);  // qh and qs
            break;
          case DType::q5_1:
            std::memset(blk + 4, 0, 20);
            break;
          case DType::q4_k:
            std::memset(blk + 16, 0, 128);
            break;
          case DType::q5_k:
            std::memset(blk + 16, 0, 160);  // qh and qs
            break;
          case DType::q2_k:
            std::memset(blk + 16, 0, 64);  // qs: every value -dmin m_g
            break;
          case DType::q3_k:
            std::memset(blk, 0, 96);  // hmask and qs: every quant -4
            break;
          default:
            std::memset(blk, 0, 192);
            break;  // q6_k: ql and qh
        }
      }
      to_f32(t, z.data(), offset.data(), N * K);
    }
  }
};

// x as the quantized path sees it (dequantized 8-bit activations) and the per-element scale.
struct QuantizedX {
  std::vector<float> xhat, dx;
  QuantizedX(const float* x, int64_t M, int64_t K, int64_t block) {
    std::vector<int16_t> q(static_cast<size_t>(M * K));
    std::vector<float> d(static_cast<size_t>(M * (K / block)));
    std::vector<int32_t> s(static_cast<size_t>(M * (K / 32)));
    cpu::QuantizedActs qa;
    qa.M = M, qa.K = K, qa.block = block, qa.q = q.data(), qa.d = d.data(), qa.sum32 = s.data();
    cpu::quantize_act_rows(x, qa, 0, M);
    for (int64_t i = 0; i < M * K; ++i) {
      const float di = d[static_cast<size_t>(i / block)];
      xhat.push_back(di * q[static_cast<size_t>(i)]);
      dx.push_back(di);
    }
  }
};

// Bound on the f32 rounding of a sum of block terms in any order: (terms + 8) eps sum |term|,
// with |term| bounded by (|w| + |offset|) |xhat| per element.
std::vector<double> rounding_bound(DType t, const Weights& w, const float* x, int64_t M, int64_t K,
                                   int64_t N) {
  const int64_t block = act_block_elems(t);
  std::vector<float> xs(x, x + M * K);
  if (block > 0) xs = QuantizedX(x, M, K, block).xhat;
  const double terms = block > 0 ? static_cast<double>(K) / 16 : static_cast<double>(K);
  std::vector<double> tol(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += (std::fabs(w.deq[n * K + k]) + std::fabs(w.offset[n * K + k])) *
             std::fabs(xs[m * K + k]);
      tol[m * N + n] = (terms + 8) * kEpsF * s + 1e-30;
    }
  return tol;
}

// A matmul_wt implementation (cpu::matmul_wt, or one of its two kernels called directly).
using MatmulWtFn = void (*)(ThreadPool&, float*, int64_t, const float*, int64_t, int64_t,
                            const void*, DType, int64_t, const float*);

void expect_simd_matches_reference(DType t, int64_t M, int64_t K, int64_t N, ThreadPool& tp,
                                   const std::string& what, MatmulWtFn fn = cpu::matmul_wt) {
  Weights w(t, N, K, 100 + M * 7 + N);
  const Buf x = normal_buf(M * K, 1, 200 + M), bias = normal_buf(N, 1, 300);
  const int64_t ldy = N + 3;
  Buf y(M * ldy, 1), yr(M * ldy, 1);
  for (int64_t i = 0; i < M * ldy; ++i) y[i] = yr[i] = -7.0f;  // padding must stay untouched
  fn(tp, y.p, ldy, x.p, M, K, w.p, t, N, bias.p);
  cpu::ref::matmul_wt(yr.p, ldy, x.p, M, K, w.p, t, N, bias.p);
  const auto tol = rounding_bound(t, w, x.p, M, K, N);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n)
      ASSERT_NEAR(y[m * ldy + n], yr[m * ldy + n], tol[m * N + n] + 4 * kEpsF * std::fabs(bias[n]))
          << what << " " << dtype_name(t) << " M=" << M << " K=" << K << " m=" << m << " n=" << n;
    for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -7.0f) << what;
  }
}

TEST(Quant, RoundTripErrorWithinBand) {
  // Relative RMS error on N(0,1) data (n = 64K), pinned around what these quantizers give
  // (q8_0 0.0054, q4_0 0.086, q4_1 0.078, q5_0 0.043, q5_1 0.038, q4_k 0.072, q5_k 0.036, q6_k
  // 0.0167, q3_k 0.148, q2_k 0.270; a fifth bit halves the 4-bit formats' error): above the band
  // is a worse quantizer, below it a no-op or a broken test.
  struct Band {
    DType t;
    double lo, hi;
  };
  const Band bands[] = {{DType::q8_0, 0.0045, 0.0065}, {DType::q4_0, 0.075, 0.100},
                        {DType::q4_1, 0.066, 0.092},   {DType::q5_0, 0.037, 0.049},
                        {DType::q5_1, 0.033, 0.044},   {DType::q4_k, 0.060, 0.077},
                        {DType::q5_k, 0.030, 0.041},   {DType::q6_k, 0.014, 0.020},
                        {DType::q2_k, 0.24, 0.30},     {DType::q3_k, 0.13, 0.165}};
  const int64_t n = 65536;
  const Buf x = normal_buf(n, 0, 7);
  for (const Band& b : bands) {
    std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(b.t, n)));
    std::vector<float> back(static_cast<size_t>(n));
    from_f32(b.t, x.p, q.data(), n);
    to_f32(b.t, q.data(), back.data(), n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (back[i] - x[i]) * (back[i] - x[i]);
      ref += x[i] * x[i];
    }
    const double rel = std::sqrt(err / ref);
    EXPECT_GT(rel, b.lo) << dtype_name(b.t);
    EXPECT_LT(rel, b.hi) << dtype_name(b.t);
  }
}

TEST(Quant, KQuantRoundTripIsStable) {
  // Quantizing dequantized data again reproduces it closely (the scales are representable).
  const int64_t n = 4096;
  const Buf x = normal_buf(n, 0, 9, 0.02f);
  for (DType t : {DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k}) {
    std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(t, n))), q2 = q;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    from_f32(t, x.p, q.data(), n);
    to_f32(t, q.data(), a.data(), n);
    from_f32(t, a.data(), q2.data(), n);
    to_f32(t, q2.data(), b.data(), n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) err += (a[i] - b[i]) * (a[i] - b[i]), ref += a[i] * a[i];
    EXPECT_LT(std::sqrt(err / ref), 0.02) << dtype_name(t);
  }
}

TEST(Quant, SimdMatchesReference) {
  for (DType t : kAllTypes)
    for (int64_t M : {1, 2, 3, 4, 5, 9}) {
      expect_simd_matches_reference(t, M, 512, 37, pool(2), "K=512");
      if (act_block_elems(t) != kQK_K) expect_simd_matches_reference(t, M, 96, 5, pool(1), "K=96");
    }
  expect_simd_matches_reference(DType::f16, 3, 37, 5, pool(1), "odd K");
}

TEST(Quant, EveryTargetMatchesReference) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetMock mock(target);
    for (DType t : kAllTypes)
      for (int64_t M : {1, 6})
        expect_simd_matches_reference(t, M, 256, 11, pool(3), hwy::TargetName(target));
  }
}

TEST(Quant, QuantizedMatmulCloseToDequantizedProduct) {
  // y_q - W x = W (xhat - x) + rounding, and |xhat - x| <= dx / 2 per element.
  const int64_t M = 3, K = 512, N = 19;
  for (DType t : kBlockTypes) {
    Weights w(t, N, K, 41);
    const Buf x = normal_buf(M * K, 0, 42);
    Buf y(M * N, 0);
    cpu::matmul_wt(pool(2), y.p, N, x.p, M, K, w.p, t, N, nullptr);
    const QuantizedX qx(x.p, M, K, act_block_elems(t));
    const auto tol = rounding_bound(t, w, x.p, M, K, N);
    double worst = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, bound = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact += double(w.deq[n * K + k]) * x[m * K + k];
          bound += std::fabs(w.deq[n * K + k]) * 0.5 * qx.dx[m * K + k] * (1 + 1e-6);
        }
        ASSERT_NEAR(y[m * N + n], exact, bound + tol[m * N + n]) << dtype_name(t);
        worst = std::max(worst, std::fabs(y[m * N + n] - exact) / bound);
      }
    EXPECT_GT(worst, 0.01) << dtype_name(t) << ": activations seem not quantized";
  }
}

TEST(Quant, FloatWeightsMatchDoubleProduct) {
  const int64_t M = 5, K = 203, N = 13;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    Weights w(t, N, K, 51, 0);
    const Buf x = normal_buf(M * K, 1, 52);
    for (bool reference : {false, true}) {
      Buf y(M * N, 0);
      if (reference)
        cpu::ref::matmul_wt(y.p, N, x.p, M, K, w.p, t, N, nullptr);
      else
        cpu::matmul_wt(pool(3), y.p, N, x.p, M, K, w.p, t, N, nullptr);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double exact = 0, abs_sum = 0;
          for (int64_t k = 0; k < K; ++k) {
            // bf16 weights multiply x rounded to bf16 (ops::matmul_wt).
            const double xk =
                t == DType::bf16 ? bf16_to_f32(f32_to_bf16(x[m * K + k])) : x[m * K + k];
            exact += double(w.deq[n * K + k]) * xk;
            abs_sum += std::fabs(double(w.deq[n * K + k]) * xk);
          }
          ASSERT_NEAR(y[m * N + n], exact, K * kEpsF * abs_sum) << dtype_name(t) << reference;
        }
    }
  }
}

// bf16 weights take x rounded to bf16 at every row count and on every route (ops::matmul_wt):
// one row (decode), a small batch, and a batch past the packed-GEMM threshold, through
// cpu::matmul_wt, each kernel called directly (the packed f32 route gemm_wt included, which this
// CPU may not pick), the grouped form and the reference, all match a double product of the
// rounded x within f32 summation error, and so row 0 does not depend on M. x and W are positive
// and every x lies 2^-10 of itself above a bf16 value (under half a bf16 step), so a route that
// kept x as is would be off by ~2^-10 of the output: 16 times the tolerance at K = 512.
TEST(Quant, Bf16WeightsRoundActivationsAtEveryRowCount) {
  const int64_t K = 512, N = 37, kMs[] = {1, 5, 300};
  const int64_t M_max = 300;
  ASSERT_TRUE(cpu::matmul_wt_takes_packed_gemm(DType::bf16, M_max));
  ASSERT_FALSE(cpu::matmul_wt_takes_packed_gemm(DType::bf16, 5));
  Buf wsrc = normal_buf(N * K, 0, 71);
  for (int64_t i = 0; i < N * K; ++i) wsrc[i] = 0.01f + std::fabs(wsrc[i]);
  std::vector<uint16_t> w(static_cast<size_t>(N * K));
  from_f32(DType::bf16, wsrc.p, w.data(), N * K);
  Buf x = normal_buf(M_max * K, 1, 72);
  std::vector<double> xr(static_cast<size_t>(M_max * K));
  for (int64_t i = 0; i < M_max * K; ++i) {
    const float base = bf16_to_f32(f32_to_bf16(0.05f + std::fabs(x[i])));
    x[i] = base + base * 0x1p-10f;  // exact in f32 (8 + 10 significant bits)
    ASSERT_EQ(bf16_to_f32(f32_to_bf16(x[i])), base);
    xr[static_cast<size_t>(i)] = base;
  }
  // The double product of the rounded x; every term is positive, so the f32 summation bound of
  // any order, (K + 2) eps sum |term|, is (K + 2) eps y.
  std::vector<double> want(static_cast<size_t>(M_max * N));
  for (int64_t m = 0; m < M_max; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += xr[m * K + k] * bf16_to_f32(w[n * K + k]);
      want[m * N + n] = s;
    }
  const double rel_tol = (K + 2) * kEpsF;
  auto group = [](ThreadPool& tp, float* y, int64_t ldy, const float* xp, int64_t M, int64_t k,
                  const void* wp, DType t, int64_t n, const float* bias) {
    // Beside an f32 product, which keeps x as is (GroupedProductsEqualSeparateOnes checks it).
    std::vector<float> w32(static_cast<size_t>(3 * k), 0.5f), y32(static_cast<size_t>(M * 3));
    const ops::WtProduct products[2] = {{y, ldy, wp, t, n, bias},
                                        {y32.data(), 3, w32.data(), DType::f32, 3, nullptr}};
    cpu::matmul_wt_group(tp, xp, M, k, products, 2);
  };
  auto reference = [](ThreadPool&, float* y, int64_t ldy, const float* xp, int64_t M, int64_t k,
                      const void* wp, DType t, int64_t n,
                      const float* bias) { cpu::ref::matmul_wt(y, ldy, xp, M, k, wp, t, n, bias); };
  std::vector<std::pair<std::string, MatmulWtFn>> routes = {{"matmul_wt", cpu::matmul_wt},
                                                            {"highway", cpu::matmul_wt_highway},
                                                            {"gemm_wt", cpu::gemm_wt},
                                                            {"group", group},
                                                            {"reference", reference}};
  if (cpu::quant_avx2_supported()) routes.emplace_back("avx2", cpu::matmul_wt_avx2);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  for (int64_t target : targets) {
    TargetMock mock(target);
    for (const auto& [name, fn] : routes) {
      if (name == "reference" && target != targets[0]) continue;  // the same on every target
      std::vector<float> row0;                                    // row 0 from M = 1
      for (int64_t M : kMs) {
        SCOPED_TRACE(::testing::Message() << hwy::TargetName(target) << " " << name << " M=" << M);
        std::vector<float> y(static_cast<size_t>(M * N));
        fn(pool(2), y.data(), N, x.p, M, K, w.data(), DType::bf16, N, nullptr);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            const double e = want[m * N + n];
            ASSERT_NEAR(y[m * N + n], e, rel_tol * e) << "m=" << m << " n=" << n;
          }
        if (M == 1) row0.assign(y.begin(), y.begin() + N);
        for (int64_t n = 0; n < N; ++n)
          ASSERT_NEAR(y[n], row0[n], 2 * rel_tol * want[n]) << "row 0 differs from M=1, n=" << n;
      }
    }
  }
}

TEST(Quant, ThreadCountDoesNotChangeResults) {
  const int64_t K = 2048, N = 301;  // several row chunks for every type, decode and prefill
  for (DType t : kAllTypes) {
    Weights w(t, N, K, 61);
    for (int64_t M : {1, 7}) {
      const Buf x = normal_buf(M * K, 0, 62);
      Buf y1(M * N, 0), y2(M * N, 0), y3(M * N, 0);
      cpu::matmul_wt(pool(1), y1.p, N, x.p, M, K, w.p, t, N, nullptr);
      cpu::matmul_wt(pool(2), y2.p, N, x.p, M, K, w.p, t, N, nullptr);
      cpu::matmul_wt(pool(3), y3.p, N, x.p, M, K, w.p, t, N, nullptr);
      ASSERT_EQ(0, std::memcmp(y1.p, y2.p, M * N * 4)) << dtype_name(t) << " M=" << M;
      ASSERT_EQ(0, std::memcmp(y1.p, y3.p, M * N * 4)) << dtype_name(t) << " M=" << M;
    }
  }
}

// A grouped product (q/k/v, gate/up) gives each output exactly what matmul_wt gives alone:
// small groups (run on the caller), large ones (rows of all products shared over threads), a
// bias on one product, strided y, and a group of mixed types (separate quantizations of x).
TEST(Quant, GroupedProductsEqualSeparateOnes) {
  struct Case {
    int64_t K;
    std::vector<std::pair<DType, int64_t>> products;  // type, N
  };
  std::vector<Case> cases;
  for (DType t : kAllTypes) {
    cases.push_back({256, {{t, 9}, {t, 5}, {t, 5}}});       // small: one task each
    cases.push_back({2048, {{t, 301}, {t, 77}, {t, 77}}});  // large: shared rows
  }
  cases.push_back({512, {{DType::q4_k, 260}, {DType::q6_k, 130}, {DType::q8_0, 130}}});
  cases.push_back({512, {{DType::f16, 260}, {DType::q4_0, 130}}});
  // bf16 products read x rounded to bf16, the other float types x itself, in one group.
  cases.push_back({512, {{DType::bf16, 260}, {DType::f32, 130}, {DType::f16, 130}}});
  for (const Case& c : cases)
    for (int64_t M : {1, 3, 6}) {
      const Buf x = normal_buf(M * c.K, 0, 81);
      const Buf bias = normal_buf(512, 0, 82);
      std::vector<Weights> ws;
      std::vector<Buf> want, got;
      std::vector<ops::WtProduct> products;
      ws.reserve(c.products.size());
      want.reserve(c.products.size());
      got.reserve(c.products.size());
      for (size_t i = 0; i < c.products.size(); ++i) {
        const auto [t, N] = c.products[i];
        ws.emplace_back(t, N, c.K, 83 + i);
        const int64_t ldy = N + 3;
        want.emplace_back(M * ldy, 0);
        got.emplace_back(M * ldy, 0);
      }
      for (size_t i = 0; i < c.products.size(); ++i) {
        const auto [t, N] = c.products[i];
        const float* b = i == 1 ? bias.p : nullptr;
        cpu::matmul_wt(pool(2), want[i].p, N + 3, x.p, M, c.K, ws[i].p, t, N, b);
        products.push_back({got[i].p, N + 3, ws[i].p, t, N, b});
      }
      for (int threads : {1, 2, 3}) {
        cpu::matmul_wt_group(pool(threads), x.p, M, c.K, products.data(),
                             static_cast<int64_t>(products.size()));
        for (size_t i = 0; i < products.size(); ++i)
          ASSERT_EQ(0, std::memcmp(want[i].p, got[i].p, M * (products[i].N + 3) * 4))
              << dtype_name(products[i].w_type) << " product " << i << " M=" << M
              << " threads=" << threads;
      }
    }
}

TEST(Quant, NonFiniteActivationsPropagate) {
  const int64_t K = 256, N = 3;
  for (DType t : kBlockTypes) {
    Weights w(t, N, K, 71);
    Buf x = normal_buf(K, 0, 72), y(N, 0);
    x[5] = std::numeric_limits<float>::infinity();
    cpu::matmul_wt(pool(1), y.p, N, x.p, 1, K, w.p, t, N, nullptr);
    for (int64_t n = 0; n < N; ++n) EXPECT_TRUE(std::isnan(y[n])) << dtype_name(t);
  }
}

TEST(Quant, ScaleConversionMatchesF16ToF32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = cpu::f16_scale_to_f32(static_cast<uint16_t>(h));
    const float b = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(b))
      ASSERT_TRUE(std::isnan(a)) << h;
    else
      ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << h;
  }
}

TEST(Quant, BadArgumentsThrowNamingThem) {
  std::vector<uint8_t> w(4096);
  std::vector<float> x(512), y(64);
  test::expect_error(
      [&] {
        cpu::matmul_wt(pool(1), y.data(), 4, x.data(), 1, 48, w.data(), DType::q4_0, 4, nullptr);
      },
      "K=48");
  test::expect_error(
      [&] {
        cpu::matmul_wt(pool(1), y.data(), 4, x.data(), 1, 224, w.data(), DType::q4_k, 4, nullptr);
      },
      "q4_k block size 256");
  test::expect_error(
      [&] {
        cpu::matmul_wt(pool(1), y.data(), 3, x.data(), 1, 32, w.data(), DType::q8_0, 4, nullptr);
      },
      "ldy=3");
  test::expect_error(
      [&] { cpu::ref::matmul_wt(y.data(), 4, x.data(), 1, 32, w.data(), DType::i32, 4, nullptr); },
      "i32");
  test::expect_error(
      [&] {
        cpu::matmul_wt(pool(1), y.data(), 4, x.data(), -1, 32, w.data(), DType::f32, 4, nullptr);
      },
      "M=-1");
}

// The AVX2 kernel set with its AVX512-VNNI tiles switched off (where the CPU has them, the
// plain entry takes those for Q4_K / Q5_K).
void matmul_wt_avx2_without_vnni(ThreadPool& tp, float* y, int64_t ldy, const float* x, int64_t M,
                                 int64_t K, const void* w, DType t, int64_t N, const float* bias) {
  struct Restore {
    ~Restore() { cpu::set_quant_avx512_vnni_allowed(true); }
  } restore;
  cpu::set_quant_avx512_vnni_allowed(false);
  cpu::matmul_wt_avx2(tp, y, ldy, x, M, K, w, t, N, bias);
}

// The SIMD kernels called directly: Highway everywhere, AVX2 where the CPU has it, and AVX2 with
// and without the AVX512-VNNI tiles where it has those.
std::vector<std::pair<std::string, MatmulWtFn>> simd_kernels() {
  std::vector<std::pair<std::string, MatmulWtFn>> k = {{"highway", cpu::matmul_wt_highway}};
  if (cpu::quant_avx2_supported()) k.emplace_back("avx2", cpu::matmul_wt_avx2);
  if (cpu::quant_avx512_vnni_active()) k.emplace_back("avx2-no-vnni", matmul_wt_avx2_without_vnni);
  return k;
}

TEST(Quant, EachKernelMatchesReferenceOverTileEdges) {
  // M covers row groups of 4 and tails 1-3; N covers weight-row tiles and their tails; K covers
  // q4_1's 8-block min vectors with and without a tail (nb = 3, 9, 16) and 1-3 super-blocks.
  for (const auto& [name, fn] : simd_kernels())
    for (DType t : kAllTypes)
      for (int64_t M : {1, 2, 3, 4, 5, 8, 11})
        for (int64_t K : {96, 288, 512, 768}) {
          if (act_block_elems(t) == kQK_K && K % kQK_K != 0) continue;
          for (int64_t N : {1, 7, 37})
            expect_simd_matches_reference(t, M, K, N, pool(2), name + " N=" + std::to_string(N),
                                          fn);
        }
}

TEST(Quant, Avx2ActivationQuantizerMatchesScalar) {
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  const int64_t M = 3, K = 512;
  for (int64_t block : {32, 256}) {
    Buf x = normal_buf(M * K, 1, 81, 3.0f);
    for (int64_t k = 0; k < 32; ++k) x[k] = 0.0f;  // an all-zero block: d = 0, q = 0
    // Ties: amax 127 gives d = 1, so x * (1/d) lands on .5 and must round to even.
    for (int64_t k = 0; k < 32; ++k)
      x[K + k] = k == 0 ? 127.0f : 0.5f + static_cast<float>(k % 7) - 3.0f;
    x[2 * K + 300] = std::numeric_limits<float>::infinity();
    x[2 * K + 40] = std::numeric_limits<float>::quiet_NaN();
    std::vector<int16_t> q(M * K);
    std::vector<float> d(M * (K / block));
    std::vector<int32_t> s32(M * (K / 32));
    cpu::QuantizedActs ref;
    ref.M = M, ref.K = K, ref.block = block, ref.q = q.data(), ref.d = d.data();
    ref.sum32 = s32.data();
    cpu::quantize_act_rows(x.p, ref, 0, M);
    const cpu::ActsQ8 a = cpu::acts_q8_buffer(M, K, block);
    cpu::quantize_acts_q8_avx2(x.p, a, 0, M);
    for (int64_t i = 0; i < M * K; ++i) ASSERT_EQ(a.q[i], q[i]) << "block " << block << " i=" << i;
    for (int64_t i = 0; i < M * (K / block); ++i) {
      if (std::isnan(d[i]))
        ASSERT_TRUE(std::isnan(a.d[i])) << i;
      else
        ASSERT_EQ(a.d[i], d[i]) << i;
    }
    for (int64_t g = 0; g < M * (K / 32); ++g) {
      int32_t lo = 0, hi = 0;
      for (int j = 0; j < 16; ++j) lo += q[g * 32 + j], hi += q[g * 32 + 16 + j];
      ASSERT_EQ(a.sum16[2 * g], lo) << g;
      ASSERT_EQ(a.sum16[2 * g + 1], hi) << g;
      ASSERT_EQ(a.sum32[g], s32[g]) << g;
      const float dg = d[g * 32 / block];
      if (std::isnan(dg)) continue;
      ASSERT_EQ(a.dsum[g], dg * static_cast<float>(s32[g])) << g;
    }
  }
}

TEST(Quant, Avx2ResultsDoNotDependOnBatchSize) {
  // Every output's arithmetic is the same in every tile shape: a row of a batch equals the same
  // row computed alone, bit for bit (batched decode gives the tokens of single decode).
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2";
  const int64_t M = 7, K = 512, N = 23;
  for (const auto& [name, fn] : simd_kernels()) {
    if (name == "highway") continue;
    for (DType t : kAllTypes) {
      Weights w(t, N, K, 91);
      const Buf x = normal_buf(M * K, 0, 92);
      Buf y(M * N, 0), y1(N, 0);
      fn(pool(2), y.p, N, x.p, M, K, w.p, t, N, nullptr);
      for (int64_t m = 0; m < M; ++m) {
        fn(pool(1), y1.p, N, x.p + m * K, 1, K, w.p, t, N, nullptr);
        ASSERT_EQ(0, std::memcmp(y1.p, y.p + m * N, N * 4))
            << name << " " << dtype_name(t) << " m=" << m;
      }
    }
  }
}

TEST(Quant, ExtremeQuantsDoNotOverflowInt16) {
  // Largest |quant| times |activation| = 127: the pair sums closest to int16's limit (q8_0's
  // -128 * -127 twice = 32512). Any saturation would show as a gross error.
  const int64_t K = 512, N = 3, M = 2;
  std::vector<float> x(M * K);
  for (int64_t k = 0; k < K; ++k) x[k] = 1.0f, x[K + k] = (k / 2) % 2 ? -1.0f : 1.0f;
  for (DType t : kBlockTypes) {
    const int64_t bb = traits(t).block_bytes, row = dtype_bytes(t, K);
    std::vector<uint8_t> w(N * row);
    for (int64_t b = 0; b < N * row / bb; ++b) {
      uint8_t* blk = w.data() + b * bb;
      const uint8_t fill = b % 3 == 0 ? 0x80 : b % 3 == 1 ? 0xff : 0x7f;  // -128, all ones, 127
      std::memset(blk, fill, bb);
      const uint16_t one = 0x3c00;  // f16 1.0 (q6_k keeps d last, the others first)
      // d: last for q6_k and q3_k, before dmin at the end for q2_k, first for the others.
      const int64_t d_at = t == DType::q6_k || t == DType::q3_k ? bb - 2
                           : t == DType::q2_k                   ? bb - 4
                                                                : 0;
      std::memcpy(blk + d_at, &one, 2);
      if (t == DType::q4_1 || t == DType::q5_1 || t == DType::q4_k || t == DType::q5_k)
        std::memcpy(blk + 2, &one, 2);
      if (t == DType::q2_k) std::memcpy(blk + bb - 2, &one, 2);
    }
    std::vector<float> deq(N * K);
    to_f32(t, w.data(), deq.data(), N * K);
    for (const auto& [name, fn] : simd_kernels()) {
      std::vector<float> y(M * N), yr(M * N);
      fn(pool(1), y.data(), N, x.data(), M, K, w.data(), t, N, nullptr);
      cpu::ref::matmul_wt(yr.data(), N, x.data(), M, K, w.data(), t, N, nullptr);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double mag = 0;
          for (int64_t k = 0; k < K; ++k) mag += std::fabs(deq[n * K + k]) + 64;
          ASSERT_NEAR(y[m * N + n], yr[m * N + n], 1e-5 * mag)
              << name << " " << dtype_name(t) << " m=" << m << " n=" << n;
        }
    }
  }
}

}  // namespace
}  // namespace tessera
