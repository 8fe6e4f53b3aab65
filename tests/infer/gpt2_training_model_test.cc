// The engine runs a training model (GPT-2, and Llama shapes: grouped and single key/value heads,
// tied and untied heads, q/k/v biases) through model::as_decoder (views of its parameters) and
// gives the logits of the training forward pass: two forward implementations (the training
// attention over (B,T) rows with RoPE applied in place, the engine's paged attention over its
// cache) checked against each other, over a whole prompt and over cached decode steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "infer/engine.h"
#include "model/train_model.h"
#include "test_util/compare.h"

namespace tessera::infer {
namespace {

constexpr int64_t kVocab = 300, kT = 40;

// The shapes checked: by preset name, with variants of llama:tiny.
model::TrainConfig shape(const std::string& name) {
  if (name == "llama-mqa-bias-tied") {
    model::TrainConfig c = model::TrainConfig::preset("llama:tiny", kVocab);
    c.n_kv_head = 1, c.qkv_bias = true, c.tied = true;
    return c;
  }
  return model::TrainConfig::preset(name, kVocab);
}

// The shape with every parameter perturbed (biases and norm weights away from 0 and 1), so a
// bias or a norm parameter the view mislays changes the logits.
std::unique_ptr<model::TrainModel> make_model(const std::string& name = "gpt2-tiny") {
  auto m = std::make_unique<model::TrainModel>(shape(name), ops::Context{});
  m->init_weights(7);
  Rng rng(11);
  for (int64_t i = 0; i < m->num_params(); ++i) m->params()[i] += 0.05f * rng.normal();
  return m;
}

std::vector<int32_t> tokens() {
  std::vector<int32_t> t(kT);
  Rng rng(3);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.next_u64() % kVocab);
  return t;
}

// test::max_rel_diff: both passes are f32 with different summation orders (the packed GEMM
// against matmul_wt, flash attention against paged attention), so they agree to a few f32 ulps
// of the largest logit times the depth: 8.7e-7 at most here (about 7 ulps), so 1e-5 keeps a 10x
// margin.
using test::max_rel_diff;

// The training model's logits (1, T, Vp) over tokens(), and an engine over its parameters.
struct BothForwards {
  std::unique_ptr<model::TrainModel> m;
  std::vector<int32_t> toks = tokens();
  model::DecoderModel view;
  std::unique_ptr<Engine> engine;
  int64_t Vp = 0;

  explicit BothForwards(const std::string& name) : m(make_model(name)) {
    m->plan(1, kT, model::Precision::f32, model::Recompute::none);
    m->forward(toks.data(), nullptr, 1, kT);
    Vp = m->config().padded_vocab_size;
    view = model::as_decoder(*m);
    EngineOptions eo;
    eo.max_ctx = kT;
    eo.kv_type = DType::f32;
    engine = std::make_unique<Engine>(view, eo);
  }
  const float* training_logits(int64_t t) const { return m->logits() + t * Vp; }
};

class TrainingModelInEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainingModelInEngine, PromptLogitsEqualTrainingForward) {
  BothForwards f(GetParam());
  const int32_t s = f.engine->new_sequence();
  const std::vector<float> all = f.engine->forward({Feed{s, f.toks, true}});
  ASSERT_EQ(static_cast<int64_t>(all.size()), kT * kVocab);
  for (int64_t t = 0; t < kT; ++t)
    EXPECT_LT(max_rel_diff(all.data() + t * kVocab, f.training_logits(t), kVocab), 1e-5)
        << "row " << t;
}

TEST_P(TrainingModelInEngine, CachedDecodeStepsEqualTrainingForward) {
  BothForwards f(GetParam());
  const int32_t s = f.engine->new_sequence();
  constexpr int64_t kPrefill = kT - 5;
  std::vector<float> last = f.engine->forward({Feed{s, {f.toks.data(), kPrefill}, false}});
  EXPECT_LT(max_rel_diff(last.data(), f.training_logits(kPrefill - 1), kVocab), 1e-5);
  for (int64_t t = kPrefill; t < kT; ++t) {
    last = f.engine->forward({Feed{s, {&f.toks[t], 1}, false}});
    EXPECT_LT(max_rel_diff(last.data(), f.training_logits(t), kVocab), 1e-5) << "step " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TrainingModelInEngine,
                         ::testing::Values("gpt2-tiny", "llama:tiny", "llama-mqa-bias-tied"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == ':' || ch == '-') ch = '_';
                           return n;
                         });

TEST(Gpt2TrainingModelInEngine, ViewFollowsParameterUpdates) {
  auto m = make_model();
  const model::DecoderModel d = model::as_decoder(*m);
  EXPECT_EQ(d.weights.tok_embd.data, m->params() + m->tensors().at("wte.weight").offset);
  EXPECT_EQ(d.weights.output.data, d.weights.tok_embd.data);  // GPT-2 ties its head
  EXPECT_EQ(d.weights.layers.back().b_down.data,
            m->params() + m->tensors().at("h.3.mlp.c_proj.bias").offset);
  // q, k and v biases are consecutive thirds of c_attn's bias.
  const float* qkv_b = m->params() + m->tensors().at("h.0.attn.c_attn.bias").offset;
  const int64_t C = m->config().n_embd;
  EXPECT_EQ(d.weights.layers[0].bk.data, qkv_b + C);
  EXPECT_EQ(d.weights.layers[0].bv.data, qkv_b + 2 * C);
}

// A Llama shape: Hugging Face Llama's tensors, the head untied.
TEST(Gpt2TrainingModelInEngine, LlamaViewUsesItsOwnTensors) {
  auto m = make_model("llama:tiny");
  const model::DecoderModel d = model::as_decoder(*m);
  const float* base = m->params();
  EXPECT_EQ(d.config.arch, model::DecoderArch::llama);
  EXPECT_EQ(d.config.n_kv_heads, 2);
  EXPECT_EQ(d.weights.tok_embd.data, base + m->tensors().at("model.embed_tokens.weight").offset);
  EXPECT_EQ(d.weights.output.data, base + m->tensors().at("lm_head.weight").offset);
  EXPECT_FALSE(d.weights.pos_embd.present());
  EXPECT_EQ(d.weights.layers[3].w_gate.data,
            base + m->tensors().at("model.layers.3.mlp.gate_proj.weight").offset);
  EXPECT_TRUE(d.weights.layers[0].wq.continued_by(d.weights.layers[0].wk));
  EXPECT_TRUE(d.weights.layers[0].w_gate.continued_by(d.weights.layers[0].w_up));
  EXPECT_FALSE(d.weights.layers[0].bq.present());
}

}  // namespace
}  // namespace tessera::infer
