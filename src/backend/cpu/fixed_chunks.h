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

// The piece that claim c takes: lane c % lanes, then its place c / lanes in that lane, so claims
// l, l + lanes, l + 2 * lanes, ... walk lane l's pieces in order.
constexpr int64_t lane_piece(int64_t c, int64_t lanes, int64_t per_lane) {
  return (c % lanes) * per_lane + c / lanes;
}

// As for_each_chunk, for streams of memory (decode's weight matrices): the chunks are cut into
// one contiguous lane per thread, and the pool's claims go round the lanes (claim c takes the
// next piece of lane c % threads), so while the threads keep pace each walks its own lane front
// to back, one unbroken stream whose prefetches run ahead into its own next piece, instead of
// jumping to wherever the next claim falls. A thread that falls behind simply takes fewer
// pieces (any thread may run any piece), so the load still balances. Chunk boundaries, and so
// results, are for_each_chunk's.
template <class Fn>
void for_each_chunk_in_lanes(ThreadPool& pool, int64_t n, int64_t chunk, const Fn& fn) {
  if (n <= 0) return;
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  const int64_t lanes = pool.size();
  if (lanes == 1 || n_chunks <= 1) return for_each_chunk(pool, n, chunk, fn);
  // About 4 pieces per thread, as parallel_for's claims; whole pieces per lane.
  const int64_t piece = std::max<int64_t>(1, (n_chunks + 4 * lanes - 1) / (4 * lanes));
  const int64_t pieces = (n_chunks + piece - 1) / piece;
  const int64_t per_lane = (pieces + lanes - 1) / lanes;
  // At most 4 claims per thread: parallel_for then hands them out one at a time.
  pool.parallel_for(lanes * per_lane, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t p = lane_piece(c, lanes, per_lane);
      for (int64_t k = p * piece; k < std::min(n_chunks, (p + 1) * piece); ++k)
        fn(k, k * chunk, std::min(n, (k + 1) * chunk));
    }
  });
}

}  // namespace tessera::cpu
