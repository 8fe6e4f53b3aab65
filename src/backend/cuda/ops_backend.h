// ops::Backend for CUDA: each op of ops/ launches the backend's kernels on the context's stream
// (ctx.stream, or the backend's own non-blocking stream when null) on the current device, and
// ops::Buffer memory is device memory. The engine (model::DecoderForward) and the trainer
// (model::TrainModel) run on it with ops::Context::device = cuda.
#pragma once

namespace tessera::cuda {

// Registers the CUDA ops backend for ops::Device::cuda; calling it again changes nothing. Needs
// no device until the first op or allocation.
void register_ops_backend();

}  // namespace tessera::cuda
