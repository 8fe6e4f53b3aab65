// Error checks for CUDA runtime, cuBLASLt and NCCL calls: a failed call throws tessera::Error
// naming the call, its source line and the library's own message.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace tessera::cuda {

[[noreturn]] inline void fail_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  fail("[cuda] ", expr, " failed at ", file, ":", line, ": ", cudaGetErrorName(e), " (",
       cudaGetErrorString(e), ")");
}

[[noreturn]] inline void fail_cublas(cublasStatus_t s, const char* expr, const char* file,
                                     int line) {
  fail("[cublasLt] ", expr, " failed at ", file, ":", line, ": status ", static_cast<int>(s));
}

}  // namespace tessera::cuda

#define TS_CUDA_CHECK(expr)                                                \
  do {                                                                     \
    cudaError_t ts_cuda_err_ = (expr);                                     \
    if (ts_cuda_err_ != cudaSuccess)                                       \
      ::tessera::cuda::fail_cuda(ts_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define TS_CUBLAS_CHECK(expr)                                                 \
  do {                                                                        \
    cublasStatus_t ts_cublas_st_ = (expr);                                    \
    if (ts_cublas_st_ != CUBLAS_STATUS_SUCCESS)                               \
      ::tessera::cuda::fail_cublas(ts_cublas_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// Checks the launch of the kernel just issued (bad configuration, missing image for this GPU).
#define TS_CUDA_CHECK_LAUNCH() TS_CUDA_CHECK(cudaGetLastError())
