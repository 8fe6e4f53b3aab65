// The sliding-window layers' own cache pool (EngineOptions::max_sequences): a Gemma 3-like model
// (local layers over a window of 5 beside global ones) and a Mistral-like one (every layer
// windowed) give the same logits with the pool apart as with every layer in one pool, bit for
// bit, over chunked prefill, decode, several sequences and forks; the pool holds only the
// windows' blocks as the sequences grow, and what it cannot do is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "infer/engine.h"
#include "test_util/expect_error.h"
#include "tiny_model.h"

namespace tessera::infer {
namespace {

EngineOptions options(int64_t max_sequences) {
  EngineOptions o;
  o.max_ctx = 128;
  o.kv_tokens = 256;
  o.block_tokens = 4;  // the window of 5 starts mid-block
  o.max_rows = 8;      // prefill in several chunks
  o.max_sequences = max_sequences;
  return o;
}

model::DecoderModel gemma3_like() {
  test::TinyOptions o;
  o.gemma3 = true;
  o.layers = 3;  // two local layers, one global
  return test::make_tiny_model(o);
}

model::DecoderModel mistral_like() {
  model::DecoderModel m = test::make_tiny_model(test::TinyOptions{});
  m.config.sliding_window = 6;  // every layer
  return m;
}

// Runs two sequences (prompts of 23 and 9 tokens, prefilled together in chunks) and a fork of
// the first, then decodes all three for `steps` tokens, one forward per step; returns every
// logit row in order.
std::vector<float> run(Engine& e, int64_t steps, int64_t* window_peak) {
  const int64_t V = e.config().vocab;
  const std::vector<int32_t> a = test::random_tokens(23, V, 5), b = test::random_tokens(9, V, 6);
  std::vector<float> out;
  auto keep = [&](const std::vector<float>& l) {
    out.insert(out.end(), l.begin(), l.end());
    if (e.window_cache()) *window_peak = std::max(*window_peak, e.window_cache()->used_blocks());
  };
  const int32_t s0 = e.new_sequence(), s1 = e.new_sequence();
  keep(e.forward({Feed{s0, a, true}, Feed{s1, b, true}}));
  const int32_t s2 = e.fork_sequence(s0);
  std::vector<int32_t> next = {1, 2, 3};
  for (int64_t t = 0; t < steps; ++t) {
    const std::vector<float>& l =
        e.forward({Feed{s0, {&next[0], 1}, false}, Feed{s1, {&next[1], 1}, false},
                   Feed{s2, {&next[2], 1}, false}});
    keep(l);
    for (int i = 0; i < 3; ++i)  // greedy
      next[static_cast<size_t>(i)] = static_cast<int32_t>(
          std::max_element(l.begin() + i * V, l.begin() + (i + 1) * V) - (l.begin() + i * V));
  }
  return out;
}

TEST(WindowPool, SameLogitsAsOnePoolAndOnlyTheWindowsHeld) {
  for (const bool mistral : {false, true}) {
    SCOPED_TRACE(mistral ? "mistral-like" : "gemma3-like");
    const model::DecoderModel m = mistral ? mistral_like() : gemma3_like();
    Engine one(m, options(0)), apart(m, options(3));
    ASSERT_EQ(one.window_cache(), nullptr);
    ASSERT_NE(apart.window_cache(), nullptr);
    // Layers split between the pools: gemma3_like's two local layers (its third is global), or
    // both layers of the Mistral-like model (the other pool then only counts blocks).
    EXPECT_EQ(apart.window_cache()->shape().n_layers, 2);
    EXPECT_EQ(apart.cache().shape().n_layers, mistral ? 0 : 1);
    EXPECT_LT(apart.kv_bytes(), one.kv_bytes());
    int64_t peak_one = 0, peak_apart = 0;
    const std::vector<float> want = run(one, 40, &peak_one);
    const std::vector<float> got = run(apart, 40, &peak_apart);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    // Three sequences of up to 63 tokens in blocks of 4, each reading at most the window's two
    // or three blocks at a decode step; the prefill chunks of 8 rows take a few more.
    const int64_t W = m.config.sliding_window;
    EXPECT_LE(peak_apart, 3 * ((8 + W - 2 + 3) / 4 + 2));
    EXPECT_LT(peak_apart, one.cache().used_blocks());
    EXPECT_GT(one.cache().used_blocks(), 3 * 10) << "the sequences did not outgrow the window";
  }
}

// What a row reads: the global layer over every key, each local one over its window at most.
TEST(WindowPool, BytesReadCountEachLayersKeys) {
  const model::DecoderModel m = gemma3_like();  // layers 0, 1 local over 5 positions; 2 global
  const Engine e(m, options(2));
  const int64_t row = 2 * m.config.n_kv_heads * m.config.head_dim * 4;  // a key and value, f32
  EXPECT_EQ(e.kv_bytes_read(3), 3 * 3 * row);
  EXPECT_EQ(e.kv_bytes_read(100), (100 + 5 + 5) * row);
}

TEST(WindowPool, KeptTogetherWhereItWouldNotSave) {
  const model::DecoderModel m = gemma3_like();
  EngineOptions o = options(40);  // 40 windows' blocks exceed the 64 blocks of the cache
  EXPECT_EQ(Engine(m, o).window_cache(), nullptr);
  o.max_sequences = 0;
  EXPECT_EQ(Engine(m, o).window_cache(), nullptr);
  const model::DecoderModel dense = test::make_tiny_model(test::TinyOptions{});
  EXPECT_EQ(Engine(dense, options(2)).window_cache(), nullptr);  // no windowed layer
}

TEST(WindowPool, RefusesWhatItCannotDo) {
  const model::DecoderModel m = gemma3_like();
  Engine e(m, options(2));
  const std::vector<int32_t> t = test::random_tokens(30, m.config.vocab, 7);
  const int32_t s = e.new_sequence();
  e.forward({Feed{s, t, false}});
  e.truncate_sequence(s, 29);  // the window of the row at 29 is still held
  test::expect_error([&] { e.truncate_sequence(s, 10); }, "cannot cut sequence");
  EXPECT_EQ(e.sequence_length(s), 29) << "a refused cut changed the sequence";
  const int32_t s1 = e.new_sequence();
  test::expect_error([&] { e.new_sequence(); }, "max_sequences");
  const std::vector<int32_t> blocks(e.sequence_blocks(s).begin(), e.sequence_blocks(s).begin() + 2);
  test::expect_error([&] { e.share_blocks(s1, blocks, 8); }, "max_sequences");
  EngineOptions bad = options(-1);
  test::expect_error([&] { Engine(m, bad); }, "max_sequences");
}

}  // namespace
}  // namespace tessera::infer
