// Op entry point for attention over a paged key/value cache (the generation engine's attention).
#pragma once

#include "backend/cpu/paged_attention.h"
#include "ops/context.h"
#include "ops/ops.h"

namespace tessera::ops {

using PagedAttentionArgs = cpu::PagedAttentionArgs;

// out (rows,H,D) = softmax(q K^T * scale) V per query row over that row's first n_keys cached
// keys; see PagedAttentionArgs for the cache layout. Checks shapes and block tables.
void paged_attention(const Context& ctx, const PagedAttentionArgs& a);
OpCost paged_attention_cost(const PagedAttentionArgs& a);

}  // namespace tessera::ops
