// Token (+ position) embedding on CUDA: forward, and an atomics-free deterministic backward.
#include <algorithm>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_common.cuh"

namespace tessera::cuda {
namespace {

using detail::aligned_to;
using detail::ceil_div;
using detail::grid_for;
using detail::load_vec;
using detail::store_vec;

constexpr int kThreads = 256;

template <typename E, int VEC>
__global__ void embedding_forward_kernel(E* out, const int32_t* tokens, const E* wte, const E* wpe,
                                         int64_t N, int64_t T, int64_t C, int64_t V) {
  const int64_t nvec = C / VEC;
  const int64_t total = N * nvec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t n = idx / nvec, c = (idx - n * nvec) * VEC;
    const int32_t tok = tokens[n];
    float y[VEC];
    if (tok < 0 || tok >= V) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) y[i] = __int_as_float(0x7fc00000);  // NaN marks a bad token
    } else {
      load_vec<E, VEC>(y, wte + static_cast<int64_t>(tok) * C + c);
      if (wpe) {
        float p[VEC];
        load_vec<E, VEC>(p, wpe + (n % T) * C + c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) y[i] += p[i];
      }
    }
    store_vec<E, VEC>(out + n * C + c, y);
  }
}

// dwte without atomics. Warp (column tile x, token class k) owns columns
// [32 x VEC, 32 (x+1) VEC) of every dwte row whose token is = k (mod K): it walks all rows in
// order, 32 tokens per step (ballot of the lanes whose token is in class k), and for each match
// lane l adds its VEC columns of that dout row to the token's dwte row. Each (token, column) is
// thus updated by one thread, in increasing row order: the reference's sums, bit for bit.
// Hashing tokens by residue spreads frequent tokens over warps.
constexpr int kWarpsPerBlock = 4;
template <typename E, int VEC>
__global__ void embedding_backward_wte_kernel(float* dwte, const E* dout, const int32_t* tokens,
                                              int64_t N, int64_t C, int64_t V, int K) {
  const int k = blockIdx.y * kWarpsPerBlock + threadIdx.y;
  if (k >= K) return;  // whole warp: no shuffle below misses a lane
  const int lane = threadIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + lane;  // this lane's vector column
  const bool has_col = j < C / VEC;
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t n = n0 + lane;
    const int32_t tok = n < N ? tokens[n] : -1;
    const bool mine = tok >= 0 && tok < V && tok % K == k;
    unsigned mask = __ballot_sync(0xffffffffu, mine);
    while (mask != 0) {
      const int src = __ffs(mask) - 1;
      mask &= mask - 1;
      const int32_t t = __shfl_sync(0xffffffffu, tok, src);
      if (has_col) {
        float d[VEC], w[VEC];
        float* dst = dwte + static_cast<int64_t>(t) * C + j * VEC;
        load_vec<E, VEC>(d, dout + (n0 + src) * C + j * VEC);
        load_vec<float, VEC>(w, dst);
#pragma unroll
        for (int i = 0; i < VEC; ++i) w[i] += d[i];
        store_vec<float, VEC>(dst, w);
      }
    }
  }
}

// dwpe: thread (t, vector column) adds dout over the batch in order b = 0, 1, ...
template <typename E, int VEC>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const E* dout, int64_t B, int64_t T,
                                              int64_t C) {
  const int64_t nvec = C / VEC;
  const int64_t total = T * nvec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t t = idx / nvec, c = (idx - t * nvec) * VEC;
    float acc[VEC];
    load_vec<float, VEC>(acc, dwpe + t * C + c);
    for (int64_t b = 0; b < B; ++b) {
      float d[VEC];
      load_vec<E, VEC>(d, dout + (b * T + t) * C + c);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += d[i];
    }
    store_vec<float, VEC>(dwpe + t * C + c, acc);
  }
}

void check_embedding(const char* op, int64_t B, int64_t T, int64_t C, int64_t V) {
  TS_CHECK(B >= 0 && T >= 0, "[", op, "] negative size B=", B, " T=", T);
  TS_CHECK(C > 0, "[", op, "] width C=", C, " must be positive");
  TS_CHECK(V > 0 && V <= 0x7fffffff, "[", op, "] vocab V=", V, " outside [1, 2^31)");
}

}  // namespace

template <typename E>
void embedding_forward(E* out, const int32_t* tokens, const E* wte, const E* wpe, int64_t B,
                       int64_t T, int64_t C, int64_t V, cudaStream_t stream) {
  check_embedding("embedding_forward", B, T, C, V);
  TS_CHECK(out != nullptr && tokens != nullptr && wte != nullptr,
           "[embedding_forward] out, tokens or wte is null");
  const int64_t N = B * T;
  if (N == 0) return;
  constexpr int kVec = 16 / sizeof(E);
  const bool vec = C % kVec == 0 && aligned_to(out, 16) && aligned_to(wte, 16) &&
                   (wpe == nullptr || aligned_to(wpe, 16));
  if (vec) {
    embedding_forward_kernel<E, kVec><<<grid_for(N * (C / kVec), kThreads), kThreads, 0, stream>>>(
        out, tokens, wte, wpe, N, T, C, V);
  } else {
    embedding_forward_kernel<E, 1>
        <<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(out, tokens, wte, wpe, N, T, C, V);
  }
  TS_CUDA_CHECK_LAUNCH();
}

template <typename E>
void embedding_backward(float* dwte, float* dwpe, const E* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C, int64_t V, cudaStream_t stream) {
  check_embedding("embedding_backward", B, T, C, V);
  TS_CHECK(dwte != nullptr && dout != nullptr && tokens != nullptr,
           "[embedding_backward] dwte, dout or tokens is null");
  const int64_t N = B * T;
  if (N == 0) return;
  constexpr int kVec = 16 / sizeof(E);  // dout vector; dwte/dwpe take kVec floats (16 or 32 B)
  const bool vec = C % kVec == 0 && aligned_to(dout, 16) && aligned_to(dwte, 16) &&
                   (dwpe == nullptr || aligned_to(dwpe, 16));
  const int64_t nvec = vec ? C / kVec : C;
  const int64_t tiles = ceil_div(nvec, 32);
  // About 8192 warps in all, whatever C; the result does not depend on K.
  const int K = static_cast<int>(
      std::clamp<int64_t>(8192 / tiles, 1, std::min<int64_t>(V, 65535 * kWarpsPerBlock)));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(ceil_div(K, kWarpsPerBlock)));
  const dim3 block(32, kWarpsPerBlock);
  if (vec)
    embedding_backward_wte_kernel<E, kVec>
        <<<grid, block, 0, stream>>>(dwte, dout, tokens, N, C, V, K);
  else
    embedding_backward_wte_kernel<E, 1><<<grid, block, 0, stream>>>(dwte, dout, tokens, N, C, V, K);
  TS_CUDA_CHECK_LAUNCH();
  if (dwpe != nullptr && T > 0) {
    if (vec)
      embedding_backward_wpe_kernel<E, kVec>
          <<<grid_for(T * nvec, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
    else
      embedding_backward_wpe_kernel<E, 1>
          <<<grid_for(T * nvec, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
    TS_CUDA_CHECK_LAUNCH();
  }
}

#define TS_INSTANTIATE(E)                                                                         \
  template void embedding_forward<E>(E*, const int32_t*, const E*, const E*, int64_t, int64_t,    \
                                     int64_t, int64_t, cudaStream_t);                             \
  template void embedding_backward<E>(float*, float*, const E*, const int32_t*, int64_t, int64_t, \
                                      int64_t, int64_t, cudaStream_t);
TS_INSTANTIATE(float)
TS_INSTANTIATE(__nv_bfloat16)
#undef TS_INSTANTIATE

}  // namespace tessera::cuda
