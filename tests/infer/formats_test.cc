// Tiny random Llama and GPT-2 models written by the test as safetensors folders and as GGUF
// files: both load to the same logits (GGUF stores llama q/k rows permuted for interleaved RoPE,
// so this also checks the permutation against the RoPE layouts), and quantized GGUF files load
// back bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "compress/quantize.h"
#include "infer/engine.h"
#include "model/decoder_save.h"
#include "tiny_model.h"

namespace tessera::infer {
namespace {

std::string scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tessera_formats_" + std::to_string(::getpid())) / name;
  std::filesystem::create_directories(dir.parent_path());
  return dir.string();
}

std::vector<float> logits_of(const model::DecoderModel& m, const std::vector<int32_t>& toks) {
  EngineOptions o;
  o.max_ctx = 64;
  o.block_tokens = 8;
  Engine e(m, o);
  const int32_t s = e.new_sequence();
  return e.forward({Feed{s, toks, true}});
}

class Formats : public ::testing::TestWithParam<int> {};

TEST_P(Formats, SafetensorsAndGgufGiveTheSameLogits) {
  test::TinyOptions o;
  o.arch = GetParam() == 2 ? model::DecoderArch::gpt2 : model::DecoderArch::llama;
  o.tied = GetParam() == 1;
  o.qkv_bias = GetParam() == 1;
  o.seed = 40 + static_cast<uint64_t>(GetParam());
  const model::DecoderModel src = test::make_tiny_model(o);
  const std::string dir = scratch(std::to_string(GetParam()) + "_hf");
  const std::string gguf = scratch(std::to_string(GetParam()) + ".gguf");
  model::save_decoder_hf(src, dir, DType::f32);
  model::save_decoder_gguf(src, gguf);
  const model::DecoderModel from_hf = model::load_decoder(dir);
  const model::DecoderModel from_gguf = model::load_decoder(gguf);
  if (o.arch == model::DecoderArch::llama) {
    EXPECT_EQ(from_gguf.config.rope_layout, ops::RopeLayout::interleaved);
  }
  const std::vector<int32_t> toks = {3, 1, 4, 1, 5, 9, 2, 6, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6};
  const std::vector<float> a = logits_of(src, toks), b = logits_of(from_hf, toks),
                           c = logits_of(from_gguf, toks);
  EXPECT_EQ(a, b);  // same values, same layout: bit for bit
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(c[i], a[i], 1e-5 * (1 + std::fabs(a[i]))) << i;

  // A q8_0 GGUF loads back to exactly the quantized model.
  compress::QuantizeOptions qo;
  qo.type = DType::q8_0;
  std::vector<compress::TensorQuantStats> stats;
  const model::DecoderModel q = compress::quantize_decoder(from_hf, qo, &stats);
  const std::string qpath = scratch(std::to_string(GetParam()) + "_q8.gguf");
  model::save_decoder_gguf(q, qpath);
  const model::DecoderModel q_back = model::load_decoder(qpath);
  EXPECT_EQ(q_back.weights.layers[0].w_up.type, DType::q8_0);
  const std::vector<float> lq = logits_of(q, toks), lq_back = logits_of(q_back, toks);
  for (size_t i = 0; i < lq.size(); ++i)
    EXPECT_NEAR(lq_back[i], lq[i], 1e-5 * (1 + std::fabs(lq[i]))) << i;
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

INSTANTIATE_TEST_SUITE_P(Models, Formats, ::testing::Values(0, 1, 2));

}  // namespace
}  // namespace tessera::infer
