// CUDA device discovery and the error helper for the CUDA backend.
#include <cuda_runtime.h>

#include "backend/cuda/ops_backend.h"
#include "backend/device.h"
#include "core/error.h"

namespace tessera::backend {

bool cuda_built() {
  return true;
}

void register_cuda_ops_backend() {
  cuda::register_ops_backend();
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string cuda_device_summary() {
  if (cuda_device_count() == 0) return "built with CUDA, but no CUDA device is present";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "cannot query CUDA device 0";
  return cat(p.name, ", ", p.totalGlobalMem >> 30, " GiB, sm_", p.major, p.minor);
}

}  // namespace tessera::backend
