// Wall-clock timing helpers for benchmarks, progress reports and profiles.
#pragma once

#include <chrono>

namespace tessera::profile {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

class Timer {
 public:
  Timer() : start_(now_seconds()) {}
  void reset() { start_ = now_seconds(); }
  double seconds() const { return now_seconds() - start_; }

 private:
  double start_;
};

// Peak resident set size of this process in bytes since start or the last reset_peak_rss().
long long peak_rss_bytes();
// Starts a new peak from the current resident size (Linux /proc/self/clear_refs; no-op elsewhere),
// so scratch memory freed earlier (the bandwidth probe's arrays) does not count.
void reset_peak_rss();
// Current resident set size in bytes (from /proc/self/statm).
long long current_rss_bytes();
// Bytes of this process's memory on transparent huge pages now (AnonHugePages of
// /proc/self/smaps_rollup; 0 where unknown).
long long huge_page_bytes();

}  // namespace tessera::profile
