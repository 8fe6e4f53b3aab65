// Run-time CPU feature checks for the hand-written intrinsic paths that Highway 1.0.3 lacks
// (AVX512-BF16 dot products, AVX512-VNNI / AVX-VNNI int8 dot products).
#pragma once

#include <string>

namespace tessera::cpu {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false;
  bool avx512_bf16 = false, avx512_vnni = false, avx_vnni = false;
  // AMX as cpuid reports it, and whether the kernel granted this process the tile data state
  // (arch_prctl ARCH_REQ_XCOMP_PERM): a VM may advertise AMX and refuse it.
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false, amx_granted = false;
};
const CpuFeatures& cpu_features();
std::string cpu_name();        // model name from cpuid's brand string
std::string simd_summary();    // "avx2 fma" / "avx512f avx512bw avx512-bf16 ..." for reports
std::string highway_target();  // the Highway target chosen at run time, e.g. "AVX2"
std::string amx_summary();     // "absent", "offered but not granted ...", "granted (...)"

}  // namespace tessera::cpu
