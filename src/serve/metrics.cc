// Prometheus text exposition of the server's counters, gauges and histograms.
#include "serve/metrics.h"

#include <algorithm>
#include <charconv>

namespace tessera::serve {

namespace {

// The shortest text that reads back as v ("0.0025", not "0.0025000000000000001").
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void line(std::string& out, const std::string& name, const std::string& type,
          const std::string& help, double value) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         number(value) + "\n";
}

// Latency buckets from 1 ms to 60 s (Prometheus' defaults stretched to both ends: a decode step
// of a small model takes milliseconds, a first token behind a long queue tens of seconds).
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
          0.4,   0.5,    0.75,  1,    1.5,  2,    3,    5,    10,  20,   60};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[static_cast<size_t>(at)];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_(latency_bounds()),
      itl_(latency_bounds()),
      step_sequences_({1, 2, 4, 8, 16, 32, 64, 128, 256}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  const std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::observe_ttft(double seconds) {
  const std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::observe_itl(double seconds) {
  const std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds);
}

void Metrics::set_scheduler(const infer::SchedulerStats& s, int64_t kv_blocks_total) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (s.steps > last_steps_) step_sequences_.observe(static_cast<double>(s.last_step_sequences));
  last_steps_ = s.steps;
  sched_ = s;
  kv_total_ = kv_blocks_total;
}

infer::SchedulerStats Metrics::scheduler() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return sched_;
}

std::string Metrics::render() const {
  const std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out +=
      "# HELP tessera_requests_total HTTP requests by endpoint and status\n"
      "# TYPE tessera_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += "tessera_requests_total{endpoint=\"" + key.first + "\",status=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  const infer::SchedulerStats& s = sched_;
  auto d = [](int64_t v) { return static_cast<double>(v); };
  line(out, "tessera_prompt_tokens_total", "counter", "prompt tokens of admitted requests",
       d(s.prompt_tokens));
  line(out, "tessera_generation_tokens_total", "counter", "tokens generated",
       d(s.generated_tokens));
  line(out, "tessera_computed_prompt_tokens_total", "counter",
       "prompt tokens run through the model (prefix-cache hits excluded, recomputes included)",
       d(s.computed_prompt_tokens));
  line(out, "tessera_prefix_cache_query_tokens_total", "counter",
       "prompt tokens looked up in the prefix cache", d(s.prefix_query_tokens));
  line(out, "tessera_prefix_cache_hit_tokens_total", "counter",
       "prompt tokens served from the prefix cache", d(s.prefix_hit_tokens));
  line(out, "tessera_preemptions_total", "counter",
       "requests preempted when the KV cache ran out (recomputed later)", d(s.preemptions));
  line(out, "tessera_engine_steps_total", "counter", "engine forward steps", d(s.steps));
  line(out, "tessera_engine_busy_seconds_total", "counter", "seconds spent in engine forwards",
       s.busy_seconds);
  line(out, "tessera_memory_read_bytes_total", "counter",
       "bytes the forward passes read: weights once per step, each sequence's cached keys and "
       "values (estimated from their sizes)",
       d(s.memory_read_bytes));
  line(out, "tessera_memory_bandwidth_bytes_per_second", "gauge",
       "the machine's measured memory bandwidth (tessera probe); 0 if unknown", bandwidth_);
  line(out, "tessera_requests_running", "gauge", "requests in the running batch", d(s.running));
  line(out, "tessera_requests_waiting", "gauge", "requests waiting to start", d(s.waiting));
  line(out, "tessera_sequences_running", "gauge", "sequences (samples) in the running batch",
       d(s.running_sequences));
  line(out, "tessera_kv_blocks_used", "gauge", "KV-cache blocks requests hold",
       d(s.kv_blocks_used));
  line(out, "tessera_kv_blocks_free", "gauge",
       "KV-cache blocks no request holds (free, or kept by the prefix cache until needed)",
       d(s.kv_blocks_free));
  line(out, "tessera_kv_blocks_cached", "gauge",
       "KV-cache blocks the prefix cache keeps (some also held by requests)",
       d(s.kv_blocks_cached));
  const double usage = kv_total_ > 0 ? d(s.kv_blocks_used) / d(kv_total_) : 0;
  line(out, "vllm:num_requests_running", "gauge", "requests in the running batch (vLLM's name)",
       d(s.running));
  line(out, "vllm:num_requests_waiting", "gauge", "requests waiting to start (vLLM's name)",
       d(s.waiting));
  line(out, "vllm:kv_cache_usage_perc", "gauge", "fraction of KV-cache blocks in use (vLLM's name)",
       usage);
  ttft_.render(out, "tessera_time_to_first_token_seconds",
               "from the request's arrival to its first token");
  itl_.render(out, "tessera_inter_token_latency_seconds", "between a sequence's tokens");
  step_sequences_.render(out, "tessera_step_sequences", "sequences in each engine step");
  return out;
}

}  // namespace tessera::serve
