// Memory on a device: buffers allocated through the device's backend, copies between host memory
// and it, and waiting for a context's ops. On the CPU a buffer is aligned host memory, a copy is
// memcpy and ops finish before they return; on an accelerator ops are queued on ctx.stream and a
// copy to the host waits for the stream (so its result can be read at once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/context.h"

namespace tessera::ops {

enum class CopyKind : uint8_t { host_to_device, device_to_host, device_to_device };

// An owned allocation of `bytes` on device d (64-byte aligned or better), uninitialized.
class Buffer {
 public:
  Buffer() = default;
  // Throws naming the device and the size when the backend cannot allocate it.
  Buffer(Device d, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept : device_(o.device_), data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Device device() const { return device_; }
  size_t size() const { return bytes_; }
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  Device device_ = Device::cpu;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Copies `bytes` from src to dst, where `kind` says which of them is in ctx.device's memory (the
// other in host memory). Ordered after the ops already issued on ctx; device_to_host returns once
// the data is in dst.
void copy(const Context& ctx, void* dst, const void* src, size_t bytes, CopyKind kind);
// Returns once every op and copy issued on ctx has finished.
void synchronize(const Context& ctx);
// p (bytes) = 0, in ctx.device's memory, ordered like an op.
void zero(const Context& ctx, void* p, size_t bytes);

// Host access to n elements of T at p in ctx.device's memory: on the CPU that memory itself; on a
// device a host copy, filled from p at construction unless the mode is write, and copied back to
// p by flush() unless the mode is read. For loading, saving and initializing, not for steps.
template <typename T>
class HostMirror {
 public:
  enum Mode { read, write, read_write };
  HostMirror(const Context& ctx, T* p, int64_t n, Mode mode)
      : ctx_(ctx), p_(p), n_(n), mode_(mode) {
    if (ctx.device == Device::cpu) return;
    copy_.resize(static_cast<size_t>(n));
    if (mode != write)
      copy(ctx, copy_.data(), p, static_cast<size_t>(n) * sizeof(T), CopyKind::device_to_host);
  }
  T* data() { return copy_.empty() ? p_ : copy_.data(); }
  void flush() {
    if constexpr (!std::is_const_v<T>) {
      if (copy_.empty() || mode_ == read) return;
      copy(ctx_, p_, copy_.data(), static_cast<size_t>(n_) * sizeof(T), CopyKind::host_to_device);
    }
  }

 private:
  Context ctx_;
  T* p_;
  int64_t n_;
  Mode mode_;
  std::vector<std::remove_const_t<T>> copy_;
};

}  // namespace tessera::ops
