// Stub linked when CUDA is off: every CUDA entry says the build has no CUDA.
#include "backend/device.h"
#include "core/error.h"

namespace tessera::backend {

bool cuda_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}
std::string cuda_device_summary() {
  return "built without CUDA";
}
void require_cuda(const char* what) {
  fail("[cuda] ", what, ": this tessera was built without CUDA (configure with -DTESSERA_CUDA=on)");
}

}  // namespace tessera::backend
