// Stub linked when CUDA is off: every CUDA entry says the build has no CUDA.
#include "backend/device.h"
#include "core/error.h"

namespace tessera::backend {

namespace {
[[noreturn]] void require_cuda(const char* what) {
  fail("[cuda] ", what, ": this tessera was built without CUDA (configure with -DTESSERA_CUDA=on)");
}
}  // namespace

bool cuda_built() {
  return false;
}
void register_cuda_ops_backend() {}
int cuda_device_count() {
  return 0;
}
std::string cuda_device_summary() {
  return "built without CUDA";
}

double cuda_read_bandwidth(size_t) {
  require_cuda("read bandwidth");
  return 0;
}

double cuda_bf16_peak_flops() {
  require_cuda("bf16 peak");
  return 0;
}

}  // namespace tessera::backend
