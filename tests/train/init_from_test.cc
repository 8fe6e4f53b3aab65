// Starting a training run from a model file: a Llama written as GGUF (q/k rows in the
// interleaved RoPE order) and as a Hugging Face folder (rotate-half order) loads into the
// training model, whose forward pass then gives the logits the inference engine gives on the
// file itself (Gemma 3's sliding-window layers and mixtures of experts included); the real
// SmolLM2 GGUF (Q4_1 layers, Q8_0 head) loads at its published size.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "infer/engine.h"
#include "infer/tiny_model.h"
#include "model/decoder_save.h"
#include "model/train_model.h"
#include "test_util/compare.h"
#include "test_util/expect_error.h"

namespace tessera::model {
namespace {

constexpr int64_t kVocab = 300, kT = 24;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/init_from_" + std::to_string(::getpid()) + "_" + name;
}

// A Llama shape (GQA, untied head, q/k/v biases) with every parameter perturbed.
TrainConfig llama_with_biases() {
  TrainConfig c = TrainConfig::preset("llama:tiny", kVocab);
  c.qkv_bias = true;
  return c;
}
std::unique_ptr<TrainModel> source_model(const TrainConfig& c = llama_with_biases()) {
  auto m = std::make_unique<TrainModel>(c, ops::Context{});
  m->init_weights(21);
  Rng rng(5);
  for (const TensorInfo& t : m->tensors().tensors())
    for (int64_t i = 0; i < m->unpadded_elems(t); ++i)
      m->params()[t.offset + i] += 0.05f * rng.normal();
  return m;
}

// The training forward of a model loaded from `path` against the engine on the file.
void expect_same_logits(const std::string& path) {
  auto m = load_trainable(path, ops::Context{});
  std::vector<int32_t> toks(kT);
  Rng rng(8);
  for (int32_t& t : toks) t = static_cast<int32_t>(rng.below(kVocab));
  m->plan(1, kT, Precision::f32, Recompute::none);
  m->forward(toks.data(), nullptr, 1, kT);
  const DecoderModel file = load_decoder(path);
  infer::EngineOptions eo;
  eo.max_ctx = kT;
  eo.kv_type = DType::f32;
  infer::Engine engine(file, eo);
  const int32_t s = engine.new_sequence();
  const std::vector<float> all = engine.forward({infer::Feed{s, toks, true}});
  const int64_t Vp = m->config().padded_vocab_size;
  for (int64_t t = 0; t < kT; ++t)
    EXPECT_LT(test::max_rel_diff(all.data() + t * kVocab, m->logits() + t * Vp, kVocab), 1e-5)
        << path << " row " << t;
}

TEST(InitFrom, LlamaGgufAndHfFolderGiveTheFilesLogits) {
  auto src = source_model();
  const std::string gguf = temp_path("tiny.gguf"), hf = temp_path("hf");
  save_decoder_gguf(as_decoder(*src), gguf);
  save_decoder_hf(as_decoder(*src), hf, DType::f32);
  EXPECT_EQ(load_decoder(gguf).config.rope_layout, ops::RopeLayout::interleaved);
  EXPECT_EQ(load_trainable(gguf, ops::Context{})->config().rope_layout,
            ops::RopeLayout::interleaved);
  expect_same_logits(gguf);
  expect_same_logits(hf);
  // The HF folder holds the source's parameters exactly (f32, rotate-half order both ways).
  auto back = load_trainable(hf, ops::Context{});
  ASSERT_EQ(back->num_params(), src->num_params());
  EXPECT_EQ(std::memcmp(back->params(), src->params(), 4 * static_cast<size_t>(src->num_params())),
            0);
  std::filesystem::remove(gguf);
  std::filesystem::remove_all(hf);
}

// Qwen3: q/k norms (trained, not frozen) and heads wider than n_embd / n_head.
TEST(InitFrom, Qwen3WithWideHeadsGivesTheFilesLogits) {
  TrainConfig c = TrainConfig::preset("llama:tiny", kVocab);
  c.options.qk_norm = true;
  c.options.head_dim = 48;  // 4 heads of 48: q_dim 192, width 128
  auto src = source_model(c);
  const std::string gguf = temp_path("qwen3.gguf"), hf = temp_path("qwen3_hf");
  save_decoder_gguf(as_decoder(*src), gguf);
  save_decoder_hf(as_decoder(*src), hf, DType::f32);
  expect_same_logits(gguf);
  expect_same_logits(hf);
  auto back = load_trainable(hf, ops::Context{});
  EXPECT_TRUE(back->config().decoder_config().qk_norm);
  EXPECT_EQ(back->config().decoder_config().head_dim, 48);
  ASSERT_EQ(back->num_params(), src->num_params());
  EXPECT_EQ(std::memcmp(back->params(), src->params(), 4 * static_cast<size_t>(src->num_params())),
            0);
  std::filesystem::remove(gguf);
  std::filesystem::remove_all(hf);
}

// Llama 3's RoPE scaling, a quarter of each head rotating, and SmolLM3's layers without RoPE
// (every fourth), as a GGUF file and as a folder.
TEST(InitFrom, ScaledPartialAndNoRopeGiveTheFilesLogits) {
  TrainConfig c = TrainConfig::preset("llama:tiny", kVocab);
  c.options.rope_scaling = RopeScaling::llama3;
  c.options.rope_factor = 8, c.options.rope_original_max_ctx = 16;
  c.options.rope_dim = 8;                // of 32
  c.options.nope_layers = {0, 0, 0, 1};  // every fourth, the pattern GGUF holds
  auto src = source_model(c);
  const std::string gguf = temp_path("scaled.gguf"), hf = temp_path("scaled_hf");
  save_decoder_gguf(as_decoder(*src), gguf);
  save_decoder_hf(as_decoder(*src), hf, DType::f32);
  expect_same_logits(gguf);
  expect_same_logits(hf);
  const DecoderConfig back = load_trainable(hf, ops::Context{})->config().decoder_config();
  EXPECT_EQ(back.rope_scaling, RopeScaling::llama3);
  EXPECT_EQ(back.rope_dim, 8);
  EXPECT_EQ(back.nope_layers, c.options.nope_layers);
  std::filesystem::remove(gguf);
  std::filesystem::remove_all(hf);
}

// Gemma 3 (q/k norms, post-norms, GeGLU, scaled embeddings and scores, local layers over a window
// of 7 positions, shorter than the kT rows compared: the training attention's window against the
// engine's), as a folder.
TEST(InitFrom, Gemma3GivesTheFilesLogits) {
  TrainConfig c = TrainConfig::preset("llama:tiny", kVocab);
  c.tied = true;
  DecoderConfig& o = c.options;
  o.qk_norm = o.post_norms = true;
  o.mlp_act = ops::GluAct::gelu_tanh;
  o.embed_scale = std::sqrt(128.0f);
  o.attn_scale = 1.0 / std::sqrt(48.0);
  o.local_layers = {1, 1, 0, 1};
  o.sliding_window = 7;
  o.rope_theta_local = 1000;
  auto src = source_model(c);
  const std::string hf = temp_path("gemma3_hf");
  save_decoder_hf(as_decoder(*src), hf, DType::f32);
  expect_same_logits(hf);
  auto back = load_trainable(hf, ops::Context{});
  EXPECT_TRUE(back->config().decoder_config().post_norms);
  ASSERT_EQ(back->num_params(), src->num_params());
  EXPECT_LT(test::max_rel_diff(back->params(), src->params(), src->num_params()), 1e-6);
  EXPECT_EQ(back->config().decoder_config().window(0), 7);
  EXPECT_EQ(back->config().decoder_config().window(2), 0);
  std::filesystem::remove_all(hf);
}

TEST(InitFrom, RealQuantizedFileLoadsAtItsSize) {
  const std::string path =
      std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << "run scripts/install-deps.sh";
  auto m = load_trainable(path, ops::Context{});
  EXPECT_EQ(m->config().arch, DecoderArch::llama);
  EXPECT_EQ(m->config().kv_heads(), 3);
  EXPECT_TRUE(m->config().tied);
  EXPECT_EQ(m->num_params(), 134515008);
  // The Q4_1 rows widened: the first layer's q row 0 equals the file's dequantized row.
  const DecoderModel file = load_decoder(path);
  std::vector<float> row(576);
  to_f32(file.weights.layers[0].wq.type, file.weights.layers[0].wq.data, row.data(), 576);
  const float* q = m->params() + m->tensors().at("model.layers.0.self_attn.q_proj.weight").offset;
  for (int i = 0; i < 576; ++i) ASSERT_EQ(q[i], row[static_cast<size_t>(i)]) << i;
}

// Mixtures of experts (Mixtral's shape; OLMoE's: weights not renormalized, whole-vector q/k
// norms) as GGUF files and folders: the training forward gives the file's logits, and a folder
// holds the parameters exactly (each expert a tensor of its own, named as HF names it).
TEST(InitFrom, MixturesOfExpertsGiveTheFilesLogits) {
  for (bool olmoe : {false, true}) {
    TrainConfig c = TrainConfig::preset("llama:tiny", kVocab);
    c.n_layer = 2;
    c.options.n_experts = 4, c.options.n_experts_used = 2, c.options.expert_norm = !olmoe;
    c.options.qk_norm = c.options.qk_norm_whole = olmoe;
    auto src = source_model(c);
    const std::string name = olmoe ? "olmoe" : "mixtral";
    const std::string gguf = temp_path(name + ".gguf"), hf = temp_path(name + "_hf");
    save_decoder_gguf(as_decoder(*src), gguf);
    save_decoder_hf(as_decoder(*src), hf, DType::f32);
    expect_same_logits(gguf);
    expect_same_logits(hf);
    auto back = load_trainable(hf, ops::Context{});
    const DecoderConfig d = back->config().decoder_config();
    EXPECT_EQ(d.n_experts, 4);
    EXPECT_EQ(d.expert_norm, !olmoe);
    EXPECT_EQ(d.qk_norm_whole, olmoe);
    ASSERT_EQ(back->num_params(), src->num_params());
    EXPECT_EQ(
        std::memcmp(back->params(), src->params(), 4 * static_cast<size_t>(src->num_params())), 0);
    EXPECT_NO_THROW(
        back->tensors().at(olmoe ? "model.layers.1.mlp.experts.3.down_proj.weight"
                                 : "model.layers.1.block_sparse_moe.experts.3.w2.weight"));
    std::filesystem::remove(gguf);
    std::filesystem::remove_all(hf);
  }
}

}  // namespace
}  // namespace tessera::model
