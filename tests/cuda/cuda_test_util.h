// Helpers for CUDA kernel tests: skip with the reason when no device is present, a small
// device array that copies to and from host vectors, and 16-bit (bf16/f16) test inputs.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/device.h"
#include "core/dtype.h"

// Every CUDA test starts with this: on a machine without a GPU the test is reported as SKIPPED
// (ctest shows it as skipped, never as passed) with the reason printed.
#define TS_REQUIRE_CUDA_DEVICE()                                                       \
  do {                                                                                 \
    if (::tessera::backend::cuda_device_count() == 0)                                  \
      GTEST_SKIP() << "no CUDA device: " << ::tessera::backend::cuda_device_summary(); \
  } while (0)

namespace tessera::cuda::test {

// Owns n elements of device memory; plain cudaMalloc so kernel tests do not depend on the pool.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    TS_CUDA_CHECK(cudaMalloc(&p_, (n ? n : 1) * sizeof(T)));
    TS_CUDA_CHECK(cudaMemset(p_, 0, (n ? n : 1) * sizeof(T)));
    // cudaMemset may return before it is done, and the kernels under test run on non-blocking
    // streams that do not wait for the default stream.
    TS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void upload(const std::vector<T>& host) {
    TS_CUDA_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return once the bytes are staged, before they land.
    TS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    TS_CUDA_CHECK(cudaDeviceSynchronize());
    TS_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() { return p_; }
  const T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Random values already representable in 16 bits (bf16 or f16), so host and device see the
// same inputs and only the accumulation differs.
inline std::vector<float> random_16bit(size_t n, float lo, float hi, DType t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) {
    const float f = u(rng);
    e = t == DType::bf16 ? bf16_to_f32(f32_to_bf16(f)) : f16_to_f32(f32_to_f16(f));
  }
  return x;
}
inline std::vector<uint16_t> to_16bit(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    h[i] = t == DType::bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
  return h;
}
}  // namespace tessera::cuda::test
