// bf16 GEMM through our cuBLASLt wrapper and through plain cublasGemmEx in the same run (the
// wrapper should cost nothing), and the device's measured memory bandwidth (copy and read-only
// reduction) that other benches and docs quote as "measured HBM bandwidth". JSON lines out.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/runtime.h"
#include "backend/device.h"

using namespace tessera;
using namespace tessera::cuda;

namespace {

// Random bf16 in [-1, 1) from a hash of the index: random data draws realistic power (zeros
// run faster than real weights).
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    p[i] = __float2bfloat16(static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// Sums n4 float4s: a read-only stream with four independent loads in flight per thread.
__global__ void sum_float4(const float4* __restrict__ p, int64_t n4, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.f;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    const float4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc += (a.x + a.y + a.z + a.w) + (b.x + b.y + b.z + b.w) + (c.x + c.y + c.z + c.w) +
           (d.x + d.y + d.z + d.w);
  }
  for (; i < n4; i += stride) {
    const float4 a = p[i];
    acc += a.x + a.y + a.z + a.w;
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0.f;
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) atomicAdd(out, acc);
  }
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct GemmShape {
  int64_t m, n, k;
  const char* label;
};

void bench_gemm(const DeviceInfo& info, cublasHandle_t blas, cudaStream_t stream,
                const GemmShape& s) {
  const int64_t M = s.m, N = s.n, K = s.k;
  __nv_bfloat16 *x = nullptr, *w = nullptr, *y = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&x, M * K * sizeof(__nv_bfloat16)));
  TS_CUDA_CHECK(cudaMalloc(&w, N * K * sizeof(__nv_bfloat16)));
  TS_CUDA_CHECK(cudaMalloc(&y, M * N * sizeof(__nv_bfloat16)));
  fill_bf16<<<1024, 256, 0, stream>>>(x, M * K, 1);
  TS_CUDA_CHECK_LAUNCH();
  fill_bf16<<<1024, 256, 0, stream>>>(w, N * K, 2);
  TS_CUDA_CHECK_LAUNCH();

  // y (M,N) = x (M,K) W^T, W (N,K): the forward layout.
  LtGemmArgs g;
  g.trans_b = true;
  g.m = M, g.n = N, g.k = K;
  g.a = x, g.a_type = LtType::bf16, g.lda = K;
  g.b = w, g.b_type = LtType::bf16, g.ldb = K;
  g.c = y, g.c_type = LtType::bf16, g.ldc = N;
  auto ours = [&] { gemm_lt(g, stream); };
  // The same product in cuBLAS's column-major terms: y^T (N,M) = W (N,K as K,N stored)^T x^T.
  auto theirs = [&] {
    const float alpha = 1.f, beta = 0.f;
    TS_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N),
                                 static_cast<int>(M), static_cast<int>(K), &alpha, w, CUDA_R_16BF,
                                 static_cast<int>(K), x, CUDA_R_16BF, static_cast<int>(K), &beta, y,
                                 CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  };

  const double flops = 2.0 * M * N * K;
  // About 0.3 s per implementation whatever the shape, at least 10 and at most 200 repetitions.
  const int reps = static_cast<int>(std::clamp(0.3 / (flops / 7e14), 10.0, 200.0));
  for (int i = 0; i < 3; ++i) {
    ours();
    theirs();
  }
  std::vector<Event> start(2 * reps), stop(2 * reps);
  // Alternate the two so clocks and temperature affect both alike.
  for (int r = 0; r < reps; ++r) {
    start[2 * r].record(stream);
    ours();
    stop[2 * r].record(stream);
    start[2 * r + 1].record(stream);
    theirs();
    stop[2 * r + 1].record(stream);
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> t_ours, t_theirs;
  for (int r = 0; r < reps; ++r) {
    t_ours.push_back(stop[2 * r].elapsed_ms_since(start[2 * r]));
    t_theirs.push_back(stop[2 * r + 1].elapsed_ms_since(start[2 * r + 1]));
  }
  const double ms_ours = median(t_ours), ms_theirs = median(t_theirs);
  const double peak = info.peaks.bf16;
  for (int which = 0; which < 2; ++which) {
    const double ms = which == 0 ? ms_ours : ms_theirs;
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf(
        "{\"bench\":\"gemm_bf16\",\"impl\":\"%s\",\"shape\":\"%s\",\"M\":%lld,\"N\":%lld,"
        "\"K\":%lld,\"layout\":\"x_Wt\",\"reps\":%d,\"median_ms\":%.4f,\"tflops\":%.1f,"
        "\"frac_peak\":%.3f,\"peak_tflops\":%.1f,\"gpu\":\"%s\"}\n",
        which == 0 ? "tessera_cublaslt" : "cublas_gemmex", s.label, static_cast<long long>(M),
        static_cast<long long>(N), static_cast<long long>(K), reps, ms, tflops,
        peak > 0 ? tflops * 1e12 / peak : 0.0, peak / 1e12, info.name.c_str());
  }
  std::printf(
      "{\"bench\":\"gemm_bf16_ratio\",\"shape\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,"
      "\"ours_over_cublas\":%.3f,\"gpu\":\"%s\"}\n",
      s.label, static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
      ms_theirs / ms_ours, info.name.c_str());
  std::fflush(stdout);
  TS_CUDA_CHECK(cudaFree(x));
  TS_CUDA_CHECK(cudaFree(w));
  TS_CUDA_CHECK(cudaFree(y));
}

void bench_bandwidth(const DeviceInfo& info, cudaStream_t stream) {
  // 2 GiB per buffer: far past the 50-60 MB L2, so every byte comes from HBM.
  const size_t bytes = std::min<size_t>(size_t{2} << 30, info.total_memory / 8);
  void *src = nullptr, *dst = nullptr;
  float* sum = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&src, bytes));
  TS_CUDA_CHECK(cudaMalloc(&dst, bytes));
  TS_CUDA_CHECK(cudaMalloc(&sum, sizeof(float)));
  TS_CUDA_CHECK(cudaMemsetAsync(src, 0x3c, bytes, stream));  // finite floats (~0.0115)
  const int reps = 20;
  const int blocks = info.sm_count * 8, threads = 256;
  const int64_t n4 = static_cast<int64_t>(bytes / sizeof(float4));
  for (int kind = 0; kind < 2; ++kind) {
    auto run = [&] {
      if (kind == 0) {
        TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
      } else {
        sum_float4<<<blocks, threads, 0, stream>>>(static_cast<const float4*>(src), n4, sum);
        TS_CUDA_CHECK_LAUNCH();
      }
    };
    run();
    run();
    std::vector<Event> start(reps), stop(reps);
    for (int r = 0; r < reps; ++r) {
      start[r].record(stream);
      run();
      stop[r].record(stream);
    }
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) t.push_back(stop[r].elapsed_ms_since(start[r]));
    const double ms = median(t);
    // A copy reads and writes every byte; the reduction only reads.
    const double moved = kind == 0 ? 2.0 * bytes : 1.0 * bytes;
    const double gbps = moved / (ms * 1e-3) / 1e9;
    std::printf(
        "{\"bench\":\"hbm_bandwidth\",\"kind\":\"%s\",\"bytes\":%zu,\"bytes_moved\":%.0f,"
        "\"reps\":%d,\"median_ms\":%.4f,\"gbps\":%.1f,\"frac_theoretical\":%.3f,"
        "\"theoretical_gbps\":%.1f,\"gpu\":\"%s\"}\n",
        kind == 0 ? "d2d_copy" : "read_reduce", bytes, moved, reps, ms, gbps,
        info.memory_bandwidth > 0 ? gbps * 1e9 / info.memory_bandwidth : 0.0,
        info.memory_bandwidth / 1e9, info.name.c_str());
  }
  std::fflush(stdout);
  TS_CUDA_CHECK(cudaFree(src));
  TS_CUDA_CHECK(cudaFree(dst));
  TS_CUDA_CHECK(cudaFree(sum));
}

}  // namespace

int main() {
  if (backend::cuda_device_count() == 0) {
    std::printf("gemm_bench: skipped, %s\n", backend::cuda_device_summary().c_str());
    return 0;
  }
  try {
    set_device(0);
    const DeviceInfo info = device_info(0);
    std::fprintf(stderr, "gemm_bench: %s, %d SMs, peaks: %s\n", info.name.c_str(), info.sm_count,
                 info.peaks.source.c_str());
    Stream stream;
    cublasHandle_t blas = nullptr;
    TS_CUBLAS_CHECK(cublasCreate(&blas));
    TS_CUBLAS_CHECK(cublasSetStream(blas, stream.get()));
    const GemmShape shapes[] = {
        {8192, 8192, 8192, "square_8192"},  {4096, 4096, 4096, "square_4096"},
        {16 * 1024, 2304, 768, "gpt2_qkv"}, {16 * 1024, 768, 768, "gpt2_attn_proj"},
        {16 * 1024, 3072, 768, "gpt2_fc"},  {16 * 1024, 768, 3072, "gpt2_fc_proj"}};
    for (const GemmShape& s : shapes) bench_gemm(info, blas, stream.get(), s);
    cublasDestroy(blas);
    bench_bandwidth(info, stream.get());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
