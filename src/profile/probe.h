// This machine's measured peaks: FMA throughput (f32; bf16 where the CPU has bf16 dot products)
// and memory bandwidth (STREAM-like triad over arrays far larger than the caches), for all cores
// and one core. Cached in ~/.cache/tessera/probe.json (for a week) so commands can report % of
// peak.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::profile {

struct MachinePeaks {
  std::string cpu;
  int threads = 1;
  double f32_gflops_all = 0, f32_gflops_one = 0;
  double bf16_gflops_all = 0, bf16_gflops_one = 0;  // 0 when the CPU has no bf16 dot product
  double triad_gbs_all = 0, triad_gbs_one = 0;      // GB/s = 1e9 bytes/s
  int64_t probed_at = 0;  // Unix seconds of the measurement (0: unknown, from an older cache)
};

// A cached probe older than this is measured again: on a shared VM the bandwidth a week-old
// reading saw can be far from today's.
inline constexpr int64_t kProbeMaxAgeSeconds = 7 * 24 * 3600;

// Runs the measurements (a few seconds). threads = 0 means all cores.
MachinePeaks probe_machine(int threads);
// Only the triad bandwidth on `threads` threads (0: all cores), best of 5, under a second: what
// a benchmark measures beside its own run instead of trusting the cache.
double measure_triad_gbs(int threads);
// Returns cached peaks if present, made for the same CPU and thread count, and fresh (probed
// within kProbeMaxAgeSeconds of `now`, not after it), else probes and caches. now = 0 means the
// clock. Never throws for an unwritable cache (it just doesn't cache).
MachinePeaks cached_peaks(int threads, int64_t now = 0);
// Writes p to the cache (what `tessera probe --force` does after measuring); false if the cache
// cannot be written.
bool save_peaks(const MachinePeaks& p);
// Whether peaks probed at p.probed_at may still be used at `now` (both Unix seconds).
bool probe_is_fresh(const MachinePeaks& p, int64_t now);
std::string peaks_to_json(const MachinePeaks& p);
MachinePeaks peaks_from_json(const std::string& json);  // throws Error on malformed input

}  // namespace tessera::profile
