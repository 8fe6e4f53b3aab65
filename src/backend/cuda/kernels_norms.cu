// LayerNorm and RMSNorm on CUDA: forward (optionally fused with the residual add) and backward
// with a deterministic two-stage reduction of the weight gradients.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_common.cuh"
#include "backend/cuda/matvec_common.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace {

using detail::aligned_to;
using detail::block_sum;
using detail::ceil_div;
using detail::load_vec;
using detail::round_to;
using detail::store_vec;

constexpr float kLayerNormEps = 1e-5f;
// Row kernels: one block per row, up to 1024 threads, each thread keeping up to kMaxSlots
// vectors of the row in registers between the passes (so a row is read from memory once).
constexpr int kMaxRowThreads = 1024;
constexpr int kMaxSlots = 4;
// The backward reduces dw/db over at most this many row chunks (partials in the workspace):
// enough blocks to fill a GPU, few enough that the second stage is cheap.
constexpr int64_t kMaxChunks = 512;
constexpr int kPartialThreads = 64;

enum class Norm { layer, rms };

// Thread i owns vectors i, i + blockDim.x, ... (at most SLOTS) of the row. kQBlock > 0 (f32
// only): the output row is also quantized in blocks of kQBlock for the matvec kernels, into
// xq (N, C), xd (N, C / kQBlock), xs (N, C / 32), as matmul_wt's own quantizer would.
template <typename E, int VEC, int SLOTS, Norm kNorm, bool kResidual, int kQBlock>
__global__ void __launch_bounds__(kMaxRowThreads)
    norm_forward_kernel(E* res_out, E* out, float* mean_out, float* rstd_out, const E* inp,
                        const E* r, const float* w, const float* b, int64_t C, float eps,
                        int8_t* xq, float* xd, int32_t* xs) {
  static_assert(kQBlock == 0 || std::is_same_v<E, float>, "only f32 rows are quantized");
  allow_dependent_launch();
  grid_dependency_wait();  // the rows come from the kernel before (dependent_launch.cuh)
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const int64_t nvec = C / VEC;
  const float inv_c = 1.0f / static_cast<float>(C);
  float x[SLOTS][VEC];
  float sum[1] = {0.0f};
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(s) * blockDim.x;
    const int64_t off = row * C + j * VEC;
    if (j < nvec) {
      load_vec<E, VEC>(x[s], inp + off);
      if constexpr (kResidual) {
        // The norm sees the residual as stored, so the backward (which reads res_out) matches.
        float y[VEC];
        load_vec<E, VEC>(y, r + off);
#pragma unroll
        for (int i = 0; i < VEC; ++i) x[s][i] = round_to<E>(x[s][i] + y[i]);
        store_vec<E, VEC>(res_out + off, x[s]);
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) sum[0] += kNorm == Norm::layer ? x[s][i] : x[s][i] * x[s][i];
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) x[s][i] = 0.0f;
    }
  }
  block_sum<1>(sum, smem);
  float mean = 0.0f, rstd;
  if constexpr (kNorm == Norm::layer) {
    // Two-pass variance (centered), as the reference: no cancellation for rows with a large mean.
    mean = sum[0] * inv_c;
    float sq[1] = {0.0f};
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(s) * blockDim.x;
      if (j < nvec) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) sq[0] += (x[s][i] - mean) * (x[s][i] - mean);
      }
    }
    block_sum<1>(sq, smem);
    rstd = 1.0f / sqrtf(sq[0] * inv_c + eps);
  } else {
    rstd = 1.0f / sqrtf(sum[0] * inv_c + eps);
  }
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(s) * blockDim.x;
    if (j < nvec) {
      float wv[VEC], y[VEC];
      load_vec<float, VEC>(wv, w + j * VEC);
      if constexpr (kNorm == Norm::layer) {
        float bv[VEC];
        load_vec<float, VEC>(bv, b + j * VEC);
#pragma unroll
        for (int i = 0; i < VEC; ++i) y[i] = (x[s][i] - mean) * rstd * wv[i] + bv[i];
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) y[i] = x[s][i] * rstd * wv[i];
      }
      store_vec<E, VEC>(out + row * C + j * VEC, y);
    }
  }
  if constexpr (kQBlock > 0) {
    // The row as stored, in the quantizer's blocks, one warp per block. __syncthreads makes the
    // block's stores visible to all its threads; __ldcg reads them through L2, never through a
    // read-only path that could hold older bytes.
    __syncthreads();
    constexpr int kGroups = kQBlock / 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int warps = static_cast<int>(blockDim.x / 32);  // blockDim.x is a multiple of 32
    const int64_t nb = C / kQBlock;
    for (int64_t q = warp; q < nb; q += warps) {
      const float* xb = out + row * C + q * kQBlock;
      float v[kGroups];
#pragma unroll
      for (int e = 0; e < kGroups; ++e) v[e] = __ldcg(xb + lane + 32 * e);
      quantize_act_block<kQBlock>(v, lane, xq + row * C + q * kQBlock, xd + row * nb + q,
                                  xs + row * (C / 32) + q * kGroups);
    }
  }
}

// dinp row kernel: g = dout * w, xhat = (x - mean) * rstd (mean 0 for RMSNorm);
// dinp += rstd * (g - mean(g) - xhat * mean(g xhat)) (RMSNorm: without the mean(g) term).
template <typename E, int VEC, int SLOTS, Norm kNorm>
__global__ void __launch_bounds__(kMaxRowThreads)
    norm_backward_dinp_kernel(E* dinp, const E* dout, const E* inp, const float* w,
                              const float* mean, const float* rstd, int64_t C) {
  __shared__ float smem[64];
  const int64_t row = blockIdx.x;
  const int64_t nvec = C / VEC;
  const float inv_c = 1.0f / static_cast<float>(C);
  const float m = kNorm == Norm::layer ? mean[row] : 0.0f;
  const float r = rstd[row];
  float x[SLOTS][VEC], dy[SLOTS][VEC];
  float sums[2] = {0.0f, 0.0f};
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(s) * blockDim.x;
    if (j < nvec) {
      float wv[VEC];
      load_vec<E, VEC>(x[s], inp + row * C + j * VEC);
      load_vec<E, VEC>(dy[s], dout + row * C + j * VEC);
      load_vec<float, VEC>(wv, w + j * VEC);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float g = dy[s][i] * wv[i];
        sums[0] += g;
        sums[1] += g * ((x[s][i] - m) * r);
      }
    }
  }
  block_sum<2>(sums, smem);
  const float g_mean = sums[0] * inv_c, gx_mean = sums[1] * inv_c;
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(s) * blockDim.x;
    if (j < nvec) {
      float wv[VEC], acc[VEC];
      load_vec<float, VEC>(wv, w + j * VEC);
      load_vec<E, VEC>(acc, dinp + row * C + j * VEC);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float g = dy[s][i] * wv[i];
        const float xhat = (x[s][i] - m) * r;
        const float centered = kNorm == Norm::layer ? g - g_mean : g;
        acc[i] += r * (centered - xhat * gx_mean);
      }
      store_vec<E, VEC>(dinp + row * C + j * VEC, acc);
    }
  }
}

// Stage 1 of dw/db: block (x, g) sums rows [g * rows_per_chunk, ...) of its vector columns
// into part (G, 2, C): part[g][0] the dw partial, part[g][1] the db partial (LayerNorm only).
template <typename E, int VEC, Norm kNorm>
__global__ void norm_dweight_partial_kernel(float* part, const E* dout, const E* inp,
                                            const float* mean, const float* rstd, int64_t N,
                                            int64_t C, int64_t rows_per_chunk) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= C / VEC) return;
  const int64_t g = blockIdx.y;
  const int64_t n0 = g * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
  float aw[VEC], ab[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) aw[i] = ab[i] = 0.0f;
  for (int64_t n = n0; n < n1; ++n) {
    float d[VEC], x[VEC];
    load_vec<E, VEC>(d, dout + n * C + j * VEC);
    load_vec<E, VEC>(x, inp + n * C + j * VEC);
    const float m = kNorm == Norm::layer ? mean[n] : 0.0f;
    const float r = rstd[n];
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      aw[i] += d[i] * ((x[i] - m) * r);
      ab[i] += d[i];
    }
  }
  float* p = part + g * 2 * C + j * VEC;
  store_vec<float, VEC>(p, aw);
  if constexpr (kNorm == Norm::layer) store_vec<float, VEC>(p + C, ab);
}

// Stage 2: dw[c] += sum over chunks of the partials. Thread row y sums chunks y, y + 8, ... in
// order; the 8 sums are then added in y order, so the result is fixed for a given (N, C).
constexpr int kFinalizeRows = 8;
__global__ void norm_dweight_finalize_kernel(float* dw, float* db, const float* part, int64_t G,
                                             int64_t C) {
  __shared__ float sw[kFinalizeRows][32], sb[kFinalizeRows][32];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int64_t g = threadIdx.y; g < G; g += kFinalizeRows) {
      aw += part[g * 2 * C + c];
      if (db) ab += part[(g * 2 + 1) * C + c];
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < kFinalizeRows; ++y) {
      tw += sw[y][threadIdx.x];
      tb += sb[y][threadIdx.x];
    }
    dw[c] += tw;
    if (db) db[c] += tb;
  }
}

// Row-kernel geometry for a row of nvec vectors.
struct RowLaunch {
  int threads = 0, slots = 0;
};
RowLaunch row_launch(const char* op, int64_t nvec, int64_t C) {
  RowLaunch l;
  l.threads = static_cast<int>(std::min<int64_t>(kMaxRowThreads, ceil_div(nvec, 32) * 32));
  const int64_t slots = ceil_div(nvec, l.threads);
  TS_CHECK(slots <= kMaxSlots, "[", op, "] row width C=", C, " is too wide (at most ",
           kMaxRowThreads * kMaxSlots, " vectors per row)");
  l.slots = slots <= 1 ? 1 : kMaxSlots;
  return l;
}

void check_rows(const char* op, int64_t N, int64_t C) {
  TS_CHECK(N >= 0, "[", op, "] rows N=", N, " must be >= 0");
  TS_CHECK(C > 0, "[", op, "] width C=", C, " must be positive");
  TS_CHECK(N <= 0x7fffffff, "[", op, "] rows N=", N, " exceed the grid limit 2^31-1");
}

template <typename E, Norm kNorm, bool kResidual, int kQBlock = 0>
void launch_norm_forward(const char* op, E* res_out, E* out, float* mean, float* rstd, const E* inp,
                         const E* r, const float* w, const float* b, int64_t N, int64_t C,
                         float eps, cudaStream_t stream, const QuantizedActs* q = nullptr) {
  check_rows(op, N, C);
  TS_CHECK(out != nullptr, "[", op, "] out is null");
  TS_CHECK(inp != nullptr, "[", op, "] input is null");
  TS_CHECK(w != nullptr, "[", op, "] weight w is null");
  TS_CHECK(kNorm == Norm::rms || b != nullptr, "[", op, "] bias b is null");
  TS_CHECK(!kResidual || (r != nullptr && res_out != nullptr), "[", op,
           "] residual input or res_out is null");
  TS_CHECK(eps >= 0.0f, "[", op, "] eps=", eps, " must be >= 0");
  if (N == 0) return;
  constexpr int kVec = 16 / sizeof(E);
  const bool vec = C % kVec == 0 && aligned_to(out, 16) && aligned_to(inp, 16) &&
                   aligned_to(w, 16) && (b == nullptr || aligned_to(b, 16)) &&
                   (!kResidual || (aligned_to(r, 16) && aligned_to(res_out, 16)));
  const RowLaunch l = row_launch(op, vec ? C / kVec : C, C);
  const dim3 grid(static_cast<unsigned>(N));
  int8_t* xq = q ? q->q : nullptr;
  float* xd = q ? q->d : nullptr;
  int32_t* xs = q ? q->s : nullptr;
#define TS_NORM_FWD(V, S)                                                                          \
  launch_dependent(norm_forward_kernel<E, V, S, kNorm, kResidual, kQBlock>, grid, dim3(l.threads), \
                   0, stream, res_out, out, mean, rstd, inp, r, w, b, C, eps, xq, xd, xs)
  if (vec && l.slots == 1)
    TS_NORM_FWD(kVec, 1);
  else if (vec)
    TS_NORM_FWD(kVec, kMaxSlots);
  else if (l.slots == 1)
    TS_NORM_FWD(1, 1);
  else
    TS_NORM_FWD(1, kMaxSlots);
#undef TS_NORM_FWD
  TS_CUDA_CHECK_LAUNCH();
}

// Chunks of rows for the dw/db reduction: a function of N only, so results are reproducible
// across GPUs and launch configurations.
int64_t rows_per_chunk(int64_t N) {
  return ceil_div(N, std::min<int64_t>(N, kMaxChunks));
}

template <typename E, Norm kNorm>
void launch_norm_backward(const char* op, E* dinp, float* dw, float* db, const E* dout,
                          const E* inp, const float* w, const float* mean, const float* rstd,
                          int64_t N, int64_t C, float* workspace, cudaStream_t stream) {
  check_rows(op, N, C);
  TS_CHECK(dinp != nullptr, "[", op, "] dinp is null");
  TS_CHECK(dw != nullptr, "[", op, "] dw is null");
  TS_CHECK(kNorm == Norm::rms || db != nullptr, "[", op, "] db is null");
  TS_CHECK(dout != nullptr && inp != nullptr, "[", op, "] dout or inp is null");
  TS_CHECK(w != nullptr, "[", op, "] weight w is null");
  TS_CHECK(kNorm == Norm::rms || mean != nullptr, "[", op, "] mean is null");
  TS_CHECK(rstd != nullptr, "[", op, "] rstd is null");
  TS_CHECK(dinp != dout && static_cast<const E*>(dinp) != inp, "[", op,
           "] dinp must not alias dout or inp");
  if (N == 0) return;
  TS_CHECK(workspace != nullptr, "[", op, "] workspace is null");
  constexpr int kVec = 16 / sizeof(E);
  const bool vec = C % kVec == 0 && aligned_to(dinp, 16) && aligned_to(dout, 16) &&
                   aligned_to(inp, 16) && aligned_to(w, 16) && aligned_to(workspace, 16);
  const int64_t nvec = vec ? C / kVec : C;
  const RowLaunch l = row_launch(op, nvec, C);

  // dw/db first: they read dout and inp, which the dinp kernel leaves alone anyway.
  const int64_t rpc = rows_per_chunk(N);
  const int64_t G = ceil_div(N, rpc);
  const dim3 pgrid(static_cast<unsigned>(ceil_div(nvec, kPartialThreads)),
                   static_cast<unsigned>(G));
  if (vec) {
    norm_dweight_partial_kernel<E, kVec, kNorm>
        <<<pgrid, kPartialThreads, 0, stream>>>(workspace, dout, inp, mean, rstd, N, C, rpc);
  } else {
    norm_dweight_partial_kernel<E, 1, kNorm>
        <<<pgrid, kPartialThreads, 0, stream>>>(workspace, dout, inp, mean, rstd, N, C, rpc);
  }
  TS_CUDA_CHECK_LAUNCH();
  norm_dweight_finalize_kernel<<<static_cast<unsigned>(ceil_div(C, 32)), dim3(32, kFinalizeRows), 0,
                                 stream>>>(dw, kNorm == Norm::layer ? db : nullptr, workspace, G,
                                           C);
  TS_CUDA_CHECK_LAUNCH();

  const dim3 grid(static_cast<unsigned>(N));
#define TS_NORM_BWD(V, S)                   \
  norm_backward_dinp_kernel<E, V, S, kNorm> \
      <<<grid, l.threads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, C)
  if (vec && l.slots == 1)
    TS_NORM_BWD(kVec, 1);
  else if (vec)
    TS_NORM_BWD(kVec, kMaxSlots);
  else if (l.slots == 1)
    TS_NORM_BWD(1, 1);
  else
    TS_NORM_BWD(1, kMaxSlots);
#undef TS_NORM_BWD
  TS_CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t norm_backward_workspace_floats(int64_t N, int64_t C) {
  TS_CHECK(N >= 0 && C > 0, "[norm_backward_workspace_floats] bad shape N=", N, " C=", C);
  if (N == 0) return 0;
  // Sized for every batch up to N rows, not only N: the chunk count ceil(N / rows_per_chunk(N))
  // is not monotone (513 rows take 257 chunks of 2, 512 rows 512 chunks of 1), and callers size
  // the workspace once for their largest batch. It never exceeds min(N, kMaxChunks).
  return std::min<int64_t>(N, kMaxChunks) * 2 * C;
}

template <typename E>
void layernorm_forward(E* out, float* mean, float* rstd, const E* inp, const float* w,
                       const float* b, int64_t N, int64_t C, cudaStream_t stream) {
  launch_norm_forward<E, Norm::layer, false>("layernorm_forward", nullptr, out, mean, rstd, inp,
                                             nullptr, w, b, N, C, kLayerNormEps, stream);
}

template <typename E>
void layernorm_residual_forward(E* res_out, E* out, float* mean, float* rstd, const E* a,
                                const E* r, const float* w, const float* b, int64_t N, int64_t C,
                                cudaStream_t stream) {
  launch_norm_forward<E, Norm::layer, true>("layernorm_residual_forward", res_out, out, mean, rstd,
                                            a, r, w, b, N, C, kLayerNormEps, stream);
}

template <typename E>
void rmsnorm_forward(E* out, float* rstd, const E* inp, const float* w, int64_t N, int64_t C,
                     float eps, cudaStream_t stream) {
  launch_norm_forward<E, Norm::rms, false>("rmsnorm_forward", nullptr, out, nullptr, rstd, inp,
                                           nullptr, w, nullptr, N, C, eps, stream);
}

template <typename E>
void rmsnorm_residual_forward(E* res_out, E* out, float* rstd, const E* a, const E* r,
                              const float* w, int64_t N, int64_t C, float eps,
                              cudaStream_t stream) {
  launch_norm_forward<E, Norm::rms, true>("rmsnorm_residual_forward", res_out, out, nullptr, rstd,
                                          a, r, w, nullptr, N, C, eps, stream);
}

void norm_quantize_f32(bool layer_norm, float* res_out, float* out, float* mean, float* rstd,
                       const float* a, const float* r, const float* w, const float* b, int64_t N,
                       int64_t C, float eps, const QuantizedActs& q, cudaStream_t stream) {
  const char* op = "norm_quantize_f32";
  TS_CHECK(q.M == N && q.K == C && q.q && q.d && q.s, "[", op, "] quantized activations for (", q.M,
           ", ", q.K, ") rows, not the (", N, ", ", C, ") being normalized");
  TS_CHECK((r == nullptr) == (res_out == nullptr), "[", op,
           "] the residual input and res_out come together");
  TS_CHECK(q.block > 0 && C % q.block == 0, "[", op, "] width C=", C,
           " is not a multiple of the activation block ", q.block);
  const float e = layer_norm ? kLayerNormEps : eps;
  const bool res = r != nullptr;
  // One instantiation per (norm, residual, block): the block types' activation blocks.
#define TS_NQ(NORM, RES, BLOCK)                                                                   \
  launch_norm_forward<float, NORM, RES, BLOCK>(op, res_out, out, mean, rstd, a, r, w, b, N, C, e, \
                                               stream, &q)
#define TS_NQ_BLOCK(BLOCK)            \
  if (layer_norm && res)              \
    TS_NQ(Norm::layer, true, BLOCK);  \
  else if (layer_norm)                \
    TS_NQ(Norm::layer, false, BLOCK); \
  else if (res)                       \
    TS_NQ(Norm::rms, true, BLOCK);    \
  else                                \
    TS_NQ(Norm::rms, false, BLOCK)
  if (q.block == 32) {
    TS_NQ_BLOCK(32);
  } else if (q.block == kQK_K) {
    TS_NQ_BLOCK(kQK_K);
  } else {
    fail("[", op, "] activation block ", q.block, " (the block types take 32 or ", kQK_K, ")");
  }
#undef TS_NQ_BLOCK
#undef TS_NQ
}

template <typename E>
void layernorm_backward(E* dinp, float* dw, float* db, const E* dout, const E* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C,
                        float* workspace, cudaStream_t stream) {
  launch_norm_backward<E, Norm::layer>("layernorm_backward", dinp, dw, db, dout, inp, w, mean, rstd,
                                       N, C, workspace, stream);
}

template <typename E>
void rmsnorm_backward(E* dinp, float* dw, const E* dout, const E* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C, float* workspace,
                      cudaStream_t stream) {
  launch_norm_backward<E, Norm::rms>("rmsnorm_backward", dinp, dw, nullptr, dout, inp, w, nullptr,
                                     rstd, N, C, workspace, stream);
}

#define TS_INSTANTIATE(E)                                                                       \
  template void layernorm_forward<E>(E*, float*, float*, const E*, const float*, const float*,  \
                                     int64_t, int64_t, cudaStream_t);                           \
  template void layernorm_residual_forward<E>(E*, E*, float*, float*, const E*, const E*,       \
                                              const float*, const float*, int64_t, int64_t,     \
                                              cudaStream_t);                                    \
  template void rmsnorm_forward<E>(E*, float*, const E*, const float*, int64_t, int64_t, float, \
                                   cudaStream_t);                                               \
  template void rmsnorm_residual_forward<E>(E*, E*, float*, const E*, const E*, const float*,   \
                                            int64_t, int64_t, float, cudaStream_t);             \
  template void layernorm_backward<E>(E*, float*, float*, const E*, const E*, const float*,     \
                                      const float*, const float*, int64_t, int64_t, float*,     \
                                      cudaStream_t);                                            \
  template void rmsnorm_backward<E>(E*, float*, const E*, const E*, const float*, const float*, \
                                    int64_t, int64_t, float*, cudaStream_t);
TS_INSTANTIATE(float)
TS_INSTANTIATE(__nv_bfloat16)
#undef TS_INSTANTIATE

}  // namespace tessera::cuda
