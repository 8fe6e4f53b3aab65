// The cudaMalloc backend of the caching device allocator and the per-device pools.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/memory_pool.h"
#include "backend/cuda/runtime.h"

namespace tessera::cuda {

void* CudaMallocBackend::allocate(size_t bytes) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // out of memory is not sticky: clear it so later calls start clean
    return nullptr;
  }
  TS_CUDA_CHECK(e);
  return p;
}

void CudaMallocBackend::release(void* p, size_t) noexcept {
  // Errors are ignored: this runs in destructors, possibly after the runtime has shut down.
  int previous = -1;
  const bool switch_device = cudaGetDevice(&previous) == cudaSuccess && previous != device_;
  if (switch_device) cudaSetDevice(device_);
  cudaFree(p);
  if (switch_device) cudaSetDevice(previous);
}

MemoryPool& MemoryPool::for_device(int device) {
  static std::mutex mu;
  static auto* pools = new std::vector<std::unique_ptr<MemoryPool>>();
  const int n = device_count();
  TS_CHECK(device >= 0 && device < n, "[cuda pool] device ", device, " out of range (", n,
           " devices)");
  std::lock_guard<std::mutex> lock(mu);
  if (pools->size() < static_cast<size_t>(n)) pools->resize(n);
  auto& slot = (*pools)[device];
  if (!slot) slot = std::make_unique<MemoryPool>(device);
  return *slot;
}

void* MemoryPool::allocate(size_t bytes, cudaStream_t stream) {
  return cache_.allocate(bytes, reinterpret_cast<uintptr_t>(stream));
}

void MemoryPool::synchronize() {
  {
    DeviceGuard guard(device());
    TS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  cache_.mark_all_reusable();
}

}  // namespace tessera::cuda
