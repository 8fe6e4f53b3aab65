// The engine thread: takes requests, cancellations and jobs from the inbox, steps the scheduler
// while it has work (sleeping otherwise), turns the scheduler's sink calls into stream events
// and latency observations, and publishes the scheduler's figures to the metrics.
#include "serve/engine_loop.h"

#include <cstdio>

#include "profile/timer.h"

namespace tessera::serve {

bool RequestStream::wait(Events* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !pending_.empty(); });
  if (pending_.empty()) return false;
  *out = std::move(pending_);
  pending_ = Events{};
  return true;
}

bool RequestStream::over() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return failed_ || finished_ == samples_;
}

void RequestStream::push_delta(Delta d) {
  const std::lock_guard<std::mutex> lock(mu_);
  pending_.deltas.push_back(std::move(d));
  cv_.notify_all();
}

void RequestStream::push_finished(size_t index, infer::GenerateResult&& r) {
  const std::lock_guard<std::mutex> lock(mu_);
  pending_.finished.emplace_back(index, std::move(r));
  ++finished_;
  cv_.notify_all();
}

void RequestStream::fail(const std::string& message) {
  const std::lock_guard<std::mutex> lock(mu_);
  pending_.error = message;
  failed_ = true;
  cv_.notify_all();
}

EngineLoop::EngineLoop(infer::Engine& engine, const tokenizer::Tokenizer& tok,
                       const infer::SchedulerOptions& opts, Metrics& metrics)
    : engine_(engine), sched_(engine, tok, opts), metrics_(metrics) {
  publish();
  thread_ = std::thread([this] { loop(); });
}

EngineLoop::~EngineLoop() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestStream> EngineLoop::submit(infer::GenerateRequest req) {
  auto s = std::make_shared<RequestStream>(req.n);
  s->added_ = profile::now_seconds();
  s->last_token_.assign(static_cast<size_t>(req.n), 0.0);
  {
    const std::lock_guard<std::mutex> lock(mu_);
    inbox_.emplace_back(std::move(req), s);
    idle_ = false;
  }
  cv_.notify_all();
  return s;
}

void EngineLoop::cancel(const std::shared_ptr<RequestStream>& s) {
  s->abandon();
  {
    const std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(s);
  }
  cv_.notify_all();
}

void EngineLoop::cancel_all() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    cancel_all_ = true;
  }
  cv_.notify_all();
}

int64_t EngineLoop::waiting() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return waiting_ + static_cast<int64_t>(inbox_.size());
}

bool EngineLoop::idle() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return idle_ && inbox_.empty();
}

void EngineLoop::publish() {
  const infer::SchedulerStats st = sched_.stats();
  metrics_.set_scheduler(st, engine_.cache().shape().n_blocks);
  const std::lock_guard<std::mutex> lock(mu_);
  waiting_ = st.waiting;
  idle_ = sched_.idle();
}

void EngineLoop::loop() {
  for (;;) {
    decltype(inbox_) inbox;
    decltype(cancels_) cancels;
    decltype(jobs_) jobs;
    bool all = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !inbox_.empty() || !cancels_.empty() || !jobs_.empty() || cancel_all_ ||
               !sched_.idle();
      });
      if (stop_) break;
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      jobs.swap(jobs_);
      all = cancel_all_;
      cancel_all_ = false;
    }
    for (auto& [req, stream] : inbox) {
      infer::RequestSink sink;
      RequestStream* s = stream.get();
      sink.on_tokens = [this, s](size_t k, std::span<const infer::GeneratedToken> t,
                                 std::string_view text) {
        const double now = profile::now_seconds();
        double& last = s->last_token_[k];
        if (last == 0)
          metrics_.observe_ttft(now - s->added_);
        else
          metrics_.observe_itl(now - last);
        last = now;
        s->push_delta({k, {t.begin(), t.end()}, std::string(text)});
        return !s->abandoned();
      };
      sink.on_finish = [s](size_t k, infer::GenerateResult&& r) {
        s->push_finished(k, std::move(r));
      };
      try {
        stream->id_ = sched_.add(std::move(req), std::move(sink));
        live_.push_back(stream);
      } catch (const std::exception& e) {
        stream->fail(e.what());
      }
    }
    for (auto& s : cancels) sched_.cancel(s->id_);
    if (all)
      for (auto& s : live_) sched_.cancel(s->id_);
    for (auto& job : jobs) job();
    try {
      // Nothing could run though requests remain (they wait on blocks a cancel will free): do
      // not spin.
      if (!sched_.step() && !sched_.idle())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } catch (const std::exception& e) {
      // The engine failed (a bug, or the device): every request in flight ends with the error,
      // and the server goes on with an empty batch.
      std::fprintf(stderr, "[serve] engine step failed: %s\n", e.what());
      for (auto& s : live_) {
        sched_.cancel(s->id_);
        s->fail(std::string("engine error: ") + e.what());
      }
    }
    std::erase_if(live_, [](const std::shared_ptr<RequestStream>& s) { return s->over(); });
    publish();
  }
  for (auto& s : live_) sched_.cancel(s->id_);
}

}  // namespace tessera::serve
