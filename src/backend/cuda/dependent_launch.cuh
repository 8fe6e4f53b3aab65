// Programmatic dependent launch: the device calls and the launch helper for kernels that may
// overlap their start with the end of the kernel before them.
//
// A kernel launched by launch_dependent() may begin while its predecessor on the stream still
// runs, so it must follow one rule: before grid_dependency_wait() it reads nothing but memory no
// kernel writes (the weights) and writes nothing at all. The wait returns once every earlier
// kernel has completed and its writes are visible; each such kernel itself waited before it
// finished, so the order holds transitively along the stream. Kernels with the wait may also be
// launched the ordinary way (the wait is then a no-op), and on GPUs below sm_90 both calls
// compile to nothing.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.h"

namespace tessera::cuda {

// Lets the next kernel on the stream be scheduled as soon as SMs free up (its blocks then sit
// in their own wait, not ours). Called first thing: it orders nothing, it only hides launch
// latency and the tail of this grid.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Blocks until the kernels this one depends on have completed and their memory is visible.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Warms L2 with the 128-byte line holding p (weights a kernel reads before its wait).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// kernel<<<grid, block, smem, stream>>>(args...), marked as a programmatic dependent of the
// kernel before it when dependent_launch_enabled(). The kernel must follow the rule above.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch_enabled() ? 1 : 0;
  TS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace tessera::cuda
