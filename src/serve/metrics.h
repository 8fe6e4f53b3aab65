// The server's metrics in the Prometheus text format (version 0.0.4): request counts by endpoint
// and status, token counters, time-to-first-token and inter-token latency histograms, and the
// scheduler's gauges (queue, running batch, KV blocks, prefix-cache hits, preemptions), the
// queue and KV gauges also under the names vLLM exports so that gateways routing on them treat
// a replica as they treat vLLM. Thread-safe: HTTP threads and the engine loop record into it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "infer/scheduler.h"

namespace tessera::serve {

// Cumulative buckets with fixed upper bounds (seconds, or counts).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // "# TYPE name histogram" and its _bucket, _sum and _count lines.
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int status);
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  // The engine loop's latest view of the scheduler, and its busy/idle state.
  void set_scheduler(const infer::SchedulerStats& s, int64_t kv_blocks_total);
  void set_memory_bandwidth(double bytes_per_second) { bandwidth_ = bytes_per_second; }
  infer::SchedulerStats scheduler() const;
  // The whole exposition, ready for GET /metrics.
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_, itl_, step_sequences_;
  infer::SchedulerStats sched_;
  int64_t last_steps_ = 0;
  int64_t kv_total_ = 0;
  double bandwidth_ = 0;
};

}  // namespace tessera::serve
