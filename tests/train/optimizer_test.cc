// AdamW: weight decay only on tensors TrainModel::decays() selects, and global-norm clipping.
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/train_model.h"

namespace tessera::train {
namespace {

// A table with a matrix (decays) between two vectors (do not), so runs alternate.
TensorTable make_table() {
  TensorTable t;
  t.add("ln.weight", Shape{5});
  t.add("fc.weight", Shape{4, 6});
  t.add("fc.bias", Shape{4});
  return t;
}

TEST(AdamW, RunsFollowDecayFlags) {
  const TensorTable t = make_table();
  AdamW opt(t, AdamWConfig{}, ops::Context{});
  ASSERT_EQ(opt.runs().size(), 3u);
  EXPECT_FALSE(opt.runs()[0].decay);
  EXPECT_TRUE(opt.runs()[1].decay);
  EXPECT_FALSE(opt.runs()[2].decay);
  int64_t covered = 0;
  for (const auto& r : opt.runs()) covered += r.n;
  EXPECT_EQ(covered, t.total_elems());
}

TEST(AdamW, DecayOnlyOnMatrices) {
  const TensorTable t = make_table();
  AdamWConfig cfg;
  cfg.weight_decay = 0.5f;
  AdamW opt(t, cfg, ops::Context{});
  std::vector<float> p(static_cast<size_t>(t.total_elems()), 2.0f);
  std::vector<float> g(p.size(), 0.0f);  // zero gradient: only decay can move a parameter
  opt.step(p.data(), g.data(), 0.1, 1);
  for (const auto& ti : t.tensors()) {
    // Decoupled decay: p -= lr * wd * p = 2 - 0.1 * 0.5 * 2 = 1.9 (exact to f32 rounding, 1 ulp).
    const float expect = model::TrainModel::decays(ti) ? 1.9f : 2.0f;
    for (int64_t i = 0; i < ti.numel(); ++i)
      EXPECT_NEAR(p[static_cast<size_t>(ti.offset + i)], expect, 4e-7f) << ti.name;
  }
}

TEST(AdamW, ClippingScalesTheGradient) {
  const TensorTable t = make_table();
  std::vector<float> g(static_cast<size_t>(t.total_elems()), 0.0f);
  double sq = 0;
  for (const auto& ti : t.tensors())
    for (int64_t i = 0; i < ti.numel(); ++i) {
      const float v = 0.25f * static_cast<float>((i % 5) - 2) + 0.5f;
      g[static_cast<size_t>(ti.offset + i)] = v;
      sq += static_cast<double>(v) * v;
    }
  const double norm = std::sqrt(sq);
  ASSERT_GT(norm, 2.0);
  for (float clip : {0.0f, 1.0f}) {  // 0 disables clipping
    AdamWConfig cfg;
    cfg.weight_decay = 0;
    cfg.clip = clip;
    // A large eps makes the first update proportional to the (clipped) gradient instead of its
    // sign, so the update itself shows the scaling.
    cfg.eps = 1e3f;
    AdamW opt(t, cfg, ops::Context{});
    std::vector<float> p(g.size(), 0.0f);
    EXPECT_NEAR(opt.step(p.data(), g.data(), 1.0, 1), norm, norm * 1e-6);
    const double s = clip > 0 ? clip / norm : 1.0;
    for (size_t i = 0; i < g.size(); ++i) {
      // First step: m = (1 - b1) g s, so mhat = g s; vhat = (g s)^2 <= ~1 << eps.
      EXPECT_NEAR(opt.m()[i], 0.1 * g[i] * s, 1e-6) << i;
      const double gs = g[i] * s;
      const double update = gs / (std::fabs(gs) + 1e3);
      EXPECT_NEAR(p[i], -update, 1e-6) << i;
    }
  }
}

TEST(AdamW, NonFiniteGradientThrows) {
  const TensorTable t = make_table();
  AdamW opt(t, AdamWConfig{}, ops::Context{});
  std::vector<float> p(static_cast<size_t>(t.total_elems()), 0.0f), g(p.size(), 0.0f);
  g[3] = NAN;
  EXPECT_THROW(opt.step(p.data(), g.data(), 1e-3, 1), Error);
  AdamWConfig bad;
  bad.beta2 = 1.0f;
  EXPECT_THROW(AdamW(t, bad, ops::Context{}), Error);
}

}  // namespace
}  // namespace tessera::train
