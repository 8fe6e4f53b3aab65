// The device decoder's glue kernels: cache append (f32 -> f32/f16) and row gather.
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decoder_kernels.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void store_kv(float* p, float x) {
  *p = x;
}
__device__ __forceinline__ void store_kv(__half* p, float x) {
  *p = __float2half_rn(x);
}

// One thread per (row, head, dim) of k and of v: consecutive threads write consecutive dims.
template <typename T>
__global__ void append_kernel(T* kv, const float* k, const float* v, const int32_t* slot,
                              int64_t rows, int64_t Hkv, int64_t D, int64_t bt, int64_t stride,
                              int64_t v_off) {
  const int64_t per_row = Hkv * D, total = rows * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, e = i - r * per_row, g = e / D, d = e - g * D;
    const int64_t s = slot[r], b = s / bt, t = s - b * bt;
    T* dst = kv + b * stride + (g * bt + t) * D + d;
    store_kv(dst, k[i]);
    store_kv(dst + v_off, v[i]);
  }
}

__global__ void gather_kernel(float* dst, const float* src, const int32_t* index, int64_t n,
                              int64_t C) {
  const int64_t total = n * C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i - r * C;
    dst[i] = src[static_cast<int64_t>(index[r]) * C + c];
  }
}

unsigned grid(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

}  // namespace

void kv_cache_append(void* layer_kv, DType kv_type, const float* k, const float* v,
                     const int32_t* slot, int64_t rows, int64_t Hkv, int64_t D,
                     int64_t block_tokens, int64_t block_stride, int64_t v_offset,
                     cudaStream_t stream) {
  TS_CHECK(layer_kv && k && v && slot, "[kv_cache_append] layer_kv, k, v and slot must be set");
  TS_CHECK(kv_type == DType::f32 || kv_type == DType::f16, "[kv_cache_append] kv_type ",
           dtype_name(kv_type), " must be f32 or f16");
  TS_CHECK(rows >= 0 && Hkv > 0 && D > 0 && block_tokens > 0, "[kv_cache_append] rows=", rows,
           " Hkv=", Hkv, " D=", D, " block_tokens=", block_tokens, " must be positive");
  TS_CHECK(v_offset >= Hkv * block_tokens * D && block_stride >= 2 * Hkv * block_tokens * D,
           "[kv_cache_append] v_offset=", v_offset, " and block_stride=", block_stride,
           " overlap a block's keys");
  if (rows == 0) return;
  const int64_t total = rows * Hkv * D;
  if (kv_type == DType::f16)
    append_kernel<<<grid(total), kThreads, 0, stream>>>(static_cast<__half*>(layer_kv), k, v, slot,
                                                        rows, Hkv, D, block_tokens, block_stride,
                                                        v_offset);
  else
    append_kernel<<<grid(total), kThreads, 0, stream>>>(static_cast<float*>(layer_kv), k, v, slot,
                                                        rows, Hkv, D, block_tokens, block_stride,
                                                        v_offset);
  TS_CUDA_CHECK_LAUNCH();
}

void gather_rows(float* dst, const float* src, const int32_t* index, int64_t n, int64_t C,
                 cudaStream_t stream) {
  TS_CHECK(dst && src && index, "[gather_rows] dst, src and index must be set");
  TS_CHECK(n >= 0 && C > 0, "[gather_rows] n=", n, " C=", C, " out of range");
  if (n == 0) return;
  gather_kernel<<<grid(n * C), kThreads, 0, stream>>>(dst, src, index, n, C);
  TS_CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::cuda
