// The mixture-of-experts ops: the router's CPU kernel against its float64 reference and a
// hand-worked row (ties, renormalization), the weighted scatter-add against a plain sum, and the
// ops/ checks on bad sizes and indices.
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
}

}  // namespace
}  // namespace tessera::cpu
