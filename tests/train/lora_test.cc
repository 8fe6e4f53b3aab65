// LoRA on the training model: adapter gradients against central differences with an f32 base,
// and a q8_0 / q4_0 base against the same model with those matrices widened (the backward
// through a quantized matrix dequantizes it); a fresh adapter leaves the base's logits; the
// engine with the adapter applied gives the training forward's logits; PEFT files round-trip
// (the q/k rows of a GGUF base permuted to Hugging Face's order and back); merging keeps the
// logits; AdamW moves only the adapters; what does not fit is refused by name. Bases with q/k
// norms, Gemma 3's layer and a mixture of experts (adapters on attention) too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
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
#include "model/lora.h"
#include "model/train_model.h"
#include "test_util/compare.h"
#include "test_util/expect_error.h"
#include "train/optimizer.h"

namespace tessera::model {
namespace {

constexpr int64_t kVocab = 37, B = 2, T = 8;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/lora_" + std::to_string(::getpid()) + "_" + name;
}

// A small Llama (GQA, q/k/v biases, untied head) with every width a multiple of 32, so its
// matrices quantize to q8_0 / q4_0; parameters perturbed away from init.
std::unique_ptr<TrainModel> full_model() {
  TrainConfig c = TrainConfig::preset("llama:tiny", kVocab);
  c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_kv_head = 2, c.d_ff = 96;
  c.max_seq = 16, c.qkv_bias = true, c.tied = false;
  auto m = std::make_unique<TrainModel>(c, ops::Context{});
  m->init_weights(3);
  Rng rng(4);
  for (const TensorInfo& t : m->tensors().tensors())
    for (int64_t i = 0; i < m->unpadded_elems(t); ++i)
      m->params()[t.offset + i] += 0.05f * rng.normal();
  return m;
}

// d with every matrix, the embedding and the head stored as t (through f32), in buffers d owns:
// quantized from an f32 model, or a quantized one widened back (the values its backward
// multiplies by).
DecoderModel stored_as(DecoderModel d, DType t) {
  auto conv = [&](WeightRef& w) {
    if (!w.present() || w.type == t) return;
    std::vector<float> f(static_cast<size_t>(w.shape.numel()));
    to_f32(w.type, w.data, f.data(), w.shape.numel());
    auto bytes = std::make_shared<std::vector<uint8_t>>(
        static_cast<size_t>(dtype_bytes(t, w.shape.numel())));
    from_f32(t, f.data(), bytes->data(), w.shape.numel());
    w = WeightRef{bytes->data(), t, w.shape};
    d.owners.push_back(bytes);
  };
  for (DecoderLayer& l : d.weights.layers)
    for (WeightRef* w : l.matrices()) conv(*w);
  conv(d.weights.tok_embd);
  conv(d.weights.output);
  return d;
}

// The engine's logits (T, V) for the first T tokens of `tokens` on model d, f32 cache.
std::vector<float> engine_logits(const DecoderModel& d, const std::vector<int32_t>& tokens) {
  infer::EngineOptions eo;
  eo.max_ctx = T;
  eo.kv_type = DType::f32;
  infer::Engine engine(d, eo);
  const int32_t s = engine.new_sequence();
  const std::vector<int32_t> toks(tokens.begin(), tokens.begin() + T);
  return engine.forward({infer::Feed{s, toks, true}});
}

LoraSpec spec_all(int64_t rank) {
  LoraSpec s;
  s.rank = rank;
  s.alpha = 2.0 * static_cast<double>(rank);
  s.targets = parse_lora_targets("all", "--lora-targets");
  return s;
}

// Adapters initialized, then B (zero at init) and A perturbed so every gradient is non-zero.
void perturb_adapters(TrainModel& m, uint64_t seed) {
  m.init_weights(seed);
  Rng rng(seed + 1);
  for (int64_t i = 0; i < m.num_params(); ++i) m.params()[i] += 0.05f * rng.normal();
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch make_batch(uint64_t seed, int64_t rows = B * T) {
  Batch b;
  Rng r(seed);
  for (int64_t i = 0; i < rows; ++i) {
    b.tokens.push_back(static_cast<int32_t>(r.below(kVocab)));
    b.targets.push_back(static_cast<int32_t>(r.below(kVocab)));
  }
  b.targets[3] = -1;
  return b;
}

std::vector<float> gradients(TrainModel& m, const Batch& b, int64_t batch = B) {
  m.plan(batch, T, Precision::f32, Recompute::none);
  m.zero_grads();
  m.forward_backward(b.tokens.data(), b.targets.data(), batch, T, 1.0f);
  return {m.grads(), m.grads() + m.num_params()};
}

// Two elements of every adapter tensor of m: the backward's gradient against central differences
// of the loss (the first batch of make_batch(2)).
void expect_central_differences(TrainModel& m) {
  const Batch b = make_batch(2);
  const std::vector<float> g = gradients(m, b);
  // A mixture of experts: every perturbed forward must keep the experts the unperturbed one chose
  // (top-k is discontinuous; a difference across a switch means nothing).
  const DecoderConfig& c = m.lora_base().config;
  std::vector<std::vector<int32_t>> chosen;
  for (int64_t l = 0; l < c.n_layers && c.moe(); ++l) chosen.push_back(m.expert_choices(l));
  int switches = 0;
  auto loss = [&] {
    const double v = m.forward(b.tokens.data(), b.targets.data(), B, T);
    for (int64_t l = 0; l < c.n_layers && c.moe(); ++l)
      switches += m.expert_choices(l) != chosen[static_cast<size_t>(l)];
    return v;
  };
  Rng pick(11);
  for (const TensorInfo& t : m.tensors().tensors()) {
    for (int k = 0; k < 2; ++k) {
      const int64_t i =
          t.offset + static_cast<int64_t>(pick.below(static_cast<uint64_t>(t.numel())));
      const double fd = test::central_difference(m.params()[i], 1e-2f, loss);
      EXPECT_NEAR(g[static_cast<size_t>(i)], fd, 2e-4 + 0.02 * std::fabs(fd)) << t.name;
    }
  }
  EXPECT_EQ(switches, 0) << "perturbed forwards chose other experts";
}

// Qwen3's shape under LoRA: per-head q/k norms (their backward) and heads wider than width / heads.
TEST(Lora, QwenThreeBaseGradientsMatchCentralDifferences) {
  test::TinyOptions o;
  o.qk_norm = true;
  o.head_dim = 16;  // q is 64 wide over a width of 32
  o.vocab = kVocab;
  const DecoderModel base = test::make_tiny_model(o);
  ops::Context ctx;
  ctx.reference = true;
  TrainModel m(base, spec_all(4), ctx);
  perturb_adapters(m, 7);
  expect_central_differences(m);
  // Its full fine-tuning trains the q/k norms too (their gradients: llama_train_test.cc).
  const std::string path = temp_path("qwen3.gguf");
  save_decoder_gguf(base, path);
  auto full = load_trainable(path, ops::Context{});
  EXPECT_EQ(full->tensors().at("model.layers.1.self_attn.q_norm.weight").shape, Shape({16}));
  std::filesystem::remove(path);
}

// OLMoE's base under LoRA on q, k, v and o: the frozen router and experts (only their input's
// gradient) and the whole-vector q/k norms pass the adapters' gradients through.
TEST(Lora, MixtureOfExpertsBaseGradientsMatchCentralDifferences) {
  test::TinyOptions o;
  o.experts = 4, o.experts_used = 2, o.expert_norm = false, o.qk_norm_whole = true;
  o.vocab = kVocab;
  ops::Context ctx;
  ctx.reference = true;
  LoraSpec spec = spec_all(4);
  spec.targets = {LayerMatrix::q, LayerMatrix::k, LayerMatrix::v, LayerMatrix::o};
  TrainModel m(test::make_tiny_model(o), spec, ctx);
  perturb_adapters(m, 9);
  expect_central_differences(m);
  // The experts' matrices take no adapters: refused by name, before anything is allocated.
  spec.targets = {LayerMatrix::q, LayerMatrix::up};
  tessera::test::expect_error([&] { TrainModel(test::make_tiny_model(o), spec, ctx); },
                              "expert matrices (up)");
}

// Gemma 3's base under LoRA: the frozen post-norms, scaled embeddings and scores, local layers
// (a window of T positions) pass the adapters' gradients through.
TEST(Lora, GemmaThreeBaseGradientsMatchCentralDifferences) {
  test::TinyOptions o;
  o.gemma3 = true;
  o.layers = 3;  // two local layers and a global one
  o.vocab = kVocab;
  DecoderModel base = test::make_tiny_model(o);
  base.config.sliding_window = T;
  ops::Context ctx;
  ctx.reference = true;
  TrainModel m(std::move(base), spec_all(4), ctx);
  perturb_adapters(m, 5);
  expect_central_differences(m);
}

TEST(Lora, AdapterGradientsMatchCentralDifferencesOverAnF32Base) {
  auto full = full_model();
  ops::Context ctx;
  ctx.reference = true;  // double accumulation keeps the differences clean
  TrainModel m(as_decoder(*full), spec_all(4), ctx);
  EXPECT_EQ(m.tensors().tensors().size(), 2u * 7 * 2);  // 2 layers x 7 matrices x (A, B)
  perturb_adapters(m, 7);
  expect_central_differences(m);
}

// The backward through a quantized base multiplies by its dequantized values: gradients equal
// those over the same base widened to f32. At 256 rows the quantized forward products take the
// packed GEMM, which widens the weights exactly too (below ~128-256 rows they quantize the
// activations to 8 bits instead, as GGUF engines do), so only the order of the sums differs.
TEST(Lora, QuantizedBaseGivesTheWidenedBasesGradients) {
  auto full = full_model();
  constexpr int64_t kBatch = 32;  // 256 rows
  const Batch b = make_batch(5, kBatch * T);
  for (DType t : {DType::q8_0, DType::q4_0}) {
    SCOPED_TRACE(dtype_name(t));
    const DecoderModel q = stored_as(as_decoder(*full), t);
    TrainModel mq(q, spec_all(4), ops::Context{});
    TrainModel mf(stored_as(q, DType::f32), spec_all(4), ops::Context{});
    perturb_adapters(mq, 9);
    perturb_adapters(mf, 9);
    const std::vector<float> gq = gradients(mq, b, kBatch), gf = gradients(mf, b, kBatch);
    for (const TensorInfo& ti : mq.tensors().tensors())
      EXPECT_LT(test::max_rel_diff(gq.data() + ti.offset, gf.data() + ti.offset, ti.numel()), 1e-4)
          << ti.name;
  }
}

// A fresh adapter (B = 0) is the base model; with trained values the engine applying the adapter
// gives the training forward's logits, and after merging them into the base the same again.
TEST(Lora, FreshAdapterIsTheBaseAndEngineAndMergeGiveTheTrainingLogits) {
  auto full = full_model();
  TrainModel m(as_decoder(*full), spec_all(8), ops::Context{});
  m.init_weights(1);
  const Batch b = make_batch(8);
  m.plan(1, T, Precision::f32, Recompute::none);
  full->plan(1, T, Precision::f32, Recompute::none);
  m.forward(b.tokens.data(), nullptr, 1, T);
  full->forward(b.tokens.data(), nullptr, 1, T);
  const int64_t Vp = full->config().padded_vocab_size;
  for (int64_t r = 0; r < T; ++r)
    EXPECT_EQ(std::memcmp(m.logits() + r * kVocab, full->logits() + r * Vp, kVocab * 4), 0) << r;

  perturb_adapters(m, 3);
  m.forward(b.tokens.data(), nullptr, 1, T);
  const std::vector<float> adapted = engine_logits(as_decoder(m), b.tokens);
  double base_diff = 0;
  for (int64_t r = 0; r < T; ++r) {
    EXPECT_LT(test::max_rel_diff(adapted.data() + r * kVocab, m.logits() + r * kVocab, kVocab),
              1e-5)
        << r;
    base_diff = std::max(base_diff, test::max_rel_diff(adapted.data() + r * kVocab,
                                                       full->logits() + r * Vp, kVocab));
  }
  EXPECT_GT(base_diff, 1e-3);  // the adapter changes the model
  DecoderModel merged = as_decoder(m);
  EXPECT_EQ(merge_adapters(merged), 2 * 7);
  const std::vector<float> after = engine_logits(merged, b.tokens);
  for (int64_t r = 0; r < T; ++r)
    EXPECT_LT(test::max_rel_diff(after.data() + r * kVocab, m.logits() + r * kVocab, kVocab), 1e-5);
}

// Merged into q8_0 / q4_0 matrices, the adapter is quantized with the weights: the merged model
// differs from the adapted one by that rounding: measured here, 4% of what this adapter changes
// in the logits for q8_0 and 22% for q4_0 (whose steps are a sixteenth of a block's range). Merge
// into a float type (convert to an HF folder, or an f16/bf16 GGUF) to keep an adapter exactly.
TEST(Lora, MergingIntoQuantizedMatricesCostsTheirRounding) {
  auto full = full_model();
  const Batch b = make_batch(8);
  for (const auto& [t, bound] : {std::pair{DType::q8_0, 0.1}, std::pair{DType::q4_0, 0.5}}) {
    SCOPED_TRACE(dtype_name(t));
    TrainModel m(stored_as(as_decoder(*full), t), spec_all(8), ops::Context{});
    perturb_adapters(m, 3);
    const std::vector<float> base = engine_logits(m.lora_base(), b.tokens),
                             adapted = engine_logits(as_decoder(m), b.tokens);
    DecoderModel merged_model = as_decoder(m);
    merge_adapters(merged_model);
    const std::vector<float> merged = engine_logits(merged_model, b.tokens);
    const double effect = test::max_rel_diff(base.data(), adapted.data(), T * kVocab);
    const double error = test::max_rel_diff(merged.data(), adapted.data(), T * kVocab);
    std::printf("%s: adapter changes the logits by %.4f (relative), merging errs by %.4f\n",
                dtype_name(t).data(), effect, error);
    EXPECT_GT(effect, 1e-2);
    EXPECT_LT(error, bound * effect);
  }
}

// Saved in PEFT's layout from a GGUF base (q/k rows interleaved) and applied to the same model as
// a Hugging Face folder (rotate-half rows), and back: the logits of the adapted models agree, so
// the q/k adapter rows moved with the weights' rows.
TEST(Lora, PeftFilesRoundTripAcrossRopeLayouts) {
  auto full = full_model();
  const std::string gguf = temp_path("base.gguf"), hf = temp_path("base_hf"),
                    dir = temp_path("adapter");
  save_decoder_gguf(as_decoder(*full), gguf);
  save_decoder_hf(as_decoder(*full), hf, DType::f32);
  auto trained = load_lora_trainable(gguf, spec_all(4), ops::Context{});
  ASSERT_EQ(trained->config().rope_layout, ops::RopeLayout::interleaved);
  perturb_adapters(*trained, 5);
  save_peft_adapter(as_decoder(*trained), trained->lora(), gguf, dir);
  EXPECT_TRUE(std::filesystem::exists(dir + "/adapter_config.json"));

  const Batch b = make_batch(6);
  const std::vector<float> want = engine_logits(as_decoder(*trained), b.tokens);
  for (const std::string& base : {gguf, hf}) {
    DecoderModel d = load_decoder(base);
    const LoraSpec got = apply_peft_adapter(d, dir);
    EXPECT_EQ(got.rank, 4);
    EXPECT_EQ(got.targets.size(), 7u);
    EXPECT_NEAR(got.scale(), 2.0f, 0);
    const std::vector<float> have = engine_logits(d, b.tokens);
    EXPECT_LT(test::max_rel_diff(have.data(), want.data(), T * kVocab), 1e-5) << base;
  }
  // A second adapter on the same model is refused, as is a folder without one.
  DecoderModel d = load_decoder(hf);
  apply_peft_adapter(d, dir);
  test::expect_error([&] { apply_peft_adapter(d, dir); }, "already has an adapter");
  test::expect_error([&] { apply_peft_adapter(d, hf); }, "no adapter_config.json");
  for (const std::string& p : {gguf, hf, dir}) std::filesystem::remove_all(p);
}

TEST(Lora, AdamWMovesOnlyTheAdaptersAndFitsABatch) {
  auto full = full_model();
  const DecoderModel base = stored_as(as_decoder(*full), DType::q8_0);
  const std::vector<uint8_t> wq_before(static_cast<const uint8_t*>(base.weights.layers[0].wq.data),
                                       static_cast<const uint8_t*>(base.weights.layers[0].wq.data) +
                                           base.weights.layers[0].wq.bytes());
  TrainModel m(base, spec_all(8), ops::Context{});
  m.init_weights(2);
  train::AdamWConfig ac;
  ac.weight_decay = 0;
  train::AdamW opt(m.tensors(), ac, ops::Context{});
  const Batch b = make_batch(4);
  m.plan(B, T, Precision::f32, Recompute::block);
  double first = 0, last = 0;
  for (int step = 1; step <= 60; ++step) {
    m.zero_grads();
    const double loss = m.forward_backward(b.tokens.data(), b.targets.data(), B, T, 1.0f);
    if (step == 1) first = loss;
    last = loss;
    opt.step(m.params(), m.grads(), 1e-2, step);
  }
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
  const DecoderLayer& l0 = m.lora_base().weights.layers[0];
  EXPECT_EQ(std::memcmp(l0.wq.data, wq_before.data(), wq_before.size()), 0);
}

TEST(Lora, RefusesWhatDoesNotFitByName) {
  auto full = full_model();
  LoraSpec big = spec_all(65);  // k and v are 32 x 64
  test::expect_error([&] { TrainModel(as_decoder(*full), big, ops::Context{}); }, "rank 65 for q");
  LoraSpec kv = spec_all(40);
  test::expect_error([&] { TrainModel(as_decoder(*full), kv, ops::Context{}); }, "rank 40 for k");
  test::expect_error([] { parse_lora_targets("q,attn", "--lora-targets"); },
                     "--lora-targets: 'attn' is not a matrix");
  EXPECT_EQ(parse_lora_targets("v_proj,q", "-t").size(), 2u);
  TrainModel gpt2(TrainConfig::preset("gpt2-tiny", kVocab), ops::Context{});
  test::expect_error([&] { TrainModel(as_decoder(gpt2), spec_all(2), ops::Context{}); },
                     "GPT-2's q, k and v are one matrix");
  TrainModel m(as_decoder(*full), spec_all(2), ops::Context{});
  test::expect_error([&] { m.plan(1, T, Precision::bf16, Recompute::none); }, "LoRA trains in f32");
}

}  // namespace
}  // namespace tessera::model
