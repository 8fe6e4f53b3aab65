// The decoder layer in training mode (block_forward over (B, T) rows, CausalAttention: keys and
// values from the rows themselves) gives the float64 whole-sequence forward's logits for Llama
// shapes (GQA, multi-query, both RoPE layouts, q/k/v bias) and GPT-2, as the engine does through
// its paged cache; and CausalAttention's backward (through the rotation) is the derivative of its
// forward, by central differences.
#include "model/causal_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "infer/tiny_model.h"
#include "model/decoder_block.h"
#include "ops/ops.h"

namespace tessera::model {
namespace {

// Logits (B*T, V) of B sequences of T tokens through every layer in training mode.
std::vector<float> training_mode_logits(const DecoderModel& m, const std::vector<int32_t>& tokens,
                                        int64_t B, int64_t T) {
  const DecoderConfig& c = m.config;
  const ops::Context ctx;
  const int64_t n = B * T, C = c.d_model, F = c.d_ff, QD = c.q_dim(), KV = c.kv_dim();
  auto f = [](const WeightRef& r) { return static_cast<const float*>(r.data); };
  std::vector<float> x(n * C), mid(n * C), branch(n * C), xn(n * C), mean(n), rstd(n);
  std::vector<float> qkv(n * (QD + 2 * KV)), att(n * QD), ff_in(n * F), ff_up(n * F);
  std::vector<float> lse(B * c.n_heads * T), rot(n * QD);
  if (c.arch == DecoderArch::gpt2)
    ops::embedding_forward(ctx, x.data(), tokens.data(), f(m.weights.tok_embd),
                           f(m.weights.pos_embd), B, T, C, c.vocab);
  else
    ops::gather_rows(ctx, x.data(), f(m.weights.tok_embd), tokens.data(), n, C, c.vocab);
  const ops::RopeTable rope = ops::make_rope_table(T, rope_inv_freqs(c));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    BlockTensors t;
    t.in = x.data();
    t.mid = mid.data();
    t.out = x.data();  // the layer reads in only before it writes mid
    t.branch = branch.data();
    t.xn1 = t.xn2 = xn.data();
    t.mean1 = t.mean2 = mean.data();
    t.rstd1 = t.rstd2 = rstd.data();
    t.qkv = qkv.data();
    t.att = att.data();
    t.ff_in = t.ff_act = ff_in.data();
    t.ff_up = ff_up.data();
    CausalAttention attention(ctx, c, &rope, c.window(l), rot.data(), lse.data(), B, T, false);
    block_forward(ctx, c, m.weights.layers[static_cast<size_t>(l)], l, n, t, attention);
  }
  norm_forward(ctx, c, xn.data(), mean.data(), rstd.data(), x.data(), n, m.weights.out_norm,
               m.weights.out_norm_b);
  const WeightRef& head = m.weights.output.present() ? m.weights.output : m.weights.tok_embd;
  std::vector<float> logits(n * c.vocab);
  linear_forward(ctx, Stage::head, logits.data(), xn.data(), n, head, {});
  return logits;
}

TEST(CausalAttention, TrainingModeForwardMatchesTheFloat64Forward) {
  std::vector<test::TinyOptions> cases(5);
  cases[0].kv_heads = 2;  // GQA, half-split RoPE
  cases[1].kv_heads = 1;  // multi-query, interleaved RoPE, q/k/v bias (Qwen2-like)
  cases[1].rope_layout = ops::RopeLayout::interleaved;
  cases[1].qkv_bias = true;
  cases[2].kv_heads = 4;  // one kv head per query head
  cases[2].tied = true;
  cases[3].arch = DecoderArch::gpt2;
  cases[4].heads = 8, cases[4].kv_heads = 2, cases[4].width = 64;  // 4 query heads per group
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].seed = 40 + i;
    const DecoderModel m = test::make_tiny_model(cases[i]);
    const int64_t B = 3, T = 11, V = m.config.vocab;
    const std::vector<int32_t> tokens = test::random_tokens(B * T, V, 7 + i);
    const std::vector<float> got = training_mode_logits(m, tokens, B, T);
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int32_t> seq(tokens.begin() + b * T, tokens.begin() + (b + 1) * T);
      const std::vector<double> want = test::reference_logits(m, seq);
      for (int64_t j = 0; j < T * V; ++j) {
        const double w = want[static_cast<size_t>(j)];
        ASSERT_NEAR(got[static_cast<size_t>(b * T * V + j)], w, 2e-4 * (1 + std::fabs(w)))
            << "case " << i << " sequence " << b << " row " << j / V << " logit " << j % V;
      }
    }
  }
}

TEST(CausalAttention, BackwardIsTheForwardsDerivative) {
  test::TinyOptions o;
  o.heads = 4, o.kv_heads = 2, o.width = 16;  // D = 4
  for (const ops::RopeLayout layout : {ops::RopeLayout::half, ops::RopeLayout::interleaved}) {
    o.rope_layout = layout;
    const DecoderConfig c = test::make_tiny_model(o).config;
    const int64_t B = 2, T = 5, n = B * T, QD = c.q_dim(), ld = QD + 2 * c.kv_dim();
    ops::Context ctx;
    ctx.reference = true;  // attention accumulated in double: finite differences stay clean
    const ops::RopeTable rope = ops::make_rope_table(T, rope_inv_freqs(c));
    std::vector<float> rot(n * QD), lse(B * c.n_heads * T), att(n * QD);
    Rng rng(3);
    std::vector<float> qkv(n * ld), r(n * QD);
    for (float& v : qkv) v = 2 * rng.uniform() - 1;
    for (float& v : r) v = 2 * rng.uniform() - 1;
    // L(qkv) = sum(att * r), att from a copy (the forward rotates q and k in place).
    auto loss = [&](const std::vector<float>& in) {
      std::vector<float> x = in;
      CausalAttention(ctx, c, &rope, 0, rot.data(), lse.data(), B, T, false)
          .attend(0, x.data(), att.data(), n, nullptr);
      double l = 0;
      for (int64_t i = 0; i < n * QD; ++i) l += static_cast<double>(att[i]) * r[i];
      return l;
    };
    std::vector<float> x = qkv, dqkv(n * ld);
    CausalAttention a(ctx, c, &rope, 0, rot.data(), lse.data(), B, T, false);
    a.attend(0, x.data(), att.data(), n, nullptr);
    a.backward(dqkv.data(), r.data(), x.data(), att.data());
    const float h = 1e-2f;
    for (int64_t i = 0; i < n * ld; ++i) {
      std::vector<float> p = qkv, m = qkv;
      p[i] += h;
      m[i] -= h;
      const double fd = (loss(p) - loss(m)) / (2 * h);
      ASSERT_NEAR(dqkv[i], fd, 2e-3)
          << "element " << i << " (row " << i / ld << ", column " << i % ld << ")";
    }
  }
}

}  // namespace
}  // namespace tessera::model
