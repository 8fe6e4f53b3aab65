// The training model in Llama shapes: the gradient of the whole model's loss (every tensor:
// embedding, norms, q/k/v with and without biases, grouped and single key/value heads, the
// SwiGLU matrices, a tied and an untied head, Qwen3's q/k norms, heads wider and narrower than
// n_embd / n_head, scaled, partial and no RoPE, Gemma 3's layer options, mixtures of experts
// (Mixtral's, OLMoE's with its whole-vector q/k norms)) against central
// differences of its forward; the recompute policies giving the same gradients bit for bit; AdamW
// memorizing a batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/train_model.h"
#include "test_util/compare.h"
#include "train/optimizer.h"

namespace tessera::model {
namespace {

struct Shape {
  const char* name;
  int64_t kv_heads;
  bool bias, tied;
  bool qk_norm = false;                       // Qwen3's per-head q/k norms
  int64_t head_dim = 0;                       // heads this wide (0: n_embd / n_head)
  void (*options)(DecoderConfig&) = nullptr;  // sets more layer options
};

// Llama 3's RoPE scaling, half of each 8-wide head rotating, the second layer without RoPE.
void scaled_partial_nope(DecoderConfig& o) {
  o.rope_scaling = RopeScaling::llama3;
  o.rope_factor = 8, o.rope_original_max_ctx = 8;
  o.rope_dim = 4;
  o.nope_layers = {0, 1};
}

// Gemma 3: q/k norms, post-norms, GeGLU, embeddings scaled by sqrt(32), scores by 1/sqrt(12)
// instead of 1/sqrt(8), the first layer local (its own RoPE base, a window of all 16 positions
// the tests run), the second global with linear RoPE scaling.
void gemma3(DecoderConfig& o) {
  o.qk_norm = o.post_norms = true;
  o.mlp_act = ops::GluAct::gelu_tanh;
  o.embed_scale = std::sqrt(32.0f);
  o.attn_scale = 1.0 / std::sqrt(12.0);
  o.local_layers = {1, 0};
  o.sliding_window = 16;
  o.rope_theta_local = 1000;
  o.rope_scaling = RopeScaling::linear;
  o.rope_factor = 4;
}

// Gemma 3 with its local layer's window of 3 positions, shorter than the 8 and 16 rows the tests
// run: row t sees rows t-2 .. t there (the training attention's sliding window).
void gemma3_window(DecoderConfig& o) {
  gemma3(o);
  o.sliding_window = 3;
}

// Mistral-style: every layer over a window of 5 positions (no local_layers).
void mistral_window(DecoderConfig& o) {
  o.sliding_window = 5;
}

// LongRoPE (Phi-3.5): per-pair factors, short ones up to 8 positions and long ones beyond (the
// gradient test runs 8, the others 16), cos and sin scaled by 1.2.
void longrope(DecoderConfig& o) {
  o.rope_scaling = RopeScaling::longrope;
  o.rope_original_max_ctx = 8;
  o.rope_freq_divisors = {1.0f, 1.5f, 2.0f, 3.5f};
  o.rope_long_divisors = {1.2f, 2.5f, 4.0f, 8.0f};
  o.rope_attn_factor = 1.2;
}

// Mixtral: 4 experts of d_ff 48, 2 a token, their weights renormalized.
void mixtral(DecoderConfig& o) {
  o.n_experts = 4, o.n_experts_used = 2, o.expert_norm = true;
}

// OLMoE: 4 experts, 2 a token, weights not renormalized; q and k each normalized as one vector.
void olmoe(DecoderConfig& o) {
  o.n_experts = 4, o.n_experts_used = 2, o.expert_norm = false;
  o.qk_norm = o.qk_norm_whole = true;
}

TrainConfig small_llama(const Shape& s) {
  TrainConfig c = TrainConfig::preset("llama:tiny", 37);
  c.n_layer = 2, c.n_embd = 32, c.n_head = 4, c.n_kv_head = s.kv_heads, c.d_ff = 48;
  c.max_seq = 16, c.qkv_bias = s.bias, c.tied = s.tied;
  c.options.qk_norm = s.qk_norm;
  c.options.head_dim = s.head_dim;
  if (s.options) s.options(c.options);
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch make_batch(int64_t n, int64_t V, uint64_t seed) {
  Batch b;
  Rng r(seed);
  for (int64_t i = 0; i < n; ++i) {
    b.tokens.push_back(static_cast<int32_t>(r.below(static_cast<uint64_t>(V))));
    b.targets.push_back(static_cast<int32_t>(r.below(static_cast<uint64_t>(V))));
  }
  b.targets[2] = -1;  // an ignored target
  return b;
}

class LlamaTraining : public ::testing::TestWithParam<Shape> {};

// Every tensor, three elements each: d loss / d p from the backward against (L(p+h) - L(p-h)) /
// 2h, with double accumulation in the products (ops reference kernels) so the differences stay
// clean. The parameters are perturbed away from init so norms and biases matter.
TEST_P(LlamaTraining, GradientsMatchCentralDifferences) {
  const Shape s = GetParam();
  ops::Context ctx;
  ctx.reference = true;
  TrainModel m(small_llama(s), ctx);
  m.init_weights(5);
  Rng noise(9);
  for (const TensorInfo& t : m.tensors().tensors())  // padding rows stay zero
    for (int64_t i = 0; i < m.unpadded_elems(t); ++i)
      m.params()[t.offset + i] += 0.1f * noise.normal();
  constexpr int64_t B = 2, T = 8;
  const Batch b = make_batch(B * T, m.config().vocab_size, 3);
  m.plan(B, T, Precision::f32, Recompute::none);
  m.zero_grads();
  m.forward_backward(b.tokens.data(), b.targets.data(), B, T, 1.0f);
  const std::vector<float> grads(m.grads(), m.grads() + m.num_params());
  // A mixture of experts: top-k is discontinuous, so every perturbed forward must choose the
  // experts the unperturbed one chose (else a difference straddles a switch and means nothing).
  // The choices are compared exactly: that is the margin check, per row and per step; an element
  // whose step moves a choice is replaced by another (and counted). The step
  // is smaller there (3e-3: the loss's f32 rounding still costs under 1e-4 of its difference) so
  // that fewer rows' margins come near it.
  const int64_t L = m.config().n_layer;
  const bool moe = m.config().decoder_config().moe();
  std::vector<std::vector<int32_t>> base;
  for (int64_t l = 0; l < L && moe; ++l) base.push_back(m.expert_choices(l));
  int switches = 0;
  auto loss = [&] {
    const double v = m.forward(b.tokens.data(), b.targets.data(), B, T);
    for (int64_t l = 0; l < L && moe; ++l)
      switches += m.expert_choices(l) != base[static_cast<size_t>(l)];
    return v;
  };
  Rng pick(17);
  int checked = 0;
  for (const TensorInfo& t : m.tensors().tensors()) {
    const int64_t n = m.unpadded_elems(t);
    for (int k = 0; k < 3; ++k) {
      const int64_t i = t.offset + static_cast<int64_t>(pick.below(static_cast<uint64_t>(n)));
      const int before = switches;
      const double fd = test::central_difference(m.params()[i], moe ? 3e-3f : 1e-2f, loss);
      if (switches != before) {  // a row's margin under the step: another element instead
        --k;
        continue;
      }
      EXPECT_NEAR(grads[static_cast<size_t>(i)], fd, 2e-4 + 0.02 * std::fabs(fd))
          << t.name << " element " << i - t.offset;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * static_cast<int>(m.tensors().tensors().size()));
  // Elements whose step moved a choice were replaced (never compared); they must stay rare, or
  // the test would be choosing around a broken router.
  EXPECT_LE(switches, 4) << "perturbed forwards chose other experts";
}

// The policies run the same ops on the same inputs (recompute replays them, SwiGLU included), so
// the gradients agree bit for bit, in f32 and in bf16.
TEST_P(LlamaTraining, RecomputePoliciesGiveIdenticalGradients) {
  const Shape s = GetParam();
  ThreadPool pool(2);
  ops::Context ctx;
  ctx.pool = &pool;
  TrainModel m(small_llama(s), ctx);
  m.init_weights(6);
  const Batch b = make_batch(2 * 16, m.config().vocab_size, 4);
  auto grads = [&](Precision p, Recompute r) {
    m.plan(2, 16, p, r);
    m.zero_grads();
    m.forward_backward(b.tokens.data(), b.targets.data(), 2, 16, 1.0f);
    return std::vector<float>(m.grads(), m.grads() + m.num_params());
  };
  for (Precision p : {Precision::f32, Precision::bf16}) {
    const auto none = grads(p, Recompute::none);
    double norm = 0;
    for (float x : none) norm += static_cast<double>(x) * x;
    EXPECT_GT(norm, 0.0);
    for (Recompute r : {Recompute::gelu, Recompute::block}) {
      const auto other = grads(p, r);
      EXPECT_EQ(std::memcmp(none.data(), other.data(), none.size() * 4), 0)
          << "recompute " << static_cast<int>(r) << " precision " << static_cast<int>(p);
    }
  }
}

// zero_grads() leaves the zeroing to the next forward_backward, whose products write the
// matrices' gradients: after a step on another batch, two accumulated micro-steps give a fresh
// model's gradients exactly (a gradient the first backward neither writes nor zeroes would keep
// the old step's values), and grads() asked for right after zero_grads() reads zero.
TEST_P(LlamaTraining, ZeroGradsLeavesNothingOfTheLastStep) {
  const Shape s = GetParam();
  ThreadPool pool(2);
  ops::Context ctx;
  ctx.pool = &pool;
  const Batch old = make_batch(2 * 16, 37, 11), b = make_batch(2 * 16, 37, 12);
  auto accumulated = [&](TrainModel& m) {
    m.zero_grads();
    for (int micro = 0; micro < 2; ++micro)
      m.forward_backward(b.tokens.data(), b.targets.data(), 2, 16, 0.5f);
    return std::vector<float>(m.grads(), m.grads() + m.num_params());
  };
  TrainModel fresh(small_llama(s), ctx), used(small_llama(s), ctx);
  for (TrainModel* m : {&fresh, &used}) {
    m->init_weights(7);
    m->plan(2, 16, Precision::f32, Recompute::none);
  }
  used.zero_grads();
  used.forward_backward(old.tokens.data(), old.targets.data(), 2, 16, 1.0f);
  const std::vector<float> want = accumulated(fresh), got = accumulated(used);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "gradient element " << i;
  used.zero_grads();
  const float* g = used.grads();
  for (int64_t i = 0; i < used.num_params(); ++i) ASSERT_EQ(g[i], 0.0f) << "element " << i;
}

// End to end: the trainer's AdamW on one fixed batch must memorize it; a broken gradient cannot
// lower the loss this far in 60 steps.
TEST_P(LlamaTraining, AdamWOverfitsOneBatch) {
  const Shape s = GetParam();
  ThreadPool pool(1);
  ops::Context ctx;
  ctx.pool = &pool;
  TrainModel m(small_llama(s), ctx);
  m.init_weights(4);
  train::AdamW opt(m.tensors(), train::AdamWConfig{}, ctx);
  const Batch b = make_batch(2 * 16, m.config().vocab_size, 8);
  m.plan(2, 16, Precision::f32, Recompute::block);
  float first = 0, last = 0;
  for (int step = 1; step <= 60; ++step) {
    m.zero_grads();
    last = m.forward_backward(b.tokens.data(), b.targets.data(), 2, 16, 1.0f);
    if (step == 1) first = last;
    opt.step(m.params(), m.grads(), 1e-2, step);
    m.params_updated();
  }
  EXPECT_NEAR(first, std::log(37.0), 0.1);  // near-uniform predictions at init
  EXPECT_LT(last, 0.25f * first) << first << " -> " << last;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LlamaTraining,
    ::testing::Values(Shape{"gqa_untied", 2, false, false}, Shape{"mqa_bias_tied", 1, true, true},
                      Shape{"mha_bias_untied", 4, true, false},
                      // Qwen3: q/k norms, heads 12 wide (q_dim 48 != 32)
                      Shape{"qwen3_wide_heads", 2, false, true, true, 12},
                      Shape{"narrow_heads", 2, true, false, false, 6},
                      Shape{"scaled_partial_nope", 2, false, false, false, 0, scaled_partial_nope},
                      Shape{"longrope", 4, false, true, false, 0, longrope},
                      Shape{"gemma3", 2, false, true, false, 0, gemma3},
                      Shape{"gemma3_window", 2, false, true, false, 0, gemma3_window},
                      Shape{"mistral_window", 2, true, false, false, 0, mistral_window},
                      Shape{"mixtral", 2, false, false, false, 0, mixtral},
                      Shape{"olmoe", 4, false, true, false, 0, olmoe}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(LlamaTraining, PresetsAreTheirModels) {
  const TrainConfig c = TrainConfig::preset("llama:smollm2-135m", 49152);
  ops::Context ctx;
  ctx.dry_run = true;  // the table only
  TrainModel m(c, ctx);
  // SmolLM2-135M: 134,515,008 parameters with its tied 49152-row embedding.
  EXPECT_EQ(m.num_params(), 134515008);
  EXPECT_EQ(c.decoder_config().n_kv_heads, 3);
  EXPECT_THROW(TrainConfig::preset("llama:nope", 10), Error);
  TrainConfig bad = TrainConfig::preset("llama:tiny", 10);
  bad.n_kv_head = 3;  // 4 heads do not share 3 key/value heads
  EXPECT_THROW(bad.validate(), Error);
}

}  // namespace
}  // namespace tessera::model
