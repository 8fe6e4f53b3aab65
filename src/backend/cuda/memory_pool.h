// Caching device allocator: size classes, per-stream free lists and statistics over plain
// cudaMalloc. The caching logic is a host-only template (BlockCache) so it is tested without a GPU.
//
// Stream rule: allocation is host-synchronous. A block handed out for stream S may be used by
// work enqueued on S after the call returns. When freed, it goes to S's free list and is reused
// only by later requests on S (whose work is ordered after the earlier user's), or by any stream
// after MemoryPool::synchronize() (which waits for the device). A caller that used a block on
// another stream must synchronize that stream with S before freeing it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tessera::cuda {

// Requests up to kPoolSmallLimit are rounded up to kPoolSmallRound bytes, larger ones to
// kPoolLargeRound: many distinct small sizes share few classes, and large buffers (activations,
// weights) waste at most 2 MiB each.
constexpr size_t kPoolSmallRound = 512;
constexpr size_t kPoolLargeRound = size_t{2} << 20;
constexpr size_t kPoolSmallLimit = size_t{1} << 20;

inline size_t pool_size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t r = bytes <= kPoolSmallLimit ? kPoolSmallRound : kPoolLargeRound;
  TS_CHECK(bytes <= SIZE_MAX - r, "[cuda pool] request of ", bytes, " bytes is too large");
  return (bytes + r - 1) / r * r;
}

struct PoolStats {
  size_t bytes_in_use = 0;       // size classes of live blocks
  size_t peak_bytes_in_use = 0;  // high-water mark of bytes_in_use
  size_t bytes_cached = 0;       // freed blocks kept for reuse
  int64_t device_allocs = 0;     // backend (cudaMalloc) calls, failed ones included
  int64_t device_frees = 0;      // backend (cudaFree) calls
  int64_t requests = 0;          // allocate() calls
  int64_t cache_hits = 0;        // requests served from a free list
};

inline std::string describe_pool_stats(const PoolStats& s) {
  return cat("in use ", s.bytes_in_use, " B, peak ", s.peak_bytes_in_use, " B, cached ",
             s.bytes_cached, " B, ", s.device_allocs, " device allocations, ", s.requests,
             " requests, ", s.cache_hits, " cache hits");
}

// The caching logic over a Backend with
//   void* allocate(size_t bytes);      // nullptr when out of memory, throws on other errors
//   void release(void* p, size_t bytes);
// Streams are opaque keys; kAnyStream marks blocks any stream may reuse.
template <typename Backend>
class BlockCache {
 public:
  using StreamKey = uintptr_t;
  static constexpr StreamKey kAnyStream = ~StreamKey{0};

  explicit BlockCache(Backend backend) : backend_(std::move(backend)) {}
  ~BlockCache() { release_all(); }
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  void* allocate(size_t bytes, StreamKey stream) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t cls = pool_size_class(bytes);
    ++stats_.requests;
    void* p = take_free(stream, cls);
    if (p) {
      ++stats_.cache_hits;
    } else {
      p = device_alloc(cls);
      if (!p) {
        release_cached_locked();
        p = device_alloc(cls);
      }
      if (!p)
        fail("[cuda pool] out of device memory allocating ", bytes, " bytes (class ", cls,
             " B) after releasing the cache: ", describe_pool_stats(stats_));
    }
    live_.emplace(p, Block{cls, stream});
    stats_.bytes_in_use += cls;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use)
      stats_.peak_bytes_in_use = stats_.bytes_in_use;
    return p;
  }

  // Returns p to the free list of the stream it was allocated for. nullptr is ignored.
  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    TS_CHECK(it != live_.end(), "[cuda pool] free of a pointer the pool did not hand out");
    const Block b = it->second;
    live_.erase(it);
    stats_.bytes_in_use -= b.cls;
    stats_.bytes_cached += b.cls;
    free_[{b.stream, b.cls}].push_back(p);
  }

  // Call after the device is idle: every cached block becomes reusable by any stream.
  void mark_all_reusable() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.first == kAnyStream) {
        ++it;
        continue;
      }
      auto& dst = free_[{kAnyStream, it->first.second}];
      dst.insert(dst.end(), it->second.begin(), it->second.end());
      it = free_.erase(it);
    }
  }

  // Call once `stream`'s work has finished and the stream is going away: its cached blocks become
  // reusable by any stream (otherwise they would wait under a dead key for a later stream that
  // happens to get the same handle, or for the next synchronize()).
  void retire_stream(StreamKey stream) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.first != stream || stream == kAnyStream) {
        ++it;
        continue;
      }
      auto& dst = free_[{kAnyStream, it->first.second}];
      dst.insert(dst.end(), it->second.begin(), it->second.end());
      it = free_.erase(it);
    }
  }
  // Gives every cached block back to the backend.
  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

  PoolStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  size_t live_blocks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  const Backend& backend() const { return backend_; }

 private:
  struct Block {
    size_t cls;
    StreamKey stream;
  };

  void* take_free(StreamKey stream, size_t cls) {
    for (StreamKey key : {stream, kAnyStream}) {
      auto it = free_.find({key, cls});
      if (it == free_.end() || it->second.empty()) continue;
      void* p = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) free_.erase(it);
      stats_.bytes_cached -= cls;
      return p;
    }
    return nullptr;
  }

  void* device_alloc(size_t cls) {
    ++stats_.device_allocs;
    return backend_.allocate(cls);
  }

  void release_cached_locked() {
    for (auto& [key, ptrs] : free_) {
      for (void* p : ptrs) {
        backend_.release(p, key.second);
        ++stats_.device_frees;
      }
    }
    free_.clear();
    stats_.bytes_cached = 0;
  }

  // Destruction frees live blocks too: nothing may use the pool's memory after the pool is gone.
  void release_all() {
    release_cached_locked();
    for (auto& [p, b] : live_) backend_.release(p, b.cls);
    live_.clear();
  }

  Backend backend_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::map<std::pair<StreamKey, size_t>, std::vector<void*>> free_;
  PoolStats stats_;
};

// cudaMalloc/cudaFree on one device.
class CudaMallocBackend {
 public:
  explicit CudaMallocBackend(int device) : device_(device) {}
  void* allocate(size_t bytes);
  void release(void* p, size_t bytes) noexcept;
  int device() const { return device_; }

 private:
  int device_;
};

class MemoryPool {
 public:
  explicit MemoryPool(int device) : cache_(CudaMallocBackend(device)) {}
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // The process-wide pool of a device (created on first use, never destroyed: blocks may be
  // freed during static destruction, after the CUDA runtime is gone).
  static MemoryPool& for_device(int device);

  // bytes on this pool's device, usable by work on `stream` (see the stream rule above).
  // Throws Error naming the size and the pool's statistics when the device is out of memory.
  void* allocate(size_t bytes, cudaStream_t stream);
  void free(void* p) { cache_.free(p); }
  // Waits for the device, then lets any stream reuse every cached block.
  void synchronize();
  // For a stream whose work has finished and which is being destroyed (Stream's destructor):
  // its cached blocks become reusable by any stream.
  void retire_stream(cudaStream_t stream) {
    cache_.retire_stream(reinterpret_cast<uintptr_t>(stream));
  }
  void release_cached() { cache_.release_cached(); }
  PoolStats stats() const { return cache_.stats(); }
  int device() const { return cache_.backend().device(); }

 private:
  BlockCache<CudaMallocBackend> cache_;
};

// Owns one pool allocation; freed (to the pool's cache) on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(MemoryPool& pool, size_t bytes, cudaStream_t stream)
      : pool_(&pool), p_(pool.allocate(bytes, stream)), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : pool_(o.pool_), p_(o.p_), bytes_(o.bytes_) {
    o.pool_ = nullptr;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(pool_, o.pool_);
      std::swap(p_, o.p_);
      std::swap(bytes_, o.bytes_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return bytes_; }
  void reset() noexcept {
    if (pool_ && p_) {
      try {
        pool_->free(p_);
      } catch (...) {  // cannot happen for a pointer the pool handed out; never throw here
      }
    }
    pool_ = nullptr;
    p_ = nullptr;
    bytes_ = 0;
  }

 private:
  MemoryPool* pool_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// One pool allocation carved into pieces at 256-byte offsets: each part is (where the piece's
// address goes, its bytes). Returns the buffer that owns them all.
inline DeviceBuffer carve(MemoryPool& pool, cudaStream_t stream,
                          const std::vector<std::pair<void**, size_t>>& parts) {
  auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  size_t total = 0;
  for (const auto& part : parts) total += aligned(part.second);
  DeviceBuffer buf(pool, total, stream);
  size_t off = 0;
  for (const auto& [where, bytes] : parts) {
    *where = buf.as<uint8_t>() + off;
    off += aligned(bytes);
  }
  return buf;
}

}  // namespace tessera::cuda
