// GGUF files whose metadata contradicts their tensors: each is refused with one line naming the
// file and the key or tensor, never run as a different model than the one stored. (Format-level
// damage is tests/formats/gguf_hostile_test.cc.)
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "model/decoder.h"
#include "model/decoder_save.h"
#include "model/hf_fixture.h"
#include "test_util/expect_error.h"

namespace tessera::model {
namespace {

// A valid GGUF of a two-layer model (Llama unless gpt2), written once per arch.
std::string source_gguf(bool gpt2) {
  const std::string dir = test::temp_folder(gpt2 ? "gguf_hostile_gpt2" : "gguf_hostile_llama");
  test::write_hf(gpt2 ? test::tiny_gpt2() : test::tiny_llama(false), dir);
  save_decoder_gguf(load_decoder_hf(dir), dir + "/m.gguf");
  return dir + "/m.gguf";
}

struct Edit {
  std::map<std::string, formats::GgufValue> set;  // keys set or replaced
  std::set<std::string> drop_tensors;
  // Extra tensors (f32 vectors of the given length).
  std::map<std::string, int64_t> add_tensors;
};

// Writes src with `e` applied to `name`.gguf beside it and returns the path.
std::string rewrite(const std::string& src, const std::string& name, const Edit& e) {
  const formats::GgufFile f(src);
  formats::GgufWriter w;
  for (const auto& [key, value] : f.metadata())
    if (key != "general.alignment") w.set(key, value);
  for (const auto& [key, value] : e.set) w.set(key, value);
  for (const formats::GgufTensorInfo& t : f.tensors())
    if (!e.drop_tensors.contains(t.name)) w.add_tensor(t.name, t.ggml_type, t.shape(), t.data);
  static std::vector<std::vector<float>> extra;  // referenced until write()
  for (const auto& [tname, n] : e.add_tensors) {
    extra.emplace_back(static_cast<size_t>(n), 1.0f);
    w.add_tensor(tname, formats::GgmlType::f32, Shape({n}), extra.back().data());
  }
  const std::string path = test::temp_folder("gguf_hostile_out") + "/" + name + ".gguf";
  w.write(path);
  return path;
}

void expect_refused(const std::string& path, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    tessera::test::expect_error([&] { load_decoder_gguf(path); }, part);
}

TEST(DecoderGgufHostile, SourceLoads) {
  EXPECT_EQ(load_decoder_gguf(source_gguf(false)).config.n_layers, 2);
  EXPECT_EQ(load_decoder_gguf(source_gguf(true)).config.n_layers, 2);
}

// Sizes in the metadata that the tensors do not have: refused naming the tensor and both shapes.
TEST(DecoderGgufHostile, SizesContradictTensors) {
  const std::string src = source_gguf(false);
  Edit e;
  e.set["llama.embedding_length"] = uint32_t{48};
  expect_refused(rewrite(src, "embd", e), {"embd.gguf", "'token_embd.weight'", "expected"});
  e = {};
  e.set["llama.feed_forward_length"] = uint32_t{96};
  expect_refused(rewrite(src, "ffn", e), {"ffn.gguf", "'blk.0.ffn_up.weight'", "expected"});
  e = {};
  e.set["llama.attention.head_count_kv"] = uint32_t{4};
  expect_refused(rewrite(src, "kv", e), {"kv.gguf", "'blk.0.attn_k.weight'", "expected"});
  e = {};
  e.set["llama.vocab_size"] = uint32_t{65};
  expect_refused(rewrite(src, "vocab", e), {"vocab.gguf", "'token_embd.weight'"});
  e = {};
  e.set["llama.block_count"] = uint32_t{3};
  expect_refused(rewrite(src, "more_blocks", e), {"more_blocks.gguf", "missing tensor 'blk.2."});
}

// Tensors the model would not use: a block_count below the blocks stored, or a tensor the
// architecture has no place for (a q/k norm, a bias on some layers only) would otherwise run a
// different model than the file holds.
TEST(DecoderGgufHostile, UnusedTensorsRefused) {
  const std::string src = source_gguf(false);
  Edit e;
  e.set["llama.block_count"] = uint32_t{1};
  expect_refused(rewrite(src, "fewer_blocks", e),
                 {"fewer_blocks.gguf", "'blk.1.", "not used", "block_count"});
  e = {};
  e.add_tensors["blk.0.attn_q_norm.weight"] = 8;
  expect_refused(rewrite(src, "q_norm", e), {"q_norm.gguf", "'blk.0.attn_q_norm.weight'"});
  e = {};
  e.add_tensors["blk.1.attn_q.bias"] = 32;  // a bias on layer 1 only: blk.0 has none
  expect_refused(rewrite(src, "bias_one_layer", e), {"bias_one_layer.gguf", "'blk.1.attn_q.bias'"});
  const std::string gpt2 = source_gguf(true);
  e = {};
  e.add_tensors["blk.0.attn_q_norm.weight"] = 8;
  expect_refused(rewrite(gpt2, "gpt2_extra", e), {"gpt2_extra.gguf", "'blk.0.attn_q_norm.weight'"});
}

// The tokenizer's token list must cover the embedding rows one to one, as llama.cpp requires.
TEST(DecoderGgufHostile, TokenCountContradictsEmbedding) {
  const std::string src = source_gguf(false);
  const int64_t vocab = load_decoder_gguf(src).config.vocab;
  std::vector<std::string> tokens;
  for (int64_t i = 0; i + 1 < vocab; ++i) tokens.push_back("t" + std::to_string(i));
  Edit e;
  e.set["tokenizer.ggml.tokens"] = formats::gguf_array(formats::GgufType::string, tokens);
  expect_refused(rewrite(src, "tokens", e), {"tokens.gguf", "tokenizer.ggml.tokens",
                                             std::to_string(vocab - 1), std::to_string(vocab)});
  tokens.push_back("last");
  e.set["tokenizer.ggml.tokens"] = formats::gguf_array(formats::GgufType::string, tokens);
  EXPECT_EQ(load_decoder_gguf(rewrite(src, "tokens_ok", e)).config.vocab, vocab);
}

// A mixture of experts asking for what is not implemented (shared experts, scaled or
// non-softmax gating, dense leading layers) is refused naming the key, and experts in an
// architecture without them (gemma3 here) too.
TEST(DecoderGgufHostile, MoeOptionsRefusedByKey) {
  const std::string dir = test::temp_folder("gguf_hostile_moe");
  test::write_hf(test::tiny_qwen3moe(), dir);
  save_decoder_gguf(load_decoder_hf(dir), dir + "/m.gguf");
  const std::string src = dir + "/m.gguf";
  EXPECT_EQ(load_decoder_gguf(src).config.n_experts, 4);
  const std::map<std::string, formats::GgufValue> refused = {
      {"qwen3moe.expert_shared_count", uint32_t{1}},
      {"qwen3moe.leading_dense_block_count", uint32_t{1}},
      {"qwen3moe.expert_weights_scale", 2.5f},
      {"qwen3moe.expert_gating_func", uint32_t{2}},
      {"qwen3moe.expert_weights_norm", uint32_t{1}}};
  for (const auto& [key, value] : refused) {
    Edit e;
    e.set[key] = value;
    expect_refused(rewrite(src, "moe_refused", e), {"moe_refused.gguf", key});
  }
  Edit none;
  none.set["qwen3moe.expert_count"] = uint32_t{0};
  expect_refused(rewrite(src, "moe_no_count", none), {"qwen3moe.expert_count"});
}

}  // namespace
}  // namespace tessera::model
