// Which FlashAttention kernels run: the sm_90a probe (asked of the code itself, once per
// device), the TESSERA_CUDA_FLASH_FWD / _BWD settings and their resolution per call.
#include <cstdlib>
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace {

// Writes 1 where the code running on this device was compiled with the sm_90a features.
__global__ void wgmma_probe_kernel(int* out) {
  *out = TESSERA_HAS_WGMMA;
}

// Whether each device runs the wgmma kernels.
PerDeviceFlag g_wgmma_ok;

bool ask_device() {
  const int dev = current_device();
  int major = 0, minor = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  // sm_90a code runs only on compute capability 9.0; elsewhere the PTX would be JIT'd.
  if (major != 9 || minor != 0) return false;
  // The first call may come while this thread captures a graph: relaxed mode lets the probe's
  // allocation and its own stream run beside the capture instead of invalidating it.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  TS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  struct RestoreMode {
    cudaStreamCaptureMode m;
    ~RestoreMode() { cudaThreadExchangeStreamCaptureMode(&m); }
  } restore{mode};
  cudaStream_t st = nullptr;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int* d = nullptr;
  int h = 0;
  cudaError_t err = cudaMalloc(&d, sizeof(int));
  if (err == cudaSuccess) {
    wgmma_probe_kernel<<<1, 1, 0, st>>>(d);
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaMemcpyAsync(&h, d, sizeof(int), cudaMemcpyDeviceToHost, st);
    if (err == cudaSuccess) err = cudaStreamSynchronize(st);
    cudaFree(d);
  }
  cudaStreamDestroy(st);
  TS_CUDA_CHECK(err);
  return h == 1;
}

const char* env_name(FlashPass pass) {
  return pass == FlashPass::forward ? "TESSERA_CUDA_FLASH_FWD" : "TESSERA_CUDA_FLASH_BWD";
}

template <FlashPass kPass>
FlashKernel env_setting() {
  static const FlashKernel k =
      parse_flash_kernel_env(env_name(kPass), std::getenv(env_name(kPass)));
  return k;
}

}  // namespace

FlashKernel parse_flash_kernel_env(const char* variable, const char* value) {
  if (value == nullptr) return FlashKernel::mma_sync;
  const std::string s(value);
  if (s == "mma") return FlashKernel::mma_sync;
  if (s == "wgmma") return FlashKernel::wgmma;
  if (s == "auto") return FlashKernel::automatic;
  fail("[flash attention] ", variable, "=", s, " must be mma, wgmma or auto");
}

const char* flash_kernel_name(FlashKernel k) {
  switch (k) {
    case FlashKernel::automatic:
      return "automatic";
    case FlashKernel::mma_sync:
      return "mma_sync";
    case FlashKernel::wgmma:
      return "wgmma";
  }
  return "?";
}

bool flash_wgmma_available() {
  return g_wgmma_ok.get(ask_device);
}

FlashKernel resolve_flash_kernel(FlashKernel k, FlashPass pass) {
  bool from_env = false;
  if (k == FlashKernel::automatic) {
    // Read once per process and pass (a bad value of one pass's variable fails that pass only).
    k = pass == FlashPass::forward ? env_setting<FlashPass::forward>()
                                   : env_setting<FlashPass::backward>();
    from_env = true;
    if (k == FlashKernel::automatic)
      return flash_wgmma_available() ? FlashKernel::wgmma : FlashKernel::mma_sync;
  }
  if (k == FlashKernel::wgmma)
    TS_CHECK(flash_wgmma_available(), "[flash attention] ",
             from_env ? cat(env_name(pass), "=wgmma") : std::string("kernel wgmma"),
             " needs sm_90a code on a compute capability 9.0 GPU (this device or build has none)");
  return k;
}

}  // namespace tessera::cuda
