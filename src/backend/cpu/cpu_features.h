// Run-time CPU feature checks for the hand-written intrinsic paths that Highway 1.0.3 lacks
// (AVX512-BF16 dot products, AVX512-VNNI / AVX-VNNI int8 dot products).
#pragma once

#include <string>

namespace tessera::cpu {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false;
  bool avx512_bf16 = false, avx512_vnni = false, avx_vnni = false;
};
const CpuFeatures& cpu_features();
std::string cpu_name();        // model name from cpuid's brand string
std::string simd_summary();    // "avx2 fma" / "avx512f avx512bw avx512-bf16 ..." for reports
std::string highway_target();  // the Highway target chosen at run time, e.g. "AVX2"

}  // namespace tessera::cpu
