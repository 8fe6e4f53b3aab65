// Device helpers shared by the quantized and the 16-bit matvec kernels: the streaming weight
// load, the warp-sum epilogue that writes one warp's kRows x M outputs, and the activation
// quantizer of one block (also used by the norm kernels that quantize their output).
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

// Quantizes one block of kBlock activations (one warp; lane holds v[e] = element lane + 32e) the
// way cpu::quantize_act_rows does: d = max|x| / 127, q = rint(x / d) clamped to +-127 (IEEE
// division and rint, round to nearest even), so the integers and scales are the CPU's bit for
// bit. Writes q to qb[lane + 32e], the scale to *d_out and the sums of each group of 32 to
// s_out[e] (lane 0). A non-finite x makes the scale NaN (and q zero), which then shows in y as
// a float matmul would show it. Callers load v themselves (the fused norm reads what it just
// wrote, through L2).
template <int kBlock>
__device__ __forceinline__ void quantize_act_block(const float (&v)[kBlock / 32], int lane,
                                                   int8_t* qb, float* d_out, int32_t* s_out) {
  static_assert(kBlock % 32 == 0, "one element per lane per group of 32");
  constexpr int E = kBlock / 32;
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    amax = fmaxf(amax, fabsf(v[e]));
    finite = finite && isfinite(v[e]);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  finite = __all_sync(0xffffffffu, finite);
  const float d = finite ? amax / 127.0f : __int_as_float(0x7fc00000);
  const float id = finite && d > 0.0f ? 1.0f / d : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int q = finite ? static_cast<int>(fminf(fmaxf(rintf(v[e] * id), -127.0f), 127.0f)) : 0;
    qb[lane + 32 * e] = static_cast<int8_t>(q);
    int s = q;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) s_out[e] = s;  // element lane + 32e is in group e
  }
  if (lane == 0) *d_out = d;
}

}  // namespace tessera::cuda
