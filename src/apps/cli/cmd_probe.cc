// `tessera probe`: measures (or shows the cached) peaks: FMA, bf16 and int8 throughput, memory
// bandwidth (triad and read-only), the L2 and L3 read bandwidths, and the load when probed.
#include <cstdio>
#include <ctime>
#include <string>

#include "apps/cli/args.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/device.h"
#include "profile/probe.h"

namespace tessera::cli {
namespace {

// "2 MiB", "480 MiB", "1.5 MiB", "512 KiB".
std::string size_text(int64_t bytes) {
  char buf[32];
  if (bytes >= (int64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%g MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%g KiB", static_cast<double>(bytes) / 1024);
  return buf;
}

// One cache level's line: its read bandwidth, or why it was not measured. `where`: the data's
// place, e.g. "one core's 2 MiB L2".
void print_cache(const char* label, int64_t bytes, const std::string& where, double all,
                 double one) {
  if (bytes <= 0) {
    std::printf("%s n/a (size unreadable from /sys/devices/system/cpu/cpu0/cache)\n", label);
    return;
  }
  std::printf("%s %8.1f GB/s all threads,     %8.1f GB/s one thread (read-only, data in %s)\n",
              label, all, one, where.c_str());
}

int run(const Args& args) {
  const int threads = static_cast<int>(args.i64("--threads"));
  const bool json = args.on("--json"), force = args.on("--force");
  profile::MachinePeaks p;
  if (force) {
    p = profile::probe_machine(threads);
    profile::save_peaks(p);  // later commands use the new reading
  } else {
    p = profile::cached_peaks(threads);
  }
  if (json) {
    std::printf("%s\n", profile::peaks_to_json(p).c_str());
    return 0;
  }
  std::printf("cpu          %s\n", p.cpu.c_str());
  std::printf("simd         %s (Highway target %s)\n", cpu::simd_summary().c_str(),
              cpu::highway_target().c_str());
  std::printf("int8 kernels %s\n",
              cpu::quant_avx512_vnni_active()
                  ? "avx512-vnni (q4_0, q4_1, q8_0, q4_K, Q5_K in 8-row groups; Q6_K), "
                    "avx2 (other block types)"
              : cpu::quant_avx2_supported() ? "avx2 (vpmaddubsw)"
                                            : "highway (int16 multiply-add)");
  std::printf("gemm kernels f32: %s; bf16: %s\n",
              cpu::gemm_kernel_name(cpu::GemmKernel::f32_fma).c_str(),
              cpu::gemm_kernel_name(cpu::gemm_kernel_for(true, 256)).c_str());
  std::printf("amx          %s\n", cpu::amx_summary().c_str());
  std::printf("threads      %d\n", p.threads);
  std::printf("f32 FMA peak %8.1f GFLOP/s all threads, %8.1f GFLOP/s one thread\n",
              p.f32_gflops_all, p.f32_gflops_one);
  if (p.bf16_gflops_all > 0)
    std::printf("bf16 peak    %8.1f GFLOP/s all threads, %8.1f GFLOP/s one thread\n",
                p.bf16_gflops_all, p.bf16_gflops_one);
  else
    std::printf("bf16 peak    n/a (no AVX512-BF16 on this CPU: bf16 matmuls run as f32 FMAs)\n");
  if (p.int8_gops_all > 0)
    std::printf(
        "int8 peak    %8.1f GOP/s all threads,   %8.1f GOP/s one thread (%s; 2 ops per "
        "multiply-add)\n",
        p.int8_gops_all, p.int8_gops_one, p.int8_kind.c_str());
  else
    std::printf("int8 peak    n/a (no AVX2 on this CPU)\n");
  std::printf(
      "triad        %8.1f GB/s all threads,     %8.1f GB/s one thread (a = b + s*c from "
      "memory, STREAM's count)\n",
      p.triad_gbs_all, p.triad_gbs_one);
  std::printf(
      "read         %8.1f GB/s all threads,     %8.1f GB/s one thread (read-only stream "
      "from memory: decode's roof)\n",
      p.read_gbs_all, p.read_gbs_one);
  print_cache("L2 read     ", p.l2_bytes, "one core's " + size_text(p.l2_bytes) + " L2",
              p.l2_gbs_all, p.l2_gbs_one);
  print_cache("L3 read     ", p.l3_bytes, "the " + size_text(p.l3_bytes) + " L3", p.l3_gbs_all,
              p.l3_gbs_one);
  const std::time_t at = static_cast<std::time_t>(p.probed_at);
  char when[32] = "unknown";
  if (p.probed_at > 0) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&at));
  std::printf("probed       %s (re-measured when older than %lld days; --force now)\n", when,
              static_cast<long long>(profile::kProbeMaxAgeSeconds / 86400));
  const bool busy = p.load_at_probe > 0.5 * p.cores;
  std::printf("load         %.2f on %d cores at the probe's start (1-minute average%s)\n",
              p.load_at_probe, p.cores,
              busy ? "; busy: the peaks may read low, re-measured once the load falls" : "");
  std::printf("ridge point  %8.1f FLOP/byte (f32 peak / bandwidth)\n",
              p.f32_gflops_all / p.triad_gbs_all);
  std::printf("cuda         %s\n", backend::cuda_device_summary().c_str());
  return 0;
}

const Registrar reg({
    "probe",
    "measure this machine's peak FLOP/s and memory bandwidth",
    {
        Flag::threads("threads to measure with; 0: all cores"),
        Flag::toggle("--json", "the peaks as one JSON line"),
        Flag::toggle("--force", "measure now (and cache) instead of reading the cache"),
    },
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
