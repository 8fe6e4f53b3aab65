// One decoder layer's backward pass (GPT-2 and the Llama family), against ops/: the forward of
// decoder_block.cc in reverse, accumulating every weight's gradient.
#include "core/error.h"
#include "model/causal_attention.h"
#include "model/decoder_block.h"
#include "ops/ops.h"

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

}  // namespace

void linear_backward(const ops::Context& ctx, float* dx, bool accumulate_dx, const float* dy,
                     const float* x, int64_t n, const WeightRef& w, float* dw, float* db,
                     bool round_bf16) {
  const int64_t N = w.rows(), K = w.cols();
  {  // dW (N,K) += dy^T (N,n) x (n,K)
    ops::GemmArgs g;
    g.trans_a = ops::Trans::T;
    g.m = N, g.n = K, g.k = n;
    g.a = dy, g.lda = N;
    g.b = x, g.ldb = K;
    g.c = dw, g.ldc = K;
    g.accumulate = true;
    g.round_bf16 = round_bf16;
    ops::gemm(ctx, g);
  }
  if (db != nullptr) ops::bias_grad(ctx, db, dy, n, N);
  if (dx != nullptr) {  // dx (n,K) = dy (n,N) W (N,K); last: dx may alias x
    ops::GemmArgs g;
    g.m = n, g.n = K, g.k = N;
    g.a = dy, g.lda = N;
    g.b = w.data, g.b_type = w.type, g.ldb = K;
    g.c = dx, g.ldc = K;
    g.accumulate = accumulate_dx;
    g.round_bf16 = round_bf16;
    ops::gemm(ctx, g);
  }
}

void norm_backward(const ops::Context& ctx, const DecoderConfig& c, float* dinp, const float* dout,
                   const float* inp, const float* mean, const float* rstd, int64_t n,
                   const WeightRef& w, const WeightRef& dw, const WeightRef& db) {
  const auto* wf = static_cast<const float*>(w.data);
  if (c.arch == DecoderArch::gpt2)
    ops::layernorm_backward(ctx, dinp, grad(dw), grad(db), dout, inp, wf, mean, rstd, n, c.d_model);
  else
    ops::rmsnorm_backward(ctx, dinp, grad(dw), dout, inp, wf, rstd, n, c.d_model);
}

void block_backward(const ops::Context& ctx, const DecoderConfig& c, const DecoderLayer& w,
                    const DecoderLayer& g, int64_t n, const BlockTensors& t,
                    CausalAttention& attention, float* dresid, const BlockGradScratch& s,
                    bool round_bf16) {
  const int64_t QD = c.q_dim(), KV = c.kv_dim(), F = c.d_ff, ld = QD + 2 * KV;
  const bool llama = c.arch == DecoderArch::llama;
  TS_CHECK(!llama || s.dup != nullptr, "[model] a Llama layer's backward needs the dup scratch");
  auto lin = [&](float* dx, bool acc, const float* dy, const float* x, const WeightRef& wr,
                 const WeightRef& gw, const WeightRef& gb) {
    linear_backward(ctx, dx, acc, dy, x, n, wr, grad(gw), grad(gb), round_bf16);
  };

  // MLP branch: out = mid + down(act(up(norm(mid)))). ff_act may be s.dbig itself (recomputed):
  // the down product reads it for dW before it writes dbig.
  lin(s.dbig, false, dresid, t.ff_act, w.w_down, g.w_down, g.b_down);
  if (llama) {
    ops::swiglu_backward(ctx, s.dbig, s.dup, s.dbig, t.ff_in, t.ff_up, n, F);
    lin(s.dx, false, s.dbig, t.xn2, w.w_gate, g.w_gate, {});
    lin(s.dx, true, s.dup, t.xn2, w.w_up, g.w_up, g.b_up);
  } else {
    ops::gelu_backward(ctx, s.dbig, t.ff_in, s.dbig, n * F);
    lin(s.dx, false, s.dbig, t.xn2, w.w_up, g.w_up, g.b_up);
  }
  // The norm's backward adds into dresid, which already holds the skip path's gradient.
  norm_backward(ctx, c, dresid, s.dx, t.mid, t.mean2, t.rstd2, n, w.ffn_norm, g.ffn_norm,
                g.ffn_norm_b);

  // Attention branch: mid = in + wo attention(q, k, v of norm(in)); dq, dk, dv into dbig.
  lin(s.dx, false, dresid, t.att, w.wo, g.wo, g.bo);
  attention.backward(s.dbig, s.dx, t.qkv, t.att);
  const WeightRef wqkv = joined(w.wq, w.wk, w.wv), gqkv = joined(g.wq, g.wk, g.wv);
  const WeightRef gbqkv = joined(g.bq, g.bk, g.bv);
  const bool bias = g.bq.present();
  if (wqkv.present() && gqkv.present() && (!bias || gbqkv.present())) {
    // q, k and v rows of one matrix (GPT-2's c_attn): one product over the whole of dqkv.
    lin(s.dx, false, s.dbig, t.xn1, wqkv, gqkv, gbqkv);
  } else {
    // Separate matrices: each product reads its columns of dqkv (rows of ld), packed first.
    TS_CHECK(s.dup != nullptr, "[model] separate q, k, v products need the dup scratch");
    const struct {
      const WeightRef &w, &g, &b;
      int64_t col, width;
    } parts[] = {
        {w.wq, g.wq, g.bq, 0, QD}, {w.wk, g.wk, g.bk, QD, KV}, {w.wv, g.wv, g.bv, QD + KV, KV}};
    for (size_t i = 0; i < 3; ++i) {
      const auto& p = parts[i];
      ops::copy_rows(ctx, s.dup, p.width, s.dbig + p.col, ld, n, p.width);
      lin(s.dx, i > 0, s.dup, t.xn1, p.w, p.g, p.b);
    }
  }
  norm_backward(ctx, c, dresid, s.dx, t.in, t.mean1, t.rstd1, n, w.attn_norm, g.attn_norm,
                g.attn_norm_b);
}

}  // namespace tessera::model
