// The machine probe: which peaks to measure and with which buffer sizes (the loops themselves
// are in probe_loops.cc), the machine facts they depend on (cache sizes, load, cores), and the
// JSON cache with its rule for measuring again.
#include "profile/probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "profile/probe_loops.h"

namespace tessera::profile {

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// The triad's 3 arrays of 32 Mi floats (128 MiB each): together beyond any last-level cache
// that this machine's bandwidth actually shows (see kReadBufferMaxBytes).
constexpr int64_t kTriadFloats = int64_t{32} << 20;
// The read-only stream reads a buffer 4x the L3: a cyclic pass over k times a cache's capacity
// can still hit in about 1/k of it under adaptive replacement, so 4x keeps the reading within
// ~25% of memory's even there (and at 0 under LRU). Unknown L3: the cap below.
constexpr int64_t kReadBufferL3Multiple = 4;
// At least the triad's arrays (the triad runs in the same buffer); at most 512 MiB, for time:
// one thread reads it 5 times in ~0.2 s at 15 GB/s, and faulting it in (huge pages, which the
// kernel may first have to compact) took 0.2-1.5 s here, 1 GiB up to 2.9 s. On these VMs sysfs
// reports a 480 MiB L3 while a read over 128 MiB already runs at memory speed (the host's real
// L3 is ~100 MiB), so the cap loses nothing here; on a machine with more than ~128 MiB of real
// L3 the read-only figure may include some cache hits.
constexpr int64_t kReadBufferMinBytes = 3 * kTriadFloats * 4;
constexpr int64_t kReadBufferMaxBytes = 512 * kMiB;
// Each timed run of a cache-level read moves at least this much per thread (in whole passes):
// ~1.2 ms from L2, long against the ~50 us a pool run takes to start; one pass of a slice
// of more than 96 MiB.
constexpr int64_t kCacheBytesPerRun = 192 * kMiB;
// Best of 5, as the triad: the VMs here show run-to-run swings of 10-30%.
constexpr int kReadReps = 5;

const char* const kCacheDir = "/sys/devices/system/cpu/cpu0/cache";

std::string cpu_brand() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  return "unknown CPU";
}

// threads <= 0 means every core.
int all_cores_if_zero(int threads) {
  return threads > 0 ? threads
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int online_cores() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : all_cores_if_zero(0);
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg && *xdg ? xdg : (home && *home ? std::string(home) + "/.cache" : ".cache");
  return base + "/tessera/probe.json";
}

std::string read_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string s;
  std::getline(in, s);
  return s;
}

// "2048K", "32M", "1G" or plain bytes; 0 when malformed.
int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || v <= 0) return 0;
  const std::string unit(end);
  if (unit.empty()) return v;
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  if (unit == "G") return v << 30;
  return 0;
}

// CPUs in a list such as "0-3,8,10-11"; 0 when malformed or empty.
int count_cpu_list(const std::string& s) {
  int count = 0;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    int lo = 0, hi = 0;
    char dash = 0;
    std::stringstream ps(part);
    if (!(ps >> lo)) return 0;
    if (ps >> dash) {
      if (dash != '-' || !(ps >> hi) || hi < lo) return 0;
    } else {
      hi = lo;
    }
    count += hi - lo + 1;
  }
  return count;
}

int64_t round_to_block(int64_t floats) {
  return floats / loops::kReadBlockFloats * loops::kReadBlockFloats;
}

// Measures `one` with 1 thread and `all` with `threads` (the same figure when threads is 1).
template <typename F>
void one_and_all(int threads, double& all, double& one, F&& measure) {
  one = measure(1);
  all = threads == 1 ? one : measure(threads);
}

// The bandwidths: triad, read-only stream, then the cache levels, all in one buffer allocated
// (and faulted in) once.
void measure_memory(MachinePeaks& p, const CacheInfo& ci, int threads) {
  int64_t bytes = ci.l3_bytes > 0 ? kReadBufferL3Multiple * ci.l3_bytes : kReadBufferMaxBytes;
  int64_t cap = kReadBufferMaxBytes;
  if (const int64_t mem = physical_memory_bytes(); mem > 0) cap = std::min(cap, mem / 4);
  bytes = std::clamp(bytes, kReadBufferMinBytes, std::max(kReadBufferMinBytes, cap));
  const int64_t floats = round_to_block(bytes / 4) / threads * threads;
  loops::ReadBuffer buf(floats, threads);

  one_and_all(threads, p.triad_gbs_all, p.triad_gbs_one,
              [&](int t) { return loops::measure_triad(buf.data(), kTriadFloats, t); });
  // Memory: each thread streams its share of the whole buffer once per run.
  one_and_all(threads, p.read_gbs_all, p.read_gbs_one, [&](int t) {
    return loops::measure_read(buf.data(), round_to_block(floats / t), t, 1, kReadReps, false);
  });
  // A level's slice per thread must fit the level and miss the levels above it. L2: half of
  // a core's L2 (the rest holds the code, the stack, and lines the hardware prefetched).
  auto cache_gbs = [&](int64_t slice_bytes, int t) {
    const int64_t per_thread = std::min(round_to_block(slice_bytes / 4), floats / t);
    if (per_thread <= 0) return 0.0;
    const int64_t passes = std::max<int64_t>(1, kCacheBytesPerRun / (per_thread * 4));
    return loops::measure_read(buf.data(), round_to_block(per_thread), t, passes, kReadReps, true);
  };
  if (ci.l2_bytes > 0) {
    const int64_t slice = ci.l2_bytes / 2 / std::max(1, ci.l2_sharing);
    one_and_all(threads, p.l2_gbs_all, p.l2_gbs_one, [&](int t) { return cache_gbs(slice, t); });
  }
  // L3: a slice of the L2's size plus half the thread's share of the L3. A pass over more than
  // the L2 misses it on every line (the L2 keeps the most recent lines, the pass wants the
  // oldest next), and the L3 has to hold only the part beyond the L2: with half its share taken
  // the data stays in it, and the slice never fits in the L2 however small the share is.
  if (ci.l3_bytes > 0) {
    const int64_t share = ci.l3_instance_bytes / std::max(1, ci.l3_sharing);
    const int64_t slice = ci.l2_bytes + share / 2;
    one_and_all(threads, p.l3_gbs_all, p.l3_gbs_one, [&](int t) { return cache_gbs(slice, t); });
  }
}

}  // namespace

CacheInfo read_cache_info(const std::string& dir, int cores) {
  CacheInfo ci;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("index", 0) != 0) continue;
    const std::string type = read_line(entry.path() / "type");
    if (type != "Unified" && type != "Data") continue;
    const std::string level = read_line(entry.path() / "level");
    const int64_t size = parse_size(read_line(entry.path() / "size"));
    const int sharing = std::max(1, count_cpu_list(read_line(entry.path() / "shared_cpu_list")));
    if (level == "2") {
      ci.l2_bytes = size;
      ci.l2_sharing = sharing;
    } else if (level == "3") {
      ci.l3_instance_bytes = size;
      ci.l3_sharing = sharing;
    }
  }
  const int instances = std::max(1, (std::max(1, cores) + ci.l3_sharing - 1) / ci.l3_sharing);
  ci.l3_bytes = ci.l3_instance_bytes * instances;
  return ci;
}

double read_load_average(const std::string& path) {
  std::ifstream in(path);
  double load = 0;
  if (!(in >> load) || load < 0) return 0;
  return load;
}

MachinePeaks probe_machine(int threads) {
  threads = all_cores_if_zero(threads);
  MachinePeaks p;
  p.load_at_probe = read_load_average();  // before the probe's own threads raise it
  p.cores = online_cores();
  p.cpu = cpu_brand();
  p.threads = threads;
  const loops::ComputeLoop f32 = loops::f32_loop(), bf16 = loops::bf16_loop(),
                           int8 = loops::int8_loop();
  one_and_all(threads, p.f32_gflops_all, p.f32_gflops_one,
              [&](int t) { return loops::measure_ops(f32, t); });
  one_and_all(threads, p.bf16_gflops_all, p.bf16_gflops_one,
              [&](int t) { return loops::measure_ops(bf16, t); });
  one_and_all(threads, p.int8_gops_all, p.int8_gops_one,
              [&](int t) { return loops::measure_ops(int8, t); });
  p.int8_kind = int8.kind;
  const CacheInfo ci = read_cache_info(kCacheDir, p.cores);
  p.l2_bytes = ci.l2_bytes;
  p.l3_bytes = ci.l3_bytes;
  measure_memory(p, ci, threads);
  p.probed_at = unix_seconds();
  return p;
}

std::string peaks_to_json(const MachinePeaks& p) {
  nlohmann::ordered_json j = {{"format", p.format},
                              {"cpu", p.cpu},
                              {"threads", p.threads},
                              {"cores", p.cores},
                              {"f32_gflops_all", p.f32_gflops_all},
                              {"f32_gflops_one", p.f32_gflops_one},
                              {"bf16_gflops_all", p.bf16_gflops_all},
                              {"bf16_gflops_one", p.bf16_gflops_one},
                              {"int8_gops_all", p.int8_gops_all},
                              {"int8_gops_one", p.int8_gops_one},
                              {"int8_kind", p.int8_kind},
                              {"triad_gbs_all", p.triad_gbs_all},
                              {"triad_gbs_one", p.triad_gbs_one},
                              {"read_gbs_all", p.read_gbs_all},
                              {"read_gbs_one", p.read_gbs_one},
                              {"l2_bytes", p.l2_bytes},
                              {"l2_gbs_all", p.l2_gbs_all},
                              {"l2_gbs_one", p.l2_gbs_one},
                              {"l3_bytes", p.l3_bytes},
                              {"l3_gbs_all", p.l3_gbs_all},
                              {"l3_gbs_one", p.l3_gbs_one},
                              {"load_at_probe", p.load_at_probe},
                              {"probed_at", p.probed_at}};
  return j.dump(2);
}

MachinePeaks peaks_from_json(const std::string& text) {
  MachinePeaks p;
  try {
    const auto j = nlohmann::json::parse(text);
    p.cpu = j.at("cpu").get<std::string>();
    p.threads = j.at("threads").get<int>();
    p.f32_gflops_all = j.at("f32_gflops_all").get<double>();
    p.f32_gflops_one = j.at("f32_gflops_one").get<double>();
    p.bf16_gflops_all = j.at("bf16_gflops_all").get<double>();
    p.bf16_gflops_one = j.at("bf16_gflops_one").get<double>();
    p.triad_gbs_all = j.at("triad_gbs_all").get<double>();
    p.triad_gbs_one = j.at("triad_gbs_one").get<double>();
    // Caches written before the field existed have no date: treated as stale.
    p.probed_at = j.contains("probed_at") ? j.at("probed_at").get<int64_t>() : 0;
    // Caches written before the format field are format 1: none of the fields below.
    p.format = j.contains("format") ? j.at("format").get<int>() : 1;
    if (p.format >= 2) {
      p.cores = j.at("cores").get<int>();
      p.int8_gops_all = j.at("int8_gops_all").get<double>();
      p.int8_gops_one = j.at("int8_gops_one").get<double>();
      p.int8_kind = j.at("int8_kind").get<std::string>();
      p.read_gbs_all = j.at("read_gbs_all").get<double>();
      p.read_gbs_one = j.at("read_gbs_one").get<double>();
      p.l2_bytes = j.at("l2_bytes").get<int64_t>();
      p.l2_gbs_all = j.at("l2_gbs_all").get<double>();
      p.l2_gbs_one = j.at("l2_gbs_one").get<double>();
      p.l3_bytes = j.at("l3_bytes").get<int64_t>();
      p.l3_gbs_all = j.at("l3_gbs_all").get<double>();
      p.l3_gbs_one = j.at("l3_gbs_one").get<double>();
      p.load_at_probe = j.at("load_at_probe").get<double>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail("[probe] malformed probe cache: ", e.what());
  }
  TS_CHECK(p.threads > 0 && p.f32_gflops_all > 0 && p.triad_gbs_all > 0,
           "[probe] probe cache holds non-positive peaks");
  TS_CHECK(p.format >= 1, "[probe] probe cache has format ", p.format);
  if (p.format >= 2)
    TS_CHECK(p.cores > 0 && p.read_gbs_all > 0 && p.l2_bytes >= 0 && p.l3_bytes >= 0 &&
                 p.int8_gops_all >= 0 && p.load_at_probe >= 0,
             "[probe] probe cache holds non-positive cores, read bandwidth or cache sizes");
  return p;
}

double measure_triad_gbs(int threads) {
  threads = all_cores_if_zero(threads);
  loops::ReadBuffer buf(3 * kTriadFloats, threads);
  return loops::measure_triad(buf.data(), kTriadFloats, threads);
}

bool probe_is_fresh(const MachinePeaks& p, int64_t now) {
  return p.probed_at > 0 && p.probed_at <= now && now - p.probed_at <= kProbeMaxAgeSeconds;
}

bool probe_needs_remeasure(const MachinePeaks& p, int64_t now, double load_now) {
  if (!probe_is_fresh(p, now) || p.format < kProbeFormat) return true;
  // The rule and the reasons for both fractions are in probe.h.
  const bool busy = p.cores > 0 && p.load_at_probe > 0.5 * p.cores;
  return busy && load_now < p.load_at_probe - 0.25 * p.cores;
}

MachinePeaks cached_peaks(int threads, int64_t now, double load_now) {
  threads = all_cores_if_zero(threads);
  if (now == 0) now = unix_seconds();
  if (load_now < 0) load_now = read_load_average();
  const std::string path = cache_path();
  std::ifstream in(path);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      MachinePeaks p = peaks_from_json(ss.str());
      if (p.threads == threads && p.cpu == cpu_brand() && !probe_needs_remeasure(p, now, load_now))
        return p;
    } catch (const Error&) {
      // A corrupt cache is simply re-measured and overwritten.
    }
  }
  MachinePeaks p = probe_machine(threads);
  p.probed_at = now;
  save_peaks(p);
  return p;
}

bool save_peaks(const MachinePeaks& p) {
  const std::string path = cache_path();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path);
  if (!out) return false;
  out << peaks_to_json(p) << "\n";
  return static_cast<bool>(out);
}

}  // namespace tessera::profile
