// CUDA runtime helpers: device selection and description (with tensor-core peaks), RAII streams
// and events, host<->device copies.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::cuda {

// Dense (no sparsity) tensor-core peaks in FLOP/s; 0 where the table has no entry for the GPU.
struct TensorPeaks {
  double bf16 = 0, fp16 = 0, fp8 = 0;
  std::string source;  // which table row matched, or why none did
};

// Looks the GPU up by compute capability and marketing name (vendor datasheets, dense figures).
// Pure host code: no device needed.
TensorPeaks tensor_peaks(int sm_major, int sm_minor, std::string_view name);

// Theoretical DRAM bandwidth in bytes/s from the memory clock (kHz, as the driver reports it)
// and the bus width in bits; HBM and GDDR both transfer twice per reported clock.
double theoretical_bandwidth(int64_t memory_clock_khz, int64_t bus_width_bits);

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  size_t total_memory = 0;  // bytes
  int64_t memory_clock_khz = 0;
  int64_t memory_bus_width_bits = 0;
  double memory_bandwidth = 0;  // theoretical bytes/s
  int64_t l2_bytes = 0;
  int64_t shared_memory_per_block_optin = 0;  // bytes a block may ask for after opting in
  TensorPeaks peaks;
};

int device_count();  // 0 when no device (or no driver) is present
// Throws "[cuda] <what>: no CUDA device is present" (or "no CUDA device <index>").
void require_device(int index, const char* what);
void set_device(int index);
int current_device();
DeviceInfo device_info(int index);

// A yes/no property of the current device, worked out by `ask` once per device and cached
// (devices past the 64th are asked each time). Safe to call from several threads: a race only
// asks twice.
class PerDeviceFlag {
 public:
  template <typename Ask>
  bool get(Ask ask) {
    const int dev = current_device();
    if (dev < 0 || dev >= kMaxDevices) return ask();
    int c = cached_[dev].load(std::memory_order_relaxed);  // 0 unknown, 1 no, 2 yes
    if (c == 0) {
      c = ask() ? 2 : 1;
      cached_[dev].store(c, std::memory_order_relaxed);
    }
    return c == 2;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<int> cached_[kMaxDevices] = {};
};

// Makes `index` current for its scope and restores the previous device on exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// A non-blocking stream (does not serialize with the legacy default stream), owned, on the
// device current at construction. Destruction waits for the stream's work, then hands what was
// kept per stream (cuBLASLt workspace, cached pool blocks) back for any stream to use.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_), device_(o.device_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  void retire() noexcept;

  cudaStream_t s_ = nullptr;
  int device_ = 0;
};

// A timing event, owned.
class Event {
 public:
  Event();
  ~Event();
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  void synchronize() const;
  cudaEvent_t get() const { return e_; }
  // Milliseconds from `start` to this event; both must have been recorded and completed (this
  // call waits for this event first).
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

// Blocking copies (return once the data has arrived).
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_device_to_device(void* dst, const void* src, size_t bytes);
// Copies ordered on `stream`; the host buffer must stay alive (and, for truly asynchronous
// transfers, be pinned) until the stream reaches them.
void copy_to_device_async(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void copy_to_host_async(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void copy_device_to_device_async(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Waits for all work on the current device.
void synchronize();

}  // namespace tessera::cuda
