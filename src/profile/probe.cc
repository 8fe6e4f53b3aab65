// Peak measurements: an FMA loop with enough independent accumulators to cover the FMA latency
// on every port, and a STREAM-style triad, each run on one thread and on all threads.
#include "profile/probe.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "profile/timer.h"

namespace tessera::profile {

namespace {

// 12 independent accumulators: 2 FMA ports x 4-5 cycles latency needs >= 10 in flight.
constexpr int kAccumulators = 12;
constexpr int64_t kFmaIterations = 20'000'000;

// Stores a loop's result where the compiler must assume it is read, so the loop is not removed
// (one per thread: the loops run on every thread at once).
thread_local volatile float g_sink;

__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters) {
  __m256 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  for (int i = 0; i < kAccumulators; ++i) g_sink = _mm256_cvtss_f32(acc[i]);
  return static_cast<double>(iters) * kAccumulators * 8 * 2;
}

__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iters) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  float lanes[16];
  for (int i = 0; i < kAccumulators; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    g_sink = lanes[0];
  }
  return static_cast<double>(iters) * kAccumulators * 16 * 2;
}

// vdpbf16ps: 32 bf16 products summed pairwise into 16 f32 lanes = 64 flops per instruction.
__attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"))) double bf16_loop(int64_t iters) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  float lanes[16];
  for (int i = 0; i < kAccumulators; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    g_sink = lanes[0];
  }
  return static_cast<double>(iters) * kAccumulators * 64;
}

double fma_loop_scalar(int64_t iters) {
  float acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.001f * i;
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  for (int i = 0; i < kAccumulators; ++i) g_sink = acc[i];
  return static_cast<double>(iters) * kAccumulators * 2;
}

using Loop = double (*)(int64_t);

// Best of 3 runs of `loop` on `threads` threads at once; returns GFLOP/s summed over threads.
double measure_flops(Loop loop, int threads, int64_t iters) {
  ThreadPool pool(threads);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> flops(static_cast<size_t>(threads));
    const Timer t;
    pool.run([&](int i) { flops[static_cast<size_t>(i)] = loop(iters); });
    const double s = t.seconds();
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / s * 1e-9);
  }
  return best;
}

double measure_triad(int threads) {
  // 3 arrays of 32 Mi floats (128 MiB each): far beyond any last-level cache here.
  constexpr int64_t kN = int64_t{32} << 20;
  AlignedBuffer<float> a(kN), b(kN), c(kN);
  ThreadPool pool(threads);
  constexpr int64_t kGrain = int64_t{1} << 16;
  pool.parallel_for(kN, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) b[i] = 1.0f, c[i] = 2.0f;
  });
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const float s = 0.5f + rep;
    const Timer t;
    // Static split per thread so each thread streams one contiguous range.
    pool.run([&](int i) {
      const int64_t lo = kN * i / threads, hi = kN * (i + 1) / threads;
      float* __restrict pa = a.data();
      const float* __restrict pb = b.data();
      const float* __restrict pc = c.data();
      for (int64_t j = lo; j < hi; ++j) pa[j] = pb[j] + s * pc[j];
    });
    const double sec = t.seconds();
    best = std::max(best, 3.0 * 4.0 * kN / sec * 1e-9);  // STREAM counts read b, c and write a
  }
  return best;
}

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

}  // namespace

MachinePeaks probe_machine(int threads) {
  threads = all_cores_if_zero(threads);
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  Loop loop = avx512 ? fma_loop_avx512 : avx2 ? fma_loop_avx2 : fma_loop_scalar;
  const int64_t iters = avx512 || avx2 ? kFmaIterations : kFmaIterations / 4;
  MachinePeaks p;
  p.cpu = cpu_brand();
  p.threads = threads;
  p.f32_gflops_one = measure_flops(loop, 1, iters);
  p.f32_gflops_all = measure_flops(loop, threads, iters);
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool has_bf16 = avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
  if (has_bf16) {
    p.bf16_gflops_one = measure_flops(bf16_loop, 1, iters);
    p.bf16_gflops_all = measure_flops(bf16_loop, threads, iters);
  }
  p.triad_gbs_one = measure_triad(1);
  p.triad_gbs_all = measure_triad(threads);
  p.probed_at = unix_seconds();
  return p;
}

std::string peaks_to_json(const MachinePeaks& p) {
  nlohmann::json j = {{"cpu", p.cpu},
                      {"threads", p.threads},
                      {"f32_gflops_all", p.f32_gflops_all},
                      {"f32_gflops_one", p.f32_gflops_one},
                      {"bf16_gflops_all", p.bf16_gflops_all},
                      {"bf16_gflops_one", p.bf16_gflops_one},
                      {"triad_gbs_all", p.triad_gbs_all},
                      {"triad_gbs_one", p.triad_gbs_one},
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
  } catch (const nlohmann::json::exception& e) {
    fail("[probe] malformed probe cache: ", e.what());
  }
  TS_CHECK(p.threads > 0 && p.f32_gflops_all > 0 && p.triad_gbs_all > 0,
           "[probe] probe cache holds non-positive peaks");
  return p;
}

double measure_triad_gbs(int threads) {
  return measure_triad(all_cores_if_zero(threads));
}

bool probe_is_fresh(const MachinePeaks& p, int64_t now) {
  return p.probed_at > 0 && p.probed_at <= now && now - p.probed_at <= kProbeMaxAgeSeconds;
}

MachinePeaks cached_peaks(int threads, int64_t now) {
  threads = all_cores_if_zero(threads);
  if (now == 0) now = unix_seconds();
  const std::string path = cache_path();
  std::ifstream in(path);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      MachinePeaks p = peaks_from_json(ss.str());
      if (p.threads == threads && p.cpu == cpu_brand() && probe_is_fresh(p, now)) return p;
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
