// Tile helpers shared by the FlashAttention kernels: cp.async copies into swizzled shared memory,
// ldmatrix and mma.sync m16n8k16 wrappers, and bf16/f16 packing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/wgmma.cuh"

namespace tessera::cuda::flash {

// Fragment layouts of mma.sync.m16n8k16 (PTX ISA), with g = lane / 4 and c = lane % 4:
//   A (16x16, row-major) regs a0..a3: (row g, cols 2c..2c+1), (row g+8, same cols),
//                                     (row g, cols 2c+8..), (row g+8, cols 2c+8..);
//   B (16x8, k x n) regs b0, b1: (k 2c..2c+1, col g), (k 2c+8.., col g);
//   C (16x8, f32) c0..c3: (row g, cols 2c, 2c+1), (row g+8, cols 2c, 2c+1).
// An S accumulator pair (n-tiles 2j, 2j+1) is therefore exactly the A fragment of the next
// product's k-step j, which is how P never leaves registers.

template <typename T>
struct Elem;

template <>
struct Elem<__nv_bfloat16> {
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
};

template <>
struct Elem<__half> {
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static float to_float(__half x) { return __half2float(x); }
};

__device__ inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives it.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// 16-byte global->shared copy; when !valid nothing is read and the chunk is zero-filled, so tail
// rows hold zeros (a garbage V row times P = 0 could still be NaN).
__device__ inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Copies rows [0, kRows) x cols [0, kCols) of a global tile (row r at gmem + r * row_stride)
// into a swizzled shared tile; rows >= valid_rows become zeros. gmem itself must be readable
// (valid_rows >= 1), it stands in as the address of the zero-filled chunks.
template <int kRows, int kCols, int kThreads, typename T>
__device__ inline void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int valid_rows) {
  static_assert(kCols % 64 == 0, "swizzle needs rows of a multiple of 128 bytes");
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = i / kChunksPerRow;
    const int c = (i % kChunksPerRow) * 8;
    const bool valid = r < valid_rows;
    const T* src = valid ? gmem + r * row_stride + c : gmem;
    cp_async_16(smem_u32(smem + attn_index::swizzle(r, c, kCols)), src, valid);
  }
}

// Copies rows [0, kRows) of a (rows x kD) global tile into the swizzled layout of wgmma.cuh
// (kD / 64 column blocks of kRows x 128 bytes); rows >= valid_rows become zeros. smem is a
// shared-space address, 1024-byte aligned.
template <int kRows, int kD, int kThreads, typename T>
__device__ inline void load_tile_sw128(uint32_t smem, const T* gmem, int64_t row_stride,
                                       int valid_rows) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = i / kChunksPerRow;
    const int c = i % kChunksPerRow;
    const bool valid = r < valid_rows;
    const T* src = valid ? gmem + r * row_stride + c * 8 : gmem;
    const uint32_t dst = smem + (c / 8) * (kRows * 128) + wgmma::sw128_offset(r, c % 8);
    cp_async_16(dst, src, valid);
  }
}

// Address of the row a lane supplies for an A-operand ldmatrix_x4 of the 16x16 block at
// (row0, col0) of a row-major tile: lanes 0-15 rows 0-15 at col0, lanes 16-31 at col0 + 8.
template <int kCols, typename T>
__device__ inline uint32_t a_frag_addr(const T* tile, int row0, int col0, int lane) {
  return smem_u32(tile + attn_index::swizzle(row0 + (lane & 15), col0 + (lane >> 4) * 8, kCols));
}
// B operand (k x n) read from a tile stored as [n][k] (e.g. K rows for Q K^T): registers
// {b0, b1} of n-tile n0 and {b0, b1} of n-tile n0 + 8, for k-step k0.
template <int kCols, typename T>
__device__ inline uint32_t b_frag_addr_nk(const T* tile, int n0, int k0, int lane) {
  return smem_u32(tile + attn_index::swizzle(n0 + (lane & 7) + ((lane >> 4) << 3),
                                             k0 + ((lane >> 3) & 1) * 8, kCols));
}
// B operand (k x n) read with .trans from a tile stored as [k][n] (e.g. V rows for P V):
// registers {b0, b1} of n-tile n0 and {b0, b1} of n-tile n0 + 8, for k-step k0.
template <int kCols, typename T>
__device__ inline uint32_t b_frag_addr_kn(const T* tile, int k0, int n0, int lane) {
  return smem_u32(tile + attn_index::swizzle(k0 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                             n0 + (lane >> 4) * 8, kCols));
}

// Max and sum over the 4 lanes of a quad (the lanes that share an accumulator row).
__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

inline constexpr float kLog2e = 1.4426950408889634f;

// Forward kernel arguments (both the mma.sync and the sm_90a wgmma kernel).
struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  AttnLayout ql, kl, vl, ol;
  int T, Hq, group;
  float scale;
  bool causal;
};
// The wgmma forward (flash_attention_fwd_sm90.cu); B is the batch (the grid's z).
void launch_fwd_wgmma(const FwdParams& p, int D, DType dtype, int64_t B, cudaStream_t stream);

// Backward main-pass arguments (both kernels); dsum and dq_acc live in the caller's workspace.
struct BwdParams {
  const void *q, *k, *v, *dout;
  const float* lse;
  float* dsum;    // (B,Hq,T)
  float* dq_acc;  // (B,T,Hq,D) f32, zeroed
  void *dk, *dv;
  AttnLayout ql, kl, vl, dol, dkl, dvl;
  int T, Hq, group;
  float scale;
  bool causal;
};
// The wgmma backward main pass (flash_attention_bwd_sm90.cu), after the D_i pre-pass and the
// zeroing of dq_acc, before the dQ conversion.
void launch_bwd_wgmma(const BwdParams& p, int D, DType dtype, int64_t B, int64_t Hkv,
                      cudaStream_t stream);

// Host-side argument checks shared by forward and backward (defined in flash_attention_fwd.cu);
// each throws naming the op and the offending parameter.
void check_shape(const char* op, const FlashAttentionShape& s);
void check_tensor(const char* op, const char* name, const void* data, const AttnLayout& l);

}  // namespace tessera::cuda::flash
