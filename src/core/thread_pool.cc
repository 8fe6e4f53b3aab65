// Thread pool: generation-counted job hand-off, spin-then-sleep waiting.
#include "core/thread_pool.h"

#include <chrono>
#include <memory>

#include "core/error.h"

namespace tessera {

namespace {
// About 50 microseconds of spinning covers the gap between back-to-back kernels in one step
// without burning a core while the pool is idle between steps.
constexpr int kSpinIterations = 20000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (n_threads <= 0) n_threads = 1;
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(2);  // a new generation of the same kind: workers see stop_
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::record_error() {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (!error_) error_ = std::current_exception();
}

void ThreadPool::publish(uint64_t kind) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t counter = (generation_.load(std::memory_order_relaxed) >> 1) + 1;
    generation_.store((counter << 1) | kind, std::memory_order_release);
  }
  wake_.notify_all();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      cpu_relax();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      gen = generation_.load();
    }
    seen = gen;
    if (stop_.load()) return;
    if (gen & 1) {
      claim_chunks(static_cast<uint32_t>(gen >> 1));
      continue;
    }
    // A run job waits for every worker, so job_ stays valid until this one is done.
    try {
      (*job_)(index);
    } catch (...) {
      record_error();
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_one();
    }
  }
}

void ThreadPool::claim_chunks(uint32_t epoch) {
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(t >> 32) != epoch) return;  // that loop is over
    // Read the loop's fields, then claim: if the claim succeeds the ticket was still this
    // loop's, and the loop cannot finish (nor its fields change) before our chunk is done.
    const auto* fn = loop_fn_.load(std::memory_order_acquire);
    const int64_t n = loop_n_.load(std::memory_order_acquire);
    const int64_t chunk = loop_chunk_.load(std::memory_order_acquire);
    const int64_t chunks = loop_chunks_.load(std::memory_order_acquire);
    const auto index = static_cast<int64_t>(t & 0xffffffffu);
    if (index >= chunks) return;
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
    const int64_t begin = index * chunk;
    try {
      (*fn)(begin, begin + chunk < n ? begin + chunk : n);
    } catch (...) {
      record_error();
    }
    loop_done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  error_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  publish(0);
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0 && spin < kSpinIterations;
       ++spin)
    cpu_relax();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_.load() == 0; });
  }
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  // Aim for ~4 chunks per thread so uneven chunks balance, but never below the grain.
  int64_t chunk = (n + 4 * n_threads_ - 1) / (4 * n_threads_);
  if (chunk < grain) chunk = grain;
  const int64_t chunks = (n + chunk - 1) / chunk;
  TS_CHECK(chunks < (int64_t{1} << 31), "[threads] parallel_for over too many chunks: ", chunks);
  error_ = nullptr;
  const uint64_t counter = (generation_.load(std::memory_order_relaxed) >> 1) + 1;
  const uint64_t epoch = static_cast<uint64_t>(static_cast<uint32_t>(counter)) << 32;
  // Close the ticket before the loop's fields change: a worker still in the previous loop's
  // claim_chunks may have read that loop's ticket (every chunk taken) and then this loop's
  // larger chunk count; its claim must fail on the ticket, or it would run a chunk of this loop
  // that the ticket hands out again, and its late done count would leave loop_done_ past
  // `chunks` (the caller then waited forever). The closed ticket is this epoch with an index no
  // loop reaches.
  // The fields are stored with release, so a worker that reads any new one (acquire) also sees
  // the closed ticket, and its compare-exchange against the old ticket fails.
  ticket_.store(epoch | 0xffffffffu, std::memory_order_seq_cst);
  loop_fn_.store(&fn, std::memory_order_release);
  loop_n_.store(n, std::memory_order_release);
  loop_chunk_.store(chunk, std::memory_order_release);
  loop_chunks_.store(chunks, std::memory_order_release);
  loop_done_.store(0, std::memory_order_release);
  ticket_.store(epoch, std::memory_order_release);
  publish(1);
  claim_chunks(static_cast<uint32_t>(counter));
  // Every chunk is claimed; wait for the ones other threads are still running (they are
  // running, not asleep, so a short spin then yielding is enough).
  for (int spin = 0; loop_done_.load(std::memory_order_acquire) != chunks; ++spin) {
    if (spin < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  if (error_) std::rethrow_exception(error_);
}

ThreadPool& default_pool() {
  static ThreadPool pool(0);  // thread-safe initialization; lives until exit
  return pool;
}

}  // namespace tessera
