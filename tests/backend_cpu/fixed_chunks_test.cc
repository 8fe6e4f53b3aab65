// Tests of the CPU kernels' work splitting: for_each_chunk_in_lanes hands out exactly the chunks
// of for_each_chunk (same indices, same boundaries), each once, for any size and thread count,
// and its claims walk each lane front to back.
#include "backend/cpu/fixed_chunks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace tessera::cpu {
namespace {

struct Visit {
  int64_t begin = -1, end = -1;
  int hits = 0;
};

std::vector<Visit> visits(ThreadPool& pool, int64_t n, int64_t chunk, bool lanes) {
  std::vector<Visit> v(static_cast<size_t>((n + chunk - 1) / chunk));
  std::mutex mu;
  auto fn = [&](int64_t k, int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    Visit& x = v.at(static_cast<size_t>(k));
    x.begin = b;
    x.end = e;
    ++x.hits;
  };
  if (lanes)
    for_each_chunk_in_lanes(pool, n, chunk, fn);
  else
    for_each_chunk(pool, n, chunk, fn);
  return v;
}

TEST(FixedChunks, LanesHandOutForEachChunksChunksOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n :
         {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{1000}, int64_t{4099}})
      for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{5000}}) {
        const std::vector<Visit> want = visits(pool, n, chunk, false);
        const std::vector<Visit> got = visits(pool, n, chunk, true);
        ASSERT_EQ(got.size(), want.size());
        for (size_t k = 0; k < got.size(); ++k) {
          ASSERT_EQ(got[k].hits, 1)
              << "threads " << threads << " n " << n << " chunk " << chunk << " chunk index " << k;
          EXPECT_EQ(got[k].begin, want[k].begin);
          EXPECT_EQ(got[k].end, want[k].end);
        }
      }
  }
}

// Claims l, l + lanes, l + 2 * lanes, ... take lane l's pieces front to back, and the claims
// take every piece once: a thread that takes every lanes-th claim walks one contiguous lane.
TEST(FixedChunks, ClaimsWalkEachLaneInOrder) {
  for (int64_t lanes : {2, 3, 8})
    for (int64_t per_lane : {1, 4, 5}) {
      std::vector<int> taken(static_cast<size_t>(lanes * per_lane));
      for (int64_t l = 0; l < lanes; ++l)
        for (int64_t i = 0; i < per_lane; ++i) {
          const int64_t p = lane_piece(l + i * lanes, lanes, per_lane);
          EXPECT_EQ(p, l * per_lane + i) << "lanes " << lanes << " per lane " << per_lane;
          ++taken.at(static_cast<size_t>(p));
        }
      for (int t : taken) EXPECT_EQ(t, 1);
    }
}

}  // namespace
}  // namespace tessera::cpu
