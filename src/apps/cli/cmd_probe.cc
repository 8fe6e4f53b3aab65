// `tessera probe`: measures (or shows the cached) peak FMA throughput and memory bandwidth.
#include <cstdio>
#include <ctime>

#include "apps/cli/args.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/device.h"
#include "profile/probe.h"

namespace tessera::cli {
namespace {

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
  std::printf("triad        %8.1f GB/s all threads,     %8.1f GB/s one thread\n", p.triad_gbs_all,
              p.triad_gbs_one);
  const std::time_t at = static_cast<std::time_t>(p.probed_at);
  char when[32] = "unknown";
  if (p.probed_at > 0) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&at));
  std::printf("probed       %s (re-measured when older than %lld days; --force now)\n", when,
              static_cast<long long>(profile::kProbeMaxAgeSeconds / 86400));
  std::printf("ridge point  %8.1f FLOP/byte (f32 peak / bandwidth)\n",
              p.f32_gflops_all / p.triad_gbs_all);
  std::printf("cuda         %s\n", backend::cuda_device_summary().c_str());
  return 0;
}

const Registrar reg({
    "probe",
    "measure this machine's peak FLOP/s and memory bandwidth",
    {
        Flag::integer("--threads", 0, 0, 1024, "threads to measure with; 0: all cores"),
        Flag::toggle("--json", "the peaks as one JSON line"),
        Flag::toggle("--force", "measure now (and cache) instead of reading the cache"),
    },
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
