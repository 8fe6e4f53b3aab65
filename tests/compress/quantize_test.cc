// quantize_decoder: output types, fallbacks for rows that are not whole blocks, error statistics
// inside bands derived from each format's step size, thread-count independence, and quantized
// models written to GGUF and HF folders.
#include "compress/quantize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>

#include "core/error.h"
#include "model/decoder_save.h"
#include "test_util/expect_error.h"

namespace tessera::compress {
namespace {

using model::DecoderLayer;
using model::DecoderModel;
using model::WeightRef;

// A random in-memory Llama model: weights N(0, 0.02^2) in f32, norms near 1. C, F chosen by the
// test (F = 48 gives ffn_down rows that are not a multiple of 32).
DecoderModel tiny_model(int64_t C, int64_t F, bool tied, uint32_t seed = 1) {
  DecoderModel m;
  model::DecoderConfig& c = m.config;
  c.n_layers = 2;
  c.d_model = C;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = C / 4;
  c.rope_dim = c.head_dim;
  c.d_ff = F;
  c.vocab = 96;
  c.max_ctx = 64;
  c.tied_embeddings = tied;
  c.validate("tiny");
  std::mt19937 rng(seed);
  auto make = [&](Shape shape, float mean, float sd) {
    auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(shape.numel()));
    std::normal_distribution<float> dist(mean, sd);
    for (float& x : *buf) x = dist(rng);
    m.owners.push_back(buf);
    return WeightRef{buf->data(), DType::f32, shape};
  };
  const int64_t KV = c.kv_dim();
  m.weights.tok_embd = make({c.vocab, C}, 0, 0.02f);
  m.weights.layers.resize(2);
  for (DecoderLayer& l : m.weights.layers) {
    l.attn_norm = make({C}, 1, 0.1f);
    l.ffn_norm = make({C}, 1, 0.1f);
    l.wq = make({C, C}, 0, 0.02f);
    l.wk = make({KV, C}, 0, 0.02f);
    l.wv = make({KV, C}, 0, 0.02f);
    l.wo = make({C, C}, 0, 0.02f);
    l.w_gate = make({F, C}, 0, 0.02f);
    l.w_up = make({F, C}, 0, 0.02f);
    l.w_down = make({C, F}, 0, 0.02f);
  }
  m.weights.out_norm = make({C}, 1, 0.1f);
  m.weights.output = tied ? m.weights.tok_embd : make({c.vocab, C}, 0, 0.02f);
  return m;
}

const TensorQuantStats& find_stats(const std::vector<TensorQuantStats>& s, const std::string& n) {
  for (const TensorQuantStats& t : s)
    if (t.name == n) return t;
  throw Error("no stats for " + n);
}

std::optional<DType> optional_dtype(const char* name) {
  try {
    return parse_dtype(name, "test");
  } catch (const Error&) {
    return std::nullopt;  // this build's DType does not have it yet
  }
}

// Relative RMS error bands for N(0, s) weights. Each format's step over a block is d = range /
// levels; rounding error is ~uniform in +-d/2, RMS d/sqrt(12). For 32 Gaussian values the
// largest magnitude is ~2.1 s: q8_0 d = 2.1 s / 127 -> 0.0048 s; q4_0 d = 2.1 s / 8 -> 0.076 s;
// q4_1 d = 4.2 s / 15 -> 0.081 s; q5_0 d = 2.1 s / 16 -> 0.038 s; q5_1 d = 4.2 s / 31 ->
// 0.039 s. The bands allow a factor of ~2 either way.
struct Band {
  const char* type;
  double lo, hi;
};

TEST(Quantize, ErrorBandsAndTypes) {
  const DecoderModel src = tiny_model(64, 128, false);
  ThreadPool pool(2);
  std::vector<Band> bands = {{"q8_0", 0.0025, 0.01},
                             {"q4_0", 0.04, 0.16},
                             {"q4_1", 0.04, 0.16},
                             {"q5_0", 0.019, 0.08},
                             {"q5_1", 0.019, 0.08}};
  for (const Band& b : bands) {
    SCOPED_TRACE(b.type);
    QuantizeOptions o;
    o.type = parse_dtype(b.type, "test");
    o.output_type = o.type;  // uniform: the head's automatic type has its own test
    o.pool = &pool;
    std::vector<TensorQuantStats> stats;
    const DecoderModel q = quantize_decoder(src, o, &stats);
    // 1 embedding + 7 matrices x 2 layers + 1 output head.
    EXPECT_EQ(stats.size(), 16u);
    const DecoderLayer& l = q.weights.layers[1];
    for (const WeightRef* w : {&q.weights.tok_embd, &l.wq, &l.wk, &l.w_down, &q.weights.output})
      EXPECT_EQ(w->type, o.type);
    EXPECT_EQ(l.attn_norm.type, DType::f32);
    EXPECT_EQ(std::memcmp(l.attn_norm.data, src.weights.layers[1].attn_norm.data, 64 * 4), 0);
    for (const TensorQuantStats& s : stats) {
      SCOPED_TRACE(s.name);
      EXPECT_EQ(s.from, DType::f32);
      EXPECT_EQ(s.to, o.type);
      EXPECT_NEAR(s.rms_value, 0.02, 0.003);
      EXPECT_GT(s.rms_error / s.rms_value, b.lo);
      EXPECT_LT(s.rms_error / s.rms_value, b.hi);
      // The worst element is off by at most one step of its block, and a step is at most the
      // tensor's range over the format's levels (4.5 s covers the max of ~10k normals: 4.5 s /
      // 7 for q4_0, whose positive side stops at +7 steps).
      EXPECT_GT(s.max_error, s.rms_error);
      EXPECT_LT(s.max_error, 5 * 0.02 / (b.lo < 0.01 ? 127 : 7));
    }
    const TensorQuantStats& wd = find_stats(stats, "blk.0.ffn_down");
    EXPECT_EQ(wd.elements, 64 * 128);
    // The statistics describe the bytes: recompute one row's error by dequantizing the output.
    std::vector<float> deq(128), orig(128);
    to_f32(l.w_down.type, l.w_down.data, deq.data(), 128);
    to_f32(DType::f32, src.weights.layers[1].w_down.data, orig.data(), 128);
    double worst = 0;
    for (int i = 0; i < 128; ++i) worst = std::max(worst, double(std::fabs(deq[i] - orig[i])));
    EXPECT_LE(worst, find_stats(stats, "blk.1.ffn_down").max_error);
  }
}

TEST(Quantize, FallbackWhenRowsAreNotWholeBlocks) {
  const DecoderModel src = tiny_model(64, 48, true);  // ffn_down rows hold 48 values
  QuantizeOptions o;
  o.type = DType::q4_0;
  o.output_type = DType::q4_0;  // uniform: the tied head is the q4_0 embedding
  std::vector<TensorQuantStats> stats;
  const DecoderModel q = quantize_decoder(src, o, &stats);
  EXPECT_EQ(q.weights.layers[0].w_down.type, DType::f16);
  EXPECT_EQ(q.weights.layers[0].w_up.type, DType::q4_0);  // rows of 64 fit
  const TensorQuantStats& s = find_stats(stats, "blk.0.ffn_down");
  EXPECT_EQ(s.to, DType::f16);
  EXPECT_LT(s.rms_error / s.rms_value, 1e-3);  // f16 keeps ~11 bits
  EXPECT_EQ(quant_type_for_row(DType::q8_0, 48), DType::f16);
  EXPECT_EQ(quant_type_for_row(DType::q8_0, 4096), DType::q8_0);
  EXPECT_EQ(quant_type_for_row(DType::bf16, 7), DType::bf16);
  // A tied head stays the (quantized) embedding; stats hold no separate "output".
  EXPECT_EQ(q.weights.output.data, q.weights.tok_embd.data);
  EXPECT_EQ(q.weights.tok_embd.type, DType::q4_0);
  EXPECT_THROW(find_stats(stats, "output"), Error);
  EXPECT_EQ(quant_type_for_row(DType::q4_k, 64), DType::q5_0);
  EXPECT_EQ(quant_type_for_row(DType::q4_k, 512), DType::q4_k);
  EXPECT_EQ(quant_type_for_row(DType::q5_k, 576), DType::q5_1);
  EXPECT_EQ(quant_type_for_row(DType::q6_k, 576), DType::q8_0);
  EXPECT_EQ(quant_type_for_row(DType::q3_k, 576), DType::q4_0);
  EXPECT_EQ(quant_type_for_row(DType::q2_k, 96), DType::q4_0);
  EXPECT_EQ(quant_type_for_row(DType::q5_0, 48), DType::f16);
  tessera::test::expect_error(
      [&] {
        QuantizeOptions bad;
        bad.type = DType::i32;
        quantize_decoder(src, bad, nullptr);
      },
      "i32");
}

TEST(Quantize, KeepEmbeddingAndRequantizeIsACopy) {
  const DecoderModel src = tiny_model(64, 64, true);
  QuantizeOptions o;
  o.type = DType::q8_0;
  o.keep_embedding = true;
  std::vector<TensorQuantStats> stats;
  const DecoderModel q = quantize_decoder(src, o, &stats);
  EXPECT_EQ(q.weights.tok_embd.type, DType::f32);
  EXPECT_NE(q.weights.tok_embd.data, src.weights.tok_embd.data);  // owns its copy
  EXPECT_EQ(q.weights.output.data, q.weights.tok_embd.data);
  EXPECT_EQ(find_stats(stats, "token_embd").rms_error, 0.0);
  EXPECT_EQ(q.weights.layers[0].wo.type, DType::q8_0);
  // Quantizing a q8_0 model to q8_0 copies the blocks: no second rounding.
  o.keep_embedding = false;
  const DecoderModel q2 = quantize_decoder(q, o, &stats);
  const WeightRef& a = q.weights.layers[1].w_gate;
  const WeightRef& b = q2.weights.layers[1].w_gate;
  EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())), 0);
  EXPECT_EQ(find_stats(stats, "blk.1.ffn_gate").max_error, 0.0);
  EXPECT_EQ(find_stats(stats, "blk.1.ffn_gate").from, DType::q8_0);
}

TEST(Quantize, SameBytesForAnyThreadCount) {
  const DecoderModel src = tiny_model(64, 128, false, 3);
  ThreadPool one(1), three(3);
  QuantizeOptions o;
  o.type = DType::q4_1;
  std::vector<TensorQuantStats> s1, s3;
  o.pool = &one;
  const DecoderModel a = quantize_decoder(src, o, &s1);
  o.pool = &three;
  const DecoderModel b = quantize_decoder(src, o, &s3);
  const WeightRef& wa = a.weights.output;
  EXPECT_EQ(std::memcmp(wa.data, b.weights.output.data, static_cast<size_t>(wa.bytes())), 0);
  for (size_t i = 0; i < s1.size(); ++i) {
    EXPECT_EQ(s1[i].rms_error, s3[i].rms_error) << s1[i].name;
    EXPECT_EQ(s1[i].max_error, s3[i].max_error) << s1[i].name;
  }
}

// k-quants: 256-element super-blocks, so rows must hold a multiple of 256 values. Bands: q4_k
// steps ~ like q4_1 with refined scales (0.05-0.08 s measured elsewhere), q5_k half of that;
// q6_k has 16-element blocks of 64 levels: d ~ 3.6 s / 63 -> 0.016 s. The 5-bit 32-element
// types go through the same GGUF round trip (bands as in ErrorBandsAndTypes).
TEST(Quantize, KQuantsWhenAvailable) {
  const DecoderModel src = tiny_model(256, 512, false);
  for (const Band& b :
       {Band{"q4_k", 0.02, 0.16}, Band{"q5_k", 0.01, 0.08}, Band{"q6_k", 0.005, 0.04},
        Band{"q5_0", 0.019, 0.08}, Band{"q5_1", 0.019, 0.08}, Band{"q2_k", 0.15, 0.40},
        Band{"q3_k", 0.08, 0.25}}) {
    const auto t = optional_dtype(b.type);
    if (!t) continue;
    SCOPED_TRACE(b.type);
    QuantizeOptions o;
    o.type = *t;
    o.output_type = *t;  // uniform (the head's automatic type: OutputHeadTypes)
    std::vector<TensorQuantStats> stats;
    const DecoderModel q = quantize_decoder(src, o, &stats);
    EXPECT_EQ(q.weights.layers[0].w_down.type, *t);
    for (const TensorQuantStats& s : stats) {
      EXPECT_EQ(s.to, *t) << s.name;
      EXPECT_GT(s.rms_error / s.rms_value, b.lo) << s.name;
      EXPECT_LT(s.rms_error / s.rms_value, b.hi) << s.name;
    }
    // GGUF stores the k-quant blocks as they are, q/k rows permuted whole.
    const std::string path = cat(::testing::TempDir(), "/quantize_", ::getpid(), b.type, ".gguf");
    model::save_decoder_gguf(q, path);
    const DecoderModel g = model::load_decoder_gguf(path);
    const WeightRef& up = g.weights.layers[1].w_up;
    EXPECT_EQ(up.type, *t);
    EXPECT_EQ(std::memcmp(up.data, q.weights.layers[1].w_up.data, static_cast<size_t>(up.bytes())),
              0);
    EXPECT_EQ(g.weights.layers[0].wq.type, *t);
    std::filesystem::remove(path);
  }
}

std::string temp_dir(const std::string& name) {
  const std::string d = cat(::testing::TempDir(), "/quantize_", ::getpid(), "_", name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// The output head (the embedding when tied) is kept finer than coarse targets: q6_k, or q8_0
// where its rows are not whole super-blocks; an untied embedding is the target type; an
// explicit --output-type wins; keep_embedding keeps a tied head as stored.
TEST(Quantize, OutputHeadTypes) {
  ThreadPool pool(2);
  struct Case {
    int64_t C;
    bool tied;
    DType type, head, embd;
  };
  for (const Case& c : {Case{64, false, DType::q4_0, DType::q8_0, DType::q4_0},
                        Case{256, false, DType::q4_0, DType::q6_k, DType::q4_0},
                        Case{256, true, DType::q4_k, DType::q6_k, DType::q6_k},
                        Case{64, true, DType::q5_1, DType::q8_0, DType::q8_0},
                        Case{64, true, DType::q8_0, DType::q8_0, DType::q8_0},
                        Case{64, false, DType::f16, DType::f16, DType::f16}}) {
    SCOPED_TRACE(cat("C=", c.C, " tied=", c.tied, " type=", dtype_name(c.type)));
    const DecoderModel src = tiny_model(c.C, 2 * c.C, c.tied);
    QuantizeOptions o;
    o.type = c.type;
    o.pool = &pool;
    const DecoderModel q = quantize_decoder(src, o, nullptr);
    EXPECT_EQ(q.weights.output.type, c.head);
    EXPECT_EQ(q.weights.tok_embd.type, c.embd);
    EXPECT_EQ(q.weights.layers[0].wq.type, c.type);
    EXPECT_EQ(c.tied, q.weights.output.data == q.weights.tok_embd.data);
  }
  const DecoderModel src = tiny_model(256, 512, true);
  QuantizeOptions o;
  o.type = DType::q4_0;
  o.output_type = DType::q4_0;
  EXPECT_EQ(quantize_decoder(src, o, nullptr).weights.output.type, DType::q4_0);
  o.output_type.reset();
  o.keep_embedding = true;
  EXPECT_EQ(quantize_decoder(src, o, nullptr).weights.output.type, DType::f32);
}

// q4_k_m / q5_k_m: q6_k for attn_v and ffn_down in the first and last eighth of the layers and
// every third between; the rest of each layer in the base type.
TEST(Quantize, KmMixLayers) {
  // n = 32: eighth 4 -> layers 0-3, 28-31, and 4 + 2, 4 + 5, ... (i - 4) % 3 == 2.
  std::vector<int64_t> more;
  for (int64_t i = 0; i < 32; ++i)
    if (k_m_layer_gets_more_bits(i, 32)) more.push_back(i);
  const std::vector<int64_t> want = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
  EXPECT_EQ(more, want);
  QuantizeOptions o;
  parse_quant_type("q4_k_m", "--type", &o);
  EXPECT_EQ(o.type, DType::q4_k);
  EXPECT_EQ(o.mix, QuantMix::k_m);
  parse_quant_type("q5_k_m", "--type", &o);
  EXPECT_EQ(o.type, DType::q5_k);
  parse_quant_type("q4_0", "--type", &o);
  EXPECT_EQ(o.mix, QuantMix::uniform);
  test::expect_error([&] { parse_quant_type("q4_k_x", "--type", &o); }, "--type");
  // Two layers: the first eighth is empty and the last eighth starts at 7 * 2 / 8 = 1.
  const DecoderModel src = tiny_model(256, 512, false);
  parse_quant_type("q4_k_m", "--type", &o);
  const DecoderModel q = quantize_decoder(src, o, nullptr);
  for (int64_t l = 0; l < 2; ++l) {
    SCOPED_TRACE(l);
    const DType hi = k_m_layer_gets_more_bits(l, 2) ? DType::q6_k : DType::q4_k;
    const DecoderLayer& L = q.weights.layers[static_cast<size_t>(l)];
    EXPECT_EQ(L.wv.type, hi);
    EXPECT_EQ(L.w_down.type, hi);
    EXPECT_EQ(L.wq.type, DType::q4_k);
    EXPECT_EQ(L.w_up.type, DType::q4_k);
  }
  EXPECT_FALSE(k_m_layer_gets_more_bits(0, 2));
  EXPECT_TRUE(k_m_layer_gets_more_bits(1, 2));
}

TEST(Quantize, QuantizedModelSavesToGgufAndHf) {
  const DecoderModel src = tiny_model(64, 128, false);
  QuantizeOptions o;
  o.type = DType::q8_0;
  const DecoderModel q = quantize_decoder(src, o, nullptr);
  const std::string dir = temp_dir("save");
  // GGUF keeps the q8_0 blocks (q/k rows permuted whole); the loader reads the same bytes back.
  model::save_decoder_gguf(q, dir + "/q.gguf");
  const DecoderModel g = model::load_decoder_gguf(dir + "/q.gguf");
  const WeightRef& wv = g.weights.layers[1].wv;
  EXPECT_EQ(wv.type, DType::q8_0);
  EXPECT_EQ(std::memcmp(wv.data, q.weights.layers[1].wv.data, static_cast<size_t>(wv.bytes())), 0);
  EXPECT_EQ(g.gguf->get_u32("general.file_type"), 7u);
  // HF dequantizes: the folder holds exactly the dequantized values, and loads back.
  model::save_decoder_hf(g, dir + "/hf", DType::f32);
  const DecoderModel h = model::load_decoder_hf(dir + "/hf");
  for (const auto& [x, y] : {std::pair{&h.weights.layers[0].wq, &q.weights.layers[0].wq},
                             std::pair{&h.weights.layers[1].w_down, &q.weights.layers[1].w_down}}) {
    const int64_t n = x->shape.numel();
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    to_f32(x->type, x->data, a.data(), n);
    to_f32(y->type, y->data, b.data(), n);
    EXPECT_EQ(a, b);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::compress
