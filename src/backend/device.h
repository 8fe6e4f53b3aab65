// What the build and the machine offer beyond the CPU. Implemented by backend/cuda when CUDA is
// built, and by backend/no_cuda otherwise, so callers never need an #ifdef.
#pragma once

#include <cstddef>
#include <string>

namespace tessera::backend {

bool cuda_built();
// Registers the CUDA ops backend (backend/cuda/ops_backend.h) for ops::Device::cuda; does
// nothing in a build without CUDA (ops on cuda then throw naming the missing backend).
void register_cuda_ops_backend();
int cuda_device_count();            // 0 when built without CUDA or no device is present
std::string cuda_device_summary();  // "NVIDIA H200, 139 GiB, sm_90" or why there is none
// Bytes/s a streaming read of `bytes` reaches on the current CUDA device (median of 10 runs after
// 3 warmups); the yardstick of decode's roofline figure. Throws without a device.
double cuda_read_bandwidth(size_t bytes = size_t{1} << 30);
// Dense bf16 tensor-core peak of the current CUDA device in FLOP/s from the datasheet table
// (0 when the GPU is not in it). Throws without a device.
double cuda_bf16_peak_flops();

}  // namespace tessera::backend
