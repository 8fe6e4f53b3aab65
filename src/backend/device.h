// What the build and the machine offer beyond the CPU. Implemented by backend/cuda when CUDA is
// built, and by backend/no_cuda otherwise, so callers never need an #ifdef.
#pragma once

#include <string>

namespace tessera::backend {

bool cuda_built();
int cuda_device_count();            // 0 when built without CUDA or no device is present
std::string cuda_device_summary();  // "NVIDIA H200, 139 GiB, sm_90" or why there is none
// Throws Error("... built without CUDA" or "no CUDA device") naming `what`.
void require_cuda(const char* what);

}  // namespace tessera::backend
