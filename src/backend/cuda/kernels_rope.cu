// Rotary position embedding on CUDA, forward and backward, for both pair layouts.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_common.cuh"

namespace tessera::cuda {
namespace {

using detail::from_f32;
using detail::grid_for;
using detail::to_f32;

constexpr int kThreads = 256;

// Work item j of a head (row of D values): j < R/2 rotates pair j; otherwise (only when
// out != inp) it copies dimension R + (j - R/2). Each pair is read and written by one thread,
// so out may equal inp.
template <typename E, bool kInterleaved>
__global__ void rope_kernel(E* out, const E* inp, const float* cos_tab, const float* sin_tab,
                            int64_t max_pos, const int32_t* positions, int64_t pos0, int64_t T,
                            int64_t H, int64_t D, int64_t R, float sign, int64_t per_head,
                            int64_t total) {
  const int64_t half = R / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t row = idx / per_head;  // (b, t, h) flattened
    const int64_t j = idx - row * per_head;
    const int64_t base = row * D;
    if (j < half) {
      const int64_t t = (row / H) % T;
      const int64_t pos = positions ? static_cast<int64_t>(positions[t]) : pos0 + t;
      const int64_t ia = kInterleaved ? 2 * j : j;
      const int64_t ib = kInterleaved ? 2 * j + 1 : j + half;
      const float xa = to_f32(inp[base + ia]), xb = to_f32(inp[base + ib]);
      float ya, yb;
      detail::rope_rotate_pair(xa, xb, cos_tab, sin_tab, max_pos, pos, half, j, sign, &ya, &yb);
      out[base + ia] = from_f32<E>(ya);
      out[base + ib] = from_f32<E>(yb);
    } else {
      const int64_t d = R + (j - half);
      out[base + d] = inp[base + d];
    }
  }
}

template <typename E>
void launch_rope(const char* op, E* out, const E* inp, const RopeTableView& table,
                 const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D,
                 RopeLayout layout, float sign, cudaStream_t stream) {
  const int64_t R = table.rotary_dim;
  TS_CHECK(R > 0 && R % 2 == 0, "[", op, "] rotary_dim=", R, " must be positive and even");
  TS_CHECK(D > 0, "[", op, "] head dim D=", D, " must be positive");
  TS_CHECK(R <= D, "[", op, "] rotary_dim=", R, " exceeds head dim D=", D);
  TS_CHECK(B >= 0 && T >= 0 && H >= 0, "[", op, "] negative size B=", B, " T=", T, " H=", H);
  TS_CHECK(table.max_pos >= 0, "[", op, "] table max_pos=", table.max_pos, " must be >= 0");
  TS_CHECK(out != nullptr && inp != nullptr, "[", op, "] output or input is null");
  TS_CHECK(table.cos != nullptr && table.sin != nullptr, "[", op, "] rope table is null");
  if (positions == nullptr)
    TS_CHECK(pos0 >= 0 && pos0 + T <= table.max_pos, "[", op, "] pos0=", pos0, " with T=", T,
             " runs outside the rope table's [0, ", table.max_pos, ")");
  const int64_t rows = B * T * H;
  if (rows == 0) return;
  const int64_t per_head = R / 2 + (out != inp ? D - R : 0);
  const int64_t total = rows * per_head;
  const unsigned grid = grid_for(total, kThreads);
  if (layout == RopeLayout::interleaved)
    rope_kernel<E, true><<<grid, kThreads, 0, stream>>>(out, inp, table.cos, table.sin,
                                                        table.max_pos, positions, pos0, T, H, D, R,
                                                        sign, per_head, total);
  else
    rope_kernel<E, false><<<grid, kThreads, 0, stream>>>(out, inp, table.cos, table.sin,
                                                         table.max_pos, positions, pos0, T, H, D, R,
                                                         sign, per_head, total);
  TS_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename E>
void rope_forward(E* out, const E* inp, const RopeTableView& table, const int32_t* positions,
                  int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D, RopeLayout layout,
                  cudaStream_t stream) {
  launch_rope("rope_forward", out, inp, table, positions, pos0, B, T, H, D, layout, 1.0f, stream);
}

template <typename E>
void rope_backward(E* dinp, const E* dout, const RopeTableView& table, const int32_t* positions,
                   int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D, RopeLayout layout,
                   cudaStream_t stream) {
  launch_rope("rope_backward", dinp, dout, table, positions, pos0, B, T, H, D, layout, -1.0f,
              stream);
}

#define TS_INSTANTIATE(E)                                                                      \
  template void rope_forward<E>(E*, const E*, const RopeTableView&, const int32_t*, int64_t,   \
                                int64_t, int64_t, int64_t, int64_t, RopeLayout, cudaStream_t); \
  template void rope_backward<E>(E*, const E*, const RopeTableView&, const int32_t*, int64_t,  \
                                 int64_t, int64_t, int64_t, int64_t, RopeLayout, cudaStream_t);
TS_INSTANTIATE(float)
TS_INSTANTIATE(__nv_bfloat16)
#undef TS_INSTANTIATE

}  // namespace tessera::cuda
