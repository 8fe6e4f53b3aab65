// Thread pool: generation-counted job hand-off, spin-then-sleep waiting.
#include "core/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"

namespace tessera {

namespace {
// How an idle worker, or a caller waiting for workers, waits before it sleeps on a condition
// variable. A sleeping thread on the VMs here takes 100-550 us to run again after a notify (the
// idle vCPU halts and the hypervisor must schedule it again; `tessera bench gemm` prints the
// measured figure), longer than a whole 512^3 product on two cores: with a 50 us spin, every
// product that followed a pause of more than 50 us (a step's data loading, another benchmark
// contender) ran its first few hundred microseconds on one thread. So a waiter first spins on
// pause for kPauseTime, then keeps polling with sched_yield until kSpinTime: yielding, so that a
// thread that needs this core (our own worker, when another process's threads hold the other
// cores) runs at once instead of after a spinning time slice.
constexpr std::chrono::microseconds kPauseTime{50};
constexpr std::chrono::microseconds kSpinTime{2000};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Waits until done() or kSpinTime has passed; true if done() held. The clock is read once per
// 256 pauses (a few microseconds) or per yield.
template <class Done>
bool spin_until(const Done& done) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 256; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() - start >= kPauseTime) break;
  }
  for (;;) {
    if (done()) return true;
    std::this_thread::yield();
    if (std::chrono::steady_clock::now() - start >= kSpinTime) return done();
  }
}
}  // namespace

namespace {
// The CPUs this process may run on, in order (all hardware threads where that cannot be read).
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
#endif
  if (cpus.empty())
    for (int c = 0; c < static_cast<int>(std::thread::hardware_concurrency()); ++c)
      cpus.push_back(c);
  return cpus;
}
}  // namespace

ThreadPool::ThreadPool(int n_threads, bool pin_workers) {
  const std::vector<int> cpus = allowed_cpus();
  if (n_threads <= 0) n_threads = static_cast<int>(cpus.size());
  if (n_threads <= 0) n_threads = 1;
  n_threads_ = n_threads;
#if defined(__linux__)
  if (pin_workers && n_threads_ > 1 && n_threads_ <= static_cast<int>(cpus.size())) {
    pinned_.assign(cpus.begin(), cpus.begin() + n_threads_);
    pinned_[0] = -1;
    caller_cpus_.assign(1, cpus[0]);
    caller_cpus_.insert(caller_cpus_.end(), cpus.begin() + n_threads_, cpus.end());
  }
#else
  (void)pin_workers;
#endif
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

void ThreadPool::leave_worker_cpus() {
#if defined(__linux__)
  if (caller_cpus_.empty()) return;
  const int here = sched_getcpu();  // a vDSO read: costs nothing per call
  if (std::find(pinned_.begin() + 1, pinned_.end(), here) == pinned_.end()) return;
  cpu_set_t mine, away;
  if (pthread_getaffinity_np(pthread_self(), sizeof(mine), &mine) != 0) return;
  CPU_ZERO(&away);
  for (int c : caller_cpus_)
    if (CPU_ISSET(c, &mine)) CPU_SET(c, &away);
  if (CPU_COUNT(&away) == 0) return;  // the caller may run nowhere else: leave it
  pthread_setaffinity_np(pthread_self(), sizeof(away), &away);  // migrates before returning
  pthread_setaffinity_np(pthread_self(), sizeof(mine), &mine);
#endif
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
#if defined(__linux__)
  if (!pinned_.empty()) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(pinned_[static_cast<size_t>(index)], &one);
    // Best effort: a refused binding (a cgroup that changed under us) leaves the worker free.
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
  }
#endif
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = seen;
    spin_until([&] { return (gen = generation_.load(std::memory_order_acquire)) != seen; });
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
  leave_worker_cpus();
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
  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
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
  leave_worker_cpus();
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
  if (!spin_until([&] { return loop_done_.load(std::memory_order_acquire) == chunks; }))
    while (loop_done_.load(std::memory_order_acquire) != chunks) std::this_thread::yield();
  if (error_) std::rethrow_exception(error_);
}

ThreadPool& default_pool() {
  static ThreadPool pool(0);  // thread-safe initialization; lives until exit
  return pool;
}

}  // namespace tessera
