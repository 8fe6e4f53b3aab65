// Caching allocator: size classes, per-stream reuse, statistics, out-of-memory retry (host, with a
// fake backend handing out fake addresses), and the cudaMalloc-backed pool on a device.
#include "backend/cuda/memory_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/runtime.h"
#include "cuda_test_util.h"

namespace tessera::cuda {
namespace {

// Hands out increasing fake addresses and fails once `capacity` bytes are outstanding.
struct FakeBackend {
  size_t capacity = SIZE_MAX;
  size_t outstanding = 0;
  uintptr_t next = 0x10000;
  int allocs = 0, releases = 0;
  std::set<uintptr_t>* live = nullptr;

  void* allocate(size_t bytes) {
    ++allocs;
    if (bytes > capacity - outstanding) return nullptr;
    outstanding += bytes;
    const uintptr_t p = next;
    next += bytes + 4096;
    if (live) live->insert(p);
    return reinterpret_cast<void*>(p);
  }
  void release(void* p, size_t bytes) {
    ++releases;
    outstanding -= bytes;
    if (live) {
      EXPECT_EQ(live->erase(reinterpret_cast<uintptr_t>(p)), 1u);
    }
  }
};

using Cache = BlockCache<FakeBackend>;
constexpr Cache::StreamKey kS1 = 1, kS2 = 2;

TEST(PoolSizeClass, RoundsSmallTo512AndLargeTo2MiB) {
  EXPECT_EQ(pool_size_class(0), 512u);
  EXPECT_EQ(pool_size_class(1), 512u);
  EXPECT_EQ(pool_size_class(512), 512u);
  EXPECT_EQ(pool_size_class(513), 1024u);
  EXPECT_EQ(pool_size_class(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(pool_size_class((size_t{1} << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(pool_size_class(size_t{2} << 20), size_t{2} << 20);
  EXPECT_EQ(pool_size_class((size_t{2} << 20) + 1), size_t{4} << 20);
  EXPECT_EQ(pool_size_class(size_t{100} << 20), size_t{100} << 20);
  EXPECT_THROW(pool_size_class(SIZE_MAX), Error);
}

TEST(BlockCacheHost, ReusesFreedBlockOfSameClassOnSameStream) {
  Cache c{FakeBackend{}};
  void* a = c.allocate(1000, kS1);
  c.free(a);
  void* b = c.allocate(1024, kS1);  // same 1024-byte class
  EXPECT_EQ(a, b);
  void* d = c.allocate(2000, kS1);  // other class: new block
  EXPECT_NE(d, a);
  const PoolStats s = c.stats();
  EXPECT_EQ(s.device_allocs, 2);
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.requests, 3);
  EXPECT_EQ(s.bytes_in_use, 1024u + 2048u);
  EXPECT_EQ(s.bytes_cached, 0u);
}

TEST(BlockCacheHost, OtherStreamReusesOnlyAfterSynchronize) {
  Cache c{FakeBackend{}};
  void* a = c.allocate(4096, kS1);
  c.free(a);
  void* b = c.allocate(4096, kS2);
  EXPECT_NE(a, b) << "a block freed on S1 must not go to S2 before a synchronize";
  c.free(b);
  c.mark_all_reusable();
  void* x = c.allocate(4096, kS2);
  void* y = c.allocate(4096, kS2);
  EXPECT_TRUE((x == a && y == b) || (x == b && y == a));
  EXPECT_EQ(c.stats().device_allocs, 2);
}

TEST(BlockCacheHost, RetiredStreamsBlocksGoToEveryStream) {
  Cache c{FakeBackend{}};
  void* a = c.allocate(4096, kS1);
  void* b = c.allocate(8192, kS1);
  void* live = c.allocate(4096, kS1);  // still in use when S1 retires
  void* other = c.allocate(4096, kS2);
  c.free(a);
  c.free(b);
  c.free(other);
  c.retire_stream(kS1);
  EXPECT_EQ(c.stats().bytes_cached, 4096u + 8192u + 4096u) << "retiring frees nothing";
  // S1's blocks now serve a third stream; S2's cached block stays S2's.
  constexpr Cache::StreamKey kS3 = 3;
  EXPECT_EQ(c.allocate(4096, kS3), a);
  EXPECT_EQ(c.allocate(8192, kS3), b);
  void* fresh = c.allocate(4096, kS3);
  EXPECT_NE(fresh, other);
  EXPECT_EQ(c.stats().device_allocs, 5);
  c.retire_stream(Cache::kAnyStream);  // no-op, not a stream
  c.free(live);
  EXPECT_EQ(c.allocate(4096, kS1), live) << "a block freed after retirement returns to its list";
}

TEST(BlockCacheHost, StatsTrackInUsePeakAndCached) {
  Cache c{FakeBackend{}};
  void* a = c.allocate(size_t{3} << 20, kS1);  // 4 MiB class
  void* b = c.allocate(100, kS1);              // 512 B class
  PoolStats s = c.stats();
  EXPECT_EQ(s.bytes_in_use, (size_t{4} << 20) + 512);
  EXPECT_EQ(s.peak_bytes_in_use, s.bytes_in_use);
  c.free(a);
  s = c.stats();
  EXPECT_EQ(s.bytes_in_use, 512u);
  EXPECT_EQ(s.bytes_cached, size_t{4} << 20);
  EXPECT_EQ(s.peak_bytes_in_use, (size_t{4} << 20) + 512);
  c.release_cached();
  s = c.stats();
  EXPECT_EQ(s.bytes_cached, 0u);
  EXPECT_EQ(s.device_frees, 1);
  EXPECT_EQ(c.backend().outstanding, 512u);
  c.free(b);
  c.free(nullptr);  // ignored
  EXPECT_EQ(c.live_blocks(), 0u);
}

TEST(BlockCacheHost, OutOfMemoryReleasesCacheAndRetriesOnce) {
  FakeBackend fb;
  fb.capacity = size_t{6} << 20;
  Cache c{fb};
  void* a = c.allocate(size_t{4} << 20, kS1);
  c.free(a);                                   // 4 MiB cached, 2 MiB left on the "device"
  void* b = c.allocate(size_t{3} << 20, kS1);  // 4 MiB class: cache hit
  EXPECT_EQ(a, b);
  c.free(b);
  // An 6 MiB request fails at first (4 MiB cached), succeeds after the cache is released.
  void* big = c.allocate(size_t{6} << 20, kS1);
  EXPECT_NE(big, nullptr);
  const PoolStats s = c.stats();
  EXPECT_EQ(s.bytes_cached, 0u);
  EXPECT_EQ(s.device_frees, 1);
  EXPECT_EQ(s.device_allocs, 3);  // first block, failed try, retry
}

TEST(BlockCacheHost, OutOfMemoryErrorNamesSizeAndStats) {
  FakeBackend fb;
  fb.capacity = size_t{2} << 20;
  Cache c{fb};
  void* a = c.allocate(1000, kS1);
  try {
    c.allocate(size_t{5} << 20, kS1);
    FAIL() << "expected an out-of-memory Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(size_t{5} << 20)), std::string::npos) << msg;
    EXPECT_NE(msg.find("in use 1024 B"), std::string::npos) << msg;
    EXPECT_NE(msg.find("device allocations"), std::string::npos) << msg;
  }
  c.free(a);
}

TEST(BlockCacheHost, FreeOfForeignPointerThrows) {
  Cache c{FakeBackend{}};
  int x = 0;
  EXPECT_THROW(c.free(&x), Error);
}

TEST(BlockCacheHost, DestructionReturnsEverything) {
  std::set<uintptr_t> live;
  {
    FakeBackend fb;
    fb.live = &live;
    Cache c{fb};
    void* a = c.allocate(10, kS1);
    c.allocate(size_t{3} << 20, kS2);  // still live at destruction
    c.free(a);
    EXPECT_EQ(live.size(), 2u);
  }
  EXPECT_TRUE(live.empty());
}

TEST(MemoryPoolDevice, AllocatesUsableMemoryAndReuses) {
  TS_REQUIRE_CUDA_DEVICE();
  MemoryPool pool(0);
  Stream s;
  void* first = nullptr;
  {
    DeviceBuffer buf(pool, 1000 * sizeof(float), s.get());
    first = buf.get();
    std::vector<float> host(1000, 2.5f), back(1000);
    copy_to_device(buf.get(), host.data(), buf.size());
    copy_to_host(back.data(), buf.get(), buf.size());
    EXPECT_EQ(back, host);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.get()) % 256, 0u);
  }
  DeviceBuffer again(pool, 900 * sizeof(float), s.get());  // same 4096-byte class, same stream
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool.stats().device_allocs, 1);
  DeviceBuffer moved = std::move(again);
  EXPECT_EQ(moved.get(), first);
  EXPECT_EQ(again.get(), nullptr);
}

TEST(MemoryPoolDevice, HugeRequestThrowsWithStats) {
  TS_REQUIRE_CUDA_DEVICE();
  MemoryPool pool(0);
  const size_t too_much = device_info(0).total_memory * 4;
  try {
    pool.allocate(too_much, nullptr);
    FAIL() << "expected an out-of-memory Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(too_much)), std::string::npos) << e.what();
  }
  // The device is still usable after the failed cudaMalloc.
  DeviceBuffer ok(pool, 4096, nullptr);
  EXPECT_NE(ok.get(), nullptr);
  pool.synchronize();
}

// A Stream's destructor waits for its work and hands its cached blocks to every stream.
TEST(MemoryPoolDevice, DestroyedStreamsBlocksServeOtherStreams) {
  TS_REQUIRE_CUDA_DEVICE();
  MemoryPool& pool = MemoryPool::for_device(0);
  void* first = nullptr;
  {
    Stream s;
    DeviceBuffer buf(pool, size_t{6} << 20, s.get());
    first = buf.get();
    ASSERT_EQ(cudaMemsetAsync(buf.get(), 1, buf.size(), s.get()), cudaSuccess);
  }  // buf freed to s's list, then s retires
  Stream t;
  DeviceBuffer again(pool, size_t{6} << 20, t.get());
  EXPECT_EQ(again.get(), first);
}

TEST(MemoryPoolDevice, PerDevicePoolIsShared) {
  TS_REQUIRE_CUDA_DEVICE();
  EXPECT_EQ(&MemoryPool::for_device(0), &MemoryPool::for_device(0));
  EXPECT_THROW(MemoryPool::for_device(device_count()), Error);
}

}  // namespace
}  // namespace tessera::cuda
