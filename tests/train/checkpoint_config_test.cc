// The model description a training checkpoint records: a model with layer options (Qwen3's q/k
// norms, heads wider than n_embd / n_head) comes back from its checkpoint with every option and
// every parameter; a checkpoint written before the options were recorded still loads, as the
// option-free model it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "model/train_model.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/options.h"

namespace tessera::train {
namespace {

std::string fresh_dir(const std::string& name) {
  const std::string d =
      ::testing::TempDir() + "/checkpoint_config_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

TEST(CheckpointConfig, LayerOptionsComeBack) {
  model::TrainConfig c = model::TrainConfig::preset("llama:tiny", 50);
  c.n_layer = 2;
  c.options.qk_norm = true;
  c.options.head_dim = 48;  // 4 heads of 48 on a width of 128
  c.options.name = "qwen3-like";
  c.options.rope_scaling = model::RopeScaling::yarn;  // the newest enum value and fields
  c.options.rope_factor = 4;
  c.options.rope_original_max_ctx = 64;
  c.options.rope_attn_factor = 1.25;
  c.options.yarn_beta_fast = 16;
  const ops::Context ctx;
  model::TrainModel m(c, ctx);
  m.init_weights(3);
  AdamW opt(m.tensors(), AdamWConfig{}, ctx);
  const std::string dir = fresh_dir("options");
  save_checkpoint(dir, m, opt, TrainState{}, options_to_json(TrainOptions{}));

  const model::DecoderConfig want = m.config().decoder_config();
  const model::DecoderConfig got = read_checkpoint_info(dir).config.decoder_config();
  EXPECT_TRUE(got.qk_norm);
  EXPECT_EQ(got.head_dim, 48);
  EXPECT_EQ(got.q_dim(), 192);
  EXPECT_EQ(got.name, "qwen3-like");
  EXPECT_EQ(got.rope_scaling, model::RopeScaling::yarn);
  EXPECT_EQ(got.rope_factor, 4.0);
  EXPECT_EQ(got.rope_attn_factor, 1.25);
  EXPECT_EQ(got.yarn_beta_fast, 16.0);
  EXPECT_EQ(got.rope_dim, want.rope_dim);
  EXPECT_EQ(got.norm_eps, want.norm_eps);
  auto back = load_model_from_checkpoint(dir, ctx);
  ASSERT_EQ(back->num_params(), m.num_params());
  EXPECT_NO_THROW(back->tensors().at("model.layers.1.self_attn.k_norm.weight"));
  EXPECT_EQ(std::memcmp(back->params(), m.params(), 4 * static_cast<size_t>(m.num_params())), 0);
  std::filesystem::remove_all(dir);
}

// The config record as checkpoints wrote it before the layer options (no "decoder" key): a
// Llama of the llama:tiny shape, 2 layers, vocabulary 50 padded to 128.
TEST(CheckpointConfig, CheckpointsWithoutOptionsStillLoad) {
  const std::string config =
      R"({"n_layer":2,"n_head":4,"n_embd":128,"vocab_size":50,"padded_vocab_size":128,)"
      R"("max_seq":256,"arch":"llama","n_kv_head":2,"d_ff":352,"rope_theta":10000.0,)"
      R"("norm_eps":1e-05,"tied":false,"qkv_bias":false,"rope_interleaved":false})";
  model::TrainConfig c = model::TrainConfig::preset("llama:tiny", 50);
  c.n_layer = 2;
  const ops::Context ctx;
  model::TrainModel same(c, ctx);
  std::vector<float> params(static_cast<size_t>(same.num_params()));
  for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i % 7) - 3.0f;
  const std::string dir = fresh_dir("old");
  formats::SafetensorsWriter w;
  w.add("params", DType::f32, Shape{same.num_params()}, params.data());
  w.set_metadata("format", "tessera-checkpoint-1");
  w.set_metadata("config", config);
  w.set_metadata("options", options_to_json(TrainOptions{}));
  w.write(checkpoint_path(dir));

  const model::DecoderConfig got = read_checkpoint_info(dir).config.decoder_config();
  EXPECT_FALSE(got.qk_norm);
  EXPECT_EQ(got.head_dim, 32);
  EXPECT_EQ(got.rope_dim, 32);
  EXPECT_EQ(got.n_kv_heads, 2);
  auto m = load_model_from_checkpoint(dir, ctx);
  ASSERT_EQ(m->num_params(), same.num_params());
  EXPECT_EQ(std::memcmp(m->params(), params.data(), params.size() * 4), 0);
  std::filesystem::remove_all(dir);
}

// A mixture of experts (OLMoE's: not renormalized, whole-vector q/k norms) comes back from its
// checkpoint with its routing settings and every expert's parameters.
TEST(CheckpointConfig, MixtureOfExpertsComesBack) {
  model::TrainConfig c = model::TrainConfig::preset("llama:tiny", 50);
  c.n_layer = 2;
  c.options.n_experts = 4, c.options.n_experts_used = 2, c.options.expert_norm = false;
  c.options.qk_norm = c.options.qk_norm_whole = true;
  const ops::Context ctx;
  model::TrainModel m(c, ctx);
  m.init_weights(3);
  AdamW opt(m.tensors(), AdamWConfig{}, ctx);
  const std::string dir = fresh_dir("moe");
  save_checkpoint(dir, m, opt, TrainState{}, options_to_json(TrainOptions{}));
  const model::DecoderConfig got = read_checkpoint_info(dir).config.decoder_config();
  EXPECT_EQ(got.n_experts, 4);
  EXPECT_EQ(got.n_experts_used, 2);
  EXPECT_FALSE(got.expert_norm);
  EXPECT_TRUE(got.qk_norm_whole);
  auto back = load_model_from_checkpoint(dir, ctx);
  ASSERT_EQ(back->num_params(), m.num_params());
  EXPECT_NO_THROW(back->tensors().at("model.layers.1.mlp.experts.3.gate_proj.weight"));
  EXPECT_EQ(std::memcmp(back->params(), m.params(), 4 * static_cast<size_t>(m.num_params())), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::train
