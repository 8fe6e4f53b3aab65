// Hostile Hugging Face folders: each broken config field, tensor or shard index is rejected
// with a one-line error naming the file and the field, tensor or shard.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "model/decoder.h"
#include "model/hf_fixture.h"
#include "test_util/expect_error.h"

namespace tessera::model {
namespace {

using test::HfModel;

// Writes `hf` (sharded when shards > 1) and expects loading it to fail naming each of `parts`.
void expect_rejected(const HfModel& hf, const std::string& name,
                     const std::vector<std::string>& parts, int shards = 1) {
  const std::string dir = test::temp_folder(name);
  test::write_hf(hf, dir, DType::f32, shards);
  for (const std::string& part : parts)
    tessera::test::expect_error([&] { load_decoder_hf(dir); }, part);
}

TEST(DecoderHfHostile, MissingConfigField) {
  HfModel hf = test::tiny_llama(false);
  hf.config.erase("intermediate_size");
  expect_rejected(hf, "no_ffn", {"config.json", "'intermediate_size'"});
}

TEST(DecoderHfHostile, BadConfigValues) {
  HfModel hf = test::tiny_llama(false);
  hf.config["num_attention_heads"] = -4;
  expect_rejected(hf, "neg_heads", {"config.json", "'num_attention_heads'"});
  hf = test::tiny_llama(false);
  hf.config["num_key_value_heads"] = 3;  // 4 heads are not a multiple of 3
  expect_rejected(hf, "gqa", {"config.json", "'num_key_value_heads' (3)"});
  hf = test::tiny_llama(false);
  hf.config["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  expect_rejected(hf, "dynamic", {"config.json", "rope_scaling.rope_type", "dynamic"});
  hf = test::tiny_llama(false);
  hf.config["architectures"] = {"FalconForCausalLM"};
  expect_rejected(hf, "falcon", {"config.json", "FalconForCausalLM"});
  HfModel g = test::tiny_gpt2();
  g.config["activation_function"] = "relu";
  expect_rejected(g, "relu", {"config.json", "activation_function"});
  g = test::tiny_gpt2();
  g.config["scale_attn_weights"] = false;
  expect_rejected(g, "unscaled", {"config.json", "'scale_attn_weights' is false"});
  g = test::tiny_gpt2();
  g.config["scale_attn_by_inverse_layer_idx"] = true;
  expect_rejected(g, "by_layer", {"config.json", "'scale_attn_by_inverse_layer_idx' is true"});
  g = test::tiny_gpt2();
  g.config["scale_attn_weights"] = "yes";
  expect_rejected(g, "scale_type", {"config.json", "'scale_attn_weights' must be true or false"});
}

// transformers 5's 'rope_parameters': a value it does not support, or one that disagrees with
// the transformers 4 fields beside it, is refused naming the fields, never run with a guess.
TEST(DecoderHfHostile, RopeParametersRefusedNotGuessed) {
  HfModel hf = test::tiny_llama(false);
  hf.config["rope_parameters"] = {{"rope_type", "dynamic"}, {"rope_theta", 1e4}, {"factor", 4.0}};
  expect_rejected(hf, "v5_dynamic", {"config.json", "'rope_parameters.rope_type'", "dynamic"});
  hf = test::tiny_llama(false);  // top-level rope_theta 10000
  hf.config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 100000.0}};
  expect_rejected(
      hf, "v5_theta",
      {"config.json", "'rope_theta' (10000)", "'rope_parameters.rope_theta' (100000)", "disagree"});
  hf = test::tiny_llama(false);
  hf.config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  hf.config["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  expect_rejected(hf, "v5_factor", {"config.json", "'rope_scaling'", "'rope_parameters'"});
  // A share of each head that is not an even number of its 8 dimensions (0.5 is: 4).
  hf = test::tiny_llama(false);
  hf.config["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", 0.3}};
  expect_rejected(hf, "v5_partial", {"config.json", "partial_rotary_factor", "0.3"});
  hf = test::tiny_llama(false);
  hf.config["rope_parameters"] = 100000.0;
  expect_rejected(hf, "v5_not_object", {"config.json", "'rope_parameters' must be an object"});
}

TEST(DecoderHfHostile, MissingTensor) {
  HfModel hf = test::tiny_llama(false);
  hf.tensors.erase("model.layers.1.mlp.up_proj.weight");
  expect_rejected(hf, "no_up", {"model.safetensors", "'model.layers.1.mlp.up_proj.weight'"});
  hf = test::tiny_llama(false, "Qwen2ForCausalLM");
  hf.tensors.erase("model.layers.0.self_attn.k_proj.bias");
  expect_rejected(hf, "no_kbias", {"model.safetensors.index.json", "k_proj.bias"}, 2);
  hf = test::tiny_llama(false);
  hf.tensors.erase("lm_head.weight");  // untied needs the head
  expect_rejected(hf, "no_head", {"'lm_head.weight'"});
}

// A tied checkpoint may carry lm_head.weight equal to the embedding (loaded as tied); one that
// differs is refused, since the file does not say which head it means.
TEST(DecoderHfHostile, TiedHeadThatDiffers) {
  HfModel hf = test::tiny_llama(true);
  hf.tensors["lm_head.weight"] = hf.tensors.at("model.embed_tokens.weight");
  const std::string dir = test::temp_folder("tied_equal");
  test::write_hf(hf, dir);
  EXPECT_TRUE(load_decoder_hf(dir).config.tied_embeddings);
  hf.tensors["lm_head.weight"].values[5] += 0.25f;
  expect_rejected(hf, "tied_differs",
                  {"model.safetensors", "'lm_head.weight' differs from the token embedding",
                   "tie_word_embeddings"});
}

TEST(DecoderHfHostile, WrongShape) {
  HfModel hf = test::tiny_llama(false);
  hf.tensors["model.layers.0.self_attn.k_proj.weight"].shape = Shape({32, 16});  // transposed
  expect_rejected(hf, "k_shape",
                  {"model.safetensors", "'model.layers.0.self_attn.k_proj.weight'", "(32, 16)",
                   "expected (16, 32)"});
  HfModel g = test::tiny_gpt2();
  g.tensors["h.0.attn.c_attn.weight"].shape = Shape({96, 32});  // Linear layout, not Conv1D
  expect_rejected(g, "c_attn_shape", {"'h.0.attn.c_attn.weight'", "expected (32, 96)"});
}

TEST(DecoderHfHostile, UnexpectedTensor) {
  HfModel hf = test::tiny_llama(false);
  hf.tensors["model.layers.7.mlp.up_proj.weight"] = {Shape({2}), {1.0f, 2.0f}};
  expect_rejected(hf, "extra", {"unexpected tensor 'model.layers.7.mlp.up_proj.weight'"});
}

TEST(DecoderHfHostile, ShardIndex) {
  const HfModel hf = test::tiny_llama(true);
  const std::string dir = test::temp_folder("missing_shard");
  test::write_hf(hf, dir, DType::f32, 2);
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  tessera::test::expect_error([&] { load_decoder_hf(dir); }, "model-00002-of-00002.safetensors");
  tessera::test::expect_error([&] { load_decoder_hf(dir); }, "model.safetensors.index.json");

  // A shard outside the folder, a tensor listed in the wrong shard, no weights at all.
  auto with_index = [&](const std::string& name, const std::string& index) {
    const std::string d = test::temp_folder(name);
    test::write_hf(hf, d, DType::f32, 2);
    write_file_atomic(d + "/model.safetensors.index.json", index);
    return d;
  };
  std::string d = with_index("escape", R"({"weight_map": {"model.norm.weight": "../x"}})");
  tessera::test::expect_error([&] { load_decoder_hf(d); }, "'../x'");
  // write_hf deals tensors round robin in name order: the embedding, first, is in shard 1.
  d = with_index("wrong_shard", R"({"weight_map": {
      "model.layers.0.input_layernorm.weight": "model-00002-of-00002.safetensors",
      "model.embed_tokens.weight": "model-00002-of-00002.safetensors"}})");
  tessera::test::expect_error([&] { load_decoder_hf(d); },
                              "tensor 'model.embed_tokens.weight' is not in its listed shard");
  d = test::temp_folder("empty");
  write_file_atomic(d + "/config.json", hf.config.dump());
  tessera::test::expect_error([&] { load_decoder_hf(d); }, "model.safetensors");
}

TEST(DecoderHfHostile, DuplicateAcrossShards) {
  const HfModel hf = test::tiny_llama(true);
  const std::string dir = test::temp_folder("dup");
  test::write_hf(hf, dir, DType::f32, 2);
  // A third shard repeating a tensor of the first.
  formats::SafetensorsWriter w;
  const std::vector<float> norm(32, 1.0f);
  w.add("model.norm.weight", DType::f32, {32}, norm.data());
  w.write(dir + "/extra.safetensors");
  nlohmann::json idx = nlohmann::json::parse(read_text_file(dir + "/model.safetensors.index.json"));
  idx["weight_map"]["model.norm.weight"] = "extra.safetensors";
  write_file_atomic(dir + "/model.safetensors.index.json", idx.dump());
  tessera::test::expect_error([&] { load_decoder_hf(dir); }, "'model.norm.weight' also appears in");
}

}  // namespace
}  // namespace tessera::model
