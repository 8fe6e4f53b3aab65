// Bias gradient for the device GPT-2: per-chunk column sums, then a fixed-order combine.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels_common.cuh"
#include "backend/cuda/train_kernels.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerChunk = 256;

// Block (column tile x, chunk y): thread i sums rows [y * kRowsPerChunk, ...) of column
// x * kThreads + i; consecutive threads read consecutive columns (coalesced).
template <typename E>
__global__ void partial_kernel(float* part, const E* dy, int64_t N, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += detail::to_f32(dy[r * C + c]);
  part[static_cast<int64_t>(blockIdx.y) * C + c] = s;
}

__global__ void combine_kernel(float* db, const float* part, int64_t chunks, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += part[k * C + c];
  db[c] += s;
}

}  // namespace

int64_t bias_grad_workspace_floats(int64_t N, int64_t C) {
  return (N + kRowsPerChunk - 1) / kRowsPerChunk * C;
}

template <typename E>
void bias_grad_accumulate(float* db, const E* dy, int64_t N, int64_t C, float* workspace,
                          cudaStream_t stream) {
  TS_CHECK(db && dy && workspace, "[bias_grad_accumulate] db, dy and workspace must be set");
  TS_CHECK(N >= 0 && C > 0, "[bias_grad_accumulate] N=", N, " C=", C, " out of range");
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  TS_CHECK(chunks <= 65535, "[bias_grad_accumulate] N=", N, " rows is too many");
  if (N == 0) return;
  const unsigned tiles = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  partial_kernel<E>
      <<<dim3(tiles, static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(workspace, dy, N, C);
  TS_CUDA_CHECK_LAUNCH();
  combine_kernel<<<tiles, kThreads, 0, stream>>>(db, workspace, chunks, C);
  TS_CUDA_CHECK_LAUNCH();
}

template void bias_grad_accumulate<float>(float*, const float*, int64_t, int64_t, float*,
                                          cudaStream_t);
template void bias_grad_accumulate<__nv_bfloat16>(float*, const __nv_bfloat16*, int64_t, int64_t,
                                                  float*, cudaStream_t);

}  // namespace tessera::cuda
