// Shared helpers for the CPU kernel tests: seeded random buffers, misaligned views, thread pools.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/thread_pool.h"

namespace tessera::test {

constexpr double kEpsF = std::numeric_limits<float>::epsilon();  // 2^-23

// A float buffer whose data starts `offset` elements past a vector's start, so a kernel sees a
// pointer that is not vector-aligned when offset is odd.
struct Buf {
  std::vector<float> storage;
  float* p;
  Buf(int64_t n, int offset)
      : storage(static_cast<size_t>(n + offset)), p(storage.data() + offset) {}
  // Copies keep the same offset into their own storage.
  Buf(const Buf& o) : storage(o.storage), p(storage.data() + (o.p - o.storage.data())) {}
  Buf& operator=(const Buf&) = delete;
  float& operator[](int64_t i) { return p[i]; }
  const float& operator[](int64_t i) const { return p[i]; }
};

inline void fill_normal(float* x, int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) x[i] = scale * rng.normal();
}

inline Buf normal_buf(int64_t n, int offset, uint64_t seed, float scale = 1.0f) {
  Buf b(n, offset);
  fill_normal(b.p, n, seed, scale);
  return b;
}

// Pools of 1, 2 and 3 threads, created once (threads outlive the tests that use them).
inline ThreadPool& pool(int n_threads) {
  static std::unique_ptr<ThreadPool> pools[4];
  auto& p = pools[n_threads];
  if (!p) p = std::make_unique<ThreadPool>(n_threads);
  return *p;
}

}  // namespace tessera::test
