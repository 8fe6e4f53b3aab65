// CPU kernels that move or sum rows: strided copies, gathers, appends to the paged KV cache, and
// column sums (bias gradients). Plain loops (memory-bound, and each is its own reference);
// contracts as in ops/ops.h and ops/paged_attention.h.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "ops/paged_attention.h"

namespace tessera::cpu {

void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows,
               int64_t cols);
void gather_rows(float* dst, const float* src, const int32_t* index, int64_t n, int64_t C);
void scatter_add_rows(float* dst, const float* src, const int32_t* index, const float* weight,
                      int64_t n, int64_t C);
// The dot products accumulate in double: the plain loop is its own reference.
void scatter_add_rows_backward(float* dsrc, float* dweight, const float* dy, const float* src,
                               const int32_t* index, const float* weight, int64_t n, int64_t C);
void kv_append(const ops::KvAppendArgs& a);
void bias_grad(ThreadPool& pool, float* db, const float* dy, int64_t m, int64_t n);

}  // namespace tessera::cpu
