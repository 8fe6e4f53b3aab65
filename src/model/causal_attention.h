// Training-mode attention: each of B sequences' T rows attends causally to its own rows 0..t
// (or, in a sliding-window layer of window W, to rows t-W+1..t, as the engine's windowed layers),
// the keys and values coming from the rows themselves (the engine's come from the paged cache:
// model/decoder_forward.cc). For Llama, q and k are rotated first (positions 0..T-1 of each
// sequence) with the layer's table, and q is scaled where the model's score scale is not
// 1/sqrt(head_dim); grouped key/value heads as the model has them. One class for the forward
// and its backward, so GPT-2's step and any other family's share them.
#pragma once

#include <cstdint>

#include "model/decoder.h"
#include "model/decoder_block.h"
#include "ops/context.h"
#include "ops/ops.h"

namespace tessera::model {

class CausalAttention final : public BlockAttention {
 public:
  // c: the model (heads, head dim, kv heads, score scale); rope: the layer's rotary table (the
  // local or the global one: DecoderConfig::local), null where a Llama layer does not rotate
  // (GPT-2 reads none); rot: scratch of B*T*max(q_dim, kv_dim) floats on ctx's device for
  // the rotation and the scaling (Llama only, else null); lse: (B, H, T) for this layer's
  // log-sum-exp. window: the layer's sliding window (c.window(l); 0: none). round_bf16: bf16
  // activations and products, as the layer's linears in bf16 precision: attend() rounds q, k, v
  // (once rotated) and its output to bf16 in place, keeping their bits in qkv_keep (n, q_dim +
  // 2 kv_dim) and att_keep (n, q_dim) where those are not null (the backward widens them back).
  CausalAttention(const ops::Context& ctx, const DecoderConfig& c, const ops::RopeTable* rope,
                  int64_t window, float* rot, float* lse, int64_t B, int64_t T, bool round_bf16,
                  uint16_t* qkv_keep = nullptr, uint16_t* att_keep = nullptr);

  // att (n, q_dim) from qkv (n, q_dim + 2 kv_dim), n = B*T. Rotates q and k (and scales q)
  // inside qkv (the backward differentiates through the values qkv then holds), and rounds as
  // round_bf16 says. Never given att_q (the trainer keeps no quantized rows).
  void attend(int64_t layer, float* qkv, float* att, int64_t n,
              const ops::QuantizedRows* att_q) override;

  // dqkv (n, q_dim + 2 kv_dim) = the gradient with respect to qkv before the rotation, from
  // datt (n, q_dim); qkv and att as attend() left them, with this object's lse.
  void backward(float* dqkv, const float* datt, const float* qkv, const float* att);

 private:
  // x's q and k column blocks (rows of ld) through the rotation and q's scaling (forward, or
  // its transpose: q_scale_ R^T, the same scalar).
  void rotate(float* x, bool inverse);

  const ops::Context& ctx_;
  const DecoderConfig& c_;
  const ops::RopeTable* rope_;
  float* rot_;
  float* lse_;
  uint16_t *qkv_keep_, *att_keep_;
  ops::AttentionArgs args_;  // the attention ops' shape, window and precision
  // The attention op scales scores by 1/sqrt(head_dim); a model's other scale s (Gemma 3's
  // attn_scale) is q multiplied by s sqrt(head_dim) first. 1: none.
  float q_scale_ = 1.0f;
};

}  // namespace tessera::model
