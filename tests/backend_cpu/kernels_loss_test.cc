// Softmax + cross-entropy and AdamW kernels: Highway vs reference, hand-computed cases, the
// ignore-target and padding contracts, and rejection of bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"
#include "kernel_test_util.h"

namespace tessera {
namespace {

using test::Buf;
using test::kEpsF;
using test::normal_buf;
using test::pool;

struct XentShape {
  int64_t N, V, Vp;
};
const XentShape kXentShapes[] = {{1, 1, 1},   {2, 3, 3},     {3, 17, 32},    {5, 63, 64},
                                 {7, 65, 80}, {4, 257, 264}, {200, 769, 784}};

// Targets in [0, V), with every 5th row ignored (-1).
std::vector<int32_t> make_targets(int64_t N, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n)
    t[n] = n % 5 == 4 ? -1 : static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

TEST(SoftmaxXent, MatchesReference) {
  for (int threads = 1; threads <= 3; ++threads) {
    for (const auto& s : kXentShapes) {
      for (float scale : {0.0f, 1.0f, 0.25f}) {
        const int64_t N = s.N, V = s.V, Vp = s.Vp, off = (V + threads) % 2;
        Buf x = normal_buf(N * Vp, off, 500 + V, 4.0f);
        for (int64_t n = 0; n < N; ++n)  // padded columns hold garbage the kernel must ignore
          for (int64_t j = V; j < Vp; ++j) x[n * Vp + j] = 1e30f;
        const Buf x0 = x;
        Buf ref = x, loss(N, off), rloss(N, off);
        const auto targets = make_targets(N, V, 501 + N);
        cpu::softmax_xent(pool(threads), loss.p, x.p, targets.data(), N, V, Vp, scale);
        cpu::ref::softmax_xent(rloss.p, ref.p, targets.data(), N, V, Vp, scale);
        for (int64_t n = 0; n < N; ++n) {
          const float* row = x0.p + n * Vp;
          const float mx = *std::max_element(row, row + V);
          double spread = 0;  // max |x - max|: x - max is rounded, so exp(.) errs by eps * this
          for (int64_t j = 0; j < V; ++j) spread = std::max(spread, double{mx} - row[j]);
          // The exp-sum runs in f32 blocks of 256 terms (error <= 256 eps of the block sum) plus
          // 1 ulp per Exp and the rounded x - max; loss = log(sum) - (x_t - max) inherits that
          // relative error of the sum as an absolute error.
          const double sum_rel = (spread + 256 + 16) * kEpsF;
          ASSERT_NEAR(loss[n], rloss[n], sum_rel + 2 * kEpsF * std::fabs(rloss[n]))
              << "N=" << N << " V=" << V << " n=" << n;
          if (scale == 0.0f) {
            // No gradient requested: logits untouched.
            ASSERT_EQ(0, std::memcmp(x.p + n * Vp, row, static_cast<size_t>(Vp) * 4));
            continue;
          }
          for (int64_t j = 0; j < Vp; ++j) {
            const int64_t i = n * Vp + j;
            if (j >= V || targets[n] < 0) {
              ASSERT_EQ(x[i], 0.0f) << "padding/ignored n=" << n << " j=" << j;
              continue;
            }
            // grad = scale (p - onehot): p carries the sum's relative error plus its own exp's,
            // the one-hot subtraction one rounding of |scale|.
            const double pr = ref[i] / scale + (j == targets[n] ? 1.0 : 0.0);
            const double tol = std::fabs(scale) * (pr * (2 * spread + 256 + 24) * kEpsF +
                                                   (j == targets[n] ? 2 * kEpsF : 0.0));
            ASSERT_NEAR(x[i], ref[i], tol) << "N=" << N << " V=" << V << " n=" << n << " j=" << j;
          }
        }
      }
    }
  }
}

TEST(SoftmaxXent, HandComputedCaseAndGradientRowsSumToZero) {
  // logits (1, 2, 3), target 2: loss = log(e + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2).
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> x = {1.0f, 2.0f, 3.0f, 7.0f};  // Vp = 4, one padded column
    const int32_t target = 2;
    float loss = -1;
    if (variant == 0)
      cpu::softmax_xent(pool(2), &loss, x.data(), &target, 1, 3, 4, 1.0f);
    else
      cpu::ref::softmax_xent(&loss, x.data(), &target, 1, 3, 4, 1.0f);
    const double z = 1 + std::exp(-1.0) + std::exp(-2.0);
    EXPECT_NEAR(loss, std::log(z), 4 * kEpsF);
    EXPECT_NEAR(x[0], std::exp(-2.0) / z, 4 * kEpsF);
    EXPECT_NEAR(x[1], std::exp(-1.0) / z, 4 * kEpsF);
    EXPECT_NEAR(x[2], 1.0 / z - 1.0, 4 * kEpsF);
    EXPECT_EQ(x[3], 0.0f);
  }
  // Each gradient row is scale * (softmax - onehot), which sums to 0; summing V rounded terms of
  // magnitude <= |scale| leaves at most ~(V + 4) eps |scale| (we allow 2x).
  const int64_t N = 6, V = 1000, Vp = 1024;
  Buf x = normal_buf(N * Vp, 1, 600, 3.0f);
  auto targets = make_targets(N, V, 601);
  std::vector<float> loss(N);
  cpu::softmax_xent(pool(3), loss.data(), x.p, targets.data(), N, V, Vp, 0.5f);
  for (int64_t n = 0; n < N; ++n) {
    double sum = 0;
    for (int64_t j = 0; j < Vp; ++j) sum += x[n * Vp + j];
    EXPECT_NEAR(sum, 0.0, 2 * (V + 4) * kEpsF * 0.5) << "row " << n;
    if (targets[n] < 0)
      EXPECT_EQ(loss[n], 0.0f);
    else
      EXPECT_GT(loss[n], 0.0f);
  }
}

TEST(SoftmaxXent, LargeLogitsStayFinite) {
  // Max subtraction: logits near f32's top would overflow exp without it.
  std::vector<float> x = {3e38f, 3e38f, -3e38f};
  const int32_t target = 0;
  float loss = 0;
  cpu::softmax_xent(pool(1), &loss, x.data(), &target, 1, 3, 3, 1.0f);
  EXPECT_NEAR(loss, std::log(2.0), 4 * kEpsF);
  EXPECT_NEAR(x[0], -0.5, 4 * kEpsF);
  EXPECT_NEAR(x[1], 0.5, 4 * kEpsF);
  EXPECT_EQ(x[2], 0.0f);
}

TEST(SoftmaxXent, TargetOutOfRangeThrows) {
  std::vector<float> x(8, 0.0f), loss(2, 0.0f);
  const int32_t targets[] = {1, 4};  // V = 4: target 4 is out of range
  EXPECT_THROW(cpu::softmax_xent(pool(2), loss.data(), x.data(), targets, 2, 4, 4, 1.0f), Error);
  EXPECT_THROW(cpu::ref::softmax_xent(loss.data(), x.data(), targets, 2, 4, 4, 1.0f), Error);
  EXPECT_THROW(cpu::softmax_xent(pool(2), loss.data(), x.data(), targets, 2, 4, 3, 1.0f), Error);
  // Targets are validated before any row is processed: row 0 (valid) is left untouched.
  for (float v : x) EXPECT_EQ(v, 0.0f);
  EXPECT_THROW(cpu::softmax_xent(pool(2), loss.data(), x.data(), targets, -1, 4, 4, 1.0f), Error);
}

TEST(SoftmaxXent, ResultsIdenticalForAnyThreadCount) {
  const int64_t N = 64, V = 1001, Vp = 1008;
  const Buf x0 = normal_buf(N * Vp, 1, 700, 3.0f);
  const auto targets = make_targets(N, V, 701);
  std::vector<std::vector<float>> results;
  for (int threads = 1; threads <= 3; ++threads) {
    Buf x = x0;
    std::vector<float> loss(N);
    cpu::softmax_xent(pool(threads), loss.data(), x.p, targets.data(), N, V, Vp, 0.1f);
    loss.insert(loss.end(), x.p, x.p + N * Vp);
    results.push_back(loss);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST(AdamW, OneHandComputedStep) {
  // Step 1: m = (1-b1) g, v = (1-b2) g^2, mhat = g, vhat = g^2, so the update is
  // lr (g / (|g| + eps) + wd p) = lr (sign(g) + wd p) up to eps / |g|.
  ops::AdamWArgs a;
  a.lr = 0.1f;
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  for (float wd : {0.0f, 0.5f}) {
    a.weight_decay = wd;
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.5f, -4.0f, 0.0f}, m(3, 0.0f), v(3, 0.0f);
      if (variant == 0)
        cpu::adamw(pool(1), p.data(), g.data(), m.data(), v.data(), 3, a);
      else
        cpu::ref::adamw(p.data(), g.data(), m.data(), v.data(), 3, a);
      // Tolerance: a handful of f32 roundings on values of magnitude <= 2.
      EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + wd * 1.0), 1e-6);
      EXPECT_NEAR(p[1], -2.0 - 0.1 * (-1.0 + wd * -2.0), 1e-6);
      EXPECT_NEAR(p[2], 0.5 - 0.1 * (0.0 + wd * 0.5), 1e-6);  // zero grad: only decay moves it
      EXPECT_NEAR(m[0], 0.05, 1e-7);
      EXPECT_NEAR(v[1], 0.05 * 16.0, 1e-6);
    }
  }
}

TEST(AdamW, SecondStepAndGradScale) {
  // Two steps by hand in double, grads scaled by 0.5 first: m2 = b1 m1 + (1-b1) g2 etc.
  ops::AdamWArgs a;
  a.lr = 0.01f;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  std::vector<float> p = {0.3f}, m = {0.0f}, v = {0.0f};
  const float g1 = 2.0f, g2 = -1.0f;
  a.t = 1;
  cpu::adamw(pool(1), p.data(), &g1, m.data(), v.data(), 1, a);
  a.t = 2;
  cpu::adamw(pool(1), p.data(), &g2, m.data(), v.data(), 1, a);
  double pd = 0.3, md = 0, vd = 0;
  const double b1 = a.beta1, b2 = a.beta2;
  for (int t = 1; t <= 2; ++t) {
    const double g = 0.5 * (t == 1 ? g1 : g2);
    md = b1 * md + (1 - b1) * g;
    vd = b2 * vd + (1 - b2) * g * g;
    const double mh = md / (1 - std::pow(b1, t)), vh = vd / (1 - std::pow(b2, t));
    pd -= a.lr * (mh / (std::sqrt(vh) + a.eps) + a.weight_decay * pd);
  }
  // f32 vs double on O(1) values through ~20 operations: well under 1e-6.
  EXPECT_NEAR(p[0], pd, 1e-6);
  EXPECT_NEAR(m[0], md, 1e-7);
  EXPECT_NEAR(v[0], vd, 1e-7);
}

TEST(AdamW, MatchesReferenceBitForBitOverManySteps) {
  // Both kernels run the same sequence of IEEE f32 operations (no fused multiply-add), so the
  // states must agree exactly after every step, for any size, alignment and thread count.
  for (int threads = 1; threads <= 3; ++threads) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{65}, int64_t{769}, int64_t{20011}}) {
      const int off = static_cast<int>(n % 2);
      Buf p = normal_buf(n, off, 800 + n), m(n, off), v(n, off);
      Buf rp = p, rm = m, rv = v;
      ops::AdamWArgs a;
      a.lr = 1e-3f;
      a.weight_decay = 0.1f;
      a.grad_scale = 0.8f;
      for (int64_t t = 1; t <= 10; ++t) {
        a.t = t;
        const Buf g = normal_buf(n, off, 900 + t);
        cpu::adamw(pool(threads), p.p, g.p, m.p, v.p, n, a);
        cpu::ref::adamw(rp.p, g.p, rm.p, rv.p, n, a);
      }
      ASSERT_EQ(0, std::memcmp(p.p, rp.p, static_cast<size_t>(n) * 4)) << "n=" << n;
      ASSERT_EQ(0, std::memcmp(m.p, rm.p, static_cast<size_t>(n) * 4)) << "n=" << n;
      ASSERT_EQ(0, std::memcmp(v.p, rv.p, static_cast<size_t>(n) * 4)) << "n=" << n;
    }
  }
}

TEST(AdamW, BadArgumentsThrow) {
  std::vector<float> p(3), g(3), m(3), v(3);
  ops::AdamWArgs a;
  a.beta1 = 1.0f;  // bias correction 1 - beta1^t would be 0
  EXPECT_THROW(cpu::adamw(pool(1), p.data(), g.data(), m.data(), v.data(), 3, a), Error);
  EXPECT_THROW(cpu::ref::adamw(p.data(), g.data(), m.data(), v.data(), 3, a), Error);
  a.beta1 = 0.9f;
  a.t = 0;
  EXPECT_THROW(cpu::adamw(pool(1), p.data(), g.data(), m.data(), v.data(), 3, a), Error);
}

}  // namespace
}  // namespace tessera
