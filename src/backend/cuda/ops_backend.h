// ops::Backend for CUDA: each op of ops/ launches the backend's kernels on the context's stream
// (ctx.stream, or the backend's own non-blocking stream when null) on the current device, and
// ops::Buffer memory is device memory. The shared forward pass (model::DecoderForward) runs on
// it when the engine is told not to use the device decoder (EngineOptions::device_decoder).
#pragma once

namespace tessera::cuda {

// Registers the CUDA ops backend for ops::Device::cuda; calling it again changes nothing. Needs
// no device until the first op or allocation.
void register_ops_backend();

}  // namespace tessera::cuda
