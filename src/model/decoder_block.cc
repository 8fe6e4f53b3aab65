// One decoder layer's forward pass, against ops/: norm, q/k/v, attention, output projection,
// residual, norm, MLP, residual.
#include "model/decoder_block.h"

#include "core/error.h"
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
// stored matrix (GPT-2's c_attn seen as q, k and v) become one product: the packed GEMM then
// packs x once instead of once per part.
void linear_group(const ops::Context& ctx, Stage stage, const float* x, int64_t n, int64_t ldy,
                  std::initializer_list<LinearOut> outs) {
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
      const bool continues = prev.w->continued_by(w) && o.y == last.y + last.N &&
                             (b == nullptr) == (last.bias == nullptr) &&
                             (b == nullptr || prev.b->continued_by(*o.b));
      if (continues) {
        last.N += w.rows();
        tail[np - 1] = &o;
        continue;
      }
    }
    TS_CHECK(np < 4, "[model] more than four products in one group");
    products[np] = ops::WtProduct{o.y, ldy, w.data, w.type, w.rows(), b};
    tail[np] = &o;
    ++np;
  }
  ops::matmul_wt_group(ctx, x, n, K, {products, static_cast<size_t>(np)});
}

// out (n,C) = stream + t.branch, the branch RMS-normalized first with weights post (post_norms).
void join_branch(const ops::Context& ctx, const DecoderConfig& c, const BlockTensors& t, int64_t n,
                 const WeightRef& post, const float* stream, float* out) {
  const int64_t C = c.d_model;
  if (c.post_norms)
    ops::rmsnorm_forward(ctx, t.branch, t.post_rstd, t.branch, static_cast<const float*>(post.data),
                         n, C, c.norm_eps);
  ops::add(ctx, out, stream, t.branch, n * C);
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
                    const WeightRef& w, const WeightRef& b) {
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
                   bool stop_after_ff_in) {
  const int64_t C = c.d_model, QD = c.q_dim(), KV = c.kv_dim();
  const bool llama = c.arch == DecoderArch::llama;

  // Attention branch: mid = in + [post-norm] wo attention(q, k, v of norm(in)).
  norm_forward(ctx, c, t.xn1, t.mean1, t.rstd1, t.in, n, w.attn_norm, w.attn_norm_b);
  // q, k and v read the same input: one grouped product into the rows of qkv.
  const int64_t QKV = QD + 2 * KV;
  linear_group(
      ctx, Stage::qkv, t.xn1, n, QKV,
      {{t.qkv, &w.wq, &w.bq}, {t.qkv + QD, &w.wk, &w.bk}, {t.qkv + QD + KV, &w.wv, &w.bv}});
  using M = LayerMatrix;
  if (w.has_adapters()) {
    const ops::Scope scope(ctx, stage_name(Stage::qkv));
    lora_forward(ctx, w.adapter(M::q), t.qkv, QKV, t.xn1, n, t.lora_u);
    lora_forward(ctx, w.adapter(M::k), t.qkv + QD, QKV, t.xn1, n, t.lora_u);
    lora_forward(ctx, w.adapter(M::v), t.qkv + QD + KV, QKV, t.xn1, n, t.lora_u);
  }
  if (c.qk_norm) {  // each head of q and k normalized in place, before attention rotates them
    const ops::Scope scope(ctx, stage_name(Stage::qkv));
    if (t.qk_raw) ops::copy_rows(ctx, t.qk_raw, QD + KV, t.qkv, QKV, n, QD + KV);
    ops::head_rmsnorm(ctx, t.qkv, QKV, n, c.n_heads, c.head_dim,
                      static_cast<const float*>(w.q_norm.data), c.norm_eps);
    ops::head_rmsnorm(ctx, t.qkv + QD, QKV, n, c.n_kv_heads, c.head_dim,
                      static_cast<const float*>(w.k_norm.data), c.norm_eps);
  }
  {
    const ops::Scope scope(ctx, stage_name(Stage::attention));
    attention.attend(layer, t.qkv, t.att, n);
  }
  linear_forward(ctx, Stage::attn_out, t.branch, t.att, n, w.wo, w.bo);
  if (w.adapter(M::o).present()) {
    const ops::Scope scope(ctx, stage_name(Stage::attn_out));
    lora_forward(ctx, w.adapter(M::o), t.branch, C, t.att, n, t.lora_u);
  }
  join_branch(ctx, c, t, n, w.post_attn_norm, t.in, t.mid);

  // MLP branch: out = mid + [post-norm] down(act(up(norm(mid)))).
  norm_forward(ctx, c, t.xn2, t.mean2, t.rstd2, t.mid, n, w.ffn_norm, w.ffn_norm_b);
  const int64_t F = c.d_ff;
  if (llama) {
    linear_group(ctx, Stage::mlp_in, t.xn2, n, F,
                 {{t.ff_in, &w.w_gate, nullptr}, {t.ff_up, &w.w_up, nullptr}});
    if (w.adapter(M::gate).present() || w.adapter(M::up).present()) {
      const ops::Scope scope(ctx, stage_name(Stage::mlp_in));
      lora_forward(ctx, w.adapter(M::gate), t.ff_in, F, t.xn2, n, t.lora_u);
      lora_forward(ctx, w.adapter(M::up), t.ff_up, F, t.xn2, n, t.lora_u);
    }
    if (stop_after_ff_in) return;
    ops::glu_forward(ctx, t.ff_act, t.ff_in, t.ff_up, n, F, c.mlp_act);
  } else {
    linear_forward(ctx, Stage::mlp_in, t.ff_in, t.xn2, n, w.w_up, w.b_up);
    if (w.adapter(M::up).present()) {
      const ops::Scope scope(ctx, stage_name(Stage::mlp_in));
      lora_forward(ctx, w.adapter(M::up), t.ff_in, F, t.xn2, n, t.lora_u);
    }
    if (stop_after_ff_in) return;
    ops::gelu_forward(ctx, t.ff_act, t.ff_in, n * F);
  }
  linear_forward(ctx, Stage::mlp_down, t.branch, t.ff_act, n, w.w_down, w.b_down);
  if (w.adapter(M::down).present()) {
    const ops::Scope scope(ctx, stage_name(Stage::mlp_down));
    lora_forward(ctx, w.adapter(M::down), t.branch, C, t.ff_act, n, t.lora_u);
  }
  join_branch(ctx, c, t, n, w.post_ffn_norm, t.mid, t.out);
}

}  // namespace tessera::model
