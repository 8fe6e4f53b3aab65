// Fused softmax + cross-entropy + gradient over the vocabulary on CUDA: one block per row, the
// row read twice (online max/sum, then the gradient) and written once, in place.
#include <cmath>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_common.cuh"

namespace tessera::cuda {
namespace {

using detail::aligned_to;
using detail::load_vec;
using detail::store_vec;
using detail::to_f32;

// 512 threads: a GPT-2 row (Vp = 50304) is ~12 vectors of 8 per thread per pass.
constexpr int kThreads = 512;
static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block per row");

// Running (max, sum of exp(x - max)) pairs; an empty pair is (-inf, 0). Combining two pairs
// rescales each to the larger max; the -inf guards keep exp(-inf - -inf) = NaN out.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  const float sa = a.m == -INFINITY ? 0.0f : a.s * __expf(a.m - m);
  const float sb = b.m == -INFINITY ? 0.0f : b.s * __expf(b.m - m);
  return {m, sa + sb};
}

template <typename E, int VEC>
__global__ void __launch_bounds__(kThreads)
    softmax_xent_kernel(float* losses, E* logits, const int32_t* targets, int64_t V, int64_t Vp,
                        float dlogits_scale) {
  __shared__ float s_m[32], s_s[32];
  __shared__ float s_target_logit;
  const int64_t row = blockIdx.x;
  E* x = logits + row * Vp;
  const int64_t nv = Vp / VEC;
  const int32_t target = targets[row];
  if (target < 0) {  // ignored row: the whole block leaves together, before any barrier
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (dlogits_scale != 0.0f) {
      float zero[VEC] = {};
      for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) store_vec<E, VEC>(x + j * VEC, zero);
    }
    return;
  }
  const bool bad = target >= V;
  // Read before the barrier below, so no thread has overwritten it with a gradient yet.
  if (threadIdx.x == 0) s_target_logit = bad ? NAN : to_f32(x[target]);

  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
    float v[VEC];
    load_vec<E, VEC>(v, x + j * VEC);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      if (j * VEC + i >= V || v[i] == -INFINITY) continue;
      if (v[i] > acc.m) {
        acc.s = (acc.m == -INFINITY ? 0.0f : acc.s * __expf(acc.m - v[i])) + 1.0f;
        acc.m = v[i];
      } else {
        acc.s += __expf(v[i] - acc.m);
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, off),
                       __shfl_xor_sync(0xffffffffu, acc.s, off)};
    acc = combine(acc, other);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    s_m[warp] = acc.m;
    s_s[warp] = acc.s;
  }
  __syncthreads();
  // Every thread combines the warps' pairs in the same order: identical (m, sum) everywhere.
  MaxSum total{s_m[0], s_s[0]};
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
    total = combine(total, {s_m[w], s_s[w]});
  const float xt = s_target_logit;
  if (threadIdx.x == 0) losses[row] = logf(total.s) + total.m - xt;
  if (dlogits_scale == 0.0f) return;

  const float inv_sum = 1.0f / total.s;
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
    float v[VEC];
    load_vec<E, VEC>(v, x + j * VEC);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const int64_t col = j * VEC + i;
      if (col < V) {
        const float p = __expf(v[i] - total.m) * inv_sum;
        v[i] = (p - (col == target ? 1.0f : 0.0f)) * dlogits_scale;
        if (bad) v[i] = NAN;
      } else {
        v[i] = 0.0f;
      }
    }
    store_vec<E, VEC>(x + j * VEC, v);
  }
}

}  // namespace

template <typename E>
void softmax_xent(float* losses, E* logits, const int32_t* targets, int64_t N, int64_t V,
                  int64_t Vp, float dlogits_scale, cudaStream_t stream) {
  TS_CHECK(N >= 0 && N <= 0x7fffffff, "[softmax_xent] rows N=", N, " outside [0, 2^31)");
  TS_CHECK(V > 0, "[softmax_xent] vocab V=", V, " must be positive");
  TS_CHECK(Vp >= V, "[softmax_xent] padded vocab Vp=", Vp, " is below V=", V);
  TS_CHECK(V <= 0x7fffffff, "[softmax_xent] vocab V=", V, " exceeds int32 targets");
  TS_CHECK(losses != nullptr && logits != nullptr && targets != nullptr,
           "[softmax_xent] losses, logits or targets is null");
  if (N == 0) return;
  constexpr int kVec = 16 / sizeof(E);
  const dim3 grid(static_cast<unsigned>(N));
  if (Vp % kVec == 0 && aligned_to(logits, 16))
    softmax_xent_kernel<E, kVec>
        <<<grid, kThreads, 0, stream>>>(losses, logits, targets, V, Vp, dlogits_scale);
  else
    softmax_xent_kernel<E, 1>
        <<<grid, kThreads, 0, stream>>>(losses, logits, targets, V, Vp, dlogits_scale);
  TS_CUDA_CHECK_LAUNCH();
}

template void softmax_xent<float>(float*, float*, const int32_t*, int64_t, int64_t, int64_t, float,
                                  cudaStream_t);
template void softmax_xent<__nv_bfloat16>(float*, __nv_bfloat16*, const int32_t*, int64_t, int64_t,
                                          int64_t, float, cudaStream_t);

}  // namespace tessera::cuda
