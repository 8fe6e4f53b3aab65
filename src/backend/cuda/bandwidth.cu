// The device's measured read bandwidth and tensor-core peak: the yardsticks for decode's roofline
// figure (weight bytes per token x tokens/s over what a plain streaming read achieves on this GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/runtime.h"
#include "backend/device.h"

namespace tessera::backend {
namespace {

// Read-only reduction: every byte is read once with 128-bit streaming loads; one partial sum per
// warp is kept (never written in practice) so the compiler cannot drop the loads.
__global__ void read_kernel(const float4* __restrict__ p, size_t n, float* __restrict__ out) {
  float s = 0.0f;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float4 v = __ldcs(p + i);
    s += v.x + v.y + v.z + v.w;
  }
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0 && s == 12345.0f) out[blockIdx.x] = s;
}

}  // namespace

double cuda_read_bandwidth(size_t bytes) {
  TS_CHECK(cuda_device_count() > 0, "[cuda] read bandwidth: no CUDA device is present");
  TS_CHECK(bytes >= (size_t{1} << 20) && bytes % 16 == 0, "[cuda] read bandwidth: bytes=", bytes,
           " must be at least 1 MiB and a multiple of 16");
  float4* buf = nullptr;
  float* out = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&buf, bytes));
  TS_CUDA_CHECK(cudaMalloc(&out, 1 << 20));
  TS_CUDA_CHECK(cudaMemset(buf, 0, bytes));
  int device = 0, sms = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaEvent_t a, b;
  TS_CUDA_CHECK(cudaEventCreate(&a));
  TS_CUDA_CHECK(cudaEventCreate(&b));
  const size_t n = bytes / sizeof(float4);
  std::vector<float> ms;
  for (int r = 0; r < 13; ++r) {  // 3 warmups, then 10 timed: the median
    TS_CUDA_CHECK(cudaEventRecord(a));
    read_kernel<<<sms * 8, 512>>>(buf, n, out);
    TS_CUDA_CHECK_LAUNCH();
    TS_CUDA_CHECK(cudaEventRecord(b));
    TS_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (r >= 3) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(buf);
  cudaFree(out);
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
}

double cuda_bf16_peak_flops() {
  TS_CHECK(cuda_device_count() > 0, "[cuda] bf16 peak: no CUDA device is present");
  return cuda::device_info(cuda::current_device()).peaks.bf16;
}

}  // namespace tessera::backend
