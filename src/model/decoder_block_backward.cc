// One decoder layer's backward pass (GPT-2 and the Llama family), against ops/: the forward of
// decoder_block.cc in reverse, accumulating every weight's gradient.
#include "core/error.h"
#include "model/causal_attention.h"
#include "model/decoder_block.h"
#include "ops/memory.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace tessera::model {

namespace {

// A gradient view's tensor: f32 memory the caller owns, viewed through a WeightRef of the
// weights' layout (as_decoder over the gradient buffer); null where the tensor is absent.
float* grad(const WeightRef& g) {
  TS_CHECK(!g.present() || g.type == DType::f32, "[model] gradients are f32");
  return g.present() ? const_cast<float*>(static_cast<const float*>(g.data)) : nullptr;
}

// a, b, c as one matrix or vector (each continuing the one before in memory), or absent.
WeightRef joined(const WeightRef& a, const WeightRef& b, const WeightRef& c) {
  if (!a.continued_by(b) || !b.continued_by(c)) return {};
  WeightRef j = a;
  const int64_t n = a.shape[0] + b.shape[0] + c.shape[0];  // rows, or a vector's length
  j.shape = a.shape.rank() == 2 ? Shape({n, a.cols()}) : Shape({n});
  return j;
}

// c (m,n) = op(a) (m,k) b (k,n), or += with accumulate; a f32, b of b_type, every operand packed
// (leading dimension its row width).
void packed_gemm(const ops::Context& ctx, float* c, bool accumulate, ops::Trans trans_a,
                 const float* a, const void* b, DType b_type, int64_t m, int64_t n, int64_t k,
                 bool round_bf16 = false) {
  ops::GemmArgs g;
  g.trans_a = trans_a;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.lda = trans_a == ops::Trans::T ? m : k;
  g.b = b, g.b_type = b_type, g.ldb = n;
  g.c = c, g.ldc = n;
  g.accumulate = accumulate;
  g.round_bf16 = round_bf16;
  ops::gemm(ctx, g);
}

// Expert e's rows of a stacked gradient matrix, or null where the gradient view has none.
float* expert_grad(const WeightRef& g, int64_t e, int64_t E) {
  return g.present() ? grad(expert_rows(g, e, E)) : nullptr;
}

// The backward of moe_mlp (decoder_block.cc): from dy (n,C), the gradient of the layer's MoE
// branch output, writes s.dx (n,C), that of its input xn2, and adds the experts' and the
// router's weight gradients into g. It reads what the forward kept (t: router logits, choices,
// grouped rows and weights, the experts' inputs, gate and up products, activations and outputs)
// and its host grouping (t.routing); nothing is recomputed here.
void moe_backward(const ops::Context& ctx, const DecoderConfig& c, const DecoderLayer& w,
                  const DecoderLayer& g, int64_t n, const BlockTensors& t, const float* dy,
                  const BlockGradScratch& s, bool round_bf16) {
  const int64_t C = c.d_model, F = c.d_ff, E = c.n_experts, k = c.n_experts_used, nk = n * k;
  TS_CHECK(t.router && t.moe_ids && t.moe_weights && t.moe_y && t.routing && (n == 1 || t.moe_x),
           "[model] a mixture-of-experts layer's backward needs the forward's router and expert "
           "tensors");
  TS_CHECK(s.moe_dy && s.moe_dw && s.moe_dlogits && s.moe_slot && s.dup,
           "[model] a mixture-of-experts layer's backward needs the moe_* and dup scratch");
  MoeRouting& h = *t.routing;
  const std::vector<int64_t>& start = h.start;
  TS_CHECK(static_cast<int64_t>(start.size()) == E + 1 && start[E] == nk &&
               static_cast<int64_t>(h.slot.size()) == nk,
           "[model] the routing does not hold this layer's forward of ", n, " rows");
  const int32_t* rows = t.moe_ids + nk;  // grouped choices' token rows and weights
  const float* weights = t.moe_weights + nk;
  // y = sum over choices of weight * expert output: each output's gradient (grouped, into
  // moe_dy) and each weight's (grouped, into moe_dw).
  ops::scatter_add_rows_backward(ctx, s.moe_dy, s.moe_dw, dy, t.moe_y, rows, weights, nk, C, n);
  for (int64_t e = 0; e < E; ++e) {  // down: d ff_act (into dbig) and dW of expert e's rows
    const int64_t r0 = start[e], m = start[e + 1] - r0;
    if (m > 0)
      linear_backward(ctx, s.dbig + r0 * F, false, s.moe_dy + r0 * C, t.ff_act + r0 * F, m,
                      expert_rows(w.w_down, e, E), expert_grad(g.w_down, e, E), nullptr,
                      round_bf16);
  }
  ops::glu_backward(ctx, s.dbig, s.dup, s.dbig, t.ff_in, t.ff_up, nk, F, c.mlp_act);
  for (int64_t e = 0; e < E; ++e) {  // gate and up: the experts' inputs' gradients into moe_dy
    const int64_t r0 = start[e], m = start[e + 1] - r0;
    if (m == 0) continue;
    const float* x = n == 1 ? t.xn2 : t.moe_x + r0 * C;  // one token: each expert read its row
    float* dx = s.moe_dy + r0 * C;
    linear_backward(ctx, dx, false, s.dbig + r0 * F, x, m, expert_rows(w.w_gate, e, E),
                    expert_grad(g.w_gate, e, E), nullptr, round_bf16);
    linear_backward(ctx, dx, true, s.dup + r0 * F, x, m, expert_rows(w.w_up, e, E),
                    expert_grad(g.w_up, e, E), nullptr, round_bf16);
  }
  // Each choice's input gradient back to its token's row (weight 1), the router weights'
  // gradients from the grouped order to the choices' (n,k), then through the router: its logits,
  // its matrix and its input.
  float* dw_choice = s.moe_dw + nk;
  float* ones = s.moe_dw + 2 * nk;
  h.ones.assign(static_cast<size_t>(nk), 1.0f);
  ops::copy(ctx, ones, h.ones.data(), static_cast<size_t>(nk) * sizeof(float),
            ops::CopyKind::host_to_device);
  ops::copy(ctx, s.moe_slot, h.slot.data(), static_cast<size_t>(nk) * sizeof(int32_t),
            ops::CopyKind::host_to_device);
  ops::zero(ctx, s.dx, static_cast<size_t>(n * C) * sizeof(float));
  ops::scatter_add_rows(ctx, s.dx, s.moe_dy, rows, ones, nk, C, n);
  ops::gather_rows(ctx, dw_choice, s.moe_dw, s.moe_slot, nk, 1, nk);
  ops::moe_route_backward(ctx, s.moe_dlogits, dw_choice, t.moe_ids, t.router, n, E, k,
                          c.expert_norm);
  linear_backward(ctx, s.dx, true, s.moe_dlogits, t.xn2, n, w.ffn_router, grad(g.ffn_router),
                  nullptr, false);
}

}  // namespace

void linear_backward(const ops::Context& ctx, float* dx, bool accumulate_dx, const float* dy,
                     const float* x, int64_t n, const WeightRef& w, float* dw, float* db,
                     bool round_bf16, const LoraGrad& lora, bool write_dw, const uint16_t* x_bf16) {
  const int64_t N = w.rows(), K = w.cols();
  if (dw != nullptr) {  // dW (N,K) += dy^T (N,n) x (n,K), or = with write_dw
    const void* xb = x_bf16 ? static_cast<const void*>(x_bf16) : x;
    packed_gemm(ctx, dw, !write_dw, ops::Trans::T, dy, xb, x_bf16 ? DType::bf16 : DType::f32, N, K,
                n, round_bf16);
  }
  if (db != nullptr) ops::bias_grad(ctx, db, dy, n, N);
  const int64_t r = lora.present() ? lora.w->rank() : 0;
  TS_CHECK(r == 0 || x_bf16 == nullptr, "[model] an adapter's backward reads its input in f32");
  if (r > 0) {
    // u (n,r) = s x A^T, the forward's; dB (N,r) += dy^T u; gu (n,r) = s dy B; dA (r,K) += gu^T x.
    TS_CHECK(lora.u != nullptr && lora.gu != nullptr,
             "[model] an adapter's backward needs the lora_u and lora_gu scratch");
    const LoraRef& a = *lora.w;
    lora_project(ctx, a, x, n, lora.u);
    if (lora.g != nullptr && lora.g->b.present())
      packed_gemm(ctx, grad(lora.g->b), true, ops::Trans::T, dy, lora.u, DType::f32, N, r, n);
    packed_gemm(ctx, lora.gu, false, ops::Trans::N, dy, a.b.data, DType::f32, n, r, N);
    if (a.scale != 1.0f) ops::scale(ctx, lora.gu, n * r, a.scale);
    if (lora.g != nullptr && lora.g->a.present())
      packed_gemm(ctx, grad(lora.g->a), true, ops::Trans::T, lora.gu, x, DType::f32, r, K, n);
  }
  if (dx == nullptr) return;
  // dx (n,K) = dy (n,N) W (N,K); last but the adapter's term: dx may alias x
  if (w.type == DType::f32 || w.type == DType::bf16) {
    packed_gemm(ctx, dx, accumulate_dx, ops::Trans::N, dy, w.data, w.type, n, K, N, round_bf16);
  } else {
    TS_CHECK(dw == nullptr, "[model] a ", dtype_name(w.type), " matrix cannot take a gradient");
    ops::matmul_w(ctx, dx, K, dy, n, N, w.data, w.type, K, accumulate_dx);
  }
  if (r > 0)  // dx (n,K) += gu (n,r) A (r,K)
    packed_gemm(ctx, dx, true, ops::Trans::N, lora.gu, lora.w->a.data, DType::f32, n, K, r);
}

void norm_backward(const ops::Context& ctx, const DecoderConfig& c, float* dinp, const float* dout,
                   const float* inp, const float* mean, const float* rstd, int64_t n,
                   const WeightRef& w, const WeightRef& dw, const WeightRef& db) {
  ops::NormBackwardArgs a;
  a.dinp = dinp, a.dw = grad(dw), a.dout = dout, a.inp = inp;
  a.w = static_cast<const float*>(w.data), a.rstd = rstd, a.N = n, a.C = c.d_model;
  if (c.arch == DecoderArch::gpt2) {
    a.db = grad(db), a.mean = mean;
    ops::layernorm_backward(ctx, a);
  } else {
    ops::rmsnorm_backward(ctx, a);
  }
}

void block_backward(const ops::Context& ctx, const DecoderConfig& c, const DecoderLayer& w,
                    const DecoderLayer& g, int64_t n, const BlockTensors& t,
                    CausalAttention& attention, float* dresid, const BlockGradScratch& s,
                    bool round_bf16, bool write_dense_dw) {
  const int64_t QD = c.q_dim(), KV = c.kv_dim(), F = c.d_ff, ld = QD + 2 * KV;
  const bool llama = c.arch == DecoderArch::llama;
  TS_CHECK(!c.qk_norm || t.qk_raw != nullptr, "[model] q/k norms' backward needs t.qk_raw");
  TS_CHECK(!llama || s.dup != nullptr, "[model] a Llama layer's backward needs the dup scratch");
  using M = LayerMatrix;
  auto lin = [&](float* dx, bool acc, const float* dy, const float* x, const WeightRef& wr,
                 const WeightRef& gw, const WeightRef& gb, M m, const uint16_t* x_bf16 = nullptr) {
    const size_t i = static_cast<size_t>(m);
    linear_backward(ctx, dx, acc, dy, x, n, wr, grad(gw), grad(gb), round_bf16,
                    {&w.lora[i], &g.lora[i], s.lora_u, s.lora_gu}, write_dense_dw, x_bf16);
  };

  // A branch's output gradient from its output's after the post-norm (post_norms: into s.dpost,
  // from the kept branch output), else that gradient itself.
  const int64_t C = c.d_model;
  TS_CHECK(!c.post_norms || (t.post_in && t.post_rstd && s.dpost),
           "[model] post-norms' backward needs t.post_in, t.post_rstd and the dpost scratch");
  auto branch_grad = [&](const WeightRef& wp, const WeightRef& gp, int64_t which) -> const float* {
    if (!c.post_norms) return dresid;
    ops::zero(ctx, s.dpost, static_cast<size_t>(n * C) * sizeof(float));
    ops::NormBackwardArgs a;
    a.dinp = s.dpost, a.dw = grad(gp), a.dout = dresid, a.inp = t.post_in + which * n * C;
    a.w = static_cast<const float*>(wp.data), a.rstd = t.post_rstd + which * n, a.N = n, a.C = C;
    ops::rmsnorm_backward(ctx, a);
    return s.dpost;
  };

  // MLP branch: out = mid + [post-norm] down(act(up(norm(mid)))), the MLP's input gradient into
  // s.dx. ff_act may be s.dbig itself (recomputed): the down product reads it for dW before it
  // writes dbig (a mixture of experts: expert by expert, each over its own rows).
  const float* dbranch = branch_grad(w.post_ffn_norm, g.post_ffn_norm, 1);
  if (c.moe()) {
    moe_backward(ctx, c, w, g, n, t, dbranch, s, round_bf16);
  } else if (llama) {
    lin(s.dbig, false, dbranch, t.ff_act, w.w_down, g.w_down, g.b_down, M::down, t.ff_act_bf16);
    ops::glu_backward(ctx, s.dbig, s.dup, s.dbig, t.ff_in, t.ff_up, n, F, c.mlp_act);
    lin(s.dx, false, s.dbig, t.xn2, w.w_gate, g.w_gate, {}, M::gate, t.xn2_bf16);
    lin(s.dx, true, s.dup, t.xn2, w.w_up, g.w_up, g.b_up, M::up, t.xn2_bf16);
  } else {
    lin(s.dbig, false, dbranch, t.ff_act, w.w_down, g.w_down, g.b_down, M::down, t.ff_act_bf16);
    ops::gelu_backward(ctx, s.dbig, t.ff_in, s.dbig, n * F);
    lin(s.dx, false, s.dbig, t.xn2, w.w_up, g.w_up, g.b_up, M::up, t.xn2_bf16);
  }
  // The norm's backward adds into dresid, which already holds the skip path's gradient.
  norm_backward(ctx, c, dresid, s.dx, t.mid, t.mean2, t.rstd2, n, w.ffn_norm, g.ffn_norm,
                g.ffn_norm_b);

  // Attention branch: mid = in + [post-norm] wo attention(q, k, v of norm(in)); dq, dk, dv into
  // dbig.
  lin(s.dx, false, branch_grad(w.post_attn_norm, g.post_attn_norm, 0), t.att, w.wo, g.wo, g.bo,
      M::o);
  attention.backward(s.dbig, s.dx, t.qkv, t.att);
  if (c.qk_norm) {  // dq, dk through each head's norm (or the whole q's, k's: one head of all
                    // the columns), in place, from the kept q and k
    const bool whole = c.qk_norm_whole;
    ops::HeadNormBackwardArgs q;  // dq in place in dbig's rows, from the kept q
    q.dx = s.dbig, q.dy = s.dbig, q.dw = grad(g.q_norm), q.x = t.qk_raw;
    q.ld = ld, q.ld_x = QD + KV, q.n = n;
    q.heads = whole ? 1 : c.n_heads, q.D = whole ? QD : c.head_dim;
    q.w = static_cast<const float*>(w.q_norm.data), q.eps = c.norm_eps;
    ops::head_rmsnorm_backward(ctx, q);
    ops::HeadNormBackwardArgs k = q;  // dk likewise, from the kept k
    k.dx = s.dbig + QD, k.dy = s.dbig + QD, k.dw = grad(g.k_norm), k.x = t.qk_raw + QD;
    k.heads = whole ? 1 : c.n_kv_heads, k.D = whole ? KV : c.head_dim;
    k.w = static_cast<const float*>(w.k_norm.data);
    ops::head_rmsnorm_backward(ctx, k);
  }
  const WeightRef wqkv = joined(w.wq, w.wk, w.wv), gqkv = joined(g.wq, g.wk, g.wv);
  const WeightRef gbqkv = joined(g.bq, g.bk, g.bv);
  const bool bias = g.bq.present();
  const bool qkv_adapters =
      w.adapter(M::q).present() || w.adapter(M::k).present() || w.adapter(M::v).present();
  if (wqkv.present() && gqkv.present() && (!bias || gbqkv.present()) && !qkv_adapters) {
    // q, k and v rows of one matrix (GPT-2's c_attn): one product over the whole of dqkv.
    lin(s.dx, false, s.dbig, t.xn1, wqkv, gqkv, gbqkv, M::q, t.xn1_bf16);
  } else {
    // Separate matrices: each product reads its columns of dqkv (rows of ld), packed first.
    TS_CHECK(s.dup != nullptr, "[model] separate q, k, v products need the dup scratch");
    const struct {
      const WeightRef &w, &g, &b;
      int64_t col, width;
      M m;
    } parts[] = {{w.wq, g.wq, g.bq, 0, QD, M::q},
                 {w.wk, g.wk, g.bk, QD, KV, M::k},
                 {w.wv, g.wv, g.bv, QD + KV, KV, M::v}};
    for (size_t i = 0; i < 3; ++i) {
      const auto& p = parts[i];
      ops::copy_rows(ctx, s.dup, p.width, s.dbig + p.col, ld, n, p.width);
      lin(s.dx, i > 0, s.dup, t.xn1, p.w, p.g, p.b, p.m, t.xn1_bf16);
    }
  }
  norm_backward(ctx, c, dresid, s.dx, t.in, t.mean1, t.rstd1, n, w.attn_norm, g.attn_norm,
                g.attn_norm_b);
}

}  // namespace tessera::model
