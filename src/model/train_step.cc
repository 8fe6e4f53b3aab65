// The training step (GPT-2 or Llama): explicit forward and backward over ops/, with the recompute
// policies (none / gelu / block) replaying what the plan did not keep.
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "model/causal_attention.h"
#include "model/decoder_block.h"
#include "model/train_model.h"
#include "model/train_model_impl.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace tessera::model {

BlockTensors TrainModel::Impl::tensors(int64_t l) const {
  const LayerActs& a = acts[static_cast<size_t>(l)];
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
  t.ff_up = a.fup;
  t.ff_act = a.gelu;  // dbig when GELU is recomputed: read by c_proj before backward reuses it
  t.lora_u = lora_u;
  t.qk_raw = a.qk_raw;
  t.post_in = a.post_in;
  t.post_rstd = a.post_rstd;
  t.xn1_bf16 = a.ln1_bf16;
  t.xn2_bf16 = a.ln2_bf16;
  t.ff_act_bf16 = a.gelu_bf16;
  t.round_ff_in = bf16();
  t.ff_in_bf16 = a.fch_bf16;
  t.ff_up_bf16 = a.fup_bf16;
  if (a.router != nullptr) {
    t.router = a.router;
    t.moe_ids = a.moe_ids;
    t.moe_weights = a.moe_weights;
    t.moe_x = a.moe_x;
    t.moe_y = a.moe_y;
    t.routing = &routing[static_cast<size_t>(l)];
  }
  return t;
}

std::vector<int32_t> TrainModel::expert_choices(int64_t layer) const {
  const Impl& im = *impl_;
  TS_CHECK(layer >= 0 && layer < static_cast<int64_t>(im.routing.size()),
           "[train] expert_choices: layer ", layer, " has no experts' routing (", im.routing.size(),
           " layers routed)");
  const MoeRouting& r = im.routing[static_cast<size_t>(layer)];
  const size_t nk = r.slot.size();  // the ids vector holds the choices, then their grouping
  TS_CHECK(nk > 0, "[train] expert_choices: no forward has run");
  return std::vector<int32_t>(r.ids.begin(), r.ids.begin() + static_cast<std::ptrdiff_t>(nk));
}

const ops::RopeTable* TrainModel::Impl::rope_table(int64_t l) const {
  const DecoderConfig& c = view.config;
  if (c.arch != DecoderArch::llama || !c.rotary(l)) return nullptr;
  return c.local(l) ? &rope_local : &rope;
}

void TrainModel::Impl::layer_forward(int64_t l, int64_t B, int64_t T, bool recompute_only,
                                     bool chained) {
  const LayerActs& a = acts[static_cast<size_t>(l)];
  CausalAttention attention(model.ctx_, view.config, rope_table(l), view.config.window(l), rot,
                            a.lse, B, T, bf16(), a.qkv_bf16, a.atty_bf16);
  NormChain chain;
  if (chained) {
    chain.in_normed = l > 0;
    const DecoderWeights& w = view.weights;
    if (l + 1 < static_cast<int64_t>(w.layers.size())) {
      const BlockTensors n = tensors(l + 1);
      const DecoderLayer& next = w.layers[static_cast<size_t>(l + 1)];
      chain.next = {n.xn1, n.mean1, n.rstd1, &next.attn_norm, &next.attn_norm_b};
    } else {
      chain.next = {lnf, lnf_mean, lnf_rstd, &w.out_norm, &w.out_norm_b};
    }
  }
  block_forward(model.ctx_, view.config, view.weights.layers[static_cast<size_t>(l)], l, B * T,
                tensors(l), attention, recompute_only, chain);
}

// On entry dresid holds d resid[l+1]; on exit d resid[l]. scratch_c serves as dx, dbig as dqkv
// and the MLP's inner gradients.
void TrainModel::Impl::layer_backward(int64_t l, int64_t B, int64_t T, bool write_dense_dw) {
  const ops::Context& ctx = model.ctx_;
  const int64_t N = B * T;
  const LayerActs& a = acts[static_cast<size_t>(l)];
  // The replay stops after the MLP's input products, unless the MLP's post-norm input (post-norms)
  // or the experts' outputs (a mixture of experts) are wanted too: then it runs whole, writing
  // resid[l+1] again with the same values.
  const DecoderConfig& c = view.config;
  if (recompute == Recompute::block) layer_forward(l, B, T, !c.post_norms && !c.moe());
  // What the layer kept as bf16 back into the f32 tensors the ops read (the same values: they
  // were rounded when written).
  const int64_t F = c.d_ff, rows = c.moe() ? N * c.n_experts_used : N;
  const struct {
    float* f32;
    const uint16_t* kept;
    int64_t n;
  } widen[] = {{a.qkv, a.qkv_bf16, N * (c.q_dim() + 2 * c.kv_dim())},
               {a.atty, a.atty_bf16, N * c.q_dim()},
               {a.fch, a.fch_bf16, rows * F},
               {a.fup, a.fup_bf16, rows * F}};
  for (const auto& w : widen)
    if (w.kept != nullptr) ops::convert_bf16_to_f32(ctx, w.f32, w.kept, w.n);
  // The MLP's activation (GELU, or the gated activation of gate and up; N k rows of the chosen
  // experts'): kept per layer with Recompute::none, else recomputed into dbig (a.gelu == dbig).
  if (recompute != Recompute::none) {
    if (c.arch == DecoderArch::llama)
      ops::glu_forward(ctx, a.gelu, a.fch, a.fup, rows, F, c.mlp_act);
    else
      ops::gelu_forward(ctx, a.gelu, a.fch, N * F);
  }
  CausalAttention attention(ctx, view.config, rope_table(l), view.config.window(l), rot, a.lse, B,
                            T, bf16(), a.qkv_bf16, a.atty_bf16);
  const size_t li = static_cast<size_t>(l);
  block_backward(
      ctx, view.config, view.weights.layers[li], grad_view.weights.layers[li], N, tensors(l),
      attention, dresid,
      {scratch_c, dbig, dup, lora_u, lora_gu, dpost, moe_dy, moe_dw, moe_dlogits, moe_slot}, bf16(),
      write_dense_dw);
}

void TrainModel::Impl::check_inputs(const int32_t* tokens, const int32_t* targets, int64_t B,
                                    int64_t T) const {
  const TrainConfig& cfg = model.cfg_;
  TS_CHECK(planned, "[train] call plan(B, T, precision, recompute) before forward");
  TS_CHECK(B > 0 && T > 0, "[train] forward: B and T must be positive, got B=", B, " T=", T);
  TS_CHECK(T <= max_t && B * T <= max_n, "[train] forward: (B=", B, ", T=", T,
           ") exceeds the plan (B*T <= ", max_n, ", T <= ", max_t, ")");
  TS_CHECK(tokens != nullptr, "[train] forward: tokens is null");
  const int64_t V = cfg.vocab_size;
  for (int64_t i = 0; i < B * T; ++i)
    TS_CHECK(tokens[i] >= 0 && tokens[i] < V, "[train] forward: tokens[", i, "] = ", tokens[i],
             " is outside the vocabulary [0, ", V, ")");
  if (targets != nullptr)
    for (int64_t i = 0; i < B * T; ++i)
      TS_CHECK(targets[i] < V, "[train] forward: targets[", i, "] = ", targets[i],
               " is outside the vocabulary [0, ", V, ") (negative means ignore)");
}

std::pair<const int32_t*, const int32_t*> TrainModel::Impl::device_ints(const int32_t* tokens,
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

std::pair<double, int64_t> TrainModel::Impl::loss_sum(const int32_t* targets, int64_t N) const {
  ops::HostMirror<float> l(model.ctx_, losses, N, ops::HostMirror<float>::read);
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] >= 0) sum += l.data()[i], ++count;
  return {sum, count};
}

WeightRef TrainModel::Impl::head_weight() const {
  if (is_lora()) return view.weights.output;  // the base's, in its stored type
  const TrainConfig& cfg = model.cfg_;
  return WeightRef{weight(head), weight_type(), Shape({cfg.padded_vocab_size, cfg.n_embd})};
}

void TrainModel::Impl::forward_to_lnf(const int32_t* tokens, const int32_t* host_tokens, int64_t B,
                                      int64_t T) {
  const ops::Context& ctx = model.ctx_;
  const TrainConfig& cfg = model.cfg_;
  const int64_t C = cfg.n_embd, L = cfg.n_layer, N = B * T;
  if (is_lora()) {  // the base's rows, in its stored type, looked up on the host
    const WeightRef& e = base.weights.tok_embd;
    for (int64_t i = 0; i < N; ++i)
      ops::dequantize_row(e.data, e.type, C, host_tokens[i], embed_rows.data() + i * C);
    ops::copy(ctx, resid[0], embed_rows.data(), static_cast<size_t>(N * C) * sizeof(float),
              ops::CopyKind::host_to_device);
  } else {
    ops::embedding_forward(ctx, resid[0], tokens, p(wte), wpe >= 0 ? p(wpe) : nullptr, B, T, C,
                           cfg.vocab_size);
  }
  const float embed_scale = view.config.embed_scale;  // Gemma 3: sqrt(C)
  if (embed_scale != 1.0f) ops::scale(ctx, resid[0], N * C, embed_scale);
  // The layers, each one's last residual add fused with the next norm: the last layer's with the
  // output norm, into lnf.
  for (int64_t l = 0; l < L; ++l)
    layer_forward(l, B, T, /*recompute_only=*/false, /*chained=*/true);
}

void TrainModel::Impl::head_rows(int64_t r0, int64_t n, float* out) {
  model::linear_forward(model.ctx_, Stage::head, out, lnf + r0 * model.cfg_.n_embd, n,
                        head_weight(), {});
}

float TrainModel::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  Impl& im = *impl_;
  im.check_inputs(tokens, targets, B, T);
  im.ensure_arena();
  const int64_t N = B * T;
  const auto [dev_tokens, dev_targets] = im.device_ints(tokens, targets, N);
  const ops::Scope scope(ctx_, "forward");
  im.last_logits = nullptr;
  im.forward_to_lnf(dev_tokens, tokens, B, T);
  const int64_t Vp = cfg_.padded_vocab_size;
  if (targets == nullptr) {  // every row's logits, kept for logits()
    const auto bytes = static_cast<size_t>(im.max_n * Vp) * sizeof(float);
    if (im.full_logits.size() < bytes) im.full_logits = ops::Buffer(ctx_.device, bytes);
    im.head_rows(0, N, im.full_logits.as<float>());
    im.last_logits = im.full_logits.as<float>();
    return 0.0f;
  }
  for (int64_t r0 = 0; r0 < N; r0 += Impl::kHeadRows) {
    const int64_t n = std::min(Impl::kHeadRows, N - r0);
    im.head_rows(r0, n, im.logits);
    ops::softmax_xent(ctx_, im.losses + r0, im.logits, dev_targets + r0, n, cfg_.vocab_size, Vp,
                      0.0f);
  }
  const auto [sum, count] = im.loss_sum(targets, N);
  return count ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
}

float TrainModel::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                   int64_t T, float loss_scale) {
  Impl& im = *impl_;
  TS_CHECK(targets != nullptr, "[train] forward_backward: targets is null");
  im.check_inputs(tokens, targets, B, T);
  im.ensure_arena();
  const int64_t C = cfg_.n_embd, L = cfg_.n_layer, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size,
                N = B * T;
  const auto [dev_tokens, dev_targets] = im.device_ints(tokens, targets, N);
  // The first backward after zero_grads() writes the matrices' gradients (and zeroes the rest).
  const bool first = grads_zero_pending_;
  if (first) {
    im.zero_unwritten_grads();
    grads_zero_pending_ = false;
  }
  {
    const ops::Scope scope(ctx_, "forward");
    im.last_logits = nullptr;
    im.forward_to_lnf(dev_tokens, tokens, B, T);
  }

  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) count += targets[i] >= 0;
  // d(mean loss * loss_scale)/dlogits; with every target ignored there is no loss and no gradient.
  const float dscale = count ? loss_scale / static_cast<float>(count) : 0.0f;
  // The head, the loss and the head's backward, kHeadRows rows at a time: logits (n,Vp) = lnf
  // head^T, dlogits in their place, dlnf (n,C) = dlogits head into scratch_c, dhead (Vp,C) +=
  // dlogits^T lnf (written by the first chunk of a step's first backward). dscale == 0 would leave
  // the logits in place (the op's "forward only" mode) for the backward to read: the loss only.
  // The last chunk's "backward" scope goes on over the layers (one per step with one chunk).
  const bool write = first && !im.is_lora();
  std::optional<ops::Scope> backward;
  for (int64_t r0 = 0; r0 < N; r0 += Impl::kHeadRows) {
    const int64_t n = std::min(Impl::kHeadRows, N - r0);
    backward.reset();
    {
      const ops::Scope scope(ctx_, "loss");
      im.head_rows(r0, n, im.logits);
      ops::softmax_xent(ctx_, im.losses + r0, im.logits, dev_targets + r0, n, V, Vp, dscale);
    }
    if (dscale == 0.0f) continue;
    backward.emplace(ctx_, "backward");
    linear_backward(ctx_, im.scratch_c + r0 * C, false, im.logits, im.lnf + r0 * C, n,
                    im.head_weight(), im.is_lora() ? nullptr : im.g(im.head), nullptr, im.bf16(),
                    {}, write && r0 == 0);
  }
  const double sum = im.loss_sum(targets, N).first;
  if (dscale == 0.0f) {
    if (first) zero_grads();  // nothing written: the gradients stay zero, to be zeroed later
    return count ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
  }
  ops::zero(ctx_, im.dresid, static_cast<size_t>(N * C) * sizeof(float));
  norm_backward(ctx_, im.view.config, im.dresid, im.scratch_c, im.resid[static_cast<size_t>(L)],
                im.lnf_mean, im.lnf_rstd, N, im.view.weights.out_norm,
                im.grad_view.weights.out_norm, im.grad_view.weights.out_norm_b);
  for (int64_t l = L - 1; l >= 0; --l) im.layer_backward(l, B, T, write);
  if (im.is_lora()) return static_cast<float>(sum / static_cast<double>(count));  // frozen table
  const float embed_scale = im.view.config.embed_scale;
  if (embed_scale != 1.0f) ops::scale(ctx_, im.dresid, N * C, embed_scale);
  ops::embedding_backward(ctx_, im.g(im.wte), im.wpe >= 0 ? im.g(im.wpe) : nullptr, im.dresid,
                          dev_tokens, B, T, C, V);
  // Padding rows of the embedding (and an untied head) get no gradient by construction; keep
  // them exactly zero regardless.
  for (int64_t off : {im.wte, im.head})
    ops::zero(ctx_, im.g(off) + V * C, static_cast<size_t>((Vp - V) * C) * sizeof(float));
  return static_cast<float>(sum / static_cast<double>(count));
}

}  // namespace tessera::model
