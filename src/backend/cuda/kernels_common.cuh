// Device helpers shared by the kernels_*.cu files: element conversion, packed (up to 128-bit)
// loads and stores, fixed-order warp and block reductions, and host-side launch helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/bf16_convert.cuh"
#include "backend/cuda/cuda_check.h"

namespace tessera::cuda::detail {

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return bf16_bits_to_f32(__bfloat16_as_ushort(x));
}

template <typename E>
__device__ __forceinline__ E from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __ushort_as_bfloat16(f32_to_bf16_bits(x));
}

// The value x takes once stored as E (so a kernel can compute on what it wrote).
template <typename E>
__device__ __forceinline__ float round_to(float x) {
  return to_f32(from_f32<E>(x));
}

// Loads V consecutive elements at p as f32. p must be aligned to V * sizeof(E) bytes when that
// is 8 or a multiple of 16 (the host checks this before choosing V > 1).
template <typename E, int V>
__device__ __forceinline__ void load_vec(float (&d)[V], const E* p) {
  constexpr int kBytes = V * static_cast<int>(sizeof(E));
  alignas(16) E e[V];
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int k = 0; k < kBytes / 16; ++k)
      reinterpret_cast<uint4*>(e)[k] = reinterpret_cast<const uint4*>(p)[k];
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(e) = *reinterpret_cast<const uint2*>(p);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = p[i];
  }
#pragma unroll
  for (int i = 0; i < V; ++i) d[i] = to_f32(e[i]);
}

// Loads V consecutive elements one at a time (no alignment needed), so a kernel can keep the
// vector path's element-to-thread assignment on unaligned data.
template <typename E, int V>
__device__ __forceinline__ void load_scalars(float (&d)[V], const E* p) {
#pragma unroll
  for (int i = 0; i < V; ++i) d[i] = to_f32(p[i]);
}

// Stores V f32 values as E at p (alignment as for load_vec).
template <typename E, int V>
__device__ __forceinline__ void store_vec(E* p, const float (&d)[V]) {
  constexpr int kBytes = V * static_cast<int>(sizeof(E));
  alignas(16) E e[V];
#pragma unroll
  for (int i = 0; i < V; ++i) e[i] = from_f32<E>(d[i]);
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int k = 0; k < kBytes / 16; ++k)
      reinterpret_cast<uint4*>(p)[k] = reinterpret_cast<const uint4*>(e)[k];
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(e);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = e[i];
  }
}

// Calls f(width, offset) for vectors of VEC elements over [0, n / VEC * VEC) (grid-stride), then
// once per leftover element with width 1, so any n works; only the vector part needs alignment.
template <int VEC, typename F>
__device__ __forceinline__ void for_each_vec(int64_t n, F&& f) {
  const int64_t nv = n / VEC;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = tid; i < nv; i += stride) f(std::integral_constant<int, VEC>{}, i * VEC);
  if constexpr (VEC > 1) {
    const int64_t t = nv * VEC + tid;
    if (t < n) f(std::integral_constant<int, 1>{}, t);
  }
}

// One RoPE pair (xa, xb) rotated by the angle with cosine c and sine s: the single expression
// the rope kernel and the fused rope + cache append share, so both give the same bits.
// A position outside the table gives NaN (a bad position must not pass unnoticed).
__device__ __forceinline__ void rope_rotate_pair(float xa, float xb, const float* cos_tab,
                                                 const float* sin_tab, int64_t max_pos, int64_t pos,
                                                 int64_t half, int64_t j, float sign, float* ya,
                                                 float* yb) {
  if (pos < 0 || pos >= max_pos) {
    *ya = *yb = __int_as_float(0x7fc00000);
    return;
  }
  const float c = cos_tab[pos * half + j], s = sign * sin_tab[pos * half + j];
  // Each product and sum rounded on its own (no contraction into FMAs), so no inlining context
  // can change the bits.
  *ya = __fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s));
  *yb = __fadd_rn(__fmul_rn(xb, c), __fmul_rn(xa, s));
}

// Butterfly sum: every lane ends with the same bits (IEEE addition is commutative, and each
// step adds the same two values on both partners).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Sums K values over the block; every thread gets the same result, combined in a fixed order
// (warps in index order). blockDim.x must be a multiple of 32 and every thread must call it.
// smem holds 32 * K values; the leading barrier makes back-to-back calls on one buffer safe.
template <int K, typename A>
__device__ __forceinline__ void block_sum(A (&v)[K], A* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) smem[k * 32 + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    A s = 0;
    for (int w = 0; w < nwarps; ++w) s += smem[k * 32 + w];
    v[k] = s;
  }
}

// Host side.
inline bool aligned_to(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}
inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
// Grid size for a grid-stride loop over `work` items: enough blocks to fill the GPU several
// times over, never more than the work needs. Results never depend on it.
inline unsigned grid_for(int64_t work, int threads) {
  const int64_t blocks = ceil_div(work, threads);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

}  // namespace tessera::cuda::detail
