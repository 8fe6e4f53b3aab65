// GPT-2 model tests: parameter table, init, recompute policies, plan reuse, activation memory,
// FLOP formula, HF save/load round trip and input/file errors.
#include "model/decoder_save.h"
#include "model/train_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"

namespace tessera::model {
namespace {

// A small model that still has every feature: 2 blocks, 4 heads, odd vocabulary (padded).
TrainConfig tiny_config() {
  TrainConfig c;
  c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.max_seq = 32;
  c.vocab_size = 101;
  c.padded_vocab_size = TrainConfig::pad_vocab(101);
  return c;
}

struct Batch {
  int64_t B, T;
  std::vector<int32_t> tokens, targets;
};

Batch make_batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Batch b{B, T, {}, {}};
  Rng r(seed);
  for (int64_t i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<int32_t>(r.below(static_cast<uint64_t>(V))));
    b.targets.push_back(static_cast<int32_t>(r.below(static_cast<uint64_t>(V))));
  }
  b.targets[1] = -1;  // one ignored target
  return b;
}

// A per-process folder under the test temp dir, removed when the test ends.
struct TempFolder {
  std::string path;
  explicit TempFolder(const std::string& name)
      : path(cat(::testing::TempDir(), "/gpt2_", ::getpid(), "_", name)) {}
  ~TempFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::vector<float> grads_of(TrainModel& m, const Batch& b, Precision p, Recompute rc) {
  m.plan(b.B, b.T, p, rc);
  m.zero_grads();
  m.forward_backward(b.tokens.data(), b.targets.data(), b.B, b.T, 1.0f);
  return std::vector<float>(m.grads(), m.grads() + m.num_params());
}

TEST(Gpt2, ParameterTableMatchesHuggingFace) {
  TrainModel m(tiny_config(), ops::Context{});
  const auto& ts = m.tensors().tensors();
  const int64_t C = 64;
  ASSERT_EQ(ts.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(ts[0].name, "wte.weight");
  EXPECT_EQ(ts[0].shape, (Shape{128, C}));
  EXPECT_EQ(ts[1].name, "wpe.weight");
  EXPECT_EQ(m.tensors().at("h.1.attn.c_attn.weight").shape, (Shape{3 * C, C}));
  EXPECT_EQ(m.tensors().at("h.1.mlp.c_proj.weight").shape, (Shape{C, 4 * C}));
  EXPECT_EQ(m.tensors().at("h.0.mlp.c_fc.bias").shape, (Shape{4 * C}));
  EXPECT_EQ(ts.back().name, "ln_f.bias");
  EXPECT_TRUE(TrainModel::decays(m.tensors().at("h.0.mlp.c_fc.weight")));
  EXPECT_FALSE(TrainModel::decays(m.tensors().at("h.0.ln_1.weight")));
}

TEST(Gpt2, InitIsDeterministicAndShaped) {
  const TrainConfig cfg = tiny_config();
  TrainModel a(cfg, ops::Context{}), b(cfg, ops::Context{});
  a.init_weights(7);
  b.init_weights(7);
  EXPECT_EQ(std::memcmp(a.params(), b.params(), sizeof(float) * a.num_params()), 0);
  b.init_weights(8);
  EXPECT_NE(std::memcmp(a.params(), b.params(), sizeof(float) * a.num_params()), 0);
  auto stddev = [&](const std::string& name, int64_t rows) {
    const TensorInfo& t = a.tensors().at(name);
    const int64_t n = rows * t.shape[1];
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
      s += double(a.params()[t.offset + i]) * a.params()[t.offset + i];
    return std::sqrt(s / n);
  };
  // Sample std of n normals has relative standard error 1/sqrt(2n): n >= 6464 gives < 1%, so
  // 10% bounds are ~10 sigma away and still catch a wrong scale (1/sqrt(2L) = 0.5 here).
  EXPECT_NEAR(stddev("wte.weight", cfg.vocab_size), 0.02, 0.002);
  EXPECT_NEAR(stddev("h.0.attn.c_attn.weight", 3 * 64), 0.02, 0.002);
  EXPECT_NEAR(stddev("h.1.mlp.c_proj.weight", 64), 0.01, 0.001);
  EXPECT_NEAR(stddev("h.1.attn.c_proj.weight", 64), 0.01, 0.001);
  const TensorInfo& wte = a.tensors().at("wte.weight");
  for (int64_t i = cfg.vocab_size * 64; i < wte.numel(); ++i)
    ASSERT_EQ(a.params()[wte.offset + i], 0.0f) << "wte padding row element " << i;
  const TensorInfo& ln = a.tensors().at("h.1.ln_2.weight");
  const TensorInfo& bias = a.tensors().at("h.1.mlp.c_fc.bias");
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(a.params()[ln.offset + i], 1.0f);
  for (int64_t i = 0; i < 256; ++i) EXPECT_EQ(a.params()[bias.offset + i], 0.0f);
}

// The policies run the same ops on the same inputs (recompute replays them), so gradients must
// agree bitwise as long as the kernels are deterministic, which ours are (fixed work splits).
void check_recompute_policies(bool reference) {
  ops::Context ctx;
  ctx.reference = reference;
  TrainModel m(tiny_config(), ctx);
  m.init_weights(3);
  const Batch b = make_batch(2, 16, 101, 11);
  const auto g_none = grads_of(m, b, Precision::f32, Recompute::none);
  const auto g_gelu = grads_of(m, b, Precision::f32, Recompute::gelu);
  const auto g_block = grads_of(m, b, Precision::f32, Recompute::block);
  double norm = 0;
  for (float x : g_none) norm += double(x) * x;
  EXPECT_GT(norm, 0.0);
  EXPECT_EQ(std::memcmp(g_none.data(), g_gelu.data(), g_none.size() * 4), 0) << "gelu differs";
  EXPECT_EQ(std::memcmp(g_none.data(), g_block.data(), g_none.size() * 4), 0) << "block differs";
  // bf16 too: the recomputed activations are rounded exactly as the kept ones were.
  const auto h_none = grads_of(m, b, Precision::bf16, Recompute::none);
  const auto h_block = grads_of(m, b, Precision::bf16, Recompute::block);
  EXPECT_EQ(std::memcmp(h_none.data(), h_block.data(), h_none.size() * 4), 0);
  EXPECT_NE(std::memcmp(h_none.data(), g_none.data(), h_none.size() * 4), 0);
}

TEST(Gpt2, RecomputePoliciesGiveIdenticalGradsReference) {
  check_recompute_policies(true);
}
TEST(Gpt2, RecomputePoliciesGiveIdenticalGradsSimd) {
  check_recompute_policies(false);
}

TEST(Gpt2, SmallerBatchReusesPlan) {
  ops::Context ctx;
  ctx.reference = true;
  TrainModel m(tiny_config(), ctx);
  m.init_weights(5);
  const Batch small = make_batch(1, 8, 101, 2);
  const auto exact = grads_of(m, small, Precision::f32, Recompute::block);
  const float loss_exact = m.forward(small.tokens.data(), small.targets.data(), 1, 8);
  m.plan(3, 16, Precision::f32, Recompute::block);  // larger plan, then a smaller step
  const size_t bytes = m.activation_bytes();
  m.zero_grads();
  const float loss = m.forward_backward(small.tokens.data(), small.targets.data(), 1, 8, 1.0f);
  EXPECT_EQ(loss, loss_exact);
  EXPECT_EQ(std::memcmp(exact.data(), m.grads(), exact.size() * 4), 0);
  EXPECT_EQ(m.activation_bytes(), bytes);
  // loss_scale scales gradients linearly (gradient accumulation): exact for a power of two.
  m.zero_grads();
  m.forward_backward(small.tokens.data(), small.targets.data(), 1, 8, 0.5f);
  for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m.grads()[i], 0.5f * exact[i]) << i;
}

// End to end: plain SGD on one fixed batch must memorize it. A broken gradient (wrong sign,
// transposed, missing a path) cannot lower the loss this far in 30 steps. The step size keeps
// the descent smooth: at 0.5 the loss jumped between 1 and 5 from step to step, so where it
// ended after 30 steps hung on any change of rounding (bf16 x in the forward's products moved
// it from 0.86 to 2.4); at 0.1 it falls steadily to ~0.75 with either rounding.
TEST(Gpt2, SgdOverfitsOneBatch) {
  // One thread: this model is so small that waking workers costs more than the math.
  ThreadPool pool(1);
  ops::Context ctx;
  ctx.pool = &pool;
  TrainModel m(tiny_config(), ctx);
  m.init_weights(4);
  const Batch b = make_batch(2, 16, 101, 8);
  m.plan(2, 16, Precision::bf16, Recompute::gelu);
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    m.zero_grads();
    last = m.forward_backward(b.tokens.data(), b.targets.data(), 2, 16, 1.0f);
    if (step == 0) first = last;
    for (int64_t i = 0; i < m.num_params(); ++i) m.params()[i] -= 0.1f * m.grads()[i];
    m.params_updated();
  }
  std::printf("SGD on one batch: loss %.3f -> %.3f\n", first, last);
  EXPECT_NEAR(first, std::log(101.0), 0.1);  // near-uniform predictions at init
  EXPECT_LT(last, 0.5f * first);
}

// bf16 precision keeps what a layer keeps as bf16: the products' inputs (ln1, ln2 and, without
// recompute, GELU's output), q/k/v, the attention output and c_fc's output, with one shared f32
// set of the last four and of the norms' outputs that every layer computes in; block recompute
// keeps nothing per layer, so its arena does not change. (That the bits agree between the
// policies is RecomputePoliciesGiveIdenticalGrads*.) Four layers, so that the kept halves
// outweigh the shared set (with two they cancel exactly at this width).
TEST(Gpt2, Bf16KeepsALayersActivationsInHalfTheBytes) {
  TrainConfig cfg = tiny_config();
  cfg.n_layer = 4;
  TrainModel m(cfg, ops::Context{});
  const int64_t B = 2, T = 32, N = B * T, C = 64, QKV = 3 * C, F = 4 * C, L = 4;
  auto arena = [&](Precision p, Recompute r) {
    m.plan(B, T, p, r);
    return static_cast<int64_t>(m.activation_bytes());
  };
  // every reservation here is a multiple of 64 bytes
  const int64_t shared = N * (C + QKV + C + F) * 4;
  const int64_t kept = N * (2 * C + QKV + C + F) * 2;  // ln1, ln2, qkv, atty, fch: f32 -> bf16
  EXPECT_EQ(arena(Precision::f32, Recompute::none) - arena(Precision::bf16, Recompute::none),
            L * (kept + N * F * 2) - shared);
  EXPECT_EQ(arena(Precision::f32, Recompute::gelu) - arena(Precision::bf16, Recompute::gelu),
            L * kept - shared);
  EXPECT_EQ(arena(Precision::f32, Recompute::block), arena(Precision::bf16, Recompute::block));
}

// A step of more rows than the head takes at once (1,280: chunks of 1,024 and 256): its loss is
// the mean cross-entropy of the whole batch's logits (from forward without targets, in double),
// and its gradients are those of the same rows as two accumulated micro-steps of 640 rows (one
// chunk each; equal up to the order in which the layers' products add the rows).
TEST(Gpt2, HeadInChunksGivesTheWholeBatch) {
  ThreadPool pool(2);
  ops::Context ctx;
  ctx.pool = &pool;
  TrainModel m(tiny_config(), ctx);
  m.init_weights(12);
  const int64_t B = 40, T = 32, V = 101, Vp = m.config().padded_vocab_size;
  const Batch b = make_batch(B, T, V, 13);
  m.plan(B, T, Precision::f32, Recompute::none);
  m.forward(b.tokens.data(), nullptr, B, T);
  double want = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < B * T; ++i) {
    if (b.targets[i] < 0) continue;
    const float* z = m.logits() + i * Vp;
    double mx = z[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    want += mx + std::log(sum) - z[b.targets[i]], ++count;
  }
  want /= static_cast<double>(count);
  m.zero_grads();
  const float loss = m.forward_backward(b.tokens.data(), b.targets.data(), B, T, 1.0f);
  EXPECT_NEAR(loss, want, 1e-5 * want);
  EXPECT_THROW(m.logits(), Error);  // a step keeps no whole logits
  const std::vector<float> whole(m.grads(), m.grads() + m.num_params());
  m.zero_grads();
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t n = B * T / 2, at = half * n;
    int64_t c = 0;
    for (int64_t i = at; i < at + n; ++i) c += b.targets[i] >= 0;
    m.forward_backward(b.tokens.data() + at, b.targets.data() + at, B / 2, T,
                       static_cast<float>(c) / static_cast<float>(count));
  }
  const std::vector<float> halves(m.grads(), m.grads() + m.num_params());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(whole[i] - halves[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(whole[i])));
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(diff, 1e-5 * norm);
}

TEST(Gpt2, BadInputsThrow) {
  TrainModel m(tiny_config(), ops::Context{});
  Batch b = make_batch(2, 8, 101, 1);
  EXPECT_THROW(m.forward(b.tokens.data(), nullptr, 2, 8), Error);       // not planned
  EXPECT_THROW(m.plan(2, 33, Precision::f32, Recompute::none), Error);  // T > max_seq
  m.plan(2, 8, Precision::f32, Recompute::none);
  EXPECT_THROW(m.logits(), Error);                                 // no forward yet
  EXPECT_THROW(m.forward(b.tokens.data(), nullptr, 3, 8), Error);  // B*T beyond the plan
  b.tokens[3] = 101;
  EXPECT_THROW(m.forward(b.tokens.data(), nullptr, 2, 8), Error);
  b.tokens[3] = 0;
  b.targets[5] = 500;
  EXPECT_THROW(m.forward_backward(b.tokens.data(), b.targets.data(), 2, 8, 1.0f), Error);
  TrainConfig bad = tiny_config();
  bad.n_head = 5;
  EXPECT_THROW(TrainModel(bad, ops::Context{}), Error);
}

TEST(Gpt2, AllTargetsIgnoredGivesNoGradient) {
  TrainModel m(tiny_config(), ops::Context{});
  m.init_weights(1);
  Batch b = make_batch(1, 4, 101, 1);
  for (auto& t : b.targets) t = -1;
  m.plan(1, 4, Precision::f32, Recompute::none);
  m.zero_grads();
  EXPECT_EQ(m.forward_backward(b.tokens.data(), b.targets.data(), 1, 4, 1.0f), 0.0f);
  for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m.grads()[i], 0.0f);
}

TEST(Gpt2, BlockRecomputeCutsActivationMemory) {
  // GPT-2 small at B=8, T=512: planning only (the arena is allocated at the first step).
  const TrainConfig cfg = TrainConfig::preset("gpt2-small", 50257);
  TrainModel m(cfg, ops::Context{});
  // 124,439,808 real parameters + 47 padding rows of wte.
  EXPECT_EQ(m.num_params(), 124439808 + 47 * 768);
  m.plan(8, 512, Precision::f32, Recompute::none);
  const double none = static_cast<double>(m.activation_bytes());
  m.plan(8, 512, Precision::f32, Recompute::gelu);
  const double gelu = static_cast<double>(m.activation_bytes());
  m.plan(8, 512, Precision::f32, Recompute::block);
  const double block = static_cast<double>(m.activation_bytes());
  std::printf(
      "GPT-2 small B=8 T=512 activation bytes: none %.1f MiB, gelu %.1f MiB, block %.1f "
      "MiB (block/none = %.3f)\n",
      none / (1 << 20), gelu / (1 << 20), block / (1 << 20), block / none);
  EXPECT_LT(gelu, none);
  EXPECT_LT(block, 0.4 * none);
  // Lower bound: the residual streams ((L+1) N C) and one chunk of the head's logits (1,024 rows
  // of Vp) in f32 are in every plan.
  EXPECT_GT(block, (13.0 * 4096 * 768 + 1024.0 * 50304) * 4);

  // FLOPs: 6 * (non-embedding params 85,056,000 + lm head 50257*768) + 6*L*T*C.
  const double expect = 6.0 * (85056000.0 + 50257.0 * 768) + 6.0 * 12 * 1024 * 768;
  EXPECT_DOUBLE_EQ(m.flops_per_token_train(1024), expect);
}

TEST(Gpt2, SaveLoadRoundTrip) {
  ops::Context ctx;
  TrainModel m(tiny_config(), ctx);
  m.init_weights(9);
  const Batch b = make_batch(2, 8, 101, 4);
  m.plan(2, 8, Precision::f32, Recompute::none);
  m.forward(b.tokens.data(), nullptr, 2, 8);
  const int64_t n_logits = 2 * 8 * 128;
  const std::vector<float> logits(m.logits(), m.logits() + n_logits);

  const TempFolder tmp("roundtrip");
  const std::string& dir = tmp.path;
  save_decoder_hf(as_decoder(m), dir, DType::f32);
  // HF layout on disk: Conv1D weights (in, out), wte without padding rows, config keys.
  {
    formats::SafetensorsReader r(dir + "/model.safetensors");
    EXPECT_EQ(r.at("h.0.attn.c_attn.weight").shape, (Shape{64, 192}));
    EXPECT_EQ(r.at("h.1.mlp.c_proj.weight").shape, (Shape{256, 64}));
    EXPECT_EQ(r.at("wte.weight").shape, (Shape{101, 64}));
    EXPECT_EQ(r.metadata().at("format"), "pt");
    std::vector<float> w(64 * 192);
    r.read_f32("h.0.attn.c_attn.weight", {64, 192}, w.data());
    const float* ours = m.params() + m.tensors().at("h.0.attn.c_attn.weight").offset;
    EXPECT_EQ(w[5 * 192 + 17], ours[17 * 64 + 5]);  // transposed
    const auto cfg = nlohmann::json::parse(read_text_file(dir + "/config.json"));
    EXPECT_EQ(cfg["model_type"], "gpt2");
    EXPECT_EQ(cfg["n_embd"], 64);
    EXPECT_EQ(cfg["vocab_size"], 101);
    EXPECT_EQ(cfg["n_positions"], 32);
    EXPECT_EQ(cfg["activation_function"], "gelu_new");
    EXPECT_EQ(cfg["architectures"][0], "GPT2LMHeadModel");
  }
  auto loaded = load_trainable(dir, ctx);
  EXPECT_EQ(loaded->config().padded_vocab_size, 128);
  ASSERT_EQ(loaded->num_params(), m.num_params());
  EXPECT_EQ(std::memcmp(loaded->params(), m.params(), sizeof(float) * m.num_params()), 0);
  loaded->plan(2, 8, Precision::f32, Recompute::none);
  loaded->forward(b.tokens.data(), nullptr, 2, 8);
  EXPECT_EQ(std::memcmp(loaded->logits(), logits.data(), sizeof(float) * n_logits), 0);
}

void expect_load_error(const std::string& dir, const std::string& needle) {
  try {
    load_trainable(dir, ops::Context{});
    ADD_FAILURE() << "load accepted a bad folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Rewrites a saved folder's weights the way HF's own checkpoints often look: a "transformer."
// prefix, attn.bias mask buffers and an lm_head.weight (tied: equal to wte, unless `untie`).
void rewrite_as_hf_checkpoint(const std::string& dir, bool untie) {
  const std::string st = dir + "/model.safetensors";
  std::vector<std::vector<float>> keep;  // inner buffers survive the outer vector's growth
  formats::SafetensorsReader r(st);
  formats::SafetensorsWriter w;
  for (const auto& e : r.entries()) {
    keep.emplace_back(static_cast<size_t>(e.shape.numel()));
    r.read_f32(e.name, e.shape, keep.back().data());
    w.add("transformer." + e.name, DType::f32, e.shape, keep.back().data());
    if (e.name == "wte.weight") {
      keep.push_back(keep.back());
      if (untie) keep.back()[7] += 1.0f;
      w.add("lm_head.weight", DType::f32, e.shape, keep.back().data());
    }
  }
  keep.emplace_back(32 * 32, 1.0f);
  w.add("transformer.h.0.attn.bias", DType::f32, {1, 1, 32, 32}, keep.back().data());
  w.add("transformer.h.1.attn.masked_bias", DType::f32, {1}, keep.back().data());
  w.set_metadata("format", "pt");
  w.write(st);
}

// A bf16 folder (as most published checkpoints are) loads into the f32 training model exactly:
// every parameter equals its bf16 value widened.
TEST(Gpt2, LoadsBf16Folder) {
  ops::Context ctx;
  TrainModel m(tiny_config(), ctx);
  m.init_weights(4);
  const TempFolder tmp("bf16");
  save_decoder_hf(as_decoder(m), tmp.path, DType::bf16);
  auto loaded = load_trainable(tmp.path, ctx);
  ASSERT_EQ(loaded->num_params(), m.num_params());
  for (int64_t i = 0; i < m.num_params(); ++i)
    ASSERT_EQ(loaded->params()[i], bf16_to_f32(f32_to_bf16(m.params()[i]))) << "parameter " << i;
}

TEST(Gpt2, LoadsHuggingFaceNamingVariants) {
  ops::Context ctx;
  TrainModel m(tiny_config(), ctx);
  m.init_weights(2);
  const TempFolder tmp("hfnames");
  const std::string& dir = tmp.path;
  save_decoder_hf(as_decoder(m), dir, DType::f32);
  rewrite_as_hf_checkpoint(dir, /*untie=*/false);
  auto loaded = load_trainable(dir, ctx);
  EXPECT_EQ(std::memcmp(loaded->params(), m.params(), sizeof(float) * m.num_params()), 0);
  save_decoder_hf(as_decoder(m), dir, DType::f32);
  rewrite_as_hf_checkpoint(dir, /*untie=*/true);
  expect_load_error(dir, "tensor 'lm_head.weight' differs from the token embedding");
}

TEST(Gpt2, LoadErrorsNameFileAndField) {
  TrainModel m(tiny_config(), ops::Context{});
  m.init_weights(1);
  const TempFolder tmp("errors");
  const std::string& dir = tmp.path;
  expect_load_error(dir, "no such file or folder");  // missing folder
  save_decoder_hf(as_decoder(m), dir, DType::f32);
  const std::string cfg_path = dir + "/config.json";
  const std::string good = read_text_file(cfg_path);
  write_file_atomic(cfg_path, std::string("{\"n_layer\": 2,"));
  expect_load_error(dir, "config.json: not valid JSON");
  auto cfg = nlohmann::json::parse(good);
  cfg.erase("n_head");
  write_file_atomic(cfg_path, cfg.dump());
  expect_load_error(dir, "missing field 'n_head'");
  cfg = nlohmann::json::parse(good);
  cfg["n_layer"] = 3;  // the weights have 2 blocks
  write_file_atomic(cfg_path, cfg.dump());
  expect_load_error(dir, "missing tensor 'h.2.ln_1.weight'");
  cfg["n_layer"] = 1000;  // a hostile config must not make us allocate a huge model
  cfg["n_embd"] = 65536;
  write_file_atomic(cfg_path, cfg.dump());
  expect_load_error(dir, "config.json: absurd dimensions (layers 1000, width 65536");
  cfg = nlohmann::json::parse(good);
  cfg["n_positions"] = 16;  // wpe rows no longer match
  write_file_atomic(cfg_path, cfg.dump());
  expect_load_error(dir,
                    "model.safetensors: tensor 'wpe.weight' has shape (32, 64), expected (16, 64)");
  cfg = nlohmann::json::parse(good);
  cfg["activation_function"] = "relu";
  write_file_atomic(cfg_path, cfg.dump());
  expect_load_error(dir, "activation_function");
}

}  // namespace
}  // namespace tessera::model
