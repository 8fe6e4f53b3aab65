// Op entry point for attention over a paged key/value cache (the generation engine's attention)
// and its argument block, which the backends' kernels take as it is.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ops/context.h"
#include "ops/ops.h"

namespace tessera::ops {

// The cache is an array of blocks of kv_type elements (f32 or f16); block b of the layer being
// computed starts at element kv + b * block_stride and holds K as (Hkv, block_tokens, D) (or, with
// k_transposed, (Hkv, D, block_tokens): keys in the fast dimension, so a query's scores for a
// whole block come from vertical multiply-adds instead of one horizontal sum per key) then,
// v_offset elements later, V as (Hkv, block_tokens, D). Query row r (of `rows`) reads keys 0 ..
// n_keys[r]-1 of the sequence whose block table is block_tables[r] (key j sits in block
// block_tables[r][j / block_tokens]).
struct PagedAttentionArgs {
  float* out = nullptr;      // (rows, H, D)
  const float* q = nullptr;  // (rows, H, D)
  int64_t rows = 0, H = 0, Hkv = 0, D = 0;
  const void* kv = nullptr;
  DType kv_type = DType::f32;  // f32 or f16; strides and offsets count elements of this type
  bool k_transposed = false;   // K blocks as (Hkv, D, block_tokens)
  int64_t block_tokens = 0, block_stride = 0, v_offset = 0;
  const int32_t* const* block_tables = nullptr;  // (rows) pointers
  const int32_t* n_keys = nullptr;               // (rows), each >= 1
  // (rows) or null: row r attends to keys first_key[r] .. n_keys[r]-1 only (a sliding window).
  const int32_t* first_key = nullptr;
  float scale = 1.0f;  // usually 1/sqrt(D)
};

// out (rows,H,D) = softmax(q K^T * scale) V per query row over that row's first n_keys cached
// keys; see PagedAttentionArgs for the cache layout. Checks shapes and block tables.
void paged_attention(const Context& ctx, const PagedAttentionArgs& a);
OpCost paged_attention_cost(const PagedAttentionArgs& a);

}  // namespace tessera::ops
