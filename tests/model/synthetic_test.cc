// Synthetic benchmark models: presets give the shapes they name, weights are in the asked type
// and run through the engine, and bad specs give one-line errors naming the part.
#include <gtest/gtest.h>

#include <cmath>

#include "model/synthetic.h"
#include "ops/quant.h"
#include "test_util/expect_error.h"

namespace tessera::model {
namespace {

TEST(Synthetic, PresetHasTheNamedShapeAndType) {
  EXPECT_TRUE(is_synthetic_spec("synthetic:1b:q4_0"));
  EXPECT_FALSE(is_synthetic_spec("models/synthetic.gguf"));
  const DecoderModel m = make_synthetic_decoder("synthetic:135m:q8_0");
  const DecoderConfig& c = m.config;
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.d_model, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 1536);
  EXPECT_EQ(c.vocab, 49152);
  EXPECT_TRUE(c.tied_embeddings);
  ASSERT_EQ(m.weights.layers.size(), 30u);
  EXPECT_EQ(m.weights.output.data, m.weights.tok_embd.data);
  EXPECT_EQ(m.weights.layers[7].w_down.type, DType::q8_0);
  EXPECT_EQ(m.weights.layers[7].w_down.shape, Shape({576, 1536}));
  EXPECT_EQ(m.weights.layers[7].attn_norm.type, DType::f32);
  // 30 layers of 4 576x576-ish attention matrices (kv 192 rows) and 3 MLP matrices, plus the
  // embedding (read twice: one row and the tied head) and norms, all q8_0 (34 bytes per 32).
  const int64_t per_layer = 576 * 576 * 2 + 192 * 576 * 2 + 1536 * 576 * 3;
  const int64_t q8 = (per_layer * 30 + 49152 * 576) / 32 * 34;
  EXPECT_EQ(m.total_weight_bytes(), q8 + (30 * 2 + 1) * 576 * 4);

  // Values are small and finite after dequantization, and rows repeat with the pattern.
  std::vector<float> row(576), later(576);
  ops::dequantize_row(m.weights.layers[0].wq.data, DType::q8_0, 576, 3, row.data());
  ops::dequantize_row(m.weights.layers[0].wq.data, DType::q8_0, 576, 19, later.data());
  double ss = 0;
  for (float v : row) {
    ASSERT_TRUE(std::isfinite(v));
    ss += v * v;
  }
  EXPECT_NEAR(std::sqrt(ss / 576), 0.02, 0.004);
  EXPECT_EQ(row, later);
}

TEST(Synthetic, BadSpecsNameThePart) {
  test::expect_error([] { make_synthetic_decoder("synthetic:3b:q4_0"); }, "unknown shape '3b'");
  test::expect_error([] { make_synthetic_decoder("synthetic:1b:iq4_nl"); }, "iq4_nl");
  test::expect_error([] { make_synthetic_decoder("synthetic:1b"); }, "synthetic:<shape>:<type>");
  test::expect_error([] { make_synthetic_decoder("synthetic:135m:q4_k"); }, "multiples of 256");
  test::expect_error([] { make_synthetic_decoder("synthetic:1b:i32"); }, "not a weight type");
}

}  // namespace
}  // namespace tessera::model
