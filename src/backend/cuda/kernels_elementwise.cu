// Elementwise CUDA kernels: GELU, SwiGLU and GeGLU forward/backward (and SwiGLU fused with the next
// product's activation quantizer), scale, f32 <-> bf16 conversion.
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_common.cuh"
#include "backend/cuda/matvec_common.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace {

using detail::aligned_to;
using detail::for_each_vec;
using detail::grid_for;
using detail::load_vec;
using detail::round_to;
using detail::store_vec;

constexpr int kThreads = 256;

constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluCubic = 0.044715f;

// 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e), e = exp(-2u): keeps full relative accuracy for
// very negative x, where 1 + tanh(u) cancels (the reference does the same).
__device__ __forceinline__ float gelu_value(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}
// gelu' = s + x * 2 s (1 - s) u'(x), 1 - s = 1 / (1 + 1/e): exact, and 1 (not NaN) when e = inf.
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float e = expf(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  const float one_minus_s = 1.0f / (1.0f + 1.0f / e);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return s + x * 2.0f * s * one_minus_s * du;
}

template <typename E, int VEC>
__global__ void gelu_forward_kernel(E* out, const E* inp, int64_t n) {
  allow_dependent_launch();
  grid_dependency_wait();  // inp comes from the kernel before (dependent_launch.cuh)
  for_each_vec<VEC>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float x[K];
    load_vec<E, K>(x, inp + off);
#pragma unroll
    for (int i = 0; i < K; ++i) x[i] = gelu_value(x[i]);
    store_vec<E, K>(out + off, x);
  });
}

// out (n) = f(a, b) element by element, in f32; out may alias a or b.
template <typename E, int VEC, typename F>
__global__ void binary_kernel(E* out, const E* a, const E* b, int64_t n, F f) {
  for_each_vec<VEC>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float x[K], y[K];
    load_vec<E, K>(x, a + off);
    load_vec<E, K>(y, b + off);
#pragma unroll
    for (int i = 0; i < K; ++i) x[i] = f(x[i], y[i]);
    store_vec<E, K>(out + off, x);
  });
}

struct GeluGrad {  // (inp, dout) -> gelu'(inp) * dout
  __device__ float operator()(float x, float d) const { return gelu_grad(x) * d; }
};
struct GegluValue {  // (gate, up) -> gelu(gate) * up
  __device__ float operator()(float g, float u) const { return gelu_value(g) * u; }
};
struct Plus {
  __device__ float operator()(float x, float y) const { return x + y; }
};

__device__ __forceinline__ float swiglu_value(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

template <typename E, int VEC>
__global__ void swiglu_forward_kernel(E* out, const E* gate, const E* up, int64_t n) {
  allow_dependent_launch();
  grid_dependency_wait();
  for_each_vec<VEC>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float g[K], u[K];
    load_vec<E, K>(g, gate + off);
    load_vec<E, K>(u, up + off);
#pragma unroll
    for (int i = 0; i < K; ++i) g[i] = swiglu_value(g[i], u[i]);
    store_vec<E, K>(out + off, g);
  });
}

// One warp per (row m, activation block): out = silu(gate) * up for the block's elements (the
// same expression as swiglu_forward_kernel), then quantized as matmul_wt would quantize out.
template <int kBlock>
__global__ void __launch_bounds__(256)
    swiglu_quantize_kernel(float* out, const float* gate, const float* up, int64_t M, int64_t F,
                           int8_t* xq, float* xd, int32_t* xs) {
  constexpr int kGroups = kBlock / 32;
  allow_dependent_launch();
  grid_dependency_wait();
  const int lane = threadIdx.x % 32;
  const int64_t nb = F / kBlock;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (g >= M * nb) return;
  const int64_t m = g / nb, b = g % nb, base = m * F + b * kBlock;
  float v[kGroups];
#pragma unroll
  for (int e = 0; e < kGroups; ++e) {
    const int64_t i = base + lane + 32 * e;
    v[e] = swiglu_value(gate[i], up[i]);
    out[i] = v[e];
  }
  quantize_act_block<kBlock>(v, lane, xq + base, xd + m * nb + b, xs + m * (F / 32) + b * kGroups);
}

// silu'(g) = s (1 + g (1 - s)), with s and 1 - s each computed without cancellation; with kGelu
// the tanh GELU (GeGLU) instead.
template <typename E, int VEC, bool kGelu>
__global__ void glu_backward_kernel(E* dgate, E* dup, const E* dout, const E* gate, const E* up,
                                    int64_t n) {
  for_each_vec<VEC>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float g[K], u[K], d[K], dg[K], du[K];
    load_vec<E, K>(g, gate + off);
    load_vec<E, K>(u, up + off);
    load_vec<E, K>(d, dout + off);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      if constexpr (kGelu) {
        dg[i] = d[i] * u[i] * gelu_grad(g[i]);
        du[i] = d[i] * gelu_value(g[i]);
      } else {
        const float s = 1.0f / (1.0f + expf(-g[i]));
        const float sm = 1.0f / (1.0f + expf(g[i]));
        dg[i] = d[i] * u[i] * s * (1.0f + g[i] * sm);
        du[i] = d[i] * g[i] * s;
      }
    }
    store_vec<E, K>(dgate + off, dg);
    store_vec<E, K>(dup + off, du);
  });
}

template <typename E, int VEC>
__global__ void scale_kernel(E* x, int64_t n, float s) {
  for_each_vec<VEC>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float v[K];
    load_vec<E, K>(v, x + off);
#pragma unroll
    for (int i = 0; i < K; ++i) v[i] *= s;
    store_vec<E, K>(x + off, v);
  });
}

template <typename To, typename From, int VEC>
__global__ void convert_kernel(To* dst, const From* src, int64_t n) {
  for_each_vec<VEC>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float v[K];
    load_vec<From, K>(v, src + off);
    store_vec<To, K>(dst + off, v);
  });
}

// x = round_to<bf16>(x) in place; keep = its bits unless null (core/dtype.h's rounding).
template <int VEC>
__global__ void round_bf16_kernel(float* x, __nv_bfloat16* keep, int64_t n) {
  for_each_vec<VEC>(n, [&](auto width, int64_t off) {
    constexpr int K = decltype(width)::value;
    float v[K];
    load_vec<float, K>(v, x + off);
    if (keep != nullptr) store_vec<__nv_bfloat16, K>(keep + off, v);
#pragma unroll
    for (int i = 0; i < K; ++i) v[i] = round_to<__nv_bfloat16>(v[i]);
    store_vec<float, K>(x + off, v);
  });
}

void check_n(const char* op, int64_t n) {
  TS_CHECK(n >= 0, "[", op, "] size n=", n, " must be >= 0");
}

// 128-bit vectors when every pointer is 16-byte aligned (the tail needs no alignment).
template <typename E>
constexpr int kVec = 16 / sizeof(E);

bool all_aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!aligned_to(p, 16)) return false;
  return true;
}

}  // namespace

template <typename E>
void gelu_forward(E* out, const E* inp, int64_t n, cudaStream_t stream) {
  check_n("gelu_forward", n);
  TS_CHECK(out != nullptr && inp != nullptr, "[gelu_forward] out or inp is null");
  if (n == 0) return;
  const unsigned grid = grid_for(n / kVec<E> + 1, kThreads);
  launch_dependent(
      all_aligned16({out, inp}) ? gelu_forward_kernel<E, kVec<E>> : gelu_forward_kernel<E, 1>,
      dim3(grid), dim3(kThreads), 0, stream, out, inp, n);
}

namespace {

template <typename E, typename F>
void launch_binary(const char* op, E* out, const E* a, const E* b, int64_t n, F f,
                   cudaStream_t stream) {
  check_n(op, n);
  TS_CHECK(out != nullptr && a != nullptr && b != nullptr, "[", op, "] a pointer is null");
  if (n == 0) return;
  const unsigned grid = grid_for(n / kVec<E> + 1, kThreads);
  if (all_aligned16({out, a, b}))
    binary_kernel<E, kVec<E>><<<grid, kThreads, 0, stream>>>(out, a, b, n, f);
  else
    binary_kernel<E, 1><<<grid, kThreads, 0, stream>>>(out, a, b, n, f);
  TS_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename E>
void gelu_backward(E* dinp, const E* inp, const E* dout, int64_t n, cudaStream_t stream) {
  launch_binary("gelu_backward", dinp, inp, dout, n, GeluGrad{}, stream);
}

template <typename E>
void add(E* out, const E* a, const E* b, int64_t n, cudaStream_t stream) {
  launch_binary("add", out, a, b, n, Plus{}, stream);
}

template <typename E>
void swiglu_forward(E* out, const E* gate, const E* up, int64_t N, int64_t F, cudaStream_t stream) {
  TS_CHECK(F > 0, "[swiglu_forward] width F=", F, " must be positive");
  TS_CHECK(N >= 0, "[swiglu_forward] rows N=", N, " must be >= 0");
  TS_CHECK(out != nullptr && gate != nullptr && up != nullptr,
           "[swiglu_forward] out, gate or up is null");
  const int64_t n = N * F;
  if (n == 0) return;
  const unsigned grid = grid_for(n / kVec<E> + 1, kThreads);
  launch_dependent(all_aligned16({out, gate, up}) ? swiglu_forward_kernel<E, kVec<E>>
                                                  : swiglu_forward_kernel<E, 1>,
                   dim3(grid), dim3(kThreads), 0, stream, out, gate, up, n);
}

void swiglu_quantize_f32(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                         const QuantizedActs& q, cudaStream_t stream) {
  const char* op = "swiglu_quantize_f32";
  TS_CHECK(N >= 1 && F > 0, "[", op, "] rows N=", N, " and width F=", F, " must be positive");
  TS_CHECK(out && gate && up, "[", op, "] out, gate or up is null");
  TS_CHECK(q.M == N && q.K == F && q.q && q.d && q.s, "[", op, "] quantized activations for (", q.M,
           ", ", q.K, ") rows, not the (", N, ", ", F, ") being computed");
  TS_CHECK(q.block > 0 && F % q.block == 0, "[", op, "] width F=", F,
           " is not a multiple of the activation block ", q.block);
  const int64_t warps = N * (F / q.block);
  TS_CHECK((warps + 7) / 8 <= 0x7fffffff, "[", op, "] F=", F, " needs too many thread blocks");
  const unsigned grid = static_cast<unsigned>((warps + 7) / 8);
  if (q.block != 32 && q.block != kQK_K)
    fail("[", op, "] activation block ", q.block, " (the block types take 32 or ", kQK_K, ")");
  launch_dependent(q.block == 32 ? swiglu_quantize_kernel<32> : swiglu_quantize_kernel<kQK_K>,
                   dim3(grid), dim3(256), 0, stream, out, gate, up, N, F, q.q, q.d, q.s);
}

template <typename E, bool kGelu>
void glu_backward(const char* op, E* dgate, E* dup, const E* dout, const E* gate, const E* up,
                  int64_t N, int64_t F, cudaStream_t stream) {
  TS_CHECK(F > 0, "[", op, "] width F=", F, " must be positive");
  TS_CHECK(N >= 0, "[", op, "] rows N=", N, " must be >= 0");
  TS_CHECK(
      dgate != nullptr && dup != nullptr && dout != nullptr && gate != nullptr && up != nullptr,
      "[", op, "] a pointer argument is null");
  TS_CHECK(dgate != dup, "[", op, "] dgate and dup must differ");
  const int64_t n = N * F;
  if (n == 0) return;
  const unsigned grid = grid_for(n / kVec<E> + 1, kThreads);
  if (all_aligned16({dgate, dup, dout, gate, up}))
    glu_backward_kernel<E, kVec<E>, kGelu>
        <<<grid, kThreads, 0, stream>>>(dgate, dup, dout, gate, up, n);
  else
    glu_backward_kernel<E, 1, kGelu><<<grid, kThreads, 0, stream>>>(dgate, dup, dout, gate, up, n);
  TS_CUDA_CHECK_LAUNCH();
}

template <typename E>
void swiglu_backward(E* dgate, E* dup, const E* dout, const E* gate, const E* up, int64_t N,
                     int64_t F, cudaStream_t stream) {
  glu_backward<E, false>("swiglu_backward", dgate, dup, dout, gate, up, N, F, stream);
}

template <typename E>
void geglu_forward(E* out, const E* gate, const E* up, int64_t N, int64_t F, cudaStream_t stream) {
  TS_CHECK(F > 0 && N >= 0, "[geglu_forward] rows N=", N, " and width F=", F, " (F must be > 0)");
  launch_binary("geglu_forward", out, gate, up, N * F, GegluValue{}, stream);
}

template <typename E>
void geglu_backward(E* dgate, E* dup, const E* dout, const E* gate, const E* up, int64_t N,
                    int64_t F, cudaStream_t stream) {
  glu_backward<E, true>("geglu_backward", dgate, dup, dout, gate, up, N, F, stream);
}

template <typename E>
void scale(E* x, int64_t n, float s, cudaStream_t stream) {
  check_n("scale", n);
  TS_CHECK(x != nullptr, "[scale] x is null");
  if (n == 0) return;
  const unsigned grid = grid_for(n / kVec<E> + 1, kThreads);
  if (aligned_to(x, 16))
    scale_kernel<E, kVec<E>><<<grid, kThreads, 0, stream>>>(x, n, s);
  else
    scale_kernel<E, 1><<<grid, kThreads, 0, stream>>>(x, n, s);
  TS_CUDA_CHECK_LAUNCH();
}

void convert_f32_to_bf16(__nv_bfloat16* dst, const float* src, int64_t n, cudaStream_t stream) {
  check_n("convert_f32_to_bf16", n);
  TS_CHECK(dst != nullptr && src != nullptr, "[convert_f32_to_bf16] dst or src is null");
  if (n == 0) return;
  const unsigned grid = grid_for(n / 8 + 1, kThreads);
  if (all_aligned16({dst, src}))
    convert_kernel<__nv_bfloat16, float, 8><<<grid, kThreads, 0, stream>>>(dst, src, n);
  else
    convert_kernel<__nv_bfloat16, float, 1><<<grid, kThreads, 0, stream>>>(dst, src, n);
  TS_CUDA_CHECK_LAUNCH();
}

void round_to_bf16(float* x, __nv_bfloat16* keep, int64_t n, cudaStream_t stream) {
  check_n("round_to_bf16", n);
  TS_CHECK(x != nullptr, "[round_to_bf16] x is null");
  if (n == 0) return;
  const unsigned grid = grid_for(n / 8 + 1, kThreads);
  if (all_aligned16({x, keep}))
    round_bf16_kernel<8><<<grid, kThreads, 0, stream>>>(x, keep, n);
  else
    round_bf16_kernel<1><<<grid, kThreads, 0, stream>>>(x, keep, n);
  TS_CUDA_CHECK_LAUNCH();
}

void convert_bf16_to_f32(float* dst, const __nv_bfloat16* src, int64_t n, cudaStream_t stream) {
  check_n("convert_bf16_to_f32", n);
  TS_CHECK(dst != nullptr && src != nullptr, "[convert_bf16_to_f32] dst or src is null");
  if (n == 0) return;
  const unsigned grid = grid_for(n / 8 + 1, kThreads);
  if (all_aligned16({dst, src}))
    convert_kernel<float, __nv_bfloat16, 8><<<grid, kThreads, 0, stream>>>(dst, src, n);
  else
    convert_kernel<float, __nv_bfloat16, 1><<<grid, kThreads, 0, stream>>>(dst, src, n);
  TS_CUDA_CHECK_LAUNCH();
}

#define TS_INSTANTIATE(E)                                                                  \
  template void gelu_forward<E>(E*, const E*, int64_t, cudaStream_t);                      \
  template void gelu_backward<E>(E*, const E*, const E*, int64_t, cudaStream_t);           \
  template void add<E>(E*, const E*, const E*, int64_t, cudaStream_t);                     \
  template void swiglu_forward<E>(E*, const E*, const E*, int64_t, int64_t, cudaStream_t); \
  template void swiglu_backward<E>(E*, E*, const E*, const E*, const E*, int64_t, int64_t, \
                                   cudaStream_t);                                          \
  template void geglu_forward<E>(E*, const E*, const E*, int64_t, int64_t, cudaStream_t);  \
  template void geglu_backward<E>(E*, E*, const E*, const E*, const E*, int64_t, int64_t,  \
                                  cudaStream_t);                                           \
  template void scale<E>(E*, int64_t, float, cudaStream_t);
TS_INSTANTIATE(float)
TS_INSTANTIATE(__nv_bfloat16)
#undef TS_INSTANTIATE

}  // namespace tessera::cuda
