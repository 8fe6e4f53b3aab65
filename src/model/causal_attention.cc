// Training-mode causal attention over (B, T) rows, with the rotary embedding and score scale
// where the model has them.
#include "model/causal_attention.h"

#include <cmath>

#include "core/error.h"

namespace tessera::model {

CausalAttention::CausalAttention(const ops::Context& ctx, const DecoderConfig& c,
                                 const ops::RopeTable* rope, int64_t window, float* rot, float* lse,
                                 int64_t B, int64_t T, bool round_bf16, uint16_t* qkv_keep,
                                 uint16_t* att_keep)
    : ctx_(ctx),
      c_(c),
      rope_(rope),
      rot_(rot),
      lse_(lse),
      qkv_keep_(qkv_keep),
      att_keep_(att_keep),
      args_{B, T, c.q_dim(), c.n_heads, c.n_kv_heads, window, round_bf16} {
  const bool llama = c.arch == DecoderArch::llama;
  TS_CHECK(!llama || rot != nullptr, "[attention] a Llama layer needs its rotation scratch");
  TS_CHECK(rope == nullptr || T <= rope->max_pos, "[attention] T=", T, " exceeds the RoPE table's ",
           rope->max_pos, " positions");
  if (llama && c.attn_scale > 0)
    q_scale_ = static_cast<float>(c.attn_scale * std::sqrt(static_cast<double>(c.head_dim)));
}

void CausalAttention::rotate(float* x, bool inverse) {
  const int64_t D = c_.head_dim, QD = c_.q_dim(), KV = c_.kv_dim(), ld = QD + 2 * KV;
  const int64_t B = args_.B, T = args_.T, n = B * T;
  // The rope ops read contiguous (B, T, heads, D): each block goes out, turns, and comes back.
  for (const auto& [col, heads] : {std::pair{int64_t{0}, c_.n_heads}, {QD, c_.n_kv_heads}}) {
    const bool scaled = col == 0 && q_scale_ != 1.0f;
    if (rope_ == nullptr && !scaled) continue;
    const int64_t w = heads * D;
    ops::copy_rows(ctx_, rot_, w, x + col, ld, n, w);
    if (rope_ != nullptr && inverse)
      ops::rope_backward(ctx_, rot_, rot_, *rope_, nullptr, 0, B, T, heads, D, c_.rope_layout);
    else if (rope_ != nullptr)
      ops::rope_forward(ctx_, rot_, rot_, *rope_, nullptr, 0, B, T, heads, D, c_.rope_layout);
    if (scaled) ops::scale(ctx_, rot_, n * w, q_scale_);
    ops::copy_rows(ctx_, x + col, ld, rot_, w, n, w);
  }
}

void CausalAttention::attend(int64_t, float* qkv, float* att, int64_t n,
                             const ops::QuantizedRows* att_q) {
  TS_CHECK(att_q == nullptr, "[model] the training attention writes no quantized rows");
  TS_CHECK(n == args_.B * args_.T, "[attention] ", n, " rows, expected B*T = ", args_.B * args_.T);
  if (c_.arch == DecoderArch::llama) rotate(qkv, false);
  if (args_.round_bf16)
    ops::round_to_bf16(ctx_, qkv, qkv_keep_, n * (c_.q_dim() + 2 * c_.kv_dim()));
  ops::attention_forward(ctx_, att, lse_, qkv, args_);
  if (args_.round_bf16) ops::round_to_bf16(ctx_, att, att_keep_, n * c_.q_dim());
}

void CausalAttention::backward(float* dqkv, const float* datt, const float* qkv, const float* att) {
  ops::attention_backward(ctx_, dqkv, datt, qkv, att, lse_, args_);
  // d/d(before) = (s R)^T d/d(after): the rotation is orthogonal up to the table's scale.
  if (c_.arch == DecoderArch::llama) rotate(dqkv, true);
}

}  // namespace tessera::model
