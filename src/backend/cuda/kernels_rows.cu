// The row kernels (kernels_rows.h): cache append (f32 -> f32/f16), alone or fused with RoPE,
// weight dequantization and activation conversion to f16, row gather and scatter, MoE routing,
// per-head RMSNorm. The decode-path ones (append, rope + append, gather) are programmatic
// dependents (dependent_launch.cuh).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kernels_common.cuh"
#include "backend/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void store_kv(float* p, float x) {
  *p = x;
}
__device__ __forceinline__ void store_kv(__half* p, float x) {
  *p = __float2half_rn(x);
}

// Where head g's key of the token in cache slot `slot` starts (its value is v_off further).
template <typename T>
__device__ __forceinline__ T* cache_key_row(T* kv, int64_t slot, int64_t g, int64_t D, int64_t bt,
                                            int64_t stride) {
  const int64_t b = slot / bt, t = slot - b * bt;
  return kv + b * stride + (g * bt + t) * D;
}

// One thread per (row, head, dim) of k and of v: consecutive threads write consecutive dims.
template <typename T>
__global__ void append_kernel(T* kv, const float* k, const float* v, const int32_t* slot,
                              int64_t rows, int64_t Hkv, int64_t D, int64_t bt, int64_t stride,
                              int64_t v_off) {
  allow_dependent_launch();
  grid_dependency_wait();  // k and v come from the products before
  const int64_t per_row = Hkv * D, total = rows * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, e = i - r * per_row, g = e / D, d = e - g * D;
    T* dst = cache_key_row(kv, slot[r], g, D, bt, stride) + d;
    store_kv(dst, k[i]);
    store_kv(dst + v_off, v[i]);
  }
}

// One thread per (row, head, pair p of dims) over the H query heads, then the Hkv key heads,
// then the Hkv value heads (D / 2 pairs each). Query and key heads rotate pair p < R/2 (dims per
// the layout); pairs p >= R/2 carry dims R + 2 (p - R/2) and the next unchanged (R = 0: no
// rotation at all). Queries go to q_out (rows, H, D); keys and values to the row's cache slot as
// append_kernel stores them. Input rows are ldq, ldk and ldv floats apart.
template <typename T, bool kInterleaved>
__global__ void rope_append_kernel(T* kv, const float* q, int64_t ldq, float* q_out, const float* k,
                                   int64_t ldk, const float* v, int64_t ldv, const float* cos_tab,
                                   const float* sin_tab, int64_t max_pos, const int32_t* positions,
                                   const int32_t* slot, int64_t rows, int64_t H, int64_t Hkv,
                                   int64_t D, int64_t R, int64_t bt, int64_t stride,
                                   int64_t v_off) {
  allow_dependent_launch();
  grid_dependency_wait();  // q, k and v come from the products before
  const int64_t pairs = D / 2, half = R / 2, heads = H + 2 * Hkv;
  const int64_t total = rows * heads * pairs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / (heads * pairs), e = i - r * (heads * pairs);
    const int64_t h = e / pairs, p = e - h * pairs;
    const bool is_q = h < H, is_k = !is_q && h < H + Hkv, is_v = !is_q && !is_k;
    int64_t ia, ib;  // the two dims this thread handles
    if (is_v) {
      ia = 2 * p, ib = 2 * p + 1;
    } else if (p < half) {
      ia = kInterleaved ? 2 * p : p;
      ib = kInterleaved ? 2 * p + 1 : p + half;
    } else {
      ia = R + 2 * (p - half), ib = ia + 1;
    }
    const float* x = is_q   ? q + r * ldq + h * D
                     : is_k ? k + r * ldk + (h - H) * D
                            : v + r * ldv + (h - H - Hkv) * D;
    float ya = x[ia], yb = x[ib];
    if (!is_v && p < half)
      detail::rope_rotate_pair(ya, yb, cos_tab, sin_tab, max_pos, positions[r], half, p, 1.0f, &ya,
                               &yb);
    if (is_q) {
      float* o = q_out + (r * H + h) * D;
      o[ia] = ya, o[ib] = yb;
      continue;
    }
    const int64_t g = is_k ? h - H : h - H - Hkv;
    T* dst = cache_key_row(kv, slot[r], g, D, bt, stride) + (is_k ? 0 : v_off);
    store_kv(dst + ia, ya);
    store_kv(dst + ib, yb);
  }
}

__device__ __forceinline__ float half_bits_to_f32(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ uint16_t f16_bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}

// One thread per 32 consecutive elements (a q8_0/q4_0/q4_1/q5_0/q5_1 block, a q4_k/q5_k
// sub-block, a q6_k run of 32); blocks are read bytewise (GGUF blocks are 18-210 bytes, not
// aligned). __fmul_rn and
// __fsub_rn/__fadd_rn keep each step separately rounded, as the CPU computes it.
template <int kType>
__global__ void dequant_kernel(uint16_t* dst, const uint8_t* w, int64_t groups) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint16_t* out = dst + g * 32;
    if constexpr (kType == 0) {  // q8_0: f16 d, 32 int8
      const uint8_t* b = w + g * 34;
      const float d = half_bits_to_f32(b);
      for (int j = 0; j < 32; ++j)
        out[j] = f16_bits(__fmul_rn(d, static_cast<float>(static_cast<int8_t>(b[2 + j]))));
    } else if constexpr (kType == 1) {  // q4_0: f16 d, 16 bytes of nibbles, value d (q - 8)
      const uint8_t* b = w + g * 18;
      const float d = half_bits_to_f32(b);
      for (int j = 0; j < 16; ++j) {
        out[j] = f16_bits(__fmul_rn(d, static_cast<float>((b[2 + j] & 0x0f) - 8)));
        out[j + 16] = f16_bits(__fmul_rn(d, static_cast<float>((b[2 + j] >> 4) - 8)));
      }
    } else if constexpr (kType == 2) {  // q4_1: f16 d, f16 m, nibbles, value d q + m
      const uint8_t* b = w + g * 20;
      const float d = half_bits_to_f32(b), m = half_bits_to_f32(b + 2);
      for (int j = 0; j < 16; ++j) {
        out[j] = f16_bits(__fadd_rn(__fmul_rn(d, static_cast<float>(b[4 + j] & 0x0f)), m));
        out[j + 16] = f16_bits(__fadd_rn(__fmul_rn(d, static_cast<float>(b[4 + j] >> 4)), m));
      }
    } else if constexpr (kType == 5 || kType == 6) {  // q5_0 (d (q - 16)) / q5_1 (d q + m)
      constexpr int kQh = kType == 5 ? 2 : 4;
      const uint8_t* b = w + g * (kQh + 20);
      const float d = half_bits_to_f32(b), m = kType == 6 ? half_bits_to_f32(b + 2) : 0.0f;
      const uint32_t qh = static_cast<uint32_t>(b[kQh]) | static_cast<uint32_t>(b[kQh + 1]) << 8 |
                          static_cast<uint32_t>(b[kQh + 2]) << 16 |
                          static_cast<uint32_t>(b[kQh + 3]) << 24;
      for (int j = 0; j < 16; ++j) {
        const int q0 = (b[kQh + 4 + j] & 0x0f) | static_cast<int>((qh >> j) & 1u) << 4;
        const int q1 = (b[kQh + 4 + j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1u) << 4;
        if constexpr (kType == 5) {
          out[j] = f16_bits(__fmul_rn(d, static_cast<float>(q0 - 16)));
          out[j + 16] = f16_bits(__fmul_rn(d, static_cast<float>(q1 - 16)));
        } else {
          out[j] = f16_bits(__fadd_rn(__fmul_rn(d, static_cast<float>(q0)), m));
          out[j + 16] = f16_bits(__fadd_rn(__fmul_rn(d, static_cast<float>(q1)), m));
        }
      }
    } else if constexpr (kType == 3 || kType == 7) {  // q4_k / q5_k sub-block j
      constexpr int kBytes = kType == 3 ? 144 : 176, kQs = kType == 3 ? 16 : 48;
      const int64_t blk = g / 8;
      const int j = static_cast<int>(g % 8);
      const uint8_t* b = w + blk * kBytes;
      const float d = half_bits_to_f32(b), dmin = half_bits_to_f32(b + 2);
      const uint8_t* s = b + 4;
      int sc, mn;
      if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
      } else {
        sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      }
      const float scale = __fmul_rn(d, static_cast<float>(sc));
      const float offset = __fmul_rn(dmin, static_cast<float>(mn));
      const uint8_t* q = b + kQs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0x0f;
        if constexpr (kType == 7) v |= ((b[16 + l] >> j) & 1) << 4;  // qh[l] bit j: the fifth bit
        out[l] = f16_bits(__fsub_rn(__fmul_rn(scale, static_cast<float>(v)), offset));
      }
    } else {  // q6_k: elements 32 r' .. of a 210-byte super-block (ql, qh, scales, d)
      const int64_t blk = g / 8;
      const int part = static_cast<int>(g % 8);
      const uint8_t* b = w + blk * 210;
      const uint8_t *ql = b, *qh = b + 128;
      const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
      const float d = half_bits_to_f32(b + 208);
      for (int l = 0; l < 32; ++l) {
        const int i = part * 32 + l;
        const int h = i / 128, r = (i % 128) / 32;
        const uint8_t lo_byte = ql[64 * h + l + 32 * (r & 1)];
        const int lo = r < 2 ? (lo_byte & 0x0f) : (lo_byte >> 4);
        const int hi = (qh[32 * h + l] >> (2 * r)) & 3;
        out[l] = f16_bits(__fmul_rn(__fmul_rn(d, static_cast<float>(scales[i / 16])),
                                    static_cast<float>((lo | (hi << 4)) - 32)));
      }
    }
  }
}

__global__ void bf16_to_f16_kernel(uint16_t* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = f16_bits(__uint_as_float(static_cast<uint32_t>(src[i]) << 16));
}

__global__ void f32_to_f16_kernel(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = f16_bits(src[i]);
}

__global__ void f16_to_f32_kernel(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __half2float(__ushort_as_half(src[i]));
}

// One thread per column walks the rows in order: repeated indices add in the order of the rows,
// as on the CPU, with no atomics.
__global__ void scatter_add_kernel(float* dst, const float* src, const int32_t* index,
                                   const float* weight, int64_t n, int64_t C) {
  allow_dependent_launch();
  grid_dependency_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t r = 0; r < n; ++r)
    dst[static_cast<int64_t>(index[r]) * C + c] += weight[r] * src[r * C + c];
}

// A row's softmax over its E logits in f32, as the CPU kernel computes it: p(v) = exp(v - mx) /
// sum.
struct RowSoftmax {
  float mx, sum;
  __device__ float p(float v) const { return expf(v - mx) / sum; }
};
__device__ RowSoftmax row_softmax(const float* x, int64_t E) {
  RowSoftmax s{x[0], 0.0f};
  for (int64_t e = 1; e < E; ++e) s.mx = fmaxf(s.mx, x[e]);
  for (int64_t e = 0; e < E; ++e) s.sum += expf(x[e] - s.mx);
  return s;
}

// One thread per row: softmax in f32, then the top k by repeated scans (the CPU kernel's order,
// ties to the lower id).
__global__ void moe_route_kernel(int32_t* ids, float* weights, const float* logits, int64_t n,
                                 int64_t E, int64_t k, bool normalize) {
  allow_dependent_launch();
  grid_dependency_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const float* x = logits + r * E;
  int32_t* id = ids + r * k;
  float* w = weights + r * k;
  const RowSoftmax sm = row_softmax(x, E);
  float chosen = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || id[i] == e;
      if (!taken && (best < 0 || x[e] > x[best])) best = e;
    }
    id[j] = static_cast<int32_t>(best);
    w[j] = sm.p(x[best]);
    chosen += w[j];
  }
  if (normalize)
    for (int64_t j = 0; j < k; ++j) w[j] /= chosen;
}

// One thread per row, as the forward: p recomputed in f32, then the closed forms of ops.h.
__global__ void moe_route_backward_kernel(float* dlogits, const float* dweights, const int32_t* ids,
                                          const float* logits, int64_t n, int64_t E, int64_t k,
                                          bool normalize) {
  allow_dependent_launch();
  grid_dependency_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const float* x = logits + r * E;
  const int32_t* id = ids + r * k;
  const float* dw = dweights + r * k;
  float* d = dlogits + r * E;
  const RowSoftmax sm = row_softmax(x, E);
  float chosen = 0.0f;
  for (int64_t j = 0; j < k; ++j) chosen += sm.p(x[id[j]]);
  const float norm = normalize ? chosen : 1.0f;
  float s = 0.0f;
  for (int64_t j = 0; j < k; ++j) s += dw[j] * (sm.p(x[id[j]]) / norm);
  for (int64_t e = 0; e < E; ++e) d[e] = normalize ? 0.0f : -sm.p(x[e]) * s;
  for (int64_t j = 0; j < k; ++j) {
    const float w = sm.p(x[id[j]]) / norm;
    d[id[j]] += normalize ? w * (dw[j] - s) : w * dw[j];
  }
}

// The sum of every thread's v over the block (blockDim.x a power of two, at most kThreads), for
// every thread; partial is the block's shared scratch of kThreads floats. Ends synchronized.
__device__ float block_sum(float v, float* partial) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  return partial[0];
}

// One block per row: the dot product reduced in the block, then the row scaled (dsrc may be src:
// the reduction reads every element before any is written).
__global__ void scatter_add_rows_backward_kernel(float* dsrc, float* dweight, const float* dy,
                                                 const float* src, const int32_t* index,
                                                 const float* weight, int64_t C) {
  allow_dependent_launch();
  grid_dependency_wait();
  __shared__ float partial[kThreads];
  const int64_t r = blockIdx.x;
  const float* g = dy + static_cast<int64_t>(index[r]) * C;
  const float* x = src + r * C;
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dot += g[i] * x[i];
  dot = block_sum(dot, partial);
  if (threadIdx.x == 0) dweight[r] = dot;
  const float w = weight[r];
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dsrc[r * C + i] = w * g[i];
}

// One block per (row, head) slice of D values: the sum of squares reduced in the block, then
// the slice scaled in place (ops::head_rmsnorm).
__global__ void head_rmsnorm_kernel(float* x, int64_t ld, int64_t heads, int64_t D, const float* w,
                                    float eps) {
  allow_dependent_launch();
  grid_dependency_wait();
  __shared__ float partial[kThreads];
  const int64_t row = blockIdx.x / heads, head = blockIdx.x % heads;
  float* s = x + row * ld + head * D;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) sum += s[i] * s[i];
  const float r = rsqrtf(block_sum(sum, partial) / static_cast<float>(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s[i] = s[i] * r * w[i];
}

// head_rmsnorm_backward, in three steps over the n * heads slices of D values (slice s: row
// s / heads, head s % heads). 1: each slice's r = 1 / sqrt(mean(x^2) + eps), one block a slice.
__global__ void head_rms_kernel(float* r, const float* x, int64_t ld_x, int64_t heads, int64_t D,
                                float eps) {
  allow_dependent_launch();
  grid_dependency_wait();
  __shared__ float partial[kThreads];
  const int64_t s = blockIdx.x;
  const float* xs = x + (s / heads) * ld_x + (s % heads) * D;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) sum += xs[i] * xs[i];
  sum = block_sum(sum, partial);
  if (threadIdx.x == 0) r[s] = rsqrtf(sum / static_cast<float>(D) + eps);
}

// 2: dw's partial sums, a column d per thread and a chunk of `per_chunk` slices per blockIdx.y,
// in slice order into partial (chunks, D); then each column's chunks summed in order into dw.
__global__ void head_rms_dweight_partial_kernel(float* partial, const float* dy, const float* x,
                                                const float* r, int64_t ld, int64_t ld_x,
                                                int64_t slices, int64_t heads, int64_t D,
                                                int64_t per_chunk) {
  allow_dependent_launch();
  grid_dependency_wait();
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= D) return;
  const int64_t s0 = static_cast<int64_t>(blockIdx.y) * per_chunk;
  const int64_t s1 = s0 + per_chunk < slices ? s0 + per_chunk : slices;
  float acc = 0.0f;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t row = s / heads, col = (s % heads) * D + d;
    acc += dy[row * ld + col] * x[row * ld_x + col] * r[s];
  }
  partial[blockIdx.y * D + d] = acc;
}

__global__ void head_rms_dweight_finalize_kernel(float* dw, const float* partial, int64_t chunks,
                                                 int64_t D) {
  allow_dependent_launch();
  grid_dependency_wait();
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= D) return;
  float acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * D + d];
  dw[d] += acc;
}

// 3: dx = r (dy w - xhat mean(dy w xhat)), xhat = x r, one block a slice; dx may be dy (each
// thread reads its elements for the sum before block_sum's barrier and writes them after).
__global__ void head_rms_dx_kernel(float* dx, const float* dy, const float* x, const float* r,
                                   int64_t ld, int64_t ld_x, int64_t heads, int64_t D,
                                   const float* w) {
  allow_dependent_launch();
  grid_dependency_wait();
  __shared__ float partial[kThreads];
  const int64_t s = blockIdx.x, row = s / heads, col = (s % heads) * D;
  const float* dys = dy + row * ld + col;
  const float* xs = x + row * ld_x + col;
  const float rs = r[s];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) sum += dys[i] * w[i] * xs[i] * rs;
  const float mean = block_sum(sum, partial) / static_cast<float>(D);
  float* dxs = dx + row * ld + col;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
    dxs[i] = rs * (dys[i] * w[i] - xs[i] * rs * mean);
}

__global__ void gather_kernel(float* dst, const float* src, const int32_t* index, int64_t n,
                              int64_t C) {
  allow_dependent_launch();
  grid_dependency_wait();
  const int64_t total = n * C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i - r * C;
    dst[i] = src[static_cast<int64_t>(index[r]) * C + c];
  }
}

unsigned grid(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

// The checks kv_cache_append and rope_kv_append share: the cache type and a block layout in
// which a block's keys, values and the next block do not overlap.
void check_cache_layout(const char* op, DType kv_type, int64_t Hkv, int64_t D, int64_t block_tokens,
                        int64_t block_stride, int64_t v_offset) {
  TS_CHECK(kv_type == DType::f32 || kv_type == DType::f16, "[", op, "] kv_type ",
           dtype_name(kv_type), " must be f32 or f16");
  TS_CHECK(v_offset >= Hkv * block_tokens * D && block_stride >= 2 * Hkv * block_tokens * D, "[",
           op, "] v_offset=", v_offset, " and block_stride=", block_stride,
           " overlap a block's keys");
}

}  // namespace

void kv_cache_append(void* layer_kv, DType kv_type, const float* k, const float* v,
                     const int32_t* slot, int64_t rows, int64_t Hkv, int64_t D,
                     int64_t block_tokens, int64_t block_stride, int64_t v_offset,
                     cudaStream_t stream) {
  TS_CHECK(layer_kv && k && v && slot, "[kv_cache_append] layer_kv, k, v and slot must be set");
  TS_CHECK(rows >= 0 && Hkv > 0 && D > 0 && block_tokens > 0, "[kv_cache_append] rows=", rows,
           " Hkv=", Hkv, " D=", D, " block_tokens=", block_tokens, " must be positive");
  check_cache_layout("kv_cache_append", kv_type, Hkv, D, block_tokens, block_stride, v_offset);
  if (rows == 0) return;
  const int64_t total = rows * Hkv * D;
  if (kv_type == DType::f16)
    launch_dependent(append_kernel<__half>, dim3(grid(total)), dim3(kThreads), 0, stream,
                     static_cast<__half*>(layer_kv), k, v, slot, rows, Hkv, D, block_tokens,
                     block_stride, v_offset);
  else
    launch_dependent(append_kernel<float>, dim3(grid(total)), dim3(kThreads), 0, stream,
                     static_cast<float*>(layer_kv), k, v, slot, rows, Hkv, D, block_tokens,
                     block_stride, v_offset);
}

void rope_kv_append(const RopeAppendArgs& a, cudaStream_t stream) {
  const char* op = "rope_kv_append";
  TS_CHECK(a.q && a.q_out && a.k && a.v && a.layer_kv && a.slot, "[", op,
           "] q, q_out, k, v, layer_kv and slot must be set");
  TS_CHECK(a.rows >= 0 && a.H > 0 && a.Hkv > 0 && a.D > 0 && a.D % 2 == 0 && a.block_tokens > 0,
           "[", op, "] rows=", a.rows, " H=", a.H, " Hkv=", a.Hkv, " D=", a.D,
           " block_tokens=", a.block_tokens, " must be positive (D even)");
  const int64_t ldq = a.ldq ? a.ldq : a.H * a.D, ldk = a.ldk ? a.ldk : a.Hkv * a.D;
  const int64_t ldv = a.ldv ? a.ldv : a.Hkv * a.D;
  TS_CHECK(ldq >= a.H * a.D && ldk >= a.Hkv * a.D && ldv >= a.Hkv * a.D, "[", op, "] ldq=", ldq,
           " ldk=", ldk, " ldv=", ldv, " shorter than a row");
  const int64_t R = a.table.rotary_dim;
  TS_CHECK(R >= 0 && R % 2 == 0 && R <= a.D, "[", op, "] rotary_dim=", R,
           " must be even and at most D=", a.D);
  TS_CHECK(R == 0 || (a.table.cos && a.table.sin && a.positions), "[", op,
           "] rope table or positions missing for rotary_dim=", R);
  TS_CHECK(a.table.max_pos >= 0, "[", op, "] table max_pos=", a.table.max_pos, " must be >= 0");
  // In place (q_out == q) is the only overlap allowed: a thread reads its pair before writing it.
  TS_CHECK(a.q_out == a.q || a.q_out + a.rows * a.H * a.D <= a.q || a.q + a.rows * ldq <= a.q_out,
           "[", op, "] q_out overlaps q other than in place");
  check_cache_layout(op, a.kv_type, a.Hkv, a.D, a.block_tokens, a.block_stride, a.v_offset);
  if (a.rows == 0) return;
  const int64_t total = a.rows * (a.H + 2 * a.Hkv) * (a.D / 2);
  const bool inter = a.layout == RopeLayout::interleaved;
  const bool f16 = a.kv_type == DType::f16;
  auto launch = [&](auto kernel, auto* kv) {
    launch_dependent(kernel, dim3(grid(total)), dim3(kThreads), 0, stream, kv, a.q, ldq, a.q_out,
                     a.k, ldk, a.v, ldv, a.table.cos, a.table.sin, a.table.max_pos, a.positions,
                     a.slot, a.rows, a.H, a.Hkv, a.D, R, a.block_tokens, a.block_stride,
                     a.v_offset);
  };
  auto* kv16 = static_cast<__half*>(a.layer_kv);
  auto* kv32 = static_cast<float*>(a.layer_kv);
  if (f16 && inter)
    launch(rope_append_kernel<__half, true>, kv16);
  else if (f16)
    launch(rope_append_kernel<__half, false>, kv16);
  else if (inter)
    launch(rope_append_kernel<float, true>, kv32);
  else
    launch(rope_append_kernel<float, false>, kv32);
}

void dequantize_to_f16(uint16_t* dst, const void* w, DType type, int64_t N, int64_t K,
                       cudaStream_t stream) {
  TS_CHECK(dst && w, "[dequantize_to_f16] dst and w must be set");
  TS_CHECK(N >= 0 && K > 0, "[dequantize_to_f16] N=", N, " K=", K, " out of range");
  const int64_t n = N * K;
  if (n == 0) return;
  if (type == DType::f16) {
    TS_CUDA_CHECK(
        cudaMemcpyAsync(dst, w, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (type == DType::bf16) {
    bf16_to_f16_kernel<<<grid(n), kThreads, 0, stream>>>(dst, static_cast<const uint16_t*>(w), n);
    TS_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t block = act_block_elems(type);  // the block types' block size, else 0
  TS_CHECK(block > 0 && K % block == 0, "[dequantize_to_f16] type ", dtype_name(type),
           " with K=", K,
           " is not supported (f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k; K a "
           "multiple of the block)");
  const int64_t groups = n / 32;
  const auto* p = static_cast<const uint8_t*>(w);
  switch (type) {
    case DType::q8_0:
      dequant_kernel<0><<<grid(groups), kThreads, 0, stream>>>(dst, p, groups);
      break;
    case DType::q4_0:
      dequant_kernel<1><<<grid(groups), kThreads, 0, stream>>>(dst, p, groups);
      break;
    case DType::q4_1:
      dequant_kernel<2><<<grid(groups), kThreads, 0, stream>>>(dst, p, groups);
      break;
    case DType::q4_k:
      dequant_kernel<3><<<grid(groups), kThreads, 0, stream>>>(dst, p, groups);
      break;
    case DType::q6_k:
      dequant_kernel<4><<<grid(groups), kThreads, 0, stream>>>(dst, p, groups);
      break;
    case DType::q5_0:
      dequant_kernel<5><<<grid(groups), kThreads, 0, stream>>>(dst, p, groups);
      break;
    case DType::q5_1:
      dequant_kernel<6><<<grid(groups), kThreads, 0, stream>>>(dst, p, groups);
      break;
    case DType::q5_k:
      dequant_kernel<7><<<grid(groups), kThreads, 0, stream>>>(dst, p, groups);
      break;
    default:
      fail("[dequantize_to_f16] type ", dtype_name(type), " is not supported");
  }
  TS_CUDA_CHECK_LAUNCH();
}

void convert_f32_to_f16(uint16_t* dst, const float* src, int64_t n, cudaStream_t stream) {
  TS_CHECK(dst && src && n >= 0, "[convert_f32_to_f16] bad arguments (n=", n, ")");
  if (n == 0) return;
  f32_to_f16_kernel<<<grid(n), kThreads, 0, stream>>>(dst, src, n);
  TS_CUDA_CHECK_LAUNCH();
}

void convert_f16_to_f32(float* dst, const uint16_t* src, int64_t n, cudaStream_t stream) {
  TS_CHECK(dst && src && n >= 0, "[convert_f16_to_f32] bad arguments (n=", n, ")");
  if (n == 0) return;
  f16_to_f32_kernel<<<grid(n), kThreads, 0, stream>>>(dst, src, n);
  TS_CUDA_CHECK_LAUNCH();
}

void gather_rows(float* dst, const float* src, const int32_t* index, int64_t n, int64_t C,
                 cudaStream_t stream) {
  TS_CHECK(dst && src && index, "[gather_rows] dst, src and index must be set");
  TS_CHECK(n >= 0 && C > 0, "[gather_rows] n=", n, " C=", C, " out of range");
  if (n == 0) return;
  launch_dependent(gather_kernel, dim3(grid(n * C)), dim3(kThreads), 0, stream, dst, src, index, n,
                   C);
}

void head_rmsnorm(float* x, int64_t ld, int64_t n, int64_t heads, int64_t D, const float* w,
                  float eps, cudaStream_t stream) {
  TS_CHECK(x && w, "[head_rmsnorm] null pointer");
  TS_CHECK(n >= 0 && heads > 0 && D > 0 && ld >= heads * D, "[head_rmsnorm] n=", n,
           " heads=", heads, " D=", D, " ld=", ld);
  if (n == 0) return;
  launch_dependent(head_rmsnorm_kernel, dim3(static_cast<unsigned>(n * heads)), dim3(kThreads), 0,
                   stream, x, ld, heads, D, w, eps);
}

// dw's slices go in chunks of kSlicesPerChunk (at most kMaxChunks chunks): enough blocks to fill
// the GPU at a training step's n * heads (thousands), few partial rows to finish.
constexpr int64_t kSlicesPerChunk = 64, kMaxChunks = 1024;

int64_t head_rms_chunks(int64_t slices) {
  const int64_t per = std::max<int64_t>(kSlicesPerChunk, (slices + kMaxChunks - 1) / kMaxChunks);
  return (slices + per - 1) / per;
}

int64_t head_rmsnorm_backward_workspace(int64_t n, int64_t heads, int64_t D) {
  return n * heads + head_rms_chunks(n * heads) * D;
}

void head_rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, int64_t ld,
                           int64_t ld_x, int64_t n, int64_t heads, int64_t D, const float* w,
                           float eps, float* workspace, cudaStream_t stream) {
  TS_CHECK(dx && dw && dy && x && w, "[head_rmsnorm_backward] null pointer");
  TS_CHECK(n >= 0 && heads > 0 && D > 0 && ld >= heads * D && ld_x >= heads * D,
           "[head_rmsnorm_backward] n=", n, " heads=", heads, " D=", D, " ld=", ld, " ld_x=", ld_x);
  if (n == 0) return;
  TS_CHECK(workspace, "[head_rmsnorm_backward] workspace is null");
  const int64_t slices = n * heads, chunks = head_rms_chunks(slices);
  const int64_t per_chunk = (slices + chunks - 1) / chunks;
  float* r = workspace;
  float* partial = workspace + slices;
  launch_dependent(head_rms_kernel, dim3(static_cast<unsigned>(slices)), dim3(kThreads), 0, stream,
                   r, x, ld_x, heads, D, eps);
  const auto columns = static_cast<unsigned>((D + kThreads - 1) / kThreads);
  launch_dependent(head_rms_dweight_partial_kernel, dim3(columns, static_cast<unsigned>(chunks)),
                   dim3(kThreads), 0, stream, partial, dy, x, r, ld, ld_x, slices, heads, D,
                   per_chunk);
  launch_dependent(head_rms_dweight_finalize_kernel, dim3(columns), dim3(kThreads), 0, stream, dw,
                   partial, chunks, D);
  launch_dependent(head_rms_dx_kernel, dim3(static_cast<unsigned>(slices)), dim3(kThreads), 0,
                   stream, dx, dy, x, r, ld, ld_x, heads, D, w);
}

void scatter_add_rows(float* dst, const float* src, const int32_t* index, const float* weight,
                      int64_t n, int64_t C, cudaStream_t stream) {
  TS_CHECK(dst && src && index && weight, "[scatter_add_rows] null pointer");
  TS_CHECK(n >= 0 && C > 0, "[scatter_add_rows] n=", n, " C=", C, " out of range");
  if (n == 0) return;
  launch_dependent(scatter_add_kernel, dim3(grid(C)), dim3(kThreads), 0, stream, dst, src, index,
                   weight, n, C);
}

void moe_route(int32_t* ids, float* weights, const float* logits, int64_t n, int64_t E, int64_t k,
               bool normalize, cudaStream_t stream) {
  TS_CHECK(ids && weights && logits, "[moe_route] null pointer");
  TS_CHECK(n >= 0 && E > 0 && k >= 1 && k <= E, "[moe_route] n=", n, " E=", E, " k=", k);
  if (n == 0) return;
  launch_dependent(moe_route_kernel, dim3(grid(n)), dim3(kThreads), 0, stream, ids, weights, logits,
                   n, E, k, normalize);
}

void moe_route_backward(float* dlogits, const float* dweights, const int32_t* ids,
                        const float* logits, int64_t n, int64_t E, int64_t k, bool normalize,
                        cudaStream_t stream) {
  TS_CHECK(dlogits && dweights && ids && logits, "[moe_route_backward] null pointer");
  TS_CHECK(n >= 0 && E > 0 && k >= 1 && k <= E, "[moe_route_backward] n=", n, " E=", E, " k=", k);
  if (n == 0) return;
  launch_dependent(moe_route_backward_kernel, dim3(grid(n)), dim3(kThreads), 0, stream, dlogits,
                   dweights, ids, logits, n, E, k, normalize);
}

void scatter_add_rows_backward(float* dsrc, float* dweight, const float* dy, const float* src,
                               const int32_t* index, const float* weight, int64_t n, int64_t C,
                               cudaStream_t stream) {
  TS_CHECK(dsrc && dweight && dy && src && index && weight,
           "[scatter_add_rows_backward] null pointer");
  TS_CHECK(n >= 0 && C > 0, "[scatter_add_rows_backward] n=", n, " C=", C, " out of range");
  if (n == 0) return;
  launch_dependent(scatter_add_rows_backward_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads),
                   0, stream, dsrc, dweight, dy, src, index, weight, C);
}

}  // namespace tessera::cuda
