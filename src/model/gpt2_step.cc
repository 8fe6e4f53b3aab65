// GPT-2 training step: explicit forward and backward over ops/, with the recompute policies
// (none / gelu / block) replaying what the plan did not keep.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/causal_attention.h"
#include "model/decoder_block.h"
#include "model/gpt2.h"
#include "model/gpt2_impl.h"
#include "ops/ops.h"

namespace tessera::model {

void Gpt2::Impl::linear_backward(float* dinp, const float* dout, const float* inp, int64_t w_off,
                                 int64_t b_off, int64_t n, int64_t n_in, int64_t n_out) {
  const ops::Context& ctx = model.ctx_;
  {  // dW (n_out,n_in) += dout^T (n_out,N) inp (N,n_in)
    ops::GemmArgs g;
    g.trans_a = ops::Trans::T;
    g.m = n_out, g.n = n_in, g.k = n;
    g.a = dout, g.lda = n_out;
    g.b = inp, g.ldb = n_in;
    g.c = this->g(w_off), g.ldc = n_in;
    g.accumulate = true;
    g.round_bf16 = bf16();
    ops::gemm(ctx, g);
  }
  if (b_off >= 0) ops::bias_grad(ctx, this->g(b_off), dout, n, n_out);
  if (dinp != nullptr) {  // dinp (N,n_in) = dout (N,n_out) W (n_out,n_in); last: may alias inp
    ops::GemmArgs g;
    g.m = n, g.n = n_in, g.k = n_out;
    g.a = dout, g.lda = n_out;
    g.b = weight(w_off), g.b_type = weight_type(), g.ldb = n_in;
    g.c = dinp, g.ldc = n_in;
    g.round_bf16 = bf16();
    ops::gemm(ctx, g);
  }
}

void Gpt2::Impl::layer_forward(int64_t l, int64_t B, int64_t T, bool recompute_only) {
  const Gpt2LayerActs& a = acts[static_cast<size_t>(l)];
  BlockTensors t;
  t.in = resid[static_cast<size_t>(l)];
  t.mid = a.resid_mid;
  t.out = resid[static_cast<size_t>(l) + 1];
  t.branch = scratch_c;
  t.xn1 = a.ln1;
  t.mean1 = a.ln1_mean;
  t.rstd1 = a.ln1_rstd;
  t.qkv = a.qkv;
  t.att = a.atty;
  t.xn2 = a.ln2;
  t.mean2 = a.ln2_mean;
  t.rstd2 = a.ln2_rstd;
  t.ff_in = a.fch;
  t.ff_act = a.gelu;  // dbig when GELU is recomputed: read by c_proj before backward reuses it
  CausalAttention attention(model.ctx_, view.config, nullptr, nullptr, a.lse, B, T, bf16());
  block_forward(model.ctx_, view.config, view.weights.layers[static_cast<size_t>(l)], l, B * T, t,
                attention, nullptr, recompute_only);
}

// On entry dresid holds d resid[l+1]; on exit d resid[l]. scratch_c serves as dx.
void Gpt2::Impl::layer_backward(int64_t l, int64_t B, int64_t T) {
  const ops::Context& ctx = model.ctx_;
  const Gpt2Config& cfg = model.cfg_;
  const int64_t C = cfg.n_embd, N = B * T;
  const Gpt2LayerParams& lp = layer_params[static_cast<size_t>(l)];
  const Gpt2LayerActs& a = acts[static_cast<size_t>(l)];
  const float* in = resid[static_cast<size_t>(l)];
  if (recompute == Recompute::block) layer_forward(l, B, T, /*recompute_only=*/true);
  // GELU output: kept per layer with Recompute::none, else recomputed into dbig (a.gelu == dbig).
  if (recompute != Recompute::none) ops::gelu_forward(ctx, a.gelu, a.fch, N * 4 * C);

  // MLP branch: resid[l+1] = resid_mid + c_proj(gelu(c_fc(ln_2(resid_mid)))).
  // a.gelu may be dbig itself: linear_backward reads inp for dW before it writes dinp.
  linear_backward(dbig, dresid, a.gelu, lp.fcproj_w, lp.fcproj_b, N, 4 * C, C);
  ops::gelu_backward(ctx, dbig, a.fch, dbig, N * 4 * C);
  linear_backward(scratch_c, dbig, a.ln2, lp.fc_w, lp.fc_b, N, C, 4 * C);
  // layernorm_backward accumulates into dresid, which already holds the skip path's gradient.
  ops::layernorm_backward(ctx, dresid, g(lp.ln2_w), g(lp.ln2_b), scratch_c, a.resid_mid,
                          p(lp.ln2_w), a.ln2_mean, a.ln2_rstd, N, C);

  // Attention branch: resid_mid = resid[l] + c_proj(attn(c_attn(ln_1(resid[l])))).
  linear_backward(scratch_c, dresid, a.atty, lp.proj_w, lp.proj_b, N, C, C);
  CausalAttention(ctx, view.config, nullptr, nullptr, a.lse, B, T, bf16())
      .backward(dbig, scratch_c, a.qkv, a.atty);
  linear_backward(scratch_c, dbig, a.ln1, lp.qkv_w, lp.qkv_b, N, C, 3 * C);
  ops::layernorm_backward(ctx, dresid, g(lp.ln1_w), g(lp.ln1_b), scratch_c, in, p(lp.ln1_w),
                          a.ln1_mean, a.ln1_rstd, N, C);
}

void Gpt2::Impl::check_inputs(const int32_t* tokens, const int32_t* targets, int64_t B,
                              int64_t T) const {
  const Gpt2Config& cfg = model.cfg_;
  TS_CHECK(planned, "[gpt2] call plan(B, T, precision, recompute) before forward");
  TS_CHECK(B > 0 && T > 0, "[gpt2] forward: B and T must be positive, got B=", B, " T=", T);
  TS_CHECK(T <= max_t && B * T <= max_n, "[gpt2] forward: (B=", B, ", T=", T,
           ") exceeds the plan (B*T <= ", max_n, ", T <= ", max_t, ")");
  TS_CHECK(tokens != nullptr, "[gpt2] forward: tokens is null");
  const int64_t V = cfg.vocab_size;
  for (int64_t i = 0; i < B * T; ++i)
    TS_CHECK(tokens[i] >= 0 && tokens[i] < V, "[gpt2] forward: tokens[", i, "] = ", tokens[i],
             " is outside the vocabulary [0, ", V, ")");
  if (targets != nullptr)
    for (int64_t i = 0; i < B * T; ++i)
      TS_CHECK(targets[i] < V, "[gpt2] forward: targets[", i, "] = ", targets[i],
               " is outside the vocabulary [0, ", V, ") (negative means ignore)");
}

std::pair<const int32_t*, const int32_t*> Gpt2::Impl::device_ints(const int32_t* tokens,
                                                                  const int32_t* targets,
                                                                  int64_t n) {
  const ops::Context& ctx = model.ctx_;
  if (ctx.device == ops::Device::cpu) return {tokens, targets};
  auto* d = ints.as<int32_t>();
  const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
  ops::copy(ctx, d, tokens, bytes, ops::CopyKind::host_to_device);
  if (targets) ops::copy(ctx, d + max_n, targets, bytes, ops::CopyKind::host_to_device);
  return {d, targets ? d + max_n : nullptr};
}

std::pair<double, int64_t> Gpt2::Impl::loss_sum(const int32_t* targets, int64_t N) const {
  ops::HostMirror<float> l(model.ctx_, losses, N, ops::HostMirror<float>::read);
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] >= 0) sum += l.data()[i], ++count;
  return {sum, count};
}

void Gpt2::Impl::forward_to_logits(const int32_t* tokens, int64_t B, int64_t T) {
  const ops::Context& ctx = model.ctx_;
  const Gpt2Config& cfg = model.cfg_;
  const int64_t C = cfg.n_embd, L = cfg.n_layer, Vp = cfg.padded_vocab_size, N = B * T;
  ops::embedding_forward(ctx, resid[0], tokens, p(wte), p(wpe), B, T, C, cfg.vocab_size);
  for (int64_t l = 0; l < L; ++l) layer_forward(l, B, T, /*recompute_only=*/false);
  ops::layernorm_forward(ctx, lnf, lnf_mean, lnf_rstd, resid[static_cast<size_t>(L)], p(lnf_w),
                         p(lnf_b), N, C);
  // Tied lm head: logits (N,Vp) = lnf (N,C) wte^T, over the padded rows too (zero weights).
  const WeightRef head{weight(wte), weight_type(), Shape({Vp, C})};
  model::linear_forward(ctx, nullptr, Stage::head, logits, lnf, N, head, {});
  have_logits = true;
}

float Gpt2::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  Impl& im = *impl_;
  im.check_inputs(tokens, targets, B, T);
  im.ensure_arena();
  const int64_t N = B * T;
  const auto [dev_tokens, dev_targets] = im.device_ints(tokens, targets, N);
  im.forward_to_logits(dev_tokens, B, T);
  if (targets == nullptr) return 0.0f;
  ops::softmax_xent(ctx_, im.losses, im.logits, dev_targets, N, cfg_.vocab_size,
                    cfg_.padded_vocab_size, 0.0f);
  const auto [sum, count] = im.loss_sum(targets, N);
  return count ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
}

float Gpt2::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                             float loss_scale) {
  Impl& im = *impl_;
  TS_CHECK(targets != nullptr, "[gpt2] forward_backward: targets is null");
  im.check_inputs(tokens, targets, B, T);
  im.ensure_arena();
  const int64_t C = cfg_.n_embd, L = cfg_.n_layer, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size,
                N = B * T;
  const auto [dev_tokens, dev_targets] = im.device_ints(tokens, targets, N);
  im.forward_to_logits(dev_tokens, B, T);

  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) count += targets[i] >= 0;
  // d(mean loss * loss_scale)/dlogits; with every target ignored there is no loss and no gradient.
  const float dscale = count ? loss_scale / static_cast<float>(count) : 0.0f;
  // dscale == 0 would leave the logits in place (the op's "forward only" mode), so the lm-head
  // backward below would read logits instead of zeros; skip the backward in that case.
  ops::softmax_xent(ctx_, im.losses, im.logits, dev_targets, N, V, Vp, dscale);
  im.have_logits = false;  // now holds dlogits
  const double sum = im.loss_sum(targets, N).first;
  if (dscale == 0.0f) return count ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;

  // lm head: dlnf (N,C) = dlogits (N,Vp) wte; dwte (Vp,C) += dlogits^T lnf.
  im.linear_backward(im.scratch_c, im.logits, im.lnf, im.wte, -1, N, C, Vp);
  ops::zero(ctx_, im.dresid, static_cast<size_t>(N * C) * sizeof(float));
  ops::layernorm_backward(ctx_, im.dresid, im.g(im.lnf_w), im.g(im.lnf_b), im.scratch_c,
                          im.resid[static_cast<size_t>(L)], im.p(im.lnf_w), im.lnf_mean,
                          im.lnf_rstd, N, C);
  for (int64_t l = L - 1; l >= 0; --l) im.layer_backward(l, B, T);
  ops::embedding_backward(ctx_, im.g(im.wte), im.g(im.wpe), im.dresid, dev_tokens, B, T, C, V);
  // Padding rows of wte get no gradient by construction; keep them exactly zero regardless.
  ops::zero(ctx_, im.g(im.wte) + V * C, static_cast<size_t>((Vp - V) * C) * sizeof(float));
  return static_cast<float>(sum / static_cast<double>(count));
}

}  // namespace tessera::model
