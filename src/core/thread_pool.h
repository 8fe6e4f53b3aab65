// A persistent thread pool for data-parallel loops. Idle workers spin briefly (yielding after
// the first 50 us), then sleep on a condition variable, so a busy neighbour on a shared machine
// slows us in proportion instead of collapsing us (as pure spin barriers do when a spinning
// thread holds a core someone needs). Workers are pinned one per CPU (see the constructor).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

class ThreadPool {
 public:
  // n_threads includes the calling thread; 0 means the CPUs this process may run on.
  // pin_workers: where the pool has no more threads than those CPUs, worker i (i >= 1) is bound
  // to the i-th of them, and a caller of run() or parallel_for() found on a worker's CPU is
  // moved off it (its affinity is set to the other CPUs and restored at once, which migrates it
  // and leaves its mask as it was). Unpinned, Linux placed a worker woken from sleep on the
  // waking caller's CPU 34 times in 40 on the VMs here (and a caller woken by a worker on the
  // worker's), and the two then shared one core while the other idled: products ran at half
  // speed in some runs and not others. Pass false where several pools share the machine.
  explicit ThreadPool(int n_threads = 0, bool pin_workers = true);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // The CPU each thread is bound to (index 0, the caller: -1), or empty when not pinned.
  const std::vector<int>& pinned_cpus() const { return pinned_; }

  // Calls fn(thread_index) once on each of the size() threads (the caller is index 0) and
  // returns when all are done. Exceptions from workers are rethrown on the caller.
  void run(const std::function<void(int)>& fn);

  // Splits [0, n) into chunks of at least `grain` items handed out dynamically; calls
  // fn(begin, end) for each. Runs inline when n is small or the pool has one thread. Returns as
  // soon as every chunk is done: a worker that has not woken up yet is not waited for (on a
  // loaded machine a descheduled worker can take milliseconds to wake; the caller then simply
  // does its chunks).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);
  // Moves the calling thread off the workers' CPUs if it is on one (pinned pools only).
  void leave_worker_cpus();
  void publish(uint64_t kind);
  // Claims and runs chunks of the loop published as `epoch` until none is left.
  void claim_chunks(uint32_t epoch);
  void record_error();

  int n_threads_;
  std::vector<int> pinned_;
  std::vector<int> caller_cpus_;  // the allowed CPUs no worker is bound to (pinned pools only)
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  // (counter << 1) | kind, kind 0 = run job, 1 = loop; every publication increments counter.
  std::atomic<uint64_t> generation_{0};
  // The current loop: its chunks are claimed through ticket_ = (epoch << 32) | next chunk, where
  // epoch is the low 32 bits of the loop's counter; a claim only succeeds for the current epoch,
  // so a late worker never touches a finished loop's (caller-owned) function. The caller closes
  // the ticket (its epoch, index 0xffffffff) before it changes the loop's fields.
  std::atomic<uint64_t> ticket_{0};
  std::atomic<const std::function<void(int64_t, int64_t)>*> loop_fn_{nullptr};
  std::atomic<int64_t> loop_n_{0}, loop_chunk_{1}, loop_chunks_{0}, loop_done_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::exception_ptr error_;
  std::mutex error_mu_;
};

// One pool of all hardware threads, made on first use and never resized: the threads of an
// ops::Context that names no pool. A caller that wants another count makes its own ThreadPool
// and passes it down in its context; nothing changes the count under another caller.
ThreadPool& default_pool();

}  // namespace tessera
