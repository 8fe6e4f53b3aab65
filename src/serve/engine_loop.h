// The engine loop: one thread that owns the scheduler (and through it the engine) and steps it
// while there is work; HTTP threads hand it requests, cancellations and other engine jobs
// (embeddings) through a locked inbox, and read each request's events from its RequestStream.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "infer/scheduler.h"
#include "serve/metrics.h"

namespace tessera::serve {

// One request's events as the engine loop produces them, for the HTTP thread serving it.
class RequestStream {
 public:
  struct Delta {
    size_t index;  // sample
    std::vector<infer::GeneratedToken> tokens;
    std::string text;
  };
  struct Events {
    std::vector<Delta> deltas;
    std::vector<std::pair<size_t, infer::GenerateResult>> finished;
    std::string error;  // the engine failed the request (its message)
    bool empty() const { return deltas.empty() && finished.empty() && error.empty(); }
  };
  explicit RequestStream(int64_t samples) : samples_(samples) {}
  // Waits up to `timeout` for events and takes them all; false when none came.
  bool wait(Events* out, std::chrono::milliseconds timeout);
  // Every sample finished (or the request failed): no more events will come.
  bool over() const;
  // The client is gone: the engine stops the request at its next token or step.
  void abandon() { abandoned_ = true; }
  bool abandoned() const { return abandoned_; }

 private:
  friend class EngineLoop;
  void push_delta(Delta d);
  void push_finished(size_t index, infer::GenerateResult&& r);
  void fail(const std::string& message);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Events pending_;
  int64_t samples_, finished_ = 0;
  bool failed_ = false;
  std::atomic<bool> abandoned_{false};
  infer::Scheduler::RequestId id_ = 0;
  double added_ = 0;
  std::vector<double> last_token_;  // per sample, for the inter-token latency
};

class EngineLoop {
 public:
  EngineLoop(infer::Engine& engine, const tokenizer::Tokenizer& tok,
             const infer::SchedulerOptions& opts, Metrics& metrics);
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request (already checked by the server; a check the scheduler still fails ends the
  // stream with an error).
  std::shared_ptr<RequestStream> submit(infer::GenerateRequest req);
  // Stops the request and frees its blocks at the engine's next turn.
  void cancel(const std::shared_ptr<RequestStream>& s);
  // Runs job on the engine thread between steps and returns its result (or rethrows).
  template <typename T>
  T run(std::function<T(infer::Scheduler&)> job);
  // Requests submitted but not yet started (queued in the inbox or the scheduler).
  int64_t waiting() const;
  bool idle() const;
  // Cancels every request (shutdown); their streams end with FinishReason::cancelled.
  void cancel_all();

 private:
  void loop();
  void publish();

  infer::Engine& engine_;
  infer::Scheduler sched_;
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<infer::GenerateRequest, std::shared_ptr<RequestStream>>> inbox_;
  std::vector<std::shared_ptr<RequestStream>> cancels_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::shared_ptr<RequestStream>> live_;  // engine thread only
  bool cancel_all_ = false, stop_ = false;
  int64_t waiting_ = 0;  // the scheduler's, as of the last step
  bool idle_ = true;
  std::thread thread_;
};

template <typename T>
T EngineLoop::run(std::function<T(infer::Scheduler&)> job) {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::optional<T> result;
  std::exception_ptr error;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back([&] {
      try {
        result = job(sched_);
      } catch (...) {
        error = std::current_exception();
      }
      const std::lock_guard<std::mutex> l(m);
      done = true;
      cv.notify_one();
    });
  }
  cv_.notify_one();
  std::unique_lock<std::mutex> l(m);
  cv.wait(l, [&] { return done; });
  if (error) std::rethrow_exception(error);
  return std::move(*result);
}

}  // namespace tessera::serve
