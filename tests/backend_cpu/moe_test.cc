// The mixture-of-experts ops: the router's CPU kernel against its float64 reference and a
// hand-worked row (ties, renormalization), the weighted scatter-add against a plain sum, and the
// ops/ checks on bad sizes and indices; the router's backward (its float64 reference against
// central differences, the kernel against that) and the scatter-add's against sums by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cpu/rows.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "test_util/expect_error.h"

namespace tessera::cpu {
namespace {

TEST(MoeRoute, HandWorkedRowWithTies) {
  // Logits 1, 3, 3, 0: experts 1 and 2 tie, the lower id comes first; p = e^x / sum.
  const std::vector<float> logits = {1, 3, 3, 0};
  const double sum = std::exp(1.0) + 2 * std::exp(3.0) + 1.0;
  ThreadPool pool(1);
  for (bool normalize : {false, true}) {
    std::vector<int32_t> ids(3);
    std::vector<float> w(3);
    moe_route(pool, ids.data(), w.data(), logits.data(), 1, 4, 3, normalize);
    EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 0}));
    const double chosen = normalize ? (2 * std::exp(3.0) + std::exp(1.0)) / sum : 1.0;
    EXPECT_NEAR(w[0], std::exp(3.0) / sum / chosen, 1e-6);
    EXPECT_NEAR(w[1], std::exp(3.0) / sum / chosen, 1e-6);
    EXPECT_NEAR(w[2], std::exp(1.0) / sum / chosen, 1e-6);
  }
}

TEST(MoeRoute, KernelMatchesReference) {
  Rng rng(7);
  ThreadPool pool(2);
  for (const auto& [E, k] : {std::pair<int64_t, int64_t>{8, 2}, {64, 8}, {5, 5}, {128, 1}}) {
    const int64_t n = 37;
    std::vector<float> logits(static_cast<size_t>(n * E));
    for (float& x : logits) x = 3.0f * rng.normal();
    for (bool normalize : {false, true}) {
      std::vector<int32_t> ids(static_cast<size_t>(n * k)), ids_ref(ids.size());
      std::vector<float> w(ids.size()), w_ref(ids.size());
      moe_route(pool, ids.data(), w.data(), logits.data(), n, E, k, normalize);
      ref::moe_route(ids_ref.data(), w_ref.data(), logits.data(), n, E, k, normalize);
      EXPECT_EQ(ids, ids_ref) << "E=" << E << " k=" << k;
      for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], w_ref[i], 2e-6) << i;
      if (normalize)
        for (int64_t r = 0; r < n; ++r) {
          double s = 0;
          for (int64_t j = 0; j < k; ++j) s += w[static_cast<size_t>(r * k + j)];
          EXPECT_NEAR(s, 1.0, 1e-6);
        }
    }
  }
}

TEST(ScatterAddRows, AddsWeightedRowsInOrder) {
  const int64_t C = 5, n = 6, dst_rows = 3;
  Rng rng(2);
  std::vector<float> src(static_cast<size_t>(n * C)), dst(static_cast<size_t>(dst_rows * C));
  for (float& x : src) x = rng.normal();
  for (float& x : dst) x = rng.normal();
  const std::vector<int32_t> index = {2, 0, 2, 1, 0, 2};  // rows repeat
  const std::vector<float> weight = {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, 0.0f};
  std::vector<double> want(dst.begin(), dst.end());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < C; ++i)
      want[static_cast<size_t>(index[r] * C + i)] +=
          weight[r] * src[static_cast<size_t>(r * C + i)];
  scatter_add_rows(dst.data(), src.data(), index.data(), weight.data(), n, C);
  for (size_t i = 0; i < dst.size(); ++i) EXPECT_NEAR(dst[i], want[i], 1e-6) << i;
}

// Logits whose top-k choice holds under a perturbation of h: sorted values at least 4h apart.
std::vector<float> separated_logits(int64_t n, int64_t E, float h, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n * E));
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> perm(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = e;
    for (int64_t e = E - 1; e > 0; --e)
      std::swap(perm[static_cast<size_t>(e)], perm[rng.below(static_cast<uint64_t>(e + 1))]);
    for (int64_t e = 0; e < E; ++e)
      x[static_cast<size_t>(r * E + perm[static_cast<size_t>(e)])] =
          0.3f * static_cast<float>(e) - 1.0f + 0.05f * static_cast<float>(rng.uniform());
  }
  for (int64_t r = 0; r < n; ++r)  // the margin the central differences rely on
    for (int64_t a = 0; a < E; ++a)
      for (int64_t b = a + 1; b < E; ++b)
        EXPECT_GT(std::fabs(x[static_cast<size_t>(r * E + a)] - x[static_cast<size_t>(r * E + b)]),
                  4 * h);
  return x;
}

// The router's backward, the reference against central differences (in double) of the loss
// sum_j dweights_j w_j over the reference forward, and the kernel against the reference.
TEST(MoeRouteBackward, MatchesCentralDifferencesAndTheReference) {
  ThreadPool pool(1);
  const double h = 1e-3;
  for (const auto& [E, k] : {std::pair<int64_t, int64_t>{8, 2}, {6, 3}, {5, 1}, {4, 4}}) {
    const int64_t n = 7;
    std::vector<float> logits = separated_logits(n, E, static_cast<float>(h), 11);
    Rng rng(12);
    std::vector<float> dw(static_cast<size_t>(n * k));
    for (float& v : dw) v = rng.normal();
    std::vector<int32_t> ids(dw.size());
    std::vector<float> w(dw.size());
    ref::moe_route(ids.data(), w.data(), logits.data(), n, E, k, true);
    for (bool normalize : {false, true}) {
      std::vector<float> want(static_cast<size_t>(n * E)), got(want.size());
      ref::moe_route_backward(want.data(), dw.data(), ids.data(), logits.data(), n, E, k,
                              normalize);
      moe_route_backward(pool, got.data(), dw.data(), ids.data(), logits.data(), n, E, k,
                         normalize);
      auto loss = [&] {
        std::vector<int32_t> i2(ids.size());
        std::vector<float> w2(ids.size());
        ref::moe_route(i2.data(), w2.data(), logits.data(), n, E, k, normalize);
        EXPECT_EQ(i2, ids);  // the choice did not move
        double l = 0;
        for (size_t i = 0; i < w2.size(); ++i) l += static_cast<double>(dw[i]) * w2[i];
        return l;
      };
      for (size_t i = 0; i < logits.size(); ++i) {
        const float x0 = logits[i];
        logits[i] = static_cast<float>(x0 + h);
        const double up = loss();
        logits[i] = static_cast<float>(x0 - h);
        const double down = loss();
        logits[i] = x0;
        const double fd = (up - down) / (static_cast<double>(static_cast<float>(x0 + h)) -
                                         static_cast<float>(x0 - h));
        EXPECT_NEAR(want[i], fd, 2e-4) << "E=" << E << " k=" << k << " " << i;
        EXPECT_NEAR(got[i], want[i], 2e-6) << "E=" << E << " k=" << k << " " << i;
      }
    }
  }
}

TEST(ScatterAddRowsBackward, GradientsOfSourceAndWeightInPlace) {
  const int64_t C = 5, n = 6, dy_rows = 3;
  Rng rng(3);
  std::vector<float> src(static_cast<size_t>(n * C)), dy(static_cast<size_t>(dy_rows * C));
  for (float& x : src) x = rng.normal();
  for (float& x : dy) x = rng.normal();
  const std::vector<int32_t> index = {2, 0, 2, 1, 0, 2};
  const std::vector<float> weight = {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, 0.0f};
  // The gradients of L = sum(dy * scatter_add_rows(0, src, index, weight)), by hand.
  std::vector<double> dsrc_want(src.size()), dw_want(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < C; ++i) {
      const double g = dy[static_cast<size_t>(index[r] * C + i)];
      dsrc_want[static_cast<size_t>(r * C + i)] = weight[r] * g;
      dw_want[r] += g * src[static_cast<size_t>(r * C + i)];
    }
  std::vector<float> dw(static_cast<size_t>(n));
  const ops::Context ctx;
  std::vector<float> inplace = src;  // dsrc over src: allowed
  ops::scatter_add_rows_backward(ctx, inplace.data(), dw.data(), dy.data(), inplace.data(),
                                 index.data(), weight.data(), n, C, dy_rows);
  for (size_t i = 0; i < src.size(); ++i) EXPECT_NEAR(inplace[i], dsrc_want[i], 1e-6) << i;
  for (int64_t r = 0; r < n; ++r) EXPECT_NEAR(dw[r], dw_want[r], 1e-5) << r;
}

TEST(MoeOps, BadSizesAndIndicesAreRefused) {
  std::vector<float> logits(8), w(8), x(8);
  std::vector<int32_t> ids(8);
  const ops::Context ctx;
  test::expect_error(
      [&] { ops::moe_route(ctx, ids.data(), w.data(), logits.data(), 1, 4, 5, true); }, "k=5");
  test::expect_error(
      [&] { ops::moe_route(ctx, ids.data(), w.data(), logits.data(), 1, 4, 0, true); }, "k=0");
  const int32_t bad = 3;
  const float one = 1.0f;
  test::expect_error([&] { ops::scatter_add_rows(ctx, x.data(), w.data(), &bad, &one, 1, 4, 2); },
                     "index[0] = 3");
  test::expect_error(
      [&] {
        ops::scatter_add_rows_backward(ctx, x.data(), w.data(), x.data(), x.data(), &bad, &one, 1,
                                       4, 2);
      },
      "index[0] = 3");
  test::expect_error(
      [&] { ops::moe_route_backward(ctx, w.data(), x.data(), &bad, logits.data(), 1, 3, 1, true); },
      "ids[0] = 3");
  test::expect_error(
      [&] {
        ops::moe_route_backward(ctx, w.data(), x.data(), ids.data(), logits.data(), 1, 4, 5, true);
      },
      "k=5");
}

}  // namespace
}  // namespace tessera::cpu
