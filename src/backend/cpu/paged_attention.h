// Attention of query rows over a paged key/value cache (decode and chunked prefill): the SIMD
// kernel and its reference, both taking ops::PagedAttentionArgs.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "ops/paged_attention.h"

namespace tessera::cpu {

void paged_attention(ThreadPool& pool, const ops::PagedAttentionArgs& a);
namespace ref {
void paged_attention(const ops::PagedAttentionArgs& a);
}  // namespace ref

}  // namespace tessera::cpu
