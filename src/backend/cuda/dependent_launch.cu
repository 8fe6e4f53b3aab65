// The process-wide switch for programmatic dependent launch (dependent_launch.h): environment,
// override, and the per-device capability check.
#include <atomic>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.h"
#include "backend/cuda/runtime.h"

namespace tessera::cuda {

namespace {

// -1: not decided yet; 0 off; 1 on (where the GPU has it).
std::atomic<int> g_setting{-1};

// Whether each device has compute capability 9.x.
PerDeviceFlag g_capable;

int setting_from_env() {
  const char* v = std::getenv("TESSERA_CUDA_PDL");
  if (v == nullptr) return 1;
  const std::string s(v);
  if (s == "0") return 0;
  if (s == "1") return 1;
  fail("[cuda] TESSERA_CUDA_PDL=", s, " must be 0 (off) or 1 (on)");
}

bool device_capable() {
  return g_capable.get([] {
    int major = 0;
    TS_CUDA_CHECK(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device()));
    // Only sm_90 runs our sm_90a code, the one build with the device-side wait: newer GPUs
    // JIT the compute_80 PTX (no wait), where a dependent launch would race.
    return major == 9;
  });
}

}  // namespace

bool dependent_launch_enabled() {
  int s = g_setting.load(std::memory_order_relaxed);
  if (s < 0) {
    s = setting_from_env();
    int expected = -1;
    g_setting.compare_exchange_strong(expected, s);
    s = g_setting.load();
  }
  return s == 1 && device_capable();
}

void set_dependent_launch(bool on) {
  g_setting.store(on ? 1 : 0);
}

}  // namespace tessera::cuda
