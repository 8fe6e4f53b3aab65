// Deterministic work splitting for the CPU kernels: chunk boundaries depend only on the problem
// size, never on the thread count or on scheduling, so results are bit-identical across runs.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/thread_pool.h"

namespace tessera::cpu {

// Elements per chunk for streaming element-wise kernels: 16K floats (64 KiB) of input is large
// enough to amortize the hand-off to a thread, small enough that a few chunks per thread balance
// the load.
constexpr int64_t kElementwiseChunk = 16384;

// Calls fn(chunk_index, begin, end) for each chunk [k*chunk, min(n, (k+1)*chunk)) of [0, n).
// Chunks are handed to threads dynamically; callers must make each chunk's work independent
// of which thread runs it (write disjoint outputs, or per-chunk partials combined in order).
template <class Fn>
void for_each_chunk(ThreadPool& pool, int64_t n, int64_t chunk, const Fn& fn) {
  if (n <= 0) return;
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  pool.parallel_for(n_chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) fn(k, k * chunk, std::min(n, (k + 1) * chunk));
  });
}

}  // namespace tessera::cpu
