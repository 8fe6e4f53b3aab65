// This machine's measured peaks, the roofs that ops are judged against: FMA throughput (f32;
// bf16 where the CPU has bf16 dot products), int8 dot-product throughput, memory bandwidth
// (STREAM-like triad, and read-only streaming, both over buffers far larger than the caches),
// and the read bandwidth of the L2 and L3 caches, for all cores and one core. Cached in
// ~/.cache/tessera/probe.json so commands can report % of peak without measuring again.
//
// When a cached probe is measured again (cached_peaks; the rule is probe_needs_remeasure):
//   - it is stale: older than kProbeMaxAgeSeconds, undated, or dated after now;
//   - it is an older format (format < kProbeFormat): a cache written before a field existed
//     lacks that roof;
//   - it was taken on a busy machine and the machine is quieter now: the 1-minute load average
//     when the probe started was above half the online cores (load_at_probe > 0.5 * cores), so
//     other work shared the cores and the peaks read low, and the load now is lower than it was
//     then by at least a quarter of the cores (load_now < load_at_probe - 0.25 * cores). The
//     margin: the load average drifts by a few hundredths between two commands, and without it
//     every command on a busy machine whose load eases a little would probe again (seconds each)
//     and read about as low; a quarter of the cores freed is a reading worth taking.
//   - or it was made for another CPU or another thread count.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::profile {

// 2: added read-only bandwidth, L2/L3 roofs, int8 peak, load_at_probe and cores.
inline constexpr int kProbeFormat = 2;

struct MachinePeaks {
  std::string cpu;
  int threads = 1;
  double f32_gflops_all = 0, f32_gflops_one = 0;
  double bf16_gflops_all = 0, bf16_gflops_one = 0;  // 0 when the CPU has no bf16 dot product
  double triad_gbs_all = 0, triad_gbs_one = 0;      // GB/s = 1e9 bytes/s
  int64_t probed_at = 0;  // Unix seconds of the measurement (0: unknown, from an older cache)

  int format = kProbeFormat;  // an older cache reads as 1 (its new fields stay 0)
  // Read-only streaming (a vectorized sum) over a buffer far larger than the last-level cache:
  // what a decode step that reads every weight once can reach, so its roof rather than triad's
  // (here the two came out within 10% of each other, either way, from run to run).
  double read_gbs_all = 0, read_gbs_one = 0;
  // Cache capacities from /sys/devices/system/cpu/cpu0/cache (0 when unreadable): the L2 of
  // one core, and the L3 of the whole machine (every instance).
  int64_t l2_bytes = 0, l3_bytes = 0;
  // Read bandwidth from each cache level: repeated read-only passes over a per-thread slice
  // that fits the level (half a core's L2; the L2 plus half the thread's share of the L3).
  // 0 when the level's size is unknown (not measured).
  double l2_gbs_all = 0, l2_gbs_one = 0;
  double l3_gbs_all = 0, l3_gbs_one = 0;
  // int8 dot products, GOP/s counting a multiply-add as 2 ops; int8_kind names the instruction
  // ("avx512-vnni vpdpbusd", "avx-vnni vpdpbusd (256-bit)", "avx2 vpmaddubsw+vpmaddwd+vpaddd",
  // or "none" with 0 peaks).
  double int8_gops_all = 0, int8_gops_one = 0;
  std::string int8_kind;
  double load_at_probe = 0;  // /proc/loadavg's 1-minute value when the probe started
  int cores = 0;             // CPUs online when probed
};

// A cached probe older than this is measured again: on a shared VM the bandwidth a week-old
// reading saw can be far from today's.
inline constexpr int64_t kProbeMaxAgeSeconds = 7 * 24 * 3600;

// Runs the measurements (a few seconds). threads = 0 means all cores.
MachinePeaks probe_machine(int threads);
// Only the triad bandwidth on `threads` threads (0: all cores), best of 5, under a second: what
// a benchmark measures beside its own run instead of trusting the cache.
double measure_triad_gbs(int threads);
// Returns cached peaks if present, made for the same CPU and thread count, and not to be
// re-measured by probe_needs_remeasure(p, now, load_now), else probes and caches. now = 0 means
// the clock; load_now < 0 means /proc/loadavg now. Never throws for an unwritable cache (it just
// doesn't cache).
MachinePeaks cached_peaks(int threads, int64_t now = 0, double load_now = -1);
// Writes p to the cache (what a forced probe does after measuring); false if the cache
// cannot be written.
bool save_peaks(const MachinePeaks& p);
// Whether peaks probed at p.probed_at may still be used at `now` (both Unix seconds).
bool probe_is_fresh(const MachinePeaks& p, int64_t now);
// The rule above (staleness, an older format, a busy probe and a quieter machine now), for a
// cache already known to be this CPU's and thread count's. load_now: the 1-minute load average.
bool probe_needs_remeasure(const MachinePeaks& p, int64_t now, double load_now);
std::string peaks_to_json(const MachinePeaks& p);
// Throws Error on malformed input. A cache without "format" is format 1 and needs none of the
// newer fields; one that says format 2 needs them all.
MachinePeaks peaks_from_json(const std::string& json);

// Cache capacities from a sysfs cache folder (/sys/devices/system/cpu/cpu0/cache): its index*/
// entries' level, type, size ("2048K") and shared_cpu_list ("0-1,4"). Unreadable: 0 bytes.
struct CacheInfo {
  int64_t l2_bytes = 0;           // one L2 instance (one core's, or shared by l2_sharing CPUs)
  int l2_sharing = 1;             // CPUs sharing that L2
  int64_t l3_instance_bytes = 0;  // one L3 instance
  int l3_sharing = 1;             // CPUs sharing it
  int64_t l3_bytes = 0;           // every instance together (instances = cores / l3_sharing)
};
CacheInfo read_cache_info(const std::string& dir, int cores);
// The 1-minute load average from a /proc/loadavg-style file; 0 when unreadable.
double read_load_average(const std::string& path = "/proc/loadavg");

}  // namespace tessera::profile
