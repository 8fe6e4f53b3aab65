// matmul_wt on the GPU for decode batches (M <= 8): argument checks, the activation quantizer,
// the f16/bf16 matvec kernel, and the per-stream scratch for the quantized activations.
#include "backend/cuda/quant_matvec.h"

#include <cuda_fp16.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/bf16_convert.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/matvec_common.cuh"
#include "core/error.h"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = kMatvecWarpRows;

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

struct ActLayout {
  size_t q = 0, d = 0, s = 0, total = 0;  // byte offsets of xq, xd, xs in the workspace
};
ActLayout act_layout(int64_t M, int64_t K, int64_t block) {
  ActLayout l;
  l.q = 0;
  l.d = align256(static_cast<size_t>(M * K));
  l.s = l.d + align256(static_cast<size_t>(M * (K / block)) * sizeof(float));
  l.total = l.s + align256(static_cast<size_t>(M * (K / 32)) * sizeof(int32_t));
  return l;
}

// One warp per (row m, activation block), quantized by quantize_act_block (matvec_common.cuh).
template <int kBlock>
__global__ void __launch_bounds__(256)
    quantize_acts_kernel(const float* __restrict__ x, int64_t M, int64_t K, int8_t* __restrict__ xq,
                         float* __restrict__ xd, int32_t* __restrict__ xs) {
  constexpr int E = kBlock / 32;
  allow_dependent_launch();
  grid_dependency_wait();  // x comes from the kernel before
  const int lane = threadIdx.x % 32;
  const int64_t nb = K / kBlock;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (g >= M * nb) return;
  const int64_t m = g / nb, b = g % nb;
  const float* xb = x + m * K + b * kBlock;
  float v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) v[e] = xb[lane + 32 * e];
  quantize_act_block<kBlock>(v, lane, xq + m * K + b * kBlock, xd + m * nb + b,
                             xs + m * (K / 32) + b * E);
}

// Two packed 16-bit weights to f32.
template <bool kBf16>
__device__ __forceinline__ float2 widen2(uint32_t u) {
  if constexpr (kBf16) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
  }
}
// An activation as the product reads it: rounded to bf16 against bf16 weights (ops::matmul_wt's
// rule at every row count), as is against f16 ones.
template <bool kBf16>
__device__ __forceinline__ float act(float x) {
  if constexpr (kBf16) return bf16_bits_to_f32(f32_to_bf16_bits(x));
  return x;
}
template <bool kBf16>
__device__ __forceinline__ float widen1(uint16_t h) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
  } else {
    return __half2float(__ushort_as_half(h));
  }
}

// f16/bf16 weights: a warp owns kRows rows; lane i reads 8 weights (16 bytes) at 8i + 256 j of
// each row, so a warp instruction reads 512 contiguous bytes. x is f32 through L1 (float4),
// rounded to bf16 for bf16 weights (act).
// `vec` (w and x 16-byte aligned, K % 8 == 0) enables the 128-bit path; otherwise, and for
// nothing else, every element goes through the scalar loop.
template <bool kBf16, int M>
__global__ void __launch_bounds__(kWarps * 32)
    half_matvec_kernel(float* __restrict__ y, int64_t ldy, const float* __restrict__ x, int64_t K,
                       const uint16_t* __restrict__ w, int64_t N, const float* __restrict__ bias,
                       bool vec) {
  allow_dependent_launch();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRows;
  if (n0 >= N) return;
  const int64_t k_vec = vec ? K / 8 * 8 : 0;
  // The first 512 bytes of each of the warp's rows towards L2 while the kernel before finishes
  // (weights only: no kernel writes them).
  if (8 * lane < k_vec) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (n0 + r < N) prefetch_l2(w + (n0 + r) * K + 8 * lane);
  }
  grid_dependency_wait();
  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

#pragma unroll 2
  for (int64_t k = 8 * lane; k < k_vec; k += 256) {
    float wf[kRows][8];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t n = n0 + r;
      const uint4 raw = n < N ? load_stream_v4(w + n * K + k) : make_uint4(0, 0, 0, 0);
      const uint32_t parts[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = widen2<kBf16>(parts[j]);
        wf[r][2 * j] = f.x;
        wf[r][2 * j + 1] = f.y;
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(x + m * K + k));
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(x + m * K + k + 4));
      const float xv[8] = {act<kBf16>(x0.x), act<kBf16>(x0.y), act<kBf16>(x0.z), act<kBf16>(x0.w),
                           act<kBf16>(x1.x), act<kBf16>(x1.y), act<kBf16>(x1.z), act<kBf16>(x1.w)};
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][m] = fmaf(wf[r][j], xv[j], acc[r][m]);
    }
  }
  for (int64_t k = k_vec + lane; k < K; k += 32) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t n = n0 + r;
      const float wv = n < N ? widen1<kBf16>(w[n * K + k]) : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] = fmaf(wv, act<kBf16>(x[m * K + k]), acc[r][m]);
    }
  }

  warp_sum_store<kRows, M>(acc, lane, n0, N, bias, y, ldy);
}

template <bool kBf16, int M>
void launch_half(float* y, int64_t ldy, const float* x, int64_t K, const void* w, int64_t N,
                 const float* bias, cudaStream_t stream) {
  const bool vec = K % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int64_t grid = (N + kWarps * kRows - 1) / (kWarps * kRows);
  TS_CHECK(grid <= 0x7fffffff, "[cuda matmul_wt] N=", N, " needs too many thread blocks");
  launch_dependent(half_matvec_kernel<kBf16, M>, dim3(static_cast<unsigned>(grid)),
                   dim3(kWarps * 32), 0, stream, y, ldy, x, K, static_cast<const uint16_t*>(w), N,
                   bias, vec);
}

template <bool kBf16>
void launch_half_m(float* y, int64_t ldy, const float* x, int64_t M, int64_t K, const void* w,
                   int64_t N, const float* bias, cudaStream_t stream) {
  switch (M) {
#define TS_CASE(m) \
  case m:          \
    return launch_half<kBf16, m>(y, ldy, x, K, w, N, bias, stream);
    TS_CASE(1)
    TS_CASE(2)
    TS_CASE(3)
    TS_CASE(4)
    TS_CASE(5)
    TS_CASE(6)
    TS_CASE(7)
    TS_CASE(8)
#undef TS_CASE
    default:
      fail("[cuda matmul_wt] M=", M, " is outside 1..", kMatvecMaxRows);
  }
}

void check_args(int64_t ldy, int64_t M, int64_t K, DType w_type, int64_t N) {
  TS_CHECK(M >= 0, "[cuda matmul_wt] rows M=", M, " must be >= 0");
  TS_CHECK(M <= kMatvecMaxRows, "[cuda matmul_wt] M=", M, " is above the matvec limit of ",
           kMatvecMaxRows, " rows; larger batches go to the GEMM");
  TS_CHECK(N >= 0, "[cuda matmul_wt] outputs N=", N, " must be >= 0");
  TS_CHECK(K > 0, "[cuda matmul_wt] inner dimension K=", K, " must be positive");
  TS_CHECK(ldy >= N, "[cuda matmul_wt] ldy=", ldy, " is smaller than N=", N);
  // The types the kernels decode, named one by one: act_block_elems also answers for block
  // types without a kernel here (q2_k, q3_k, the CPU's row-interleaved layouts), which must be
  // refused before any activation is quantized or scratch allocated.
  bool supported = false;
  for (DType t : {DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0,
                  DType::q5_1, DType::q4_k, DType::q5_k, DType::q6_k})
    supported = supported || w_type == t;
  TS_CHECK(supported, "[cuda matmul_wt] weight type ", dtype_name(w_type),
           " is not supported (f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)");
  const int64_t block = traits(w_type).block_elems;
  TS_CHECK(K % block == 0, "[cuda matmul_wt] K=", K, " is not a multiple of the ",
           dtype_name(w_type), " block size ", block);
}

}  // namespace

size_t matmul_wt_workspace_bytes(int64_t M, int64_t K, DType w_type) {
  const int64_t block = act_block_elems(w_type);
  if (block == 0 || M <= 0 || K <= 0 || K % block != 0) return 0;
  return act_layout(M, K, block).total;
}

void matmul_wt(float* y, int64_t ldy, const float* x, int64_t M, int64_t K, const void* w,
               DType w_type, int64_t N, const float* bias, void* workspace, size_t workspace_bytes,
               cudaStream_t stream) {
  check_args(ldy, M, K, w_type, N);
  if (M == 0 || N == 0) return;
  TS_CHECK(y && x && w, "[cuda matmul_wt] y, x and w must be device pointers (got null)");
  const int64_t block = act_block_elems(w_type);
  if (block == 0) {
    if (w_type == DType::bf16)
      launch_half_m<true>(y, ldy, x, M, K, w, N, bias, stream);
    else
      launch_half_m<false>(y, ldy, x, M, K, w, N, bias, stream);
    return;
  }
  const ActLayout l = act_layout(M, K, block);
  TS_CHECK(workspace != nullptr && workspace_bytes >= l.total, "[cuda matmul_wt] workspace of ",
           workspace_bytes, " bytes is smaller than the ", l.total, " bytes M=", M, " K=", K,
           " needs");
  TS_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0,
           "[cuda matmul_wt] workspace must be 16-byte aligned");
  auto* base = static_cast<uint8_t*>(workspace);
  auto* xq = reinterpret_cast<int8_t*>(base + l.q);
  auto* xd = reinterpret_cast<float*>(base + l.d);
  auto* xs = reinterpret_cast<int32_t*>(base + l.s);
  const int64_t warps = M * (K / block);
  const int64_t grid = (warps + 7) / 8;
  TS_CHECK(grid <= 0x7fffffff, "[cuda matmul_wt] K=", K, " needs too many thread blocks");
  launch_dependent(block == 32 ? quantize_acts_kernel<32> : quantize_acts_kernel<kQK_K>,
                   dim3(static_cast<unsigned>(grid)), dim3(256), 0, stream, x, M, K, xq, xd, xs);
  detail::launch_block_matvec(y, ldy, xq, xd, xs, M, K, w, w_type, N, bias, stream);
}

void quantize_acts(const float* x, const QuantizedActs& q, cudaStream_t stream) {
  TS_CHECK(q.M >= 1 && q.M <= kMatvecMaxRows && q.K > 0 && (q.block == 32 || q.block == kQK_K) &&
               q.K % q.block == 0,
           "[cuda quantize_acts] M=", q.M, " K=", q.K, " block=", q.block, " out of range");
  TS_CHECK(x && q.q && q.d && q.s, "[cuda quantize_acts] null pointer");
  const int64_t grid = (q.M * (q.K / q.block) + 7) / 8;
  TS_CHECK(grid <= 0x7fffffff, "[cuda quantize_acts] K=", q.K, " needs too many thread blocks");
  launch_dependent(q.block == 32 ? quantize_acts_kernel<32> : quantize_acts_kernel<kQK_K>,
                   dim3(static_cast<unsigned>(grid)), dim3(256), 0, stream, x, q.M, q.K, q.q, q.d,
                   q.s);
}

QuantizedActs quantized_acts_view(void* workspace, size_t workspace_bytes, int64_t M, int64_t K,
                                  DType w_type) {
  TS_CHECK(M >= 1 && M <= kMatvecMaxRows && K > 0, "[cuda quantized_acts_view] M=", M, " K=", K,
           " out of range");
  const int64_t block = act_block_elems(w_type);
  TS_CHECK(block > 0, "[cuda quantized_acts_view] weight type ", dtype_name(w_type),
           " takes float activations (nothing to quantize)");
  TS_CHECK(K % block == 0, "[cuda quantized_acts_view] K=", K, " is not a multiple of the ",
           dtype_name(w_type), " activation block ", block);
  const ActLayout l = act_layout(M, K, block);
  TS_CHECK(workspace != nullptr && workspace_bytes >= l.total,
           "[cuda quantized_acts_view] workspace of ", workspace_bytes,
           " bytes is smaller than the ", l.total, " bytes M=", M, " K=", K, " needs");
  TS_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0,
           "[cuda quantized_acts_view] workspace must be 16-byte aligned");
  auto* base = static_cast<uint8_t*>(workspace);
  QuantizedActs a;
  a.q = reinterpret_cast<int8_t*>(base + l.q);
  a.d = reinterpret_cast<float*>(base + l.d);
  a.s = reinterpret_cast<int32_t*>(base + l.s);
  a.M = M, a.K = K, a.block = block;
  return a;
}

void matmul_wt_quantized(float* y, int64_t ldy, const QuantizedActs& x, const void* w, DType w_type,
                         int64_t N, const float* bias, cudaStream_t stream) {
  check_args(ldy, x.M, x.K, w_type, N);
  TS_CHECK(x.block > 0 && x.block == act_block_elems(w_type), "[cuda matmul_wt_quantized] ",
           dtype_name(w_type), " takes activation blocks of ", act_block_elems(w_type),
           ", the activations were quantized in blocks of ", x.block);
  if (x.M == 0 || N == 0) return;
  TS_CHECK(y && w && x.q && x.d && x.s,
           "[cuda matmul_wt_quantized] y, w and the activations must be device pointers");
  detail::launch_block_matvec(y, ldy, x.q, x.d, x.s, x.M, x.K, w, w_type, N, bias, stream);
}

void matmul_wt(float* y, int64_t ldy, const float* x, int64_t M, int64_t K, const void* w,
               DType w_type, int64_t N, const float* bias, cudaStream_t stream) {
  check_args(ldy, M, K, w_type, N);
  if (M == 0 || N == 0) return;
  TS_CHECK(y && x && w, "[cuda matmul_wt] y, x and w must be device pointers (got null)");
  const size_t need = matmul_wt_workspace_bytes(M, K, w_type);
  if (need == 0) return matmul_wt(y, ldy, x, M, K, w, w_type, N, bias, nullptr, 0, stream);
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  // Leaked on purpose: freeing at exit would race the CUDA runtime's own teardown.
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, cudaStream_t>, Scratch>();
  int dev = 0;
  TS_CUDA_CHECK(cudaGetDevice(&dev));
  void* ws = nullptr;
  size_t ws_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    Scratch& s = (*cache)[{dev, stream}];
    if (s.bytes < need) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      TS_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
      TS_CHECK(capture == cudaStreamCaptureStatusNone, "[cuda matmul_wt] scratch of ", s.bytes,
               " bytes must grow to ", need,
               " while the stream is being captured: run the largest shape once before capture "
               "or pass a workspace");
      // Work already queued on this stream may still read the old buffer.
      TS_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (s.p) TS_CUDA_CHECK(cudaFree(s.p));
      s.p = nullptr;
      s.bytes = 0;
      const size_t grown = need < (1u << 20) ? (1u << 20) : need;  // fewer regrowths
      TS_CUDA_CHECK(cudaMalloc(&s.p, grown));
      s.bytes = grown;
    }
    ws = s.p;
    ws_bytes = s.bytes;
  }
  matmul_wt(y, ldy, x, M, K, w, w_type, N, bias, ws, ws_bytes, stream);
}

}  // namespace tessera::cuda
