// The step-cost line the scheduler learns: exact on steps that lie on a line, absent until the
// steps differ in size, forgetting old steps; row units by hand.
#include "infer/step_cost.h"

#include <gtest/gtest.h>

namespace tessera::infer {
namespace {

TEST(StepCostFit, RecoversALine) {
  StepCostFit fit;
  for (int i = 0; i < 7; ++i) fit.add(1 + i, 0.003 + 0.001 * (1 + i));
  EXPECT_FALSE(fit.valid());  // fewer than eight steps
  fit.add(8, 0.011);
  ASSERT_TRUE(fit.valid());
  EXPECT_NEAR(fit.fixed_seconds(), 0.003, 1e-12);
  EXPECT_NEAR(fit.seconds_per_unit(), 0.001, 1e-12);
}

TEST(StepCostFit, SameSizedStepsGiveNoLine) {
  StepCostFit fit;
  for (int i = 0; i < 20; ++i) fit.add(8, 0.01 + 1e-4 * (i % 3));
  EXPECT_FALSE(fit.valid());
}

TEST(StepCostFit, ForgetsOldSteps) {
  StepCostFit fit(0.5);  // each step halves the weight of those before it
  for (int i = 0; i < 10; ++i) fit.add(1 + i % 5, 0.001 * (1 + i % 5));  // 1 ms a unit, no fixed
  for (int i = 0; i < 40; ++i) fit.add(1 + i % 5, 0.002 + 0.003 * (1 + i % 5));
  ASSERT_TRUE(fit.valid());
  EXPECT_NEAR(fit.seconds_per_unit(), 0.003, 1e-6);
  EXPECT_NEAR(fit.fixed_seconds(), 0.002, 1e-6);
}

TEST(StepCost, RowUnitsByHand) {
  model::DecoderConfig c;
  c.arch = model::DecoderArch::llama;
  c.d_model = 576, c.n_heads = 9, c.n_kv_heads = 3, c.head_dim = 64, c.d_ff = 1536;
  // Weights per layer: q and o 576 x 576 each, k and v 192 x 576 each, three 1536 x 576; two
  // FLOPs each per token, against 4 x 576 FLOPs per key.
  const double weights = 576.0 * (2 * 576 + 2 * 192 + 3 * 1536);
  EXPECT_DOUBLE_EQ(attention_scale(c), 2 * weights / (4 * 576.0));
  const double s = attention_scale(c);
  EXPECT_DOUBLE_EQ(row_units(0, 1, s), 1.0);
  EXPECT_DOUBLE_EQ(row_units(static_cast<int64_t>(s), 1, s), 2.0);
  // Rows at 10, 11, 12: three rows at a mean position of 11.
  EXPECT_DOUBLE_EQ(row_units(10, 3, s), 3 * (1 + 11 / s));
  EXPECT_EQ(row_units(5, 0, s), 0.0);
}

}  // namespace
}  // namespace tessera::infer
