// Packed CPU GEMM (Goto/BLIS style): blocking parameters and the entry that takes them, so tests
// can force tiny blocks and exercise every loop edge with small matrices.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/ops.h"

namespace tessera::cpu {

// Cache blocking of the packed GEMM. kc: depth of one packed panel pair (A micro-panel + B
// micro-panel stay in L1); mc: rows of the packed A block (stays in L2); nc: columns of the
// packed B block (stays in L3). 0 means "the default for the running SIMD target". Values are
// rounded up to multiples of the micro-tile.
struct GemmBlocking {
  int64_t mc = 0, kc = 0, nc = 0;
};

// cpu::gemm (cpu_kernels.h) with explicit blocking; results do not depend on the blocking of
// M and N nor on the thread count (each output's K loop order is fixed by kc alone).
void gemm_blocked(ThreadPool& pool, const ops::GemmArgs& g, const GemmBlocking& blocking);

// y (M,N) = x (M,K) W^T [+ bias (N)] with W (N,K) stored as w_type (f32, f16, bf16 or a block
// type; K a whole number of blocks), through the packed f32 kernel: W's panels are widened to
// f32 while packed, once per depth block and shared by all M rows, and x is used as is (no
// 8-bit activations). Any M; worth it over the integer kernels of matmul_wt once M is large
// enough to amortize the widening (cpu::matmul_wt decides). kc is rounded up to whole blocks.
void gemm_wt(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
             const void* w, DType w_type, int64_t N, const float* bias);
void gemm_wt_blocked(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
                     const void* w, DType w_type, int64_t N, const float* bias,
                     const GemmBlocking& blocking);

// Micro-tile of the running SIMD target: mr rows x nr columns of C per micro-kernel call.
struct GemmTile {
  int64_t mr = 0, nr = 0;
};
GemmTile gemm_tile();

namespace gemm_detail {
// Per-thread pack buffer `slot` (0: A block, 1: B block, 2: staging of widened weights) of at least
// `floats` floats, 64-byte aligned; grown on demand and reused by later calls on the same thread.
float* pack_buffer(int slot, size_t floats);
}  // namespace gemm_detail

}  // namespace tessera::cpu
