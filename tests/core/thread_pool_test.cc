// Tests of the thread pool: every index visited once, exceptions propagate, reuse is safe.
#include "core/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

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

// Where the pool fits on the CPUs this process may use, worker i runs on the i-th of them (the
// caller keeps its own affinity); a pool larger than that, or asked not to, pins nothing.
TEST(ThreadPool, PinsOneWorkerPerCpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  EXPECT_TRUE(ThreadPool(static_cast<int>(cpus.size()) + 1).pinned_cpus().empty());
  EXPECT_TRUE(ThreadPool(2, /*pin_workers=*/false).pinned_cpus().empty());
  EXPECT_TRUE(ThreadPool(1).pinned_cpus().empty());
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU allowed: nothing to pin";
  const int n = static_cast<int>(std::min<size_t>(cpus.size(), 4));
  ThreadPool pool(n);
  ASSERT_EQ(pool.pinned_cpus().size(), static_cast<size_t>(n));
  EXPECT_EQ(pool.pinned_cpus()[0], -1);
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  for (int rep = 0; rep < 50; ++rep) {
    for (auto& s : seen) s = -2;
    pool.run([&](int t) { seen[static_cast<size_t>(t)] = sched_getcpu(); });
    for (int t = 1; t < n; ++t) ASSERT_EQ(seen[static_cast<size_t>(t)].load(), cpus[t]) << t;
    // The caller runs on a CPU no worker holds.
    for (int t = 1; t < n; ++t) ASSERT_NE(seen[0].load(), cpus[t]) << t;
  }
  // The caller's own affinity is as it was.
  cpu_set_t after;
  CPU_ZERO(&after);
  ASSERT_EQ(sched_getaffinity(0, sizeof(after), &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&set, &after));
}

}  // namespace
}  // namespace tessera
