// Op entry point for attention over a paged key/value cache (the generation engine's attention)
// and its argument block, which the backends' kernels take as it is.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ops/context.h"
#include "ops/ops.h"

namespace tessera::ops {

// The paged key/value cache of one layer: an array of blocks of kv_type elements (f32 or f16);
// block b starts at element b * block_stride of the layer's base and holds K as
// (Hkv, block_tokens, D) (or, with k_transposed, (Hkv, D, block_tokens): keys in the fast
// dimension, so a query's scores for a whole block come from vertical multiply-adds instead of
// one horizontal sum per key) then, v_offset elements later, V as (Hkv, block_tokens, D). Which
// K layout a device reads best: paged_keys_transposed.
struct PagedKvLayout {
  int64_t Hkv = 0, D = 0;
  DType kv_type = DType::f32;  // f32 or f16; strides and offsets count elements of this type
  bool k_transposed = false;
  int64_t block_tokens = 0, block_stride = 0, v_offset = 0;
};

// Query row r (of `rows`) reads keys 0 .. n_keys[r]-1 of its sequence, whose block table is row r
// of block_tables (rows, table_stride): key j sits in block block_tables[r * table_stride +
// j / block_tokens]. Every array is in the memory of the device that runs the op.
struct PagedAttentionArgs : PagedKvLayout {
  float* out = nullptr;      // (rows, H, D)
  const float* q = nullptr;  // (rows, H, D)
  int64_t rows = 0, H = 0;
  const void* kv = nullptr;               // the layer's base
  const int32_t* block_tables = nullptr;  // (rows, table_stride)
  int64_t table_stride = 0;
  const int32_t* n_keys = nullptr;  // (rows), each >= 1
  // (rows) or null: row r attends to keys first_key[r] .. n_keys[r]-1 only (a sliding window).
  const int32_t* first_key = nullptr;
  // An upper bound of n_keys over the rows, known on the host (sizes a device's launch); 0 when
  // unknown (the CPU reads n_keys itself).
  int64_t max_keys = 0;
  float scale = 1.0f;  // usually 1/sqrt(D)
  // The device's plan of these rows (plan_paged_attention) in its memory and the key that
  // plan_paged_attention returned for it; null: no plan (every device then runs every row its
  // default way).
  const void* plan = nullptr;
  int64_t plan_key = 0;
  const QuantizedRows* q_out = nullptr;  // optional: out also quantized, (rows, H D)
};

// out (rows,H,D) = softmax(q K^T * scale) V per query row over that row's first n_keys cached
// keys; see PagedAttentionArgs for the cache layout. Checks the shapes, and on the CPU (whose
// arrays are host memory) every row's keys; a device's kernels say what an out-of-range entry
// there does.
void paged_attention(const Context& ctx, const PagedAttentionArgs& a);
// From n_keys on the CPU; from max_keys (an upper bound) where the arrays are in device memory.
OpCost paged_attention_cost(const PagedAttentionArgs& a, bool arrays_on_host = true);

// A device may split a call's rows between its kernels by a plan made on the host from the
// call's row arrays, staged with them and read from its memory (CUDA: runs of 16 or more rows of
// one sequence, a prompt, go to tensor-core tiles, the rest to the decode kernel). Rows of one
// sequence must then be adjacent with their tables equal in full (the entries past a row's own
// keys too: the tiles read their first row's table).
// paged_attention_plan_bytes: the plan's size for up to `rows` rows; 0 where the device plans
// nothing (the CPU, which reads the arrays itself).
int64_t paged_attention_plan_bytes(const Context& ctx, int64_t rows);
// Writes into `plan` (host memory, paged_attention_plan_bytes(rows) bytes) the plan of a's rows,
// a's n_keys, first_key and block_tables being host copies of the arrays the call will read (no
// other pointer is read). Returns the plan's key: two calls whose plans have one key launch the
// same kernels, so a recorded graph (ops/graph.h) holding one replays the other.
int64_t plan_paged_attention(const Context& ctx, const PagedAttentionArgs& a, void* plan);

// Whether the device's paged attention reads K transposed (PagedKvLayout::k_transposed): the
// CPU's vertical score loops do, a GPU's (one warp per key row) do not.
bool paged_keys_transposed(Device d);

// Writes one chunk's keys and values into the cache: row r's k (Hkv*D floats at k + r * ldk) and
// v (at v + r * ldv) go to token slot[r] = block * block_tokens + offset of the layer at kv,
// rounded to kv_type (nearest even). slot (rows) is in the device's memory.
struct KvAppendArgs : PagedKvLayout {
  void* kv = nullptr;  // the layer's base
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ldk = 0, ldv = 0, rows = 0;
  const int32_t* slot = nullptr;
  int64_t n_blocks = 0;  // blocks in the cache (the CPU checks each slot against it)
};
void kv_append(const Context& ctx, const KvAppendArgs& a);

// The attention's inputs of one chunk in one op (what copy_rows, rope_forward on q and on k, and
// kv_append do in sequence, bit for bit): row r's query (H heads of D floats at q + r * ldq) is
// rotated at position positions[r] into q_out (rows, H, D); its key (at k + r * ldk) is rotated
// the same way and written with its value to cache slot slot[r] as kv_append writes them. Without
// a table (GPT-2, layers without RoPE) the query is copied and the key appended as it is. q_out
// must not overlap q, k or v. positions (rows) is in the device's memory; off the CPU the table
// needs its device copy (RopeTable::device).
struct RopeKvAppendArgs : KvAppendArgs {
  const float* q = nullptr;
  int64_t ldq = 0, H = 0;
  float* q_out = nullptr;
  const RopeTable* rope = nullptr;  // null: no rotation
  RopeLayout layout = RopeLayout::half;
  const int32_t* positions = nullptr;  // (rows); needed with a table
};
void rope_kv_append(const Context& ctx, const RopeKvAppendArgs& a);

}  // namespace tessera::ops
