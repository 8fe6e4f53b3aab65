// block_backward, the decoder layer's backward written once for both families, is the
// derivative of block_forward: for Llama layers (GQA, multi-query, RoPE in either layout, q/k/v
// bias; q, k and v as separate matrices or as rows of one), the gradients of the layer's input
// and of every weight match central differences of the forward; likewise with Qwen3's q/k norms
// and heads wider or narrower than d_model / n_heads, with scaled, partial and no RoPE, in
// Gemma 3's layers, and in mixture-of-experts layers (OLMoE's whole-vector q/k norms too).
// GPT-2's layer is held to the same by the trainer's gradient tests (tests/model/gpt2_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "infer/tiny_model.h"
#include "model/causal_attention.h"
#include "model/decoder_block.h"
#include "model/decoder_forward.h"
#include "ops/ops.h"
#include "test_util/compare.h"

namespace tessera::model {
namespace {

// One layer's forward over (B, T) rows, every tensor its own buffer (the backward reads them).
struct Layer {
  const DecoderConfig& c;
  int64_t l, B, T, n;  // the layer's index (its RoPE table, window, ...)
  ops::Context ctx;
  ops::RopeTable rope, rope_local;
  ops::Buffer rope_device;  // unused on the CPU
  std::vector<float> in, mid, out, branch, xn1, xn2, rstd1, rstd2, qkv, att, ff_in, ff_up, ff_act;
  std::vector<float> lse, rot, qk_raw, post_in, post_rstd;
  std::vector<float> router, moe_weights, moe_x, moe_y;  // a mixture of experts' (k choices a row)
  std::vector<int32_t> moe_ids;
  MoeRouting routing;

  Layer(const DecoderConfig& cfg, int64_t layer, int64_t b, int64_t t)
      : c(cfg), l(layer), B(b), T(t), n(b * t) {
    ctx.reference = true;  // products accumulated in double: finite differences stay clean
    make_rope_tables(ctx, c, T, &rope, &rope_local, &rope_device);
    const int64_t C = c.d_model, F = c.d_ff, QD = c.q_dim(), KV = c.kv_dim();
    for (auto* v : {&in, &mid, &out, &branch, &xn1, &xn2}) v->resize(n * C);
    rstd1.resize(n), rstd2.resize(n);
    qkv.resize(n * (QD + 2 * KV)), att.resize(n * QD), rot.resize(n * std::max(QD, KV));
    if (c.qk_norm) qk_raw.resize(n * (QD + KV));
    if (c.post_norms) post_in.resize(2 * n * C), post_rstd.resize(2 * n);
    const int64_t nk = n * std::max<int64_t>(c.n_experts_used, 1);  // rows of the MLP
    ff_in.resize(nk * F), ff_up.resize(nk * F), ff_act.resize(nk * F);
    lse.resize(B * c.n_heads * T);
    if (c.moe()) {
      router.resize(n * c.n_experts), moe_ids.resize(2 * nk), moe_weights.resize(2 * nk);
      moe_x.resize(nk * C), moe_y.resize(nk * C);
    }
  }
  BlockTensors tensors() {
    BlockTensors t;
    t.in = in.data(), t.mid = mid.data(), t.out = out.data(), t.branch = branch.data();
    t.xn1 = xn1.data(), t.rstd1 = rstd1.data(), t.xn2 = xn2.data(), t.rstd2 = rstd2.data();
    t.qkv = qkv.data(), t.att = att.data();
    t.ff_in = ff_in.data(), t.ff_up = ff_up.data(), t.ff_act = ff_act.data();
    t.qk_raw = qk_raw.empty() ? nullptr : qk_raw.data();
    t.post_in = post_in.empty() ? nullptr : post_in.data();
    t.post_rstd = post_rstd.empty() ? nullptr : post_rstd.data();
    if (c.moe()) {
      t.router = router.data(), t.moe_ids = moe_ids.data(), t.moe_weights = moe_weights.data();
      t.moe_x = moe_x.data(), t.moe_y = moe_y.data(), t.routing = &routing;
    }
    return t;
  }
  CausalAttention attention() {
    const ops::RopeTable* table = !c.rotary(l) ? nullptr : c.local(l) ? &rope_local : &rope;
    return CausalAttention(ctx, c, table, c.window(l), rot.data(), lse.data(), B, T, false);
  }
  // Each row's chosen experts (a set: their order does not change the output).
  std::vector<std::vector<int32_t>> choices() const {
    std::vector<std::vector<int32_t>> sets;
    const int64_t k = c.n_experts_used;
    for (int64_t i = 0; i < n && c.moe(); ++i) {
      std::vector<int32_t> row(moe_ids.begin() + i * k, moe_ids.begin() + (i + 1) * k);
      std::sort(row.begin(), row.end());
      sets.push_back(row);
    }
    return sets;
  }
  std::vector<std::vector<int32_t>> base_choices;  // set: loss() counts the forwards that differ
  int switches = 0;
  // sum(out * r) after the forward of w on x.
  double loss(const DecoderLayer& w, const std::vector<float>& x, const std::vector<float>& r) {
    in = x;
    CausalAttention a = attention();
    block_forward(ctx, c, w, l, n, tensors(), a);
    if (!base_choices.empty() && choices() != base_choices) ++switches;
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += static_cast<double>(out[i]) * r[i];
    return sum;
  }
};

// Zeroed f32 gradients in the layout of w's tensors, in one buffer (q, k, v consecutive, and
// their biases: the joined path sees them as one matrix where w's are), and the view over them.
struct Grads {
  std::vector<float> store;
  DecoderLayer view;
  explicit Grads(const DecoderLayer& w) {
    const std::pair<const WeightRef*, WeightRef*> order[] = {
        {&w.attn_norm, &view.attn_norm},
        {&w.wq, &view.wq},
        {&w.wk, &view.wk},
        {&w.wv, &view.wv},
        {&w.wo, &view.wo},
        {&w.bq, &view.bq},
        {&w.bk, &view.bk},
        {&w.bv, &view.bv},
        {&w.bo, &view.bo},
        {&w.q_norm, &view.q_norm},
        {&w.k_norm, &view.k_norm},
        {&w.post_attn_norm, &view.post_attn_norm},
        {&w.ffn_norm, &view.ffn_norm},
        {&w.post_ffn_norm, &view.post_ffn_norm},
        {&w.w_gate, &view.w_gate},
        {&w.w_up, &view.w_up},
        {&w.w_down, &view.w_down},
        {&w.ffn_router, &view.ffn_router}};
    int64_t total = 0;
    for (const auto& [r, g] : order) total += r->present() ? r->shape.numel() : 0;
    store.assign(static_cast<size_t>(total), 0.0f);
    int64_t at = 0;
    for (const auto& [r, g] : order) {
      if (!r->present()) continue;
      *g = WeightRef{store.data() + at, DType::f32, r->shape};
      at += r->shape.numel();
    }
  }
};

// q, k and v of w moved into one matrix (and their biases into one vector), rows in order.
DecoderLayer joined_qkv(const DecoderLayer& w, std::vector<std::vector<float>>& store) {
  DecoderLayer j = w;
  auto join = [&](WeightRef& a, WeightRef& b, WeightRef& c) {
    if (!a.present()) return;
    std::vector<float> v;
    for (const WeightRef* r : {&a, &b, &c}) {
      const auto* p = static_cast<const float*>(r->data);
      v.insert(v.end(), p, p + r->shape.numel());
    }
    store.push_back(std::move(v));
    float* base = store.back().data();
    a.data = base;
    b.data = base + a.shape.numel();
    c.data = base + a.shape.numel() + b.shape.numel();
  };
  join(j.wq, j.wk, j.wv);
  join(j.bq, j.bk, j.bv);
  return j;
}

// The smallest margin, over L's rows, between the k-th and the (k+1)-th largest router logit of
// its last forward (infinite where every expert is chosen).
float router_margin(const Layer& L) {
  const int64_t E = L.c.n_experts, k = L.c.n_experts_used;
  float margin = INFINITY;
  for (int64_t i = 0; i < L.n && k < E; ++i) {
    std::vector<float> lg(L.router.begin() + i * E, L.router.begin() + (i + 1) * E);
    std::sort(lg.begin(), lg.end(), std::greater<>());
    margin = std::min(margin, lg[k - 1] - lg[k]);
  }
  return margin;
}

// check_layer's input rows (B = 2, T = 5) and the output's weights r.
void layer_inputs(int64_t n, int64_t C, std::vector<float>& x, std::vector<float>& r) {
  Rng rng(5);
  x.resize(n * C), r.resize(n * C);
  for (float& v : x) v = 2 * rng.uniform() - 1;
  for (float& v : r) v = 2 * rng.uniform() - 1;
}

// The router must clear this margin in every row (check_layer): at the steps check_layer takes a
// logit moves by about 1e-2 (h times an input of about 1), ten times less.
constexpr float kRouterMargin = 0.1f;

// o with the first seed from o.seed on whose MoE layer's router clears kRouterMargin in every row
// of check_layer's forward.
test::TinyOptions with_router_margins(test::TinyOptions o) {
  for (int tries = 0; tries < 1000; ++tries, ++o.seed) {
    const DecoderModel m = test::make_tiny_model(o);
    Layer L(m.config, 0, 2, 5);
    std::vector<float> r;
    layer_inputs(L.n, m.config.d_model, L.in, r);
    CausalAttention a = L.attention();
    block_forward(L.ctx, m.config, m.weights.layers[0], 0, L.n, L.tensors(), a);
    if (router_margin(L) > kRouterMargin) return o;
  }
  ADD_FAILURE() << "no seed gives the router margins";
  return o;
}

// Layer `layer` of m: the backward's gradients of its input and of every weight against central
// differences of its forward.
void check_layer(const DecoderModel& m, int64_t layer, bool join, const std::string& what) {
  const DecoderConfig& c = m.config;
  std::vector<std::vector<float>> joined_store;
  const DecoderLayer& stored = m.weights.layers[static_cast<size_t>(layer)];
  DecoderLayer w = join ? joined_qkv(stored, joined_store) : stored;
  const int64_t B = 2, T = 5, C = c.d_model, F = c.d_ff;
  Layer L(c, layer, B, T);
  const int64_t n = L.n;
  std::vector<float> x, r;
  layer_inputs(n, C, x, r);

  // Analytic: the forward, then the backward from dL/dout = r.
  L.in = x;
  CausalAttention a = L.attention();
  block_forward(L.ctx, c, w, layer, n, L.tensors(), a);
  Grads g(w);
  const int64_t k = std::max<int64_t>(c.n_experts_used, 1), nk = n * k, E = c.n_experts;
  const int64_t big = std::max(c.q_dim() + 2 * c.kv_dim(), k * F);
  std::vector<float> dresid = r, dx(n * std::max(C, c.q_dim())), dbig(n * big),
                     dup(n * std::max(c.q_dim(), k * F)), dpost(n * C), moe_dy(nk * C),
                     moe_dw(3 * nk), dlogits(n * std::max<int64_t>(E, 1));
  std::vector<int32_t> slot(nk);
  // Top-k is discontinuous: each row's k-th largest router logit must clear the (k+1)-th by more
  // than a step of h can move it, and every perturbed forward below must choose the same experts
  // (Layer::loss counts those that do not), else the differences straddle a switch.
  if (c.moe()) {
    L.base_choices = L.choices();
    EXPECT_GT(router_margin(L), kRouterMargin) << what;
  }
  block_backward(L.ctx, c, w, g.view, n, L.tensors(), a, dresid.data(),
                 {dx.data(), dbig.data(), dup.data(), nullptr, nullptr, dpost.data(), moe_dy.data(),
                  moe_dw.data(), dlogits.data(), slot.data()},
                 false);

  // Central differences; the tolerance covers h^2 curvature and f32 rounding of the loss. The
  // per-head norms of short heads curve more steeply (at h = 1e-2 one of wk's elements is 30% off,
  // at 3e-3 and 1e-3 within tolerance): a smaller step there.
  const float h = c.qk_norm ? 3e-3f : 1e-2f;
  int failures = 0;
  auto expect = [&](double got, double fd, const std::string& where) {
    if (std::fabs(got - fd) > 3e-3 + 1e-2 * std::fabs(fd) && ++failures <= 5)
      ADD_FAILURE() << what << ": " << where << " got " << got << " want " << fd;
  };
  for (int64_t i = 0; i < n * C; ++i) {
    std::vector<float> p = x, q = x;
    p[i] += h, q[i] -= h;
    expect(dresid[i], (L.loss(w, p, r) - L.loss(w, q, r)) / (2 * h), "input " + std::to_string(i));
  }
  const std::pair<const char*, WeightRef DecoderLayer::*> tensors[] = {
      {"attn_norm", &DecoderLayer::attn_norm},
      {"wq", &DecoderLayer::wq},
      {"wk", &DecoderLayer::wk},
      {"wv", &DecoderLayer::wv},
      {"wo", &DecoderLayer::wo},
      {"bq", &DecoderLayer::bq},
      {"bk", &DecoderLayer::bk},
      {"bv", &DecoderLayer::bv},
      {"q_norm", &DecoderLayer::q_norm},
      {"k_norm", &DecoderLayer::k_norm},
      {"post_attn_norm", &DecoderLayer::post_attn_norm},
      {"ffn_norm", &DecoderLayer::ffn_norm},
      {"post_ffn_norm", &DecoderLayer::post_ffn_norm},
      {"w_gate", &DecoderLayer::w_gate},
      {"w_up", &DecoderLayer::w_up},
      {"w_down", &DecoderLayer::w_down},
      {"ffn_router", &DecoderLayer::ffn_router}};
  int checked = 0;
  for (const auto& [name, member] : tensors) {
    const WeightRef& wr = w.*member;
    if (!wr.present()) continue;
    auto* p = const_cast<float*>(static_cast<const float*>(wr.data));
    const auto* gp = static_cast<const float*>((g.view.*member).data);
    for (int64_t i = 0; i < wr.shape.numel(); ++i) {
      const double fd = test::central_difference(p[i], h, [&] { return L.loss(w, x, r); });
      expect(gp[i], fd, std::string(name) + "[" + std::to_string(i) + "]");
    }
    ++checked;
  }
  EXPECT_EQ(failures, 0) << what;
  EXPECT_EQ(L.switches, 0) << what << ": perturbed forwards chose other experts";
  EXPECT_GE(checked, 9) << what;
}

void check_layer(const test::TinyOptions& o, bool join, const std::string& what) {
  check_layer(test::make_tiny_model(o), 0, join, what);
}

TEST(BlockBackward, LlamaLayerMatchesFiniteDifferences) {
  test::TinyOptions o;
  o.layers = 1, o.width = 16, o.heads = 4, o.kv_heads = 2, o.ffn = 24, o.vocab = 8;
  check_layer(o, false, "GQA, half RoPE");
  check_layer(o, true, "GQA, q/k/v as one matrix");
  o.kv_heads = 1, o.rope_layout = ops::RopeLayout::interleaved, o.qkv_bias = true, o.seed = 2;
  check_layer(o, false, "multi-query, interleaved RoPE, bias");
  check_layer(o, true, "multi-query, bias, q/k/v and biases joined");
}

TEST(BlockBackward, QkNormsAndHeadWidthsMatchFiniteDifferences) {
  test::TinyOptions o;
  o.layers = 1, o.width = 16, o.heads = 4, o.kv_heads = 2, o.ffn = 24, o.vocab = 8;
  o.qk_norm = true, o.head_dim = 6;  // Qwen3: q/k norms, q_dim 24 != width 16
  check_layer(o, false, "q/k norms, wide heads");
  o.qk_norm = false, o.head_dim = 2, o.seed = 3;  // q_dim 8: narrower than the width
  check_layer(o, true, "narrow heads, q/k/v joined");
}

// RoPE as the inference loaders describe it: scaled (LongRoPE's factors and attention factor,
// Llama 3's bands), rotating only the first dimensions of each head, or not at all.
TEST(BlockBackward, RopeVariantsMatchFiniteDifferences) {
  test::TinyOptions o;
  o.layers = 1, o.width = 16, o.heads = 2, o.kv_heads = 1, o.ffn = 24, o.vocab = 8;  // D = 8
  o.longrope = true;
  check_layer(o, false, "LongRoPE");
  o.longrope = false;
  DecoderModel m = test::make_tiny_model(o);
  m.config.rope_scaling = RopeScaling::llama3;
  m.config.rope_factor = 8, m.config.rope_original_max_ctx = 4;
  m.config.rope_dim = 4;  // half of each head rotates
  check_layer(m, 0, false, "llama3 scaling, partial rotary");
  o.nope_every = 1;  // SmolLM3's layers without RoPE
  check_layer(o, true, "no RoPE");
}

// Gemma 3's layer: q/k norms, post-norms, GeGLU, an attention scale apart from 1/sqrt(head_dim),
// a local layer (its own RoPE base, a window of 3 positions, shorter than T = 5: rows 3 and 4
// do not see rows 0 and 1) and a global one (linear RoPE scaling).
TEST(BlockBackward, Gemma3LayersMatchFiniteDifferences) {
  test::TinyOptions o;
  o.layers = 3, o.width = 16, o.heads = 2, o.kv_heads = 1, o.ffn = 24, o.vocab = 8;
  o.gemma3 = true;
  DecoderModel m = test::make_tiny_model(o);
  m.config.sliding_window = 3;
  ASSERT_TRUE(m.config.local(0) && !m.config.local(2));
  ASSERT_EQ(m.config.window(0), 3);
  check_layer(m, 0, false, "Gemma 3, local layer");
  check_layer(m, 2, true, "Gemma 3, global layer");
}

// Mixtures of experts: 4 SwiGLU experts, 2 chosen a token, the chosen weights renormalized
// (Mixtral, Qwen3-MoE) or not (OLMoE, with its q and k each normalized as one whole vector). Every
// weight (router, each expert's rows of the stacked matrices) and the input against central
// differences; the router's margins and unchanged choices are checked (check_layer).
TEST(BlockBackward, MixtureOfExpertsLayersMatchFiniteDifferences) {
  test::TinyOptions o;
  o.layers = 1, o.width = 16, o.heads = 4, o.kv_heads = 2, o.ffn = 12, o.vocab = 8;
  o.experts = 4, o.experts_used = 2;
  check_layer(with_router_margins(o), false, "Mixtral-like, renormalized");
  o.expert_norm = false, o.qk_norm_whole = true;
  check_layer(with_router_margins(o), false, "OLMoE-like, whole-vector q/k norms");
  o.experts_used = 1;
  check_layer(with_router_margins(o), true, "one expert a token, q/k/v joined");
}

}  // namespace
}  // namespace tessera::model
