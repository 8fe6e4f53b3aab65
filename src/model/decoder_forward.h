// The inference forward pass of a DecoderModel (the Llama family and GPT-2) over a chunk of token
// rows from one or many sequences: embedding, the layers (block_forward, each row's key and value
// appended to a paged cache and attention over that cache), the final norm and the head for the
// rows whose logits are wanted. The engine drives it; it holds no forward of its own.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "model/decoder.h"
#include "model/decoder_block.h"
#include "ops/context.h"
#include "ops/ops.h"

namespace tessera::model {

// A paged key/value cache of kv_type elements (f32 or f16). Layer l's block b starts at element
// l * layer_stride + b * block_stride of base and holds K transposed as (Hkv, D, block_tokens),
// then, v_offset elements later, V as (Hkv, block_tokens, D) (ops::PagedAttentionArgs).
struct PagedKv {
  uint8_t* base = nullptr;
  DType type = DType::f32;
  int64_t layer_stride = 0, block_tokens = 0, block_stride = 0, v_offset = 0;
};

// Row r: token tokens[r] at position pos[r] of the sequence whose block table is tables[r]
// (blocks of the cache holding positions 0 .. pos[r]); want_logits[r] asks for its logits.
struct DecoderRows {
  int64_t n = 0;
  const int32_t* tokens = nullptr;
  const int32_t* pos = nullptr;
  const int32_t* const* tables = nullptr;
  const uint8_t* want_logits = nullptr;  // 0 or 1
};

class DecoderForward {
 public:
  // model's norm weights and biases must be f32 (the engine widens them once); it must outlive
  // this. Buffers are sized for chunks of up to max_rows rows; RoPE for positions < max_ctx.
  DecoderForward(const DecoderModel& model, const ops::Context& ctx, int64_t max_rows,
                 int64_t max_ctx);

  // x (n, C) = the rows' token embeddings (+ learned positions for GPT-2), into x().
  void embed(const DecoderRows& rows);
  const float* x() const { return x_.data(); }
  // Embeds and runs rows.n <= max_rows rows through every layer, appending their keys and
  // values to kv, then writes the logits (m, V) of the m rows with want_logits, in row order.
  // Returns m. Adds each stage's time and weight bytes to stages (kNumStages entries).
  int64_t forward(const DecoderRows& rows, const PagedKv& kv, float* logits, StageStats* stages);

  const ops::RopeTable& rope() const { return rope_; }

 private:
  class PagedAttention;

  const DecoderModel& model_;
  ops::Context ctx_;
  int64_t max_rows_;
  ops::RopeTable rope_;
  // Embedding buffers at construction; the layers' buffers at the first forward (a device
  // engine only embeds here).
  std::vector<float> x_, tmp_;
  std::vector<float> xn_, qkv_, q_, k_, att_, ff_a_, ff_b_, stat_a_, stat_b_;
  std::vector<int32_t> n_keys_, first_key_;
};

}  // namespace tessera::model
