// One decoder layer's forward pass, against ops/: norm, q/k/v, attention, output projection,
// residual, norm, MLP, residual.
#include "model/decoder_block.h"

#include <vector>

#include "core/error.h"
#include "ops/memory.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace tessera::model {

namespace {

const float* bias_of(const WeightRef& b) {
  return b.present() ? static_cast<const float*>(b.data) : nullptr;
}

struct LinearOut {
  float* y;
  const WeightRef* w;
  const WeightRef* b;  // may be null or absent
};

// Several linears of the same input x (n rows, ldy the outputs' common row stride): one grouped
// product, x quantized once. Outputs side by side in y whose matrices are consecutive rows of one
// stored matrix (GPT-2's c_attn seen as q, k and v; q, k and v, or gate and up, uploaded side by
// side by to_device) become one product: the packed GEMM then packs x once instead of once per
// part, and a device launches one kernel.
void linear_group(const ops::Context& ctx, Stage stage, const float* x, int64_t n, int64_t ldy,
                  std::initializer_list<LinearOut> outs, const ops::QuantizedRows* xq) {
  const ops::Scope scope(ctx, stage_name(stage));
  int64_t K = 0;
  ops::WtProduct products[4];
  const LinearOut* tail[4] = {};  // the last linear joined into products[i]
  int64_t np = 0;
  for (const LinearOut& o : outs) {
    const WeightRef& w = *o.w;
    const float* b = o.b ? bias_of(*o.b) : nullptr;
    K = w.cols();
    if (np > 0) {
      ops::WtProduct& last = products[np - 1];
      const LinearOut& prev = *tail[np - 1];
      // At one row the outputs need only be side by side (the row stride means nothing).
      const bool continues = prev.w->continued_by(w) && o.y == last.y + last.N &&
                             (n == 1 || last.N + w.rows() <= ldy) &&
                             (b == nullptr) == (last.bias == nullptr) &&
                             (b == nullptr || prev.b->continued_by(*o.b));
      if (continues) {
        last.N += w.rows();
        last.ldy = std::max(last.ldy, last.N);
        tail[np - 1] = &o;
        continue;
      }
    }
    TS_CHECK(np < 4, "[model] more than four products in one group");
    products[np] = ops::WtProduct{o.y, ldy, w.data, w.type, w.rows(), b};
    tail[np] = &o;
    ++np;
  }
  ops::matmul_wt_group(ctx, x, n, K, {products, static_cast<size_t>(np)}, xq);
}

// out (n,C) = stream + t.branch, the branch RMS-normalized first with weights post (post_norms);
// which: 0 the attention branch, 1 the MLP's (its slot of t.post_in and t.post_rstd where kept).
// With norm.out set, the join also writes the norm of out (one ops::residual_norm).
void join_branch(const ops::Context& ctx, const DecoderConfig& c, const BlockTensors& t, int64_t n,
                 const WeightRef& post, const float* stream, float* out, int64_t which,
                 const NormInto& norm) {
  const int64_t C = c.d_model;
  if (c.post_norms) {
    float* rstd = t.post_rstd;
    if (t.post_in) {
      ops::copy_rows(ctx, t.post_in + which * n * C, C, t.branch, C, n, C);
      rstd += which * n;
    }
    ops::rmsnorm_forward(ctx, t.branch, rstd, t.branch, static_cast<const float*>(post.data), n, C,
                         c.norm_eps);
  }
  if (!norm.out) return ops::add(ctx, out, stream, t.branch, n * C);
  ops::ResidualNormArgs a;
  a.kind = c.arch == DecoderArch::gpt2 ? ops::NormKind::layer : ops::NormKind::rms;
  a.x_out = out, a.out = norm.out, a.mean = norm.mean, a.rstd = norm.rstd;
  a.a = stream, a.r = t.branch;
  a.w = static_cast<const float*>(norm.w->data);
  a.b = bias_of(*norm.b);
  a.N = n, a.C = C, a.eps = c.norm_eps;
  a.q_out = norm.q;
  ops::residual_norm(ctx, a);
}

// A bf16 step's MLP input products (BlockTensors::round_ff_in): ff_in and ff_up (rows, F; ff_up
// where the MLP is gated) rounded to bf16 in place, their bits kept where the tensors say.
void round_ff_in(const ops::Context& ctx, const BlockTensors& t, int64_t rows, int64_t F,
                 bool gated) {
  if (!t.round_ff_in) return;
  ops::round_to_bf16(ctx, t.ff_in, t.ff_in_bf16, rows * F);
  if (gated) ops::round_to_bf16(ctx, t.ff_up, t.ff_up_bf16, rows * F);
}

// t.branch (n,C) = the MoE MLP of t.xn2: the router picks k experts per row (ops::moe_route);
// the host groups the n k choices by expert, and each chosen expert runs once on the rows that
// chose it, reading only its own rows of the stacked matrices; the outputs are added into their
// rows with the router's weights. The grouping needs the choices on the host: one small copy
// per layer, which a device graph cannot record (DecoderForward does not record MoE steps).
void moe_mlp(const ops::Context& ctx, const DecoderConfig& c, const DecoderLayer& w, int64_t n,
             const BlockTensors& t) {
  const int64_t C = c.d_model, F = c.d_ff, E = c.n_experts, k = c.n_experts_used, nk = n * k;
  TS_CHECK(t.router && t.moe_ids && t.moe_weights && t.moe_x && t.moe_y && t.routing,
           "[model] a mixture-of-experts layer needs the router and expert scratch");
  {
    const ops::Scope scope(ctx, stage_name(Stage::mlp_in));
    ops::matmul_wt(ctx, t.router, E, t.xn2, n, C, w.ffn_router.data, w.ffn_router.type, E, nullptr);
    ops::moe_route(ctx, t.moe_ids, t.moe_weights, t.router, n, E, k, c.expert_norm);
  }
  MoeRouting& h = *t.routing;
  h.ids.resize(static_cast<size_t>(2 * nk));
  h.weights.resize(static_cast<size_t>(2 * nk));
  int32_t* ids = h.ids.data();
  float* weights = h.weights.data();
  ops::copy(ctx, ids, t.moe_ids, static_cast<size_t>(nk) * sizeof(int32_t),
            ops::CopyKind::device_to_host);
  ops::copy(ctx, weights, t.moe_weights, static_cast<size_t>(nk) * sizeof(float),
            ops::CopyKind::device_to_host);
  if (ctx.dry_run)  // the router did not run: an even spread, the case a plan assumes
    for (int64_t i = 0; i < nk; ++i) {
      ids[i] = static_cast<int32_t>(i % E);
      weights[i] = 1.0f / static_cast<float>(k);
    }
  // Counting sort of the choices by expert: expert e's rows are [start[e], start[e + 1]).
  std::vector<int64_t>& start = h.start;
  start.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < nk; ++i) {
    TS_CHECK(ids[i] >= 0 && ids[i] < E, "[model] the router chose expert ", ids[i], " of ", E);
    ++start[static_cast<size_t>(ids[i]) + 1];
  }
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  h.next.assign(start.begin(), start.end() - 1);
  h.slot.resize(static_cast<size_t>(nk));
  int32_t* rows = ids + nk;
  float* grouped = weights + nk;
  for (int64_t i = 0; i < nk; ++i) {
    const int64_t at = h.next[static_cast<size_t>(ids[i])]++;
    rows[at] = static_cast<int32_t>(i / k);
    grouped[at] = weights[i];
    h.slot[static_cast<size_t>(i)] = static_cast<int32_t>(at);
  }
  ops::copy(ctx, t.moe_ids + nk, rows, static_cast<size_t>(nk) * sizeof(int32_t),
            ops::CopyKind::host_to_device);
  ops::copy(ctx, t.moe_weights + nk, grouped, static_cast<size_t>(nk) * sizeof(float),
            ops::CopyKind::host_to_device);
  if (n == 1) {
    // One token (decode at batch 1): every chosen expert reads the same row, so their gate and
    // up products go as one group, the row quantized once and the threads handed off once.
    h.products.clear();
    for (int64_t e = 0; e < E; ++e)
      if (start[e + 1] > start[e])
        for (const WeightRef* m : {&w.w_gate, &w.w_up})
          h.products.push_back(ops::WtProduct{(m == &w.w_gate ? t.ff_in : t.ff_up) + start[e] * F,
                                              F, expert_rows(*m, e, E).data, m->type, F, nullptr});
    const ops::Scope scope(ctx, stage_name(Stage::mlp_in));
    ops::matmul_wt_group(ctx, t.xn2, 1, C, h.products);
  } else {
    ops::gather_rows(ctx, t.moe_x, t.xn2, t.moe_ids + nk, nk, C, n);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = start[e], m = start[e + 1] - r0;
      if (m == 0) continue;
      const WeightRef gate = expert_rows(w.w_gate, e, E), up = expert_rows(w.w_up, e, E);
      linear_group(ctx, Stage::mlp_in, t.moe_x + r0 * C, m, F,
                   {{t.ff_in + r0 * F, &gate, nullptr}, {t.ff_up + r0 * F, &up, nullptr}}, nullptr);
    }
  }
  round_ff_in(ctx, t, nk, F, true);
  ops::glu_forward(ctx, t.ff_act, t.ff_in, t.ff_up, nk, F, c.mlp_act);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = start[e], m = start[e + 1] - r0;
    if (m > 0)
      linear_forward(ctx, Stage::mlp_down, t.moe_y + r0 * C, t.ff_act + r0 * F, m,
                     expert_rows(w.w_down, e, E), {});
  }
  const ops::Scope scope(ctx, stage_name(Stage::mlp_down));
  ops::zero(ctx, t.branch, static_cast<size_t>(n * C) * sizeof(float));
  ops::scatter_add_rows(ctx, t.branch, t.moe_y, t.moe_ids + nk, t.moe_weights + nk, nk, C, n);
}

}  // namespace

const char* stage_name(Stage s) {
  static constexpr const char* kNames[kNumStages] = {"qkv",      "attn_out", "mlp_in",
                                                     "mlp_down", "head",     "attention"};
  return kNames[static_cast<int>(s)];
}

void norm_forward(const ops::Context& ctx, const DecoderConfig& c, float* out, float* mean,
                  float* rstd, const float* inp, int64_t n, const WeightRef& w,
                  const WeightRef& b) {
  const auto* wf = static_cast<const float*>(w.data);
  if (c.arch == DecoderArch::gpt2)
    ops::layernorm_forward(ctx, out, mean, rstd, inp, wf, bias_of(b), n, c.d_model);
  else
    ops::rmsnorm_forward(ctx, out, rstd, inp, wf, n, c.d_model, c.norm_eps);
}

void linear_forward(const ops::Context& ctx, Stage stage, float* y, const float* x, int64_t n,
                    const WeightRef& w, const WeightRef& b, const ops::QuantizedRows* xq) {
  if (xq) return linear_group(ctx, stage, x, n, w.rows(), {{y, &w, &b}}, xq);
  const ops::Scope scope(ctx, stage_name(stage));
  ops::matmul_wt(ctx, y, w.rows(), x, n, w.cols(), w.data, w.type, w.rows(), bias_of(b));
}

void lora_project(const ops::Context& ctx, const LoraRef& a, const float* x, int64_t n, float* u) {
  TS_CHECK(a.a.type == DType::f32 && a.b.type == DType::f32, "[model] adapters are f32");
  const int64_t r = a.rank(), K = a.a.cols();
  ops::GemmArgs g;  // u (n,r) = x (n,K) A^T
  g.trans_b = ops::Trans::T;
  g.m = n, g.n = r, g.k = K;
  g.a = x, g.lda = K;
  g.b = a.a.data, g.ldb = K;
  g.c = u, g.ldc = r;
  ops::gemm(ctx, g);
  if (a.scale != 1.0f) ops::scale(ctx, u, n * r, a.scale);
}

void lora_forward(const ops::Context& ctx, const LoraRef& a, float* y, int64_t ldy, const float* x,
                  int64_t n, float* u) {
  if (!a.present()) return;
  TS_CHECK(u != nullptr, "[model] a layer with adapters needs the lora_u scratch");
  lora_project(ctx, a, x, n, u);
  const int64_t r = a.rank(), N = a.b.rows();
  ops::GemmArgs g;  // y (n,N) += u (n,r) B^T
  g.trans_b = ops::Trans::T;
  g.m = n, g.n = N, g.k = r;
  g.a = u, g.lda = r;
  g.b = a.b.data, g.ldb = r;
  g.c = y, g.ldc = ldy;
  g.accumulate = true;
  ops::gemm(ctx, g);
}

void block_forward(const ops::Context& ctx, const DecoderConfig& c, const DecoderLayer& w,
                   int64_t layer, int64_t n, const BlockTensors& t, BlockAttention& attention,
                   bool stop_after_ff_in, const NormChain& chain) {
  const int64_t C = c.d_model, QD = c.q_dim(), KV = c.kv_dim();
  const bool llama = c.arch == DecoderArch::llama;

  // Attention branch: mid = in + [post-norm] wo attention(q, k, v of norm(in)).
  if (!chain.in_normed)
    norm_forward(ctx, c, t.xn1, t.mean1, t.rstd1, t.in, n, w.attn_norm, w.attn_norm_b);
  TS_CHECK(!c.moe() || (!t.xn2_bf16 && !t.ff_act_bf16),
           "[model] a mixture-of-experts layer keeps its MLP input and activation in f32");
  if (t.xn1_bf16) ops::convert_f32_to_bf16(ctx, t.xn1_bf16, t.xn1, n * C);
  // q, k and v read the same input: one grouped product into the rows of qkv.
  const int64_t QKV = QD + 2 * KV;
  linear_group(ctx, Stage::qkv, t.xn1, n, QKV,
               {{t.qkv, &w.wq, &w.bq}, {t.qkv + QD, &w.wk, &w.bk}, {t.qkv + QD + KV, &w.wv, &w.bv}},
               t.xn1_q);
  using M = LayerMatrix;
  if (w.has_adapters()) {
    const ops::Scope scope(ctx, stage_name(Stage::qkv));
    lora_forward(ctx, w.adapter(M::q), t.qkv, QKV, t.xn1, n, t.lora_u);
    lora_forward(ctx, w.adapter(M::k), t.qkv + QD, QKV, t.xn1, n, t.lora_u);
    lora_forward(ctx, w.adapter(M::v), t.qkv + QD + KV, QKV, t.xn1, n, t.lora_u);
  }
  if (c.qk_norm) {  // each head of q and k (or each whole) normalized before attention rotates
    const ops::Scope scope(ctx, stage_name(Stage::qkv));
    if (t.qk_raw) ops::copy_rows(ctx, t.qk_raw, QD + KV, t.qkv, QKV, n, QD + KV);
    const bool whole = c.qk_norm_whole;
    ops::head_rmsnorm(ctx, t.qkv, QKV, n, whole ? 1 : c.n_heads, whole ? QD : c.head_dim,
                      static_cast<const float*>(w.q_norm.data), c.norm_eps);
    ops::head_rmsnorm(ctx, t.qkv + QD, QKV, n, whole ? 1 : c.n_kv_heads, whole ? KV : c.head_dim,
                      static_cast<const float*>(w.k_norm.data), c.norm_eps);
  }
  {
    const ops::Scope scope(ctx, stage_name(Stage::attention));
    attention.attend(layer, t.qkv, t.att, n, t.att_q);
  }
  linear_forward(ctx, Stage::attn_out, t.branch, t.att, n, w.wo, w.bo, t.att_q);
  if (w.adapter(M::o).present()) {
    const ops::Scope scope(ctx, stage_name(Stage::attn_out));
    lora_forward(ctx, w.adapter(M::o), t.branch, C, t.att, n, t.lora_u);
  }
  // MLP branch: out = mid + [post-norm] down(act(up(norm(mid)))), norm(mid) fused with the join.
  join_branch(ctx, c, t, n, w.post_attn_norm, t.in, t.mid, 0,
              {t.xn2, t.mean2, t.rstd2, &w.ffn_norm, &w.ffn_norm_b, t.xn2_q});
  if (t.xn2_bf16) ops::convert_f32_to_bf16(ctx, t.xn2_bf16, t.xn2, n * C);
  const int64_t F = c.d_ff;
  if (c.moe()) {
    TS_CHECK(!stop_after_ff_in,
             "[model] a mixture-of-experts layer's backward replays the whole layer (it reads "
             "the experts' outputs)");
    TS_CHECK(!w.adapter(M::gate).present() && !w.adapter(M::up).present() &&
                 !w.adapter(M::down).present(),
             "[model] LoRA adapters on a mixture-of-experts layer's expert matrices are not "
             "implemented");
    moe_mlp(ctx, c, w, n, t);
  } else if (llama) {
    linear_group(ctx, Stage::mlp_in, t.xn2, n, F,
                 {{t.ff_in, &w.w_gate, nullptr}, {t.ff_up, &w.w_up, nullptr}}, t.xn2_q);
    if (w.adapter(M::gate).present() || w.adapter(M::up).present()) {
      const ops::Scope scope(ctx, stage_name(Stage::mlp_in));
      lora_forward(ctx, w.adapter(M::gate), t.ff_in, F, t.xn2, n, t.lora_u);
      lora_forward(ctx, w.adapter(M::up), t.ff_up, F, t.xn2, n, t.lora_u);
    }
    round_ff_in(ctx, t, n, F, true);
    if (stop_after_ff_in) return;
    ops::glu_forward(ctx, t.ff_act, t.ff_in, t.ff_up, n, F, c.mlp_act, t.act_q);
  } else {
    linear_forward(ctx, Stage::mlp_in, t.ff_in, t.xn2, n, w.w_up, w.b_up, t.xn2_q);
    if (w.adapter(M::up).present()) {
      const ops::Scope scope(ctx, stage_name(Stage::mlp_in));
      lora_forward(ctx, w.adapter(M::up), t.ff_in, F, t.xn2, n, t.lora_u);
    }
    round_ff_in(ctx, t, n, F, false);
    if (stop_after_ff_in) return;
    ops::gelu_forward(ctx, t.ff_act, t.ff_in, n * F);
  }
  if (t.ff_act_bf16) ops::convert_f32_to_bf16(ctx, t.ff_act_bf16, t.ff_act, n * F);
  if (!c.moe())
    linear_forward(ctx, Stage::mlp_down, t.branch, t.ff_act, n, w.w_down, w.b_down, t.act_q);
  if (w.adapter(M::down).present()) {
    const ops::Scope scope(ctx, stage_name(Stage::mlp_down));
    lora_forward(ctx, w.adapter(M::down), t.branch, C, t.ff_act, n, t.lora_u);
  }
  join_branch(ctx, c, t, n, w.post_ffn_norm, t.mid, t.out, 1, chain.next);
}

}  // namespace tessera::model
