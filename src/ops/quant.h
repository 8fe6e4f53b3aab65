// Matmul against weights kept in their stored type (f32/f16/bf16 or GGUF block formats), the
// inference engine's linear layers; and row lookups (embeddings) from such weights.
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "ops/context.h"
#include "ops/ops.h"

namespace tessera::ops {

// y (M,N) = x (M,K) W^T [+ bias (N)], W (N,K) stored as w_type with rows contiguous
// (row stride = dtype_bytes(w_type, K)); ldy = row stride of y (>= N).
// w_type f32/f16/bf16: float math (f16/bf16 widened), f32 accumulation. bf16 weights take x
// rounded to bf16 (nearest even, as core's f32_to_bf16) at every M, as a bf16 model's
// activations are in transformers and llama.cpp: M picks the kernel, never the values, and a row
// differs between calls of different M only in the f32 summation order of the same exact
// products (bf16 times bf16 is exact in f32). The CPU and CUDA do so on every route. f32 and f16
// weights take x as is. Block types q8_0/q4_0/q4_1/q4_k/q6_k: x is quantized on the fly to 8-bit
// blocks (one scale per weight block) and the dot products run in integers, as GGUF engines do; K
// must be a multiple of the block size. The interleaved q4_0x8 / q4_1x8 / q8_0x8 / q4_kx8 / q5_kx8
// / q6_kx8 (8 rows, see cpu_preferred_layout) and f16x16 (16 rows) need N a multiple of their group
// and the AVX2 kernels. Results do not depend on the thread count.
void matmul_wt(const Context& ctx, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
               const void* w, DType w_type, int64_t N, const float* bias = nullptr);
// One product of a grouped matmul: y (M,N) = x (M,K) W^T [+ bias (N)] for the group's shared
// x; W (N,K) stored as w_type.
struct WtProduct {
  float* y = nullptr;
  int64_t ldy = 0;  // row stride of y (>= N)
  const void* w = nullptr;
  DType w_type = DType::f32;
  int64_t N = 0;
  const float* bias = nullptr;  // optional
};
// Throws naming the parameter unless the shapes, ldy and the type/K combination are valid for
// matmul_wt (every backend's kernels call it too).
void check_matmul_wt_args(int64_t ldy, int64_t M, int64_t K, DType w_type, int64_t N);
// Several products of the same x (M,K), e.g. a layer's q/k/v or gate/up projections: each y
// equals what matmul_wt gives alone, bit for bit, but x is quantized once and the rows of all
// products are shared out over the threads together (small matrices no longer leave a thread
// idle, and there is one hand-off instead of several).
// With xq (x quantized by the op that wrote x, for products of xq->for_type), the products whose
// weights take that format read it instead of quantizing x again; the others read x. x must
// still be given, and xq must hold x's present values.
void matmul_wt_group(const Context& ctx, const float* x, int64_t M, int64_t K,
                     std::span<const WtProduct> products, const QuantizedRows* xq = nullptr);
// Bytes of QuantizedRows of (rows, cols) for products of for_type on ctx's device; 0 where the
// device has no such format for them (the CPU, whose kernels quantize x as they go; CUDA above
// its matvec's 8 rows or for float weights): no op may then be given one.
int64_t quantized_rows_bytes(const Context& ctx, int64_t rows, int64_t cols, DType for_type);
// Throws naming op unless q is null or holds (rows, cols) in a format ctx's device has
// (quantized_rows_bytes > 0); the ops given a QuantizedRows check it with this.
void check_quantized_rows(const Context& ctx, const QuantizedRows* q, int64_t rows, int64_t cols,
                          const char* op);
// dx (M,K) = dy (M,N) W (N,K), or += with accumulate; W stored as w_type (any type matmul_wt
// takes), ldx the row stride of dx (>= K). The backward of matmul_wt through x, for a weight that
// stays in its stored type (a frozen LoRA base): the CPU widens W a panel of rows at a time into
// scratch, so no widened copy of W outlives the call.
void matmul_w(const Context& ctx, float* dx, int64_t ldx, const float* dy, int64_t M, int64_t N,
              const void* w, DType w_type, int64_t K, bool accumulate);
// flops = 2 M N K; bytes = W once + dy + dx (read too with accumulate).
OpCost matmul_w_cost(int64_t M, int64_t N, int64_t K, DType w_type, bool accumulate);
// The layout the CPU matmul reads fastest for a matrix stored as t with n_rows rows: the
// row-interleaved q4_0x8 / q4_1x8 / q8_0x8 (core/interleave.h) for q4_0 / q4_1 / q8_0 with a
// multiple of 8 rows, f16x16 for f16 with a multiple of 16, where the AVX2 kernels run; q4_kx8 /
// q5_kx8 / q6_kx8 for q4_K / Q5_K / Q6_K with a multiple of 8 rows where the AVX512-VNNI kernels
// run; otherwise t itself. Loaders rearrange weights into it once.
DType cpu_preferred_layout(DType t, int64_t n_rows);
// Rows per call from which matmul_wt against w_type weights runs at its full speed per row on
// ctx's device: 512 where the CPU takes the packed GEMM for large M (it widens each weight
// panel once per call and shares it over the rows, so more rows amortize it: f32/f16/bf16 and
// plain q8_0/q6_K/q4_0/q4_1; and f16x16, whose panels need no widening but whose packed route
// still beats its kernel from 64 rows), 128 where the integer kernels run at every M (the
// q4_0x8 / q4_1x8 / q8_0x8 / q4_kx8 layouts and q4_K gain nothing from more rows), 512 on CUDA.
int64_t matmul_wt_saturating_rows(const Context& ctx, DType w_type);
// flops = 2 M N K (+ M N with a bias); bytes = W once + x + y (decode reads every weight once).
OpCost matmul_wt_cost(int64_t M, int64_t K, int64_t N, DType w_type, bool bias = false);

// dst (K) = row `row` of W (N,K) of type w_type, as f32 (embedding lookups). Throws unless
// 0 <= row < N.
void dequantize_row(const void* w, DType w_type, int64_t K, int64_t N, int64_t row, float* dst);
// As above without a bound check on row (callers that validated tokens already).
void dequantize_row(const void* w, DType w_type, int64_t K, int64_t row, float* dst);

}  // namespace tessera::ops
