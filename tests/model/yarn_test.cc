// YaRN rotary scaling (Qwen2.5 / Qwen3 long context): the frequencies keep the fast pairs, slow
// the slow ones by the factor and ramp between; the configs of transformers 4 and 5 and GGUF
// files load with transformers' and llama.cpp's defaults, round-trip HF -> GGUF -> HF, and what
// is not implemented is refused by key. (scripts/compare-llamacpp-families.sh qwen3-yarn checks
// greedy output against llama.cpp and scripts/float64_reference.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "model/decoder.h"
#include "model/decoder_save.h"
#include "model/hf_fixture.h"
#include "test_util/expect_error.h"

namespace tessera::model {
namespace {

// The tiny fixture (head dim 8, theta 1e4) over 32 dimensions, pretrained on 64 positions.
DecoderConfig yarn_config(double factor) {
  DecoderConfig c;
  c.rope_dim = 32;
  c.rope_theta = 10000;
  c.rope_scaling = RopeScaling::yarn;
  c.rope_factor = factor;
  c.rope_original_max_ctx = 64;
  return c;
}

// A pair that turns more than beta_fast (32) times over the 64 positions is kept; one that turns
// less than beta_slow (1) time is slowed by the factor; between, the ratio falls monotonically.
TEST(Yarn, KeepsFastPairsSlowsSlowOnesRampsBetween) {
  const DecoderConfig c = yarn_config(4);
  DecoderConfig plain = c;
  plain.rope_scaling = RopeScaling::none;
  const std::vector<double> got = rope_inv_freqs(c), base = rope_inv_freqs(plain);
  ASSERT_EQ(got.size(), 16u);
  double last_ratio = 1.0;
  int kept = 0, slowed = 0, between = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double turns = 64 * base[i] / (2 * std::numbers::pi), ratio = got[i] / base[i];
    // The ramp's ends are rounded outwards to whole pairs: a margin either side.
    if (turns > 32 * 1.5) {
      EXPECT_EQ(ratio, 1.0) << i;
    }
    if (turns < 1 / 1.5) {
      EXPECT_DOUBLE_EQ(ratio, 0.25) << i;
    }
    EXPECT_LE(ratio, last_ratio) << i;
    last_ratio = ratio;
    kept += ratio == 1.0;
    slowed += std::fabs(ratio - 0.25) < 1e-15;
    between += ratio < 1.0 && ratio > 0.25 + 1e-15;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(slowed, 0);
  EXPECT_GT(between, 2);
}

std::string write_yarn_folder(const std::string& name, const nlohmann::json& rope_key,
                              const std::string& key = "rope_scaling") {
  test::HfModel hf = test::tiny_llama(false, "Qwen2ForCausalLM");
  hf.config[key] = rope_key;
  const std::string dir = test::temp_folder(name);
  test::write_hf(hf, dir);
  return dir;
}

TEST(Yarn, HfConfigsLoadWithTransformersDefaults) {
  // transformers 4: factor and length given; attention factor 0.1 ln(factor) + 1.
  const DecoderModel a = load_decoder_hf(write_yarn_folder(
      "yarn_v4", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}}));
  EXPECT_EQ(a.config.rope_scaling, RopeScaling::yarn);
  EXPECT_EQ(a.config.rope_factor, 4.0);
  EXPECT_EQ(a.config.rope_original_max_ctx, 32);
  EXPECT_NEAR(a.config.rope_attn_factor, 0.1 * std::log(4.0) + 1, 1e-15);
  EXPECT_EQ(a.config.yarn_beta_fast, 32.0);
  EXPECT_EQ(a.config.yarn_beta_slow, 1.0);
  // transformers 5: no factor (the lengths' ratio, 128 / 64), its own attention factor and betas.
  const DecoderModel b =
      load_decoder_hf(write_yarn_folder("yarn_v5",
                                        {{"rope_type", "yarn"},
                                         {"rope_theta", 10000.0},
                                         {"original_max_position_embeddings", 64},
                                         {"attention_factor", 1.5},
                                         {"beta_fast", 16},
                                         {"beta_slow", 2}},
                                        "rope_parameters"));
  EXPECT_EQ(b.config.rope_factor, 2.0);
  EXPECT_EQ(b.config.rope_attn_factor, 1.5);
  EXPECT_EQ(b.config.yarn_beta_fast, 16.0);
  EXPECT_EQ(b.config.yarn_beta_slow, 2.0);
  // DeepSeek's attention factor and an unrounded ramp are refused by field.
  tessera::test::expect_error(
      [] {
        load_decoder_hf(
            write_yarn_folder("yarn_mscale", {{"type", "yarn"}, {"factor", 4.0}, {"mscale", 0.7}}));
      },
      "mscale");
  tessera::test::expect_error(
      [] {
        load_decoder_hf(write_yarn_folder(
            "yarn_truncate", {{"type", "yarn"}, {"factor", 4.0}, {"truncate", false}}));
      },
      "truncate");
}

// HF -> GGUF (rope.scaling.type yarn; attn_factor the part beyond llama.cpp's own
// 0.1 ln(factor) + 1) -> HF keeps every field; a GGUF with DeepSeek's log multiplier is refused.
TEST(Yarn, RoundTripsThroughGgufAndRefusesWhatItLacks) {
  const std::string dir = write_yarn_folder("yarn_rt", {{"type", "yarn"},
                                                        {"factor", 4.0},
                                                        {"original_max_position_embeddings", 32},
                                                        {"attention_factor", 1.25},
                                                        {"beta_fast", 24}});
  const DecoderModel hf = load_decoder_hf(dir);
  save_decoder_gguf(hf, dir + "/m.gguf");
  const DecoderModel g = load_decoder_gguf(dir + "/m.gguf");
  const std::string arch = g.gguf->get_string("general.architecture") + ".";
  EXPECT_EQ(g.gguf->get_string(arch + "rope.scaling.type"), "yarn");
  EXPECT_NEAR(g.gguf->get_f32(arch + "rope.scaling.attn_factor"), 1.25 / (0.1 * std::log(4.0) + 1),
              1e-6);
  const std::string back_dir = test::temp_folder("yarn_rt_back");
  save_decoder_hf(g, back_dir, DType::f32, "{\"model\": {}}");
  for (const DecoderModel& m : {g, load_decoder_hf(back_dir)}) {
    EXPECT_EQ(m.config.rope_scaling, RopeScaling::yarn);
    EXPECT_EQ(m.config.rope_factor, 4.0);
    EXPECT_EQ(m.config.rope_original_max_ctx, 32);
    EXPECT_NEAR(m.config.rope_attn_factor, 1.25, 1e-6);
    EXPECT_EQ(m.config.yarn_beta_fast, 24.0);
    EXPECT_EQ(rope_inv_freqs(m.config), rope_inv_freqs(hf.config));
  }
  const formats::GgufFile f(dir + "/m.gguf");
  formats::GgufWriter w;
  for (const auto& [key, value] : f.metadata())
    if (key != "general.alignment") w.set(key, value);
  w.set(arch + "rope.scaling.yarn_log_multiplier", 0.1f);
  for (const formats::GgufTensorInfo& t : f.tensors())
    w.add_tensor(t.name, t.ggml_type, t.shape(), t.data);
  w.write(dir + "/deepseek.gguf");
  tessera::test::expect_error([&] { load_decoder_gguf(dir + "/deepseek.gguf"); },
                              arch + "rope.scaling.yarn_log_multiplier");
}

}  // namespace
}  // namespace tessera::model
