// AdamW with f32 master weights and the deterministic global gradient norm on CUDA.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_common.cuh"

namespace tessera::cuda {
namespace {

using detail::aligned_to;
using detail::block_sum;
using detail::ceil_div;
using detail::for_each_vec;
using detail::grid_for;
using detail::load_scalars;
using detail::load_vec;
using detail::store_vec;

constexpr int kThreads = 256;

struct AdamWConsts {
  float lr, beta1, beta2, one_minus_b1, one_minus_b2, eps, weight_decay, grad_scale, inv_bc1,
      rsqrt_bc2;
};

// The reference's operation sequence with explicit round-to-nearest intrinsics: nvcc would
// otherwise contract a * b + c into FMAs and the bits would differ from the CPU's.
template <typename G, int VEC>
__global__ void adamw_kernel(float* params, __nv_bfloat16* params_bf16, const G* grads, float* m,
                             float* v, int64_t n, AdamWConsts k) {
  for_each_vec<VEC>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float p[K], g[K], mv[K], vv[K];
    load_vec<float, K>(p, params + off);
    load_vec<G, K>(g, grads + off);
    load_vec<float, K>(mv, m + off);
    load_vec<float, K>(vv, v + off);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const float gi = __fmul_rn(g[i], k.grad_scale);
      const float mi = __fadd_rn(__fmul_rn(k.beta1, mv[i]), __fmul_rn(k.one_minus_b1, gi));
      const float vi =
          __fadd_rn(__fmul_rn(k.beta2, vv[i]), __fmul_rn(__fmul_rn(k.one_minus_b2, gi), gi));
      mv[i] = mi;
      vv[i] = vi;
      const float mhat = __fmul_rn(mi, k.inv_bc1);
      const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.rsqrt_bc2), k.eps);
      const float step = __fadd_rn(__fdiv_rn(mhat, denom), __fmul_rn(k.weight_decay, p[i]));
      p[i] = __fsub_rn(p[i], __fmul_rn(k.lr, step));
    }
    store_vec<float, K>(params + off, p);
    store_vec<float, K>(m + off, mv);
    store_vec<float, K>(v + off, vv);
    if (params_bf16) store_vec<__nv_bfloat16, K>(params_bf16 + off, p);
  });
}

// Stage 1 of the global norm: block b of a tensor sums squares over the elements
// for_each_vec gives it (in double: each square of a float is exact) into part[b]. The element
// assignment is that of 4-wide vectors whether or not the data is aligned, so the partition
// (and the rounding) depends on n alone.
constexpr int kNormVec = 4;
constexpr int64_t kMaxNormBlocks = 1024;
int64_t norm_blocks(int64_t n) {
  return std::clamp<int64_t>(ceil_div(n, kThreads * kNormVec * 8), 1, kMaxNormBlocks);
}

template <typename G, bool kAligned>
__global__ void sum_squares_partial_kernel(double* part, const G* x, int64_t n) {
  __shared__ double smem[32];
  double acc[1] = {0.0};
  for_each_vec<kNormVec>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float v[K];
    if constexpr (kAligned)
      load_vec<G, K>(v, x + off);
    else
      load_scalars<G, K>(v, x + off);
#pragma unroll
    for (int i = 0; i < K; ++i) acc[0] += static_cast<double>(v[i]) * static_cast<double>(v[i]);
  });
  block_sum<1>(acc, smem);
  if (threadIdx.x == 0) part[blockIdx.x] = acc[0];
}

// Stage 2: one block adds the partials, thread i taking i, i + blockDim, ... in order.
__global__ void sum_partials_kernel(double* out, const double* part, int64_t count) {
  __shared__ double smem[32];
  double acc[1] = {0.0};
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc[0] += part[i];
  block_sum<1>(acc, smem);
  if (threadIdx.x == 0) out[0] = acc[0];
}

}  // namespace

template <typename G>
void adamw(float* params, __nv_bfloat16* params_bf16, const G* grads, float* m, float* v, int64_t n,
           const ops::AdamWArgs& a, cudaStream_t stream) {
  TS_CHECK(n >= 0, "[adamw] size n=", n, " must be >= 0");
  TS_CHECK(a.t >= 1, "[adamw] step t must count from 1, got ", a.t);
  TS_CHECK(a.beta1 >= 0.0f && a.beta1 < 1.0f, "[adamw] beta1 must be in [0, 1), got ", a.beta1);
  TS_CHECK(a.beta2 >= 0.0f && a.beta2 < 1.0f, "[adamw] beta2 must be in [0, 1), got ", a.beta2);
  TS_CHECK(params != nullptr && grads != nullptr && m != nullptr && v != nullptr,
           "[adamw] params, grads, m or v is null");
  if (n == 0) return;
  // Bias corrections exactly as the reference: in double, rounded once.
  AdamWConsts k{};
  k.lr = a.lr;
  k.beta1 = a.beta1;
  k.beta2 = a.beta2;
  k.one_minus_b1 = 1.0f - a.beta1;
  k.one_minus_b2 = 1.0f - a.beta2;
  k.eps = a.eps;
  k.weight_decay = a.weight_decay;
  k.grad_scale = a.grad_scale;
  const ops::AdamWBias bc = ops::adamw_bias(a);
  k.inv_bc1 = bc.inv_bc1;
  k.rsqrt_bc2 = bc.rsqrt_bc2;
  constexpr int kVec = 4;  // float4 for params, m, v; 8 bytes of bf16 for grads / params_bf16
  const bool vec = aligned_to(params, 16) && aligned_to(m, 16) && aligned_to(v, 16) &&
                   aligned_to(grads, kVec * sizeof(G)) &&
                   (params_bf16 == nullptr || aligned_to(params_bf16, 8));
  const unsigned grid = grid_for(n / kVec + 1, kThreads);
  if (vec)
    adamw_kernel<G, kVec><<<grid, kThreads, 0, stream>>>(params, params_bf16, grads, m, v, n, k);
  else
    adamw_kernel<G, 1><<<grid, kThreads, 0, stream>>>(params, params_bf16, grads, m, v, n, k);
  TS_CUDA_CHECK_LAUNCH();
}

int64_t global_sum_squares_workspace(const int64_t* sizes, int count) {
  TS_CHECK(count >= 0, "[global_sum_squares] count=", count, " must be >= 0");
  TS_CHECK(count == 0 || sizes != nullptr, "[global_sum_squares] sizes is null");
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    TS_CHECK(sizes[i] >= 0, "[global_sum_squares] sizes[", i, "]=", sizes[i], " is negative");
    total += norm_blocks(sizes[i]);
  }
  return std::max<int64_t>(total, 1);
}

template <typename G>
void global_sum_squares(double* out, const G* const* ptrs, const int64_t* sizes, int count,
                        double* workspace, cudaStream_t stream) {
  TS_CHECK(out != nullptr, "[global_sum_squares] out is null");
  TS_CHECK(workspace != nullptr, "[global_sum_squares] workspace is null");
  const int64_t slots = global_sum_squares_workspace(sizes, count);
  TS_CHECK(count == 0 || ptrs != nullptr, "[global_sum_squares] ptrs is null");
  int64_t at = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t blocks = norm_blocks(sizes[i]);
    if (sizes[i] > 0) {
      TS_CHECK(ptrs[i] != nullptr, "[global_sum_squares] ptrs[", i, "] is null");
      if (aligned_to(ptrs[i], kNormVec * sizeof(G)))
        sum_squares_partial_kernel<G, true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            workspace + at, ptrs[i], sizes[i]);
      else
        sum_squares_partial_kernel<G, false>
            <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(workspace + at, ptrs[i],
                                                                     sizes[i]);
      TS_CUDA_CHECK_LAUNCH();
    } else {
      TS_CUDA_CHECK(cudaMemsetAsync(workspace + at, 0, blocks * sizeof(double), stream));
    }
    at += blocks;
  }
  if (at == 0) TS_CUDA_CHECK(cudaMemsetAsync(workspace, 0, sizeof(double), stream));
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(out, workspace, slots);
  TS_CUDA_CHECK_LAUNCH();
}

template void adamw<float>(float*, __nv_bfloat16*, const float*, float*, float*, int64_t,
                           const ops::AdamWArgs&, cudaStream_t);
template void adamw<__nv_bfloat16>(float*, __nv_bfloat16*, const __nv_bfloat16*, float*, float*,
                                   int64_t, const ops::AdamWArgs&, cudaStream_t);
template void global_sum_squares<float>(double*, const float* const*, const int64_t*, int, double*,
                                        cudaStream_t);
template void global_sum_squares<__nv_bfloat16>(double*, const __nv_bfloat16* const*,
                                                const int64_t*, int, double*, cudaStream_t);

}  // namespace tessera::cuda
