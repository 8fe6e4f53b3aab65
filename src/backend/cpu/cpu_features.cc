// cpuid-based feature detection (GCC's builtins) and the Highway target name.
#include "backend/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "core/error.h"
#include "hwy/targets.h"

namespace tessera::cpu {

namespace {
CpuFeatures detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(1, 0, &a, &b, &c, &d)) f.f16c = (c >> 29) & 1;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    f.amx_int8 = (d >> 25) & 1;
  }
  // Linux hands out the AMX tile data state (XFEATURE_XTILEDATA = 18) only on request
  // (ARCH_REQ_XCOMP_PERM = 0x1023); without it the first tile instruction faults.
  if (f.amx_tile) f.amx_granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx_vnni = (a >> 4) & 1;
    f.avx512_bf16 = (a >> 5) & 1;
  }
  return f;
}
}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::string cpu_name() {
  char brand[49] = {};
  unsigned regs[12] = {};
  for (unsigned i = 0; i < 3; ++i)
    if (!__get_cpuid(0x80000002u + i, &regs[i * 4], &regs[i * 4 + 1], &regs[i * 4 + 2],
                     &regs[i * 4 + 3]))
      return "unknown CPU";
  std::memcpy(brand, regs, 48);
  std::string s(brand);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string simd_summary() {
  const auto& f = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512_bf16, "avx512-bf16");
  add(f.avx512_vnni, "avx512-vnni");
  add(f.avx_vnni, "avx-vnni");
  return s.empty() ? "none" : s;
}

std::string amx_summary() {
  const auto& f = cpu_features();
  if (!f.amx_tile) return "absent (cpuid)";
  const std::string kinds = std::string(f.amx_bf16 ? "bf16" : "") +
                            (f.amx_bf16 && f.amx_int8 ? " " : "") + (f.amx_int8 ? "int8" : "");
  if (!f.amx_granted)
    return cat("offered (", kinds, ") but the kernel refused the tile state: not used");
  return cat("granted (", kinds, "); no AMX kernel yet: products take the kernels above");
}

std::string highway_target() {
  const int64_t targets = hwy::SupportedTargets();
  // The best supported target is the lowest set bit among compiled targets on x86.
  for (int64_t bit = 1; bit != 0 && bit <= targets; bit <<= 1)
    if (targets & bit) return hwy::TargetName(bit);
  return "scalar";
}

}  // namespace tessera::cpu
