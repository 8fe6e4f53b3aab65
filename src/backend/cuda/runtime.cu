// CUDA runtime helpers: device queries, the tensor-core peak table, streams, events and copies.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/memory_pool.h"
#include "backend/cuda/runtime.h"
#include "backend/device.h"
#include "core/error.h"

namespace tessera::cuda {

namespace {

bool has(std::string_view name, std::string_view part) {
  return name.find(part) != std::string_view::npos;
}

}  // namespace

TensorPeaks tensor_peaks(int sm_major, int sm_minor, std::string_view name) {
  TensorPeaks p;
  // Vendor datasheets halve the "with sparsity" figures to get these dense rates.
  if (sm_major == 9 && sm_minor == 0) {
    if (has(name, "PCIe")) {
      p = {756.5e12, 756.5e12, 1513e12, "table: H100 PCIe (sm_90)"};
    } else if (has(name, "NVL")) {
      p = {835.5e12, 835.5e12, 1670.5e12, "table: H100/H200 NVL (sm_90)"};
    } else if (has(name, "H100") || has(name, "H200") || has(name, "H800") || has(name, "GH200")) {
      p = {989.4e12, 989.4e12, 1978.9e12, "table: H100/H200 SXM (sm_90)"};
    }
  } else if (sm_major == 8 && sm_minor == 0 && (has(name, "A100") || has(name, "A800"))) {
    p = {312e12, 312e12, 0, "table: A100 (sm_80; no fp8)"};
  } else if (sm_major == 8 && sm_minor == 9 && has(name, "L40S")) {
    p = {362.05e12, 362.05e12, 733e12, "table: L40S (sm_89)"};
  }
  if (p.source.empty())
    p.source = cat("unknown GPU '", name, "' (sm_", sm_major, sm_minor,
                   "): no entry in the peak table, peaks reported as 0");
  return p;
}

double theoretical_bandwidth(int64_t memory_clock_khz, int64_t bus_width_bits) {
  return 2.0 * static_cast<double>(memory_clock_khz) * 1e3 * static_cast<double>(bus_width_bits) /
         8.0;
}

int device_count() {
  return backend::cuda_device_count();
}

void require_device(int index, const char* what) {
  const int n = device_count();
  TS_CHECK(n > 0, "[cuda] ", what, ": no CUDA device is present");
  TS_CHECK(index >= 0 && index < n, "[cuda] ", what, ": no CUDA device ", index, " (", n,
           " present)");
}

void set_device(int index) {
  const int n = device_count();
  TS_CHECK(index >= 0 && index < n, "[cuda] set_device: index ", index, " out of range (", n,
           " devices)");
  TS_CUDA_CHECK(cudaSetDevice(index));
}

int current_device() {
  int d = 0;
  TS_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

DeviceInfo device_info(int index) {
  const int n = device_count();
  TS_CHECK(index >= 0 && index < n, "[cuda] device_info: index ", index, " out of range (", n,
           " devices)");
  cudaDeviceProp p{};
  TS_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.total_memory = p.totalGlobalMem;
  // CUDA 13 dropped the clock fields from cudaDeviceProp; the attributes remain.
  int clock_khz = 0, bus_bits = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, index));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index));
  d.memory_clock_khz = clock_khz;
  d.memory_bus_width_bits = bus_bits;
  d.memory_bandwidth = theoretical_bandwidth(clock_khz, bus_bits);
  d.l2_bytes = p.l2CacheSize;
  d.shared_memory_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  d.peaks = tensor_peaks(p.major, p.minor, d.name);
  return d;
}

DeviceGuard::DeviceGuard(int index) {
  TS_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) TS_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

Stream::Stream() {
  TS_CUDA_CHECK(cudaGetDevice(&device_));
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
}

void Stream::retire() noexcept {
  if (!s_) return;
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  // Only a stream whose work has finished may give its blocks to other streams; if the wait
  // fails (a sticky device error) they stay under its key, which is merely wasteful.
  if (cudaStreamSynchronize(s_) == cudaSuccess) {
    gemm_lt_retire_stream(s_);
    try {
      MemoryPool::for_device(device_).retire_stream(s_);
    } catch (...) {  // the pool exists whenever it holds blocks of this stream; never throw here
    }
  }
  cudaStreamDestroy(s_);
  s_ = nullptr;
  if (switched) cudaSetDevice(previous);
}

Stream::~Stream() {
  retire();
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    retire();
    s_ = o.s_;
    device_ = o.device_;
    o.s_ = nullptr;
  }
  return *this;
}

void Stream::synchronize() const {
  TS_CUDA_CHECK(cudaStreamSynchronize(s_));
}

Event::Event() {
  TS_CUDA_CHECK(cudaEventCreate(&e_));
}

Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_) cudaEventDestroy(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

void Event::record(cudaStream_t stream) {
  TS_CUDA_CHECK(cudaEventRecord(e_, stream));
}

void Event::synchronize() const {
  TS_CUDA_CHECK(cudaEventSynchronize(e_));
}

float Event::elapsed_ms_since(const Event& start) const {
  synchronize();
  float ms = 0;
  TS_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) {
    TS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    // From pageable host memory cudaMemcpy may return once the bytes are staged for DMA, before
    // they reach the device, and our streams are non-blocking (they do not wait for the default
    // stream's copy): wait for it, as "blocking" promises.
    TS_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) TS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void copy_device_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) {
    TS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    // cudaMemcpy device-to-device may return before the copy finishes; honour "blocking".
    TS_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void copy_to_device_async(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes) TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
}

void copy_to_host_async(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes) TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
}

void copy_device_to_device_async(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes) TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

void synchronize() {
  TS_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace tessera::cuda
