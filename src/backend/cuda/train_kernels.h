// Training glue kernels that kernels.h does not have: the bias gradient as a deterministic
// two-stage column sum (the device GPT-2's bf16 activations, ops::bias_grad's f32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::cuda {

// f32 scratch bias_grad_accumulate needs for (N, C).
int64_t bias_grad_workspace_floats(int64_t N, int64_t C);

// db (C) += column sums of dy (N, C), E = float or __nv_bfloat16. Rows are split into fixed
// chunks whose partial sums (in row order) are then added chunk by chunk: the result depends on
// N and C only, not on the launch, and equals a sequential f32 sum up to the order of the chunk
// partials.
template <typename E>
void bias_grad_accumulate(float* db, const E* dy, int64_t N, int64_t C, float* workspace,
                          cudaStream_t stream);

}  // namespace tessera::cuda
