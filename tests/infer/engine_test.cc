// The engine against a plain float64 forward pass on tiny random Llama and GPT-2 models: prefill,
// token-by-token decode, several sequences in one call, chunked prefill across cache blocks,
// reference and SIMD kernels; and its cache bookkeeping and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/device.h"
#include "compress/quantize.h"
#include "infer/engine.h"
#include "model/decoder.h"
#include "model/synthetic.h"
#include "ops/backend.h"
#include "ops/op_tally.h"
#include "ops/quant.h"
#include "test_util/expect_error.h"
#include "tiny_model.h"

namespace tessera::infer {
namespace {

using test::TinyOptions;

void expect_close(const float* got, const double* want, int64_t n, double tol, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
}

EngineOptions small_options(bool reference) {
  EngineOptions o;
  o.max_ctx = 64;
  o.kv_tokens = 256;
  o.block_tokens = 4;  // many blocks per sequence
  o.max_rows = 8;      // prefill in several chunks
  o.ctx.reference = reference;
  return o;
}

class EngineVsReference : public ::testing::TestWithParam<int> {};

TinyOptions variant(int v) {
  TinyOptions o;
  switch (v) {
    case 0:
      break;  // llama, GQA, untied, rotate-half
    case 1:
      o.tied = true;
      o.rope_layout = ops::RopeLayout::interleaved;
      break;
    case 2:
      o.qkv_bias = true;
      o.kv_heads = 1;
      break;  // qwen2-like bias, multi-query
    case 3:
      o.arch = model::DecoderArch::gpt2;
      break;
    case 4:  // qwen3: q/k norms, heads wider than width / heads (q_dim 64 over a width of 32)
      o.qk_norm = true;
      o.head_dim = 16;
      break;
    case 5:  // gemma3: local layers 0, 1 over 5 positions, layer 2 global; tied, multi-query
      o.gemma3 = true;
      o.layers = 3;
      o.head_dim = 16;
      o.kv_heads = 1;
      o.tied = true;
      break;
    case 6:  // OLMoE-like: 4 experts, 2 per token, weights as the router gives them, whole-vector
             // q/k norms
      o.experts = 4;
      o.expert_norm = false;
      o.qk_norm_whole = true;
      break;
    case 7:  // Mixtral-like: 8 experts, 2 per token renormalized, interleaved RoPE, tied
      o.experts = 8;
      o.ffn = 16;
      o.rope_layout = ops::RopeLayout::interleaved;
      o.tied = true;
      break;
    case 8:  // SmolLM3-like: layer 1 of 3 without RoPE
      o.layers = 3;
      o.nope_every = 2;
      break;
    case 9:  // Phi-3.5-like LongRoPE: the engine's 64 positions take the long factors
      o.longrope = true;
      break;
  }
  o.seed = 10 + static_cast<uint64_t>(v);
  return o;
}

TEST_P(EngineVsReference, PrefillAndDecodeMatchPlainForward) {
  const model::DecoderModel m = test::make_tiny_model(variant(GetParam()));
  const int64_t V = m.config.vocab;
  const std::vector<int32_t> toks = test::random_tokens(21, V, 3);
  const std::vector<double> want =
      test::reference_logits(m, toks, false, small_options(false).max_ctx);
  for (bool reference : {true, false}) {
    Engine e(m, small_options(reference));
    // All positions in one call (chunks of 8 rows, blocks of 4 tokens).
    const int32_t s = e.new_sequence();
    const std::vector<float> all = e.forward({Feed{s, toks, true}});
    expect_close(all.data(), want.data(), static_cast<int64_t>(toks.size()) * V, 2e-4, "prefill");
    // Prefix of 13, then one token at a time.
    const int32_t s2 = e.new_sequence();
    std::vector<int32_t> head(toks.begin(), toks.begin() + 13);
    std::vector<float> last = e.forward({Feed{s2, head, false}});
    expect_close(last.data(), want.data() + 12 * V, V, 2e-4, "prefix");
    for (size_t t = 13; t < toks.size(); ++t) {
      last = e.forward({Feed{s2, {&toks[t], 1}, false}});
      expect_close(last.data(), want.data() + t * V, V, 2e-4, "decode");
    }
    EXPECT_EQ(e.sequence_length(s2), 21);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, EngineVsReference,
                         ::testing::Values(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));

// LongRoPE takes its short factors in a run sized within the pretrained length (32 positions
// here) and its long ones beyond; the two give different logits.
TEST(Engine, LongRopePicksItsFactorsByTheContext) {
  const model::DecoderModel m = test::make_tiny_model(variant(9));
  const int64_t V = m.config.vocab;
  const std::vector<int32_t> toks = test::random_tokens(21, V, 3);
  EngineOptions o = small_options(false);
  o.max_ctx = 32;
  const std::vector<double> short_want = test::reference_logits(m, toks, false, 32);
  const std::vector<double> long_want = test::reference_logits(m, toks, false, 64);
  Engine e(m, o);
  const int32_t s = e.new_sequence();
  const std::vector<float> all = e.forward({Feed{s, toks, true}});
  expect_close(all.data(), short_want.data(), static_cast<int64_t>(toks.size()) * V, 2e-4,
               "short factors");
  double diff = 0;
  for (size_t i = 0; i < short_want.size(); ++i)
    diff = std::max(diff, std::fabs(short_want[i] - long_want[i]));
  EXPECT_GT(diff, 1e-2) << "short and long factors give the same logits: the test sees nothing";
}

// A MoE decode step reads only the experts its token chose: the weight products' bytes, as the
// ops report them, are the attention's, the router's, the head's and k of E experts' matrices,
// which is also what weight_bytes_per_token counts (besides the norms and one embedding row).
TEST(Engine, MoeDecodeReadsOnlyTheChosenExperts) {
  TinyOptions opts = variant(7);  // 8 experts, 2 per token; wide enough that the products'
  opts.width = opts.ffn = 128;    // activations (x and y) add under 2% to their weight bytes
  const model::DecoderModel m = test::make_tiny_model(opts);
  const model::DecoderConfig& c = m.config;
  const int64_t C = c.d_model, F = c.d_ff, Q = c.q_dim(), KV = c.kv_dim(), V = c.vocab;
  const int64_t k = c.n_experts_used, E = c.n_experts, L = c.n_layers;
  const double attention = static_cast<double>(L * (2 * Q * C + 2 * KV * C)) * 4;
  const double chosen = static_cast<double>(L * (E * C + k * 3 * F * C) + V * C) * 4;
  const double all = chosen + static_cast<double>(L * (E - k) * 3 * F * C) * 4;
  ops::OpTally tally(false);
  EngineOptions o = small_options(false);
  o.ctx.observer = &tally;
  Engine e(m, o);
  const std::vector<int32_t> toks = test::random_tokens(6, V, 4);
  const int32_t s = e.new_sequence();
  e.forward({Feed{s, {toks.data(), 5}, false}});
  tally.reset();
  e.forward({Feed{s, {&toks[5], 1}, false}});
  double read = 0;
  for (const ops::OpTotal& t : tally.totals())
    if (t.op == "matmul_wt" || t.op == "matmul_wt_group") read += t.bytes;
  EXPECT_GT(read, attention + chosen);
  EXPECT_LT(read, (attention + chosen) * 1.02) << "all experts would be " << attention + all;
  const double norms = static_cast<double>(L * 2 * C + C) * 4;
  EXPECT_EQ(static_cast<double>(m.weight_bytes_per_token()),
            attention + chosen + norms + static_cast<double>(C) * 4 /* the looked-up row */);
}

// Mistral v0.1's sliding window: each position sees only the last W positions. Prefill in
// chunks and token-by-token decode both match the windowed float64 forward, and differ from the
// full-attention model once the sequence is longer than the window.
TEST(Engine, SlidingWindowMatchesWindowedReference) {
  model::DecoderModel m = test::make_tiny_model(variant(0));
  const int64_t V = m.config.vocab;
  const std::vector<int32_t> toks = test::random_tokens(21, V, 3);
  const std::vector<double> full = test::reference_logits(m, toks);
  m.config.sliding_window = 6;  // blocks of 4 tokens: the window starts mid-block
  const std::vector<double> want = test::reference_logits(m, toks);
  Engine e(m, small_options(false));
  const int32_t s = e.new_sequence();
  const std::vector<float> all = e.forward({Feed{s, toks, true}});
  expect_close(all.data(), want.data(), static_cast<int64_t>(toks.size()) * V, 2e-4, "prefill");
  const int32_t s2 = e.new_sequence();
  std::vector<int32_t> head(toks.begin(), toks.begin() + 9);
  std::vector<float> last = e.forward({Feed{s2, head, false}});
  for (size_t t = 9; t < toks.size(); ++t) {
    last = e.forward({Feed{s2, {&toks[t], 1}, false}});
    expect_close(last.data(), want.data() + t * V, V, 2e-4, "decode");
  }
  double diff = 0;
  for (int64_t i = 0; i < V; ++i)
    diff = std::max(diff, std::fabs(full[20 * V + i] - want[20 * V + i]));
  EXPECT_GT(diff, 1e-3) << "the window changed nothing: the test would not see it ignored";
}

// An f16 cache holds each key and value to 2^-11 relative; logits of the tiny models (size ~1)
// then move by well under 1e-2, and the cache takes half the bytes.
TEST(Engine, HalfPrecisionCacheStaysCloseToReference) {
  for (int v : {0, 3}) {
    const model::DecoderModel m = test::make_tiny_model(variant(v));
    const int64_t V = m.config.vocab;
    const std::vector<int32_t> toks = test::random_tokens(21, V, 3);
    const std::vector<double> want = test::reference_logits(m, toks);
    EngineOptions o = small_options(false);
    const int64_t f32_bytes = Engine(m, o).cache().bytes();
    o.kv_type = DType::f16;
    Engine e(m, o);
    EXPECT_EQ(e.cache().bytes() * 2, f32_bytes);
    const int32_t s = e.new_sequence();
    std::vector<int32_t> head(toks.begin(), toks.begin() + 13);
    std::vector<float> last = e.forward({Feed{s, head, false}});
    expect_close(last.data(), want.data() + 12 * V, V, 1e-2, "prefix");
    double max_diff = 0;
    for (size_t t = 13; t < toks.size(); ++t) {
      last = e.forward({Feed{s, {&toks[t], 1}, false}});
      expect_close(last.data(), want.data() + t * V, V, 1e-2, "decode");
      for (int64_t i = 0; i < V; ++i)
        max_diff = std::max(max_diff, std::fabs(last[i] - want[t * V + i]));
    }
    EXPECT_GT(max_diff, 0.0) << "variant " << v;
  }
}

// Several sequences of different lengths in one forward give what each gives alone.
TEST(Engine, BatchedSequencesEqualSeparateOnes) {
  const model::DecoderModel m = test::make_tiny_model(variant(0));
  const int64_t V = m.config.vocab;
  const std::vector<int32_t> a = test::random_tokens(9, V, 1), b = test::random_tokens(5, V, 2),
                             c = test::random_tokens(14, V, 3);
  Engine solo(m, small_options(false));
  std::vector<std::vector<float>> want;
  for (const auto* t : {&a, &b, &c}) {
    const int32_t s = solo.new_sequence();
    want.push_back(solo.forward({Feed{s, *t, false}}));
    solo.free_sequence(s);
  }
  Engine batch(m, small_options(false));
  const int32_t sa = batch.new_sequence(), sb = batch.new_sequence(), sc = batch.new_sequence();
  const std::vector<float> got =
      batch.forward({Feed{sa, a, false}, Feed{sb, b, false}, Feed{sc, c, false}});
  ASSERT_EQ(got.size(), static_cast<size_t>(3 * V));
  for (int i = 0; i < 3; ++i)
    for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(got[i * V + v], want[i][v], 1e-5) << i << " " << v;
  // A decode step for all three at once equals three single steps.
  const int32_t next[3] = {1, 2, 3};
  const std::vector<float> step =
      batch.forward({Feed{sa, {&next[0], 1}, false}, Feed{sb, {&next[1], 1}, false},
                     Feed{sc, {&next[2], 1}, false}});
  Engine one(m, small_options(false));
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t>& t = i == 0 ? a : i == 1 ? b : c;
    std::vector<int32_t> seq(t);
    seq.push_back(next[i]);
    const int32_t s = one.new_sequence();
    const std::vector<float> w = one.forward({Feed{s, seq, false}});
    for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(step[i * V + v], w[v], 1e-5);
    one.free_sequence(s);
  }
}

TEST(Engine, CacheBlocksAreReusedAndTruncationRewinds) {
  const model::DecoderModel m = test::make_tiny_model(variant(1));
  const int64_t V = m.config.vocab;
  EngineOptions o = small_options(false);
  o.kv_tokens = 32;  // 8 blocks of 4
  Engine e(m, o);
  const std::vector<int32_t> t = test::random_tokens(30, V, 5);
  const int32_t s = e.new_sequence();
  const std::vector<float> first = e.forward({Feed{s, t, false}});
  EXPECT_EQ(e.cache().free_blocks(), 0);
  // Rewind to 10 tokens and run the same suffix again: identical logits.
  e.truncate_sequence(s, 10);
  EXPECT_EQ(e.cache().free_blocks(), 5);
  const std::vector<int32_t> rest(t.begin() + 10, t.end());
  // (Rows fall into different kernel tiles than in the first call, so allow float rounding.)
  const std::vector<float> again = e.forward({Feed{s, rest, false}});
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(again[v], first[v], 1e-5 * (1 + std::fabs(first[v])));
  // Full cache: one more token needs a ninth block.
  const int32_t s2 = e.new_sequence();
  test::expect_error([&] { e.forward({Feed{s2, {&t[0], 3}, false}}); }, "kv-cache");
  EXPECT_EQ(e.sequence_length(s2), 0);
  e.free_sequence(s);
  EXPECT_EQ(e.cache().free_blocks(), 8);
}

// A fork shares its source's blocks; the partly filled last block is copied before either
// appends to it (copy-on-write), so both continue as sequences of their own would.
TEST(Engine, ForkedSequencesShareBlocksAndCopyBeforeWriting) {
  const model::DecoderModel m = test::make_tiny_model(variant(0));
  const int64_t V = m.config.vocab;
  EngineOptions o = small_options(false);
  o.kv_tokens = 64;  // 16 blocks of 4
  Engine e(m, o);
  const std::vector<int32_t> t = test::random_tokens(10, V, 8);  // 2 full blocks and 2 tokens
  const int32_t a = e.new_sequence();
  e.forward({Feed{a, t, false}});
  EXPECT_EQ(e.cache().used_blocks(), 3);
  const int32_t b = e.fork_sequence(a);
  EXPECT_EQ(e.cache().used_blocks(), 3) << "a fork copies nothing";
  EXPECT_EQ(e.sequence_length(b), 10);
  EXPECT_EQ(e.blocks_to_append(b, 1), 1) << "the shared last block is copied first";
  EXPECT_EQ(e.blocks_to_append(b, 7), 3) << "17 tokens: 2 more blocks and the copy";
  const int32_t na = 3, nb = 5;
  const std::vector<float> got = e.forward({Feed{a, {&na, 1}, false}, Feed{b, {&nb, 1}, false}});
  EXPECT_EQ(e.cache().used_blocks(), 4) << "one copy of the shared block";
  EXPECT_EQ(e.cache().ref_count(e.sequence_blocks(a)[0]), 2);
  Engine solo(m, small_options(false));
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> seq = t;
    seq.push_back(i == 0 ? na : nb);
    const int32_t s = solo.new_sequence();
    const std::vector<float> want = solo.forward({Feed{s, seq, false}});
    for (int64_t v = 0; v < V; ++v)
      EXPECT_NEAR(got[i * V + v], want[v], 1e-5 * (1 + std::fabs(want[v]))) << i << " " << v;
    solo.free_sequence(s);
  }
  // Blocks another holds: a new sequence takes a's first two blocks as its 8 tokens.
  const int32_t c = e.new_sequence();
  e.share_blocks(c, e.sequence_blocks(a).subspan(0, 2), 8);
  EXPECT_EQ(e.cache().ref_count(e.sequence_blocks(a)[0]), 3);
  test::expect_error([&] { e.share_blocks(c, e.sequence_blocks(a).subspan(0, 2), 8); },
                     "not empty");
  for (int32_t s : {a, b, c}) e.free_sequence(s);
  EXPECT_EQ(e.cache().free_blocks(), 16);
}

// A copy holds the same keys and values in blocks of its own: both continue as the source
// would, and freeing one leaves the other whole.
TEST(Engine, CopiedSequencesOwnTheirBlocks) {
  const model::DecoderModel m = test::make_tiny_model(variant(0));
  const int64_t V = m.config.vocab;
  EngineOptions o = small_options(false);
  o.kv_tokens = 32;  // 8 blocks of 4
  Engine e(m, o);
  const std::vector<int32_t> t = test::random_tokens(10, V, 9);  // 3 blocks
  const int32_t a = e.new_sequence();
  e.forward({Feed{a, t, false}});
  const int32_t b = e.copy_sequence(a);
  EXPECT_EQ(e.cache().used_blocks(), 6);
  EXPECT_EQ(e.sequence_length(b), 10);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(e.sequence_blocks(a)[i], e.sequence_blocks(b)[i]);
    EXPECT_EQ(e.cache().ref_count(e.sequence_blocks(b)[i]), 1);
  }
  const int32_t next = 4;
  const std::vector<float> from_a = e.forward({Feed{a, {&next, 1}, false}});
  e.free_sequence(a);
  const std::vector<float> from_b = e.forward({Feed{b, {&next, 1}, false}});
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(from_a[v], from_b[v]) << v;
  const int32_t c = e.copy_sequence(b), d = e.new_sequence();
  e.forward({Feed{d, {&next, 1}, false}});  // the last free block
  test::expect_error([&] { e.copy_sequence(c); }, "cache blocks");
  for (int32_t s : {b, c, d}) e.free_sequence(s);
  EXPECT_EQ(e.cache().free_blocks(), 8);
}

TEST(Engine, BadInputGivesOneLineErrors) {
  const model::DecoderModel m = test::make_tiny_model(variant(0));
  Engine e(m, small_options(false));
  const int32_t s = e.new_sequence();
  const int32_t bad = 64, ok = 1;
  test::expect_error([&] { e.forward({Feed{s, {&bad, 1}, false}}); }, "token id 64");
  test::expect_error([&] { e.forward({Feed{7, {&ok, 1}, false}}); }, "no live sequence 7");
  test::expect_error(
      [&] {
        e.forward({Feed{s, {&ok, 1}, false}, Feed{s, {&ok, 1}, false}});
      },
      "fed twice");
  const std::vector<int32_t> long_seq(65, 1);
  test::expect_error([&] { e.forward({Feed{s, long_seq, false}}); }, "context length 64");
  EXPECT_EQ(e.sequence_length(s), 0);
  EngineOptions o = small_options(false);
  o.max_ctx = 1000;
  test::expect_error([&] { Engine(m, o); }, "max_ctx 1000");
}

// max_rows 0 sizes the prefill chunks by the layer matrices' types: 512 rows where a product
// takes the packed GEMM (float weights), 128 where every one takes an integer kernel (the
// interleaved layouts); a chunk size given stays, a negative one is refused.
TEST(Engine, ChunkRowsFollowTheWeights) {
  EngineOptions o;
  o.max_ctx = 64;
  o.kv_type = DType::f16;
  model::DecoderModel f16 = model::make_synthetic_decoder("synthetic:135m:f16");
  EXPECT_EQ(Engine(f16, o).options().max_rows, 512);
  model::DecoderModel q4 = model::make_synthetic_decoder("synthetic:135m:q4_0");
  model::use_cpu_layout(q4);
  const bool interleaved = q4.weights.layers[0].w_up.type != DType::q4_0;
  EXPECT_EQ(Engine(q4, o).options().max_rows, interleaved ? 128 : 512);
  EXPECT_EQ(ops::matmul_wt_saturating_rows(o.ctx, DType::q4_0), 512);
  // q4_K takes the packed GEMM only where that GEMM is 512 bits wide (cpu::matmul_wt).
  EXPECT_EQ(ops::matmul_wt_saturating_rows(o.ctx, DType::q4_k),
            cpu::gemm_tile().nr >= 32 ? 512 : 128);
  // One float matrix among block-quantized ones: the chunk must suit it too.
  q4.weights.layers[1].wo = f16.weights.layers[1].wo;
  EXPECT_EQ(Engine(q4, o).options().max_rows, 512);
  o.max_rows = 40;
  EXPECT_EQ(Engine(q4, o).options().max_rows, 40);
  o.max_rows = -1;
  test::expect_error([&] { Engine(q4, o); }, "max_rows must be >= 0");
}

// The logits of every position of toks, in one forward of a fresh engine on m.
std::vector<float> all_logits(const model::DecoderModel& m, const std::vector<int32_t>& toks,
                              bool reference) {
  Engine e(m, small_options(reference));
  return e.forward({Feed{e.new_sequence(), toks, true}});
}

// The k-quant matrices in the CPU's interleaved layouts (q4_kx8 / q5_kx8 / q6_kx8, where the
// AVX512-VNNI kernels run): the engine's logits match the same model in the file's layout to
// within the kernels' different rounding, and its greedy tokens are the same; the reference
// path, which reads both layouts back as plain rows, gives the same bits for both.
TEST(Engine, InterleavedKQuantLayoutsDecodeAsThePlainOnes) {
  TinyOptions tiny;
  tiny.width = 256, tiny.heads = 4, tiny.kv_heads = 2, tiny.ffn = 512;  // whole super-blocks
  const model::DecoderModel src = test::make_tiny_model(tiny);
  const std::vector<int32_t> toks = test::random_tokens(21, src.config.vocab, 5);
  const int64_t V = src.config.vocab, n = static_cast<int64_t>(toks.size());
  for (DType t : {DType::q4_k, DType::q5_k, DType::q6_k}) {
    compress::QuantizeOptions q;
    q.type = t;
    const model::DecoderModel plain = compress::quantize_decoder(src, q, nullptr);
    model::DecoderModel x8 = compress::quantize_decoder(src, q, nullptr);
    model::use_cpu_layout(x8);
    const DType laid = x8.weights.layers[1].w_down.type;
    EXPECT_EQ(laid, ops::cpu_preferred_layout(t, 256)) << dtype_name(t);
    ASSERT_EQ(plain.weights.layers[1].w_down.type, t);
    for (bool reference : {false, true}) {
      const std::vector<float> la = all_logits(plain, toks, reference);
      const std::vector<float> lb = all_logits(x8, toks, reference);
      if (reference) {
        EXPECT_EQ(la, lb) << dtype_name(t) << ": the reference reads both layouts as plain rows";
        continue;
      }
      for (int64_t i = 0; i < n * V; ++i)
        ASSERT_NEAR(la[i], lb[i], 1e-3 * (1 + std::fabs(la[i])))
            << dtype_name(laid) << " logit " << i;
      for (int64_t r = 0; r < n; ++r) {
        const auto row_a = la.begin() + r * V, row_b = lb.begin() + r * V;
        EXPECT_EQ(std::max_element(row_a, row_a + V) - row_a,
                  std::max_element(row_b, row_b + V) - row_b)
            << dtype_name(laid) << " position " << r;
      }
    }
  }
}

// A mixture of experts quantized and rearranged into the CPU's interleaved layouts: each expert
// is a row slice of the stacked matrices, which must start on a row group of the layout. The
// reference path reads both layouts as plain rows: the same bits, so every slice holds its rows.
// The SIMD kernels of the two layouts agree to ~1e-5 on most seeds of these random tiny models,
// but on some a logit moves by up to ~0.4 (seeds 16-21 measured, dense models as well; the cause
// is not established), so the SIMD check is loose: a slice read from the wrong rows moves the
// logits by their own size (several units).
TEST(Engine, InterleavedLayoutsSliceTheExperts) {
  TinyOptions tiny = variant(6);     // 4 experts, 2 per token
  tiny.width = 256, tiny.ffn = 256;  // whole k-quant super-blocks
  const model::DecoderModel src = test::make_tiny_model(tiny);
  const std::vector<int32_t> toks = test::random_tokens(13, src.config.vocab, 6);
  const int64_t V = src.config.vocab, n = static_cast<int64_t>(toks.size());
  for (DType t : {DType::q4_0, DType::q8_0, DType::q4_k}) {
    compress::QuantizeOptions q;
    q.type = t;
    const model::DecoderModel plain = compress::quantize_decoder(src, q, nullptr);
    model::DecoderModel laid = compress::quantize_decoder(src, q, nullptr);
    model::use_cpu_layout(laid);
    ASSERT_EQ(plain.weights.layers[0].ffn_router.type, DType::f32) << "the router stays f32";
    EXPECT_EQ(laid.weights.layers[0].w_gate.type, ops::cpu_preferred_layout(t, 4 * 256))
        << dtype_name(t) << ": the stacked experts take the CPU's layout";
    for (bool reference : {false, true}) {
      const std::vector<float> la = all_logits(plain, toks, reference);
      const std::vector<float> lb = all_logits(laid, toks, reference);
      if (reference) {
        EXPECT_EQ(la, lb) << dtype_name(t);
        continue;
      }
      for (int64_t i = 0; i < n * V; ++i)
        ASSERT_NEAR(la[i], lb[i], 1.0) << dtype_name(t) << " logit " << i;
    }
  }
}

// Without a GPU (or without CUDA in the build) a CUDA engine is refused in one line, before any
// memory is taken; with one, tests/cuda/engine_test.cc runs it against this engine.
TEST(Engine, CudaDeviceWithoutGpuIsRefused) {
  if (backend::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  const model::DecoderModel m = test::make_tiny_model(variant(0));
  EngineOptions o = small_options(false);
  o.ctx.device = ops::Device::cuda;
  // With CUDA built: no device is present; without: not built. Either way one line naming it,
  // before anything is allocated.
  backend::register_cuda_ops_backend();
  test::expect_error([&] { Engine(m, o); }, backend::cuda_built()
                                                ? "[cuda] the engine: no CUDA device is present"
                                                : "no backend registered for device cuda");
  ops::register_backend(ops::Device::cuda, nullptr);
}

}  // namespace
}  // namespace tessera::infer
