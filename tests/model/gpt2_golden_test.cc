// Golden test: a tiny GPT-2's logits, loss and every parameter gradient against PyTorch float64
// (tests/data/gpt2/tiny_golden.safetensors from scripts/gen_gpt2_golden.py), with the reference
// kernels and the SIMD kernels, f32 precision; and bf16 precision's loss against f32's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "model/train_model.h"

namespace tessera::model {
namespace {

const std::string kGolden =
    std::string(TESSERA_SOURCE_DIR) + "/tests/data/gpt2/tiny_golden.safetensors";

constexpr double kEpsF32 = std::numeric_limits<float>::epsilon();  // 2^-23
constexpr double kEpsBf16 = 1.0 / 128;                             // 2^-7 (8-bit significand)

struct Golden {
  formats::SafetensorsReader r{kGolden};
  TrainConfig cfg;
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;

  Golden() {
    auto meta = [&](const char* k) { return std::stoll(r.metadata().at(k)); };
    cfg.n_layer = meta("n_layer");
    cfg.n_head = meta("n_head");
    cfg.n_embd = meta("n_embd");
    cfg.vocab_size = meta("vocab_size");
    cfg.padded_vocab_size = TrainConfig::pad_vocab(cfg.vocab_size);
    cfg.max_seq = meta("max_seq");
    B = meta("B");
    T = meta("T");
    tokens = ints("tokens");
    targets = ints("targets");
  }
  std::vector<int32_t> ints(const std::string& name) const {
    const formats::SafetensorsEntry& e = r.at(name);
    EXPECT_EQ(e.dtype, DType::i32);
    std::vector<int32_t> v(static_cast<size_t>(e.shape.numel()));
    std::memcpy(v.data(), e.data, v.size() * 4);
    return v;
  }
  std::vector<float> floats(const std::string& name, const Shape& shape) const {
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    r.read_f32(name, shape, v.data());
    return v;
  }
  // Shape of a tensor as stored in the golden file (wte without padding rows).
  Shape file_shape(const TensorInfo& t) const {
    if (t.name == "wte.weight") return {cfg.vocab_size, cfg.n_embd};
    return t.shape;
  }
  std::unique_ptr<TrainModel> make_model(bool reference) const {
    ops::Context ctx;
    ctx.reference = reference;
    auto m = std::make_unique<TrainModel>(cfg, ctx);
    for (const TensorInfo& t : m->tensors().tensors())
      r.read_f32("param." + t.name, file_shape(t), m->params() + t.offset);
    return m;
  }
};

double max_abs(const float* x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

// Error model. Every f32 op rounds with relative error <= eps. A K-term dot product with
// roundings of random sign is off by ~sqrt(K) eps times the size of its terms, which for these
// well-conditioned layers (layernorm outputs of unit variance, weights ~1/sqrt(K)) is ~eps of
// the output's scale (the worst case, K eps, needs every rounding to go the same way). The
// longest path to the logits has ~20 dependent steps (per block: ln statistics, qkv, scores,
// softmax, PV, proj, ln, fc, gelu, fc-proj; then ln_f and the head), each with gain of order 1,
// so errors add in quadrature to ~sqrt(20) eps ~ 4.5 eps of the output's max-abs; the worst of
// ~1000 logits sits ~4 standard deviations out: ~18 eps. We allow 64 eps. The backward doubles
// the path and adds N-term weight-gradient reductions: ~sqrt(45) eps ~ 7 eps, worst ~28 eps; we
// allow 128 eps. Real bugs (a wrong transpose, a missing bias, a wrong scale) move values by
// O(1) of the magnitude, i.e. ~10^7 eps. Measured (printed below): a few eps.
constexpr double kLogitTol = 64 * kEpsF32;
constexpr double kGradTol = 128 * kEpsF32;

// Returns the worst |got - want| relative to the scale (so callers can report it in eps).
double check_close(const std::string& what, const float* got, const float* want, int64_t n,
                   double rel_tol, double floor) {
  const double scale = std::max(max_abs(want, n), floor);
  double worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) worst = d, at = i;  // also catches NaN
  }
  EXPECT_LE(worst, rel_tol * scale)
      << what << ": worst |diff| " << worst << " at " << at << " (got " << got[at] << ", want "
      << want[at] << "), scale " << scale;
  return worst / scale;
}

void run_golden(bool reference, Recompute recompute) {
  Golden g;
  auto m = g.make_model(reference);
  m->plan(g.B, g.T, Precision::f32, recompute);
  const int64_t N = g.B * g.T, V = g.cfg.vocab_size, Vp = g.cfg.padded_vocab_size;

  EXPECT_EQ(m->forward(g.tokens.data(), nullptr, g.B, g.T), 0.0f);
  const std::vector<float> want_logits = g.floats("logits", {g.B, g.T, V});
  std::vector<float> got_logits(static_cast<size_t>(N * V));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t v = 0; v < V; ++v) got_logits[i * V + v] = m->logits()[i * Vp + v];
  const double logit_err =
      check_close("logits", got_logits.data(), want_logits.data(), N * V, kLogitTol, 0);

  const float want_loss = g.floats("loss", {1})[0];
  // The loss is a mean of log-sum-exps of the logits: its error is bounded by the logits' error
  // (|d lse| <= max |d logit|), so the logit tolerance times the logit scale bounds it.
  const double loss_tol = kLogitTol * max_abs(want_logits.data(), N * V);
  EXPECT_NEAR(m->forward(g.tokens.data(), g.targets.data(), g.B, g.T), want_loss, loss_tol);

  m->zero_grads();
  const float loss = m->forward_backward(g.tokens.data(), g.targets.data(), g.B, g.T, 1.0f);
  EXPECT_NEAR(loss, want_loss, loss_tol);
  // Gradients are compared per tensor against the tensor's own max-abs, floored at 1e-3 of the
  // largest gradient anywhere: a tensor whose true gradient is tiny (e.g. a bias whose terms
  // cancel over the batch) still carries absolute rounding error of the size of the terms.
  double global = 0;
  for (const TensorInfo& t : m->tensors().tensors()) {
    const auto want = g.floats("grad." + t.name, g.file_shape(t));
    global = std::max(global, max_abs(want.data(), static_cast<int64_t>(want.size())));
  }
  double grad_err = 0;
  for (const TensorInfo& t : m->tensors().tensors()) {
    const auto want = g.floats("grad." + t.name, g.file_shape(t));
    grad_err =
        std::max(grad_err, check_close("grad " + t.name, m->grads() + t.offset, want.data(),
                                       static_cast<int64_t>(want.size()), kGradTol, 1e-3 * global));
  }
  std::printf("worst relative error vs float64: logits %.0f eps, grads %.0f eps\n",
              logit_err / kEpsF32, grad_err / kEpsF32);
  // Padding rows of wte (V..Vp) must have exactly zero gradient.
  const float* dwte = m->grads() + m->tensors().at("wte.weight").offset;
  EXPECT_EQ(max_abs(dwte + V * g.cfg.n_embd, (Vp - V) * g.cfg.n_embd), 0.0);
}

TEST(Gpt2Golden, ReferenceKernels) {
  run_golden(true, Recompute::none);
}
TEST(Gpt2Golden, SimdKernels) {
  run_golden(false, Recompute::none);
}
TEST(Gpt2Golden, SimdKernelsBlockRecompute) {
  run_golden(false, Recompute::block);
}

TEST(Gpt2Golden, Bf16NearF32) {
  Golden g;
  auto m = g.make_model(false);
  m->plan(g.B, g.T, Precision::f32, Recompute::none);
  const float loss_f32 = m->forward(g.tokens.data(), g.targets.data(), g.B, g.T);
  m->plan(g.B, g.T, Precision::bf16, Recompute::none);
  const float loss_bf16 = m->forward(g.tokens.data(), g.targets.data(), g.B, g.T);
  // bf16 rounds every GEMM input (weights and activations) with relative error <= u = 2^-8 =
  // eps_bf16 / 2. A product of two rounded operands is off by <= 2u, and with errors of random
  // sign a K-term dot product is off by ~ sqrt(2) u |y|. About 10 GEMMs lie on the path to the
  // logits; their errors add in quadrature: sqrt(10) sqrt(2) u ~ 2.2 eps_bf16 of max|logit| for
  // the worst logits. The loss (log-sum-exp minus target logit) moves by at most twice a row's
  // logit error, and the mean over N rows averages errors down by ~sqrt(N) (N = 17 here).
  // Bound: 2 * eps_bf16 * max|logit|, a margin of ~2x over that estimate. A bf16 path that
  // skipped rounding would pass, so the losses must also differ.
  const int64_t NV = g.B * g.T * g.cfg.vocab_size;
  const double max_logit = max_abs(g.floats("logits", {g.B, g.T, g.cfg.vocab_size}).data(), NV);
  EXPECT_NEAR(loss_bf16, loss_f32, 2 * kEpsBf16 * max_logit);
  EXPECT_NE(loss_bf16, loss_f32);

  // Gradients: the backward adds ~20 more GEMMs (two per forward GEMM) and the lm head, so the
  // quadrature estimate grows to sqrt(30) sqrt(2) u ~ 4 eps_bf16 of a tensor's scale; the worst
  // of a tensor's elements sits a few standard deviations out: allow 16 eps_bf16 (12.5%), with
  // the same 1e-3 floor as the f32 test. Wrong bf16 plumbing (e.g. stale weights) is O(1).
  m->zero_grads();
  EXPECT_EQ(m->forward_backward(g.tokens.data(), g.targets.data(), g.B, g.T, 1.0f), loss_bf16);
  double global = 0, worst = 0;
  for (const TensorInfo& t : m->tensors().tensors()) {
    const auto want = g.floats("grad." + t.name, g.file_shape(t));
    global = std::max(global, max_abs(want.data(), static_cast<int64_t>(want.size())));
  }
  for (const TensorInfo& t : m->tensors().tensors()) {
    const auto want = g.floats("grad." + t.name, g.file_shape(t));
    worst = std::max(worst,
                     check_close("bf16 grad " + t.name, m->grads() + t.offset, want.data(),
                                 static_cast<int64_t>(want.size()), 16 * kEpsBf16, 1e-3 * global));
  }
  std::printf("bf16: loss diff %.3g (%.3f eps_bf16 max|logit|), worst grad error %.2f eps_bf16\n",
              loss_bf16 - loss_f32, std::fabs(loss_bf16 - loss_f32) / (kEpsBf16 * max_logit),
              worst / kEpsBf16);

  // params_updated() refreshes the bf16 copy: a changed weight must change the bf16 result.
  m->params()[m->tensors().at("h.0.mlp.c_fc.weight").offset] += 1.0f;
  m->params_updated();
  EXPECT_NE(m->forward(g.tokens.data(), g.targets.data(), g.B, g.T), loss_bf16);
}

}  // namespace
}  // namespace tessera::model
