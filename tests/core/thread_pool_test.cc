// Tests of the thread pool: every index visited once, exceptions propagate, reuse is safe.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

namespace tessera {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 7, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1);
  }
}

// Loops back to back, their chunk counts changing from one to the next: a worker still in the
// previous loop's claim while the caller sets up the next must not claim a chunk with the new
// loop's fields (it would run a chunk twice and leave the done count past the chunk count, so
// the caller would wait forever; seen as a hang in a CI perplexity run). Each loop checks that
// every index ran exactly once; a hang fails the test by its timeout.
TEST(ThreadPool, BackToBackLoopsOfChangingSizeRunEachIndexOnce) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    std::vector<int> hits(64);
    for (int loop = 0; loop < 200000; ++loop) {
      const int64_t n = 2 + loop % 61;
      std::fill(hits.begin(), hits.begin() + n, 0);
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
      });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "loop " << loop << " index " << i;
    }
  }
}

TEST(ThreadPool, RunCallsEachThreadAndRethrows) {
  ThreadPool pool(4);
  for (int rep = 0; rep < 200; ++rep) {
    std::atomic<int> mask{0};
    pool.run([&](int t) { mask |= 1 << t; });
    ASSERT_EQ(mask.load(), 15);
  }
  EXPECT_THROW(pool.run([](int t) {
    if (t == 2) throw std::runtime_error("boom");
  }),
               std::runtime_error);
  std::atomic<int> count{0};
  pool.run([&](int) { count++; });
  EXPECT_EQ(count.load(), 4);
}

}  // namespace
}  // namespace tessera
