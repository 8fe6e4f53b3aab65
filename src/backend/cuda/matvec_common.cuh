// Device helpers shared by the quantized and the 16-bit matvec kernels: the streaming weight
// load and the warp-sum epilogue that writes one warp's kRows x M outputs.
#pragma once

#include <cstdint>

namespace tessera::cuda {

// Streaming 128-bit load: weights are read once, so they bypass L1 (which keeps x).
__device__ __forceinline__ uint4 load_stream_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Each lane holds partial sums acc[r][m] for weight rows n0 + r and activation rows m; the warp
// adds them across lanes (butterfly: every lane ends with the total) and lane 0 writes
// y[m * ldy + n] = total + bias[n] for the rows n < N.
template <int kRows, int M>
__device__ __forceinline__ void warp_sum_store(float (&acc)[kRows][M], int lane, int64_t n0,
                                               int64_t N, const float* bias, float* y,
                                               int64_t ldy) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][m] = v;
    }
    const int64_t n = n0 + r;
    if (lane == 0 && n < N) {
      const float b = bias ? bias[n] : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) y[m * ldy + n] = acc[r][m] + b;
    }
  }
}

}  // namespace tessera::cuda
