// This machine's measured peaks: FMA throughput (f32; bf16 where the CPU has bf16 dot products)
// and memory bandwidth (STREAM-like triad over arrays far larger than the caches), for all cores
// and one core. Cached in ~/.cache/tessera/probe.json so commands can report % of peak.
#pragma once

#include <string>

namespace tessera::profile {

struct MachinePeaks {
  std::string cpu;
  int threads = 1;
  double f32_gflops_all = 0, f32_gflops_one = 0;
  double bf16_gflops_all = 0, bf16_gflops_one = 0;  // 0 when the CPU has no bf16 dot product
  double triad_gbs_all = 0, triad_gbs_one = 0;      // GB/s = 1e9 bytes/s
};

// Runs the measurements (a few seconds). threads = 0 means all cores.
MachinePeaks probe_machine(int threads);
// Returns cached peaks if present and made for the same CPU and thread count, else probes and
// caches. Never throws for an unwritable cache (it just doesn't cache).
MachinePeaks cached_peaks(int threads);
std::string peaks_to_json(const MachinePeaks& p);
MachinePeaks peaks_from_json(const std::string& json);  // throws Error on malformed input

}  // namespace tessera::profile
