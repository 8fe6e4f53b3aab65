// Decode-time matmul on the GPU against weights kept in their stored type (f16, bf16 and the
// GGUF blocks q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K): y = x W^T for 1 to 8 activation
// rows.
//
// Design (bandwidth): a warp owns kMatvecWarpRows consecutive weight rows and streams them in
// chunks of whole blocks (~1-2 KB per row) with 128-bit loads that cover contiguous bytes
// (lane i reads bytes 16i.., so a warp instruction reads 512 contiguous bytes) into a per-warp
// shared-memory buffer; the loads for the next chunk are issued into registers before the
// current chunk is decoded. Every weight byte is read from global memory exactly once per call
// and all M rows of x are applied to it. Warp-shuffle reductions, no atomics.
//
// Activations: for block types x is quantized on the fly (a small first kernel) to int8 with
// one f32 scale per weight block, exactly as the CPU path (backend/cpu/quant_act.h) does, and
// the kernel multiplies with __dp4a. Why not f32 x in shared memory: a 4-bit weight would then
// cost ~3 instructions (unpack, convert, FMA) per element at M=1; at the H200's 4.8 TB/s that is
// ~29 T instr/s against a ~33 T/s FP32 issue limit, so the kernel would be compute bound. With
// __dp4a, 8 weights cost ~3 logic ops + 2 dp4a. Because the integers match the CPU's, the GPU
// result equals cpu::ref::matmul_wt up to the order of the f32 block sums.
// f16/bf16 weights use f32 math on x read through L1 (x is at most 8 x K floats).
//
// Expected bandwidth (H200, ~4.8 TB/s peak, ~4.0-4.3 TB/s measured by a read kernel):
// - M=1: bound by HBM; large shapes should reach ~80-90% of the measured read bandwidth.
//   Small matrices (N K < ~8M weights, e.g. 2048x2048 q4_0 = 2.4 MB) last ~1-2 us, so launch
//   latency and the tail wave dominate and the fraction drops (CUDA graphs hide only the CPU
//   side of that).
// - M=8: the dp4a work grows with M (4-bit types: M/2 dp4a per weight byte, 4 per byte at M=8),
//   which meets the ~64 dp4a/clk/SM issue rate near M=8 for 4-bit types, and the x reads through
//   L1 grow with M too; expect ~50-80% of bandwidth (q8_0 and q6_K fare better: fewer weights
//   per byte). f16/bf16 at M=8 are limited by the L1 traffic of x (M floats per weight,
//   shared by the warp's rows).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tessera::cuda {

// Largest M the matvec kernels take; larger batches go to the GEMM.
constexpr int64_t kMatvecMaxRows = 8;
// Weight rows per warp (shares each x load across these rows).
constexpr int kMatvecWarpRows = 2;

// Device scratch the block types need for the quantized activations (0 for f16/bf16).
size_t matmul_wt_workspace_bytes(int64_t M, int64_t K, DType w_type);

// y (M, ldy) = x (M, K) W^T [+ bias (N)], W (N, K) stored as w_type with rows
// dtype_bytes(w_type, K) apart, exactly as in the GGUF/safetensors file (any alignment).
// x, y, bias f32; all pointers on the device. 1 <= M <= 8 (M == 0 or N == 0 does nothing);
// K a multiple of the block size; ldy >= N. w_type one of f16, bf16, q8_0, q4_0, q4_1, q5_0,
// q5_1, q4_k, q5_k, q6_k. `workspace` holds matmul_wt_workspace_bytes(M, K, w_type) bytes (may be
// null for f16/bf16); it is used in stream order, so one workspace serves all calls on one stream.
void matmul_wt(float* y, int64_t ldy, const float* x, int64_t M, int64_t K, const void* w,
               DType w_type, int64_t N, const float* bias, void* workspace, size_t workspace_bytes,
               cudaStream_t stream);

// As above with a scratch buffer owned by this module, one per (device, stream), grown when a
// call needs more (growth synchronizes the stream and is refused while the stream is being
// captured into a CUDA graph: make one call of the largest shape before capturing).
void matmul_wt(float* y, int64_t ldy, const float* x, int64_t M, int64_t K, const void* w,
               DType w_type, int64_t N, const float* bias, cudaStream_t stream);

// Activations quantized for the block types' kernels, as matmul_wt's workspace holds them:
// q (M, K) int8, d (M, K / block) f32 scales, s (M, K / 32) int32 sums of each 32 q; block is
// the weight type's activation block (act_block_elems: 32, or 256 for the k-quants).
struct QuantizedActs {
  int8_t* q = nullptr;
  float* d = nullptr;
  int32_t* s = nullptr;
  int64_t M = 0, K = 0, block = 0;
};

// The view of `workspace` (at least matmul_wt_workspace_bytes(M, K, w_type) bytes, 16-byte
// aligned) in which matmul_wt quantizes its x; throws for f16/bf16 (nothing to quantize) or a
// workspace too small. Host-only (touches no device memory).
QuantizedActs quantized_acts_view(void* workspace, size_t workspace_bytes, int64_t M, int64_t K,
                                  DType w_type);

// q = x (q.M, q.K) f32 quantized as matmul_wt quantizes its x (the same bits): for an op that
// cannot quantize its output itself.
void quantize_acts(const float* x, const QuantizedActs& q, cudaStream_t stream);

// y (M, ldy) = x W^T [+ bias] with x already quantized into `x` (by matmul_wt's quantizer or a
// kernel that quantizes its output, such as norm_quantize_f32): the same products, bit for bit,
// as matmul_wt on the float x, one launch fewer. x.block must be w_type's activation block.
void matmul_wt_quantized(float* y, int64_t ldy, const QuantizedActs& x, const void* w, DType w_type,
                         int64_t N, const float* bias, cudaStream_t stream);

namespace detail {
// Launches of the block-type kernels (quant_matvec_blocks.cu) on pre-quantized activations:
// xq (M, K) int8, xd (M, K / block) f32 scales, xs (M, K / 32) int32 sums of xq.
void launch_block_matvec(float* y, int64_t ldy, const int8_t* xq, const float* xd,
                         const int32_t* xs, int64_t M, int64_t K, const void* w, DType w_type,
                         int64_t N, const float* bias, cudaStream_t stream);
}  // namespace detail

}  // namespace tessera::cuda
