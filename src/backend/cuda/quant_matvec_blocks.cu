// Quantized matvec kernels for the GGUF block types (q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K,
// q6_K): weight rows
// streamed once through shared memory with 128-bit loads, __dp4a against int8 activations.
// Launched as programmatic dependents: the first chunk of weights is in flight before the wait
// for the kernel that wrote the activations.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/matvec_common.cuh"
#include "backend/cuda/quant_blocks.cuh"
#include "backend/cuda/quant_matvec.h"

namespace tessera::cuda::detail {

namespace {

namespace qb = qblocks;

constexpr int kWarps = 4;  // warps per CTA: small CTAs keep the tail wave short for small N
constexpr int kRows = kMatvecWarpRows;

// The 16 bytes at aligned address a, keeping only those inside [lo, hi) (others zero). Used for
// the first and last slot of a chunk whose start is not 16-byte aligned.
__device__ __forceinline__ uint4 load_slot_masked(uintptr_t a, uintptr_t lo, uintptr_t hi) {
  if (a >= lo && a + 16 <= hi) return load_stream_v4(reinterpret_cast<const void*>(a));
  uint32_t w[4] = {0, 0, 0, 0};
  if (a + 16 > lo && a < hi) {
    for (int j = 0; j < 16; ++j) {
      const uintptr_t b = a + j;
      if (b >= lo && b < hi)
        w[j / 4] |= static_cast<uint32_t>(*reinterpret_cast<const uint8_t*>(b)) << (8 * (j % 4));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <class T, int M>
__global__ void __launch_bounds__(kWarps * 32)
    block_matvec_kernel(float* __restrict__ y, int64_t ldy, const int8_t* __restrict__ xq,
                        const float* __restrict__ xd, const int32_t* __restrict__ xs, int64_t K,
                        const uint8_t* __restrict__ w, int64_t row_bytes, int64_t N,
                        const float* __restrict__ bias) {
  using G = qb::Chunk<T>;
  constexpr int CB = G::kBlocks, kChunkBytes = G::kBytes, LS = G::kSlotsPerLane;
  constexpr int kUnitsPerLane = G::kUnitsPerLane, kRowBuf = G::kRowBuf;
  constexpr int BB = T::kBlockBytes, BE = T::kBlockElems, UPB = T::kUnitsPerBlock;
  constexpr int NW = T::kWords, XV = T::kXVec;
  static_assert(kWarps * kRows * kRowBuf <= 48 * 1024, "static shared memory limit");

  __shared__ __align__(16) uint8_t stage[kWarps][kRows][kRowBuf];

  allow_dependent_launch();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRows;
  if (n0 >= N) return;  // the whole warp leaves together; the kernel has no block-wide barrier

  const int64_t nblk = K / BE;  // blocks per row
  const int64_t nchunks = (nblk + CB - 1) / CB;
  const int64_t x_groups = K / 32;

  // Rows past N load nothing (their slots stay zero) and are never written.
  uint4 buf[kRows][LS];
  int phase[kRows];
  auto load_chunk = [&](int64_t c) {
    const int64_t blocks = min(static_cast<int64_t>(CB), nblk - c * CB);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t n = n0 + r;
      const uintptr_t lo =
          reinterpret_cast<uintptr_t>(w) + (n < N ? n : 0) * row_bytes + c * kChunkBytes;
      const uintptr_t hi = n < N ? lo + blocks * BB : lo;  // empty range: all zero
      phase[r] = static_cast<int>(lo & 15u);
      const uintptr_t base = lo & ~uintptr_t{15};
#pragma unroll
      for (int s = 0; s < LS; ++s) {
        const uintptr_t a = base + 16 * static_cast<uintptr_t>(lane + 32 * s);
        buf[r][s] = a < hi ? load_slot_masked(a, lo, hi) : make_uint4(0, 0, 0, 0);
      }
    }
  };

  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

  load_chunk(0);           // weights only: no kernel writes them
  grid_dependency_wait();  // xq, xd, xs (and y's old readers) belong to earlier kernels
  for (int64_t c = 0; c < nchunks; ++c) {
    int ph[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      ph[r] = phase[r];
      auto* dst = reinterpret_cast<uint4*>(stage[warp][r]);
#pragma unroll
      for (int s = 0; s < LS; ++s) dst[lane + 32 * s] = buf[r][s];
    }
    __syncwarp();
    if (c + 1 < nchunks) load_chunk(c + 1);  // in flight while this chunk is decoded

#pragma unroll
    for (int i = 0; i < kUnitsPerLane; ++i) {
      const int v = lane + 32 * i;
      const int bl = v / UPB, u = v % UPB;
      const int64_t b = c * CB + bl;  // block index within the row
      if (b >= nblk) continue;
      uint32_t q[kRows][NW];
      int sc[kRows][NW];
      float d[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint8_t* blk = stage[warp][r] + ph[r] + bl * BB;
        T::unit(blk, u, q[r], sc[r]);
        d[r] = T::scale(blk);
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const int8_t* xb = xq + m * K + b * BE;
        uint32_t xw[NW];
#pragma unroll
        for (int g = 0; g < NW; g += XV) {
          const int8_t* p = xb + T::x_first(u, g);
          if constexpr (XV == 4) {
            const int4 t = __ldg(reinterpret_cast<const int4*>(p));
            xw[g] = t.x, xw[g + 1] = t.y, xw[g + 2] = t.z, xw[g + 3] = t.w;
          } else if constexpr (XV == 2) {
            const int2 t = __ldg(reinterpret_cast<const int2*>(p));
            xw[g] = t.x, xw[g + 1] = t.y;
          } else {
            xw[g] = __ldg(reinterpret_cast<const int*>(p));
          }
        }
        const float dx = __ldg(xd + m * nblk + b);
        const int32_t* sums = xs + m * x_groups + b * (BE / 32);  // this block's 32-sums
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          int isum = 0;
#pragma unroll
          for (int k = 0; k < NW; ++k) isum += sc[r][k] * qb::dot4(q[r][k], xw[k], 0);
          const uint8_t* blk = stage[warp][r] + ph[r] + bl * BB;
          float f = 0.0f;  // the offsets' float part (mins), in units of dx
          T::offset_terms(blk, u, sums, &isum, &f);
          acc[r][m] += d[r] * dx * static_cast<float>(isum);
          acc[r][m] += f * dx;
        }
      }
    }
    __syncwarp();  // everyone is done with stage before the next chunk overwrites it
  }

  warp_sum_store<kRows, M>(acc, lane, n0, N, bias, y, ldy);
}

template <class T, int M>
void launch_typed(float* y, int64_t ldy, const int8_t* xq, const float* xd, const int32_t* xs,
                  int64_t K, const void* w, int64_t N, const float* bias, cudaStream_t stream) {
  const int64_t rows_per_cta = kWarps * kRows;
  const int64_t grid = (N + rows_per_cta - 1) / rows_per_cta;
  TS_CHECK(grid <= 0x7fffffff, "[cuda matmul_wt] N=", N, " needs too many thread blocks");
  const int64_t row_bytes = static_cast<int64_t>(K / T::kBlockElems) * T::kBlockBytes;
  launch_dependent(block_matvec_kernel<T, M>, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32),
                   0, stream, y, ldy, xq, xd, xs, K, static_cast<const uint8_t*>(w), row_bytes, N,
                   bias);
}

template <class T>
void launch_m(float* y, int64_t ldy, const int8_t* xq, const float* xd, const int32_t* xs,
              int64_t M, int64_t K, const void* w, int64_t N, const float* bias,
              cudaStream_t stream) {
  switch (M) {
#define TS_CASE(m) \
  case m:          \
    return launch_typed<T, m>(y, ldy, xq, xd, xs, K, w, N, bias, stream);
    TS_CASE(1)
    TS_CASE(2)
    TS_CASE(3)
    TS_CASE(4)
    TS_CASE(5)
    TS_CASE(6)
    TS_CASE(7)
    TS_CASE(8)
#undef TS_CASE
    default:
      fail("[cuda matmul_wt] M=", M, " is outside 1..", kMatvecMaxRows);
  }
}

}  // namespace

void launch_block_matvec(float* y, int64_t ldy, const int8_t* xq, const float* xd,
                         const int32_t* xs, int64_t M, int64_t K, const void* w, DType w_type,
                         int64_t N, const float* bias, cudaStream_t stream) {
  switch (w_type) {
    case DType::q8_0:
      return launch_m<qb::Q8_0>(y, ldy, xq, xd, xs, M, K, w, N, bias, stream);
    case DType::q4_0:
      return launch_m<qb::Q4_0>(y, ldy, xq, xd, xs, M, K, w, N, bias, stream);
    case DType::q4_1:
      return launch_m<qb::Q4_1>(y, ldy, xq, xd, xs, M, K, w, N, bias, stream);
    case DType::q5_0:
      return launch_m<qb::Q5_0>(y, ldy, xq, xd, xs, M, K, w, N, bias, stream);
    case DType::q5_1:
      return launch_m<qb::Q5_1>(y, ldy, xq, xd, xs, M, K, w, N, bias, stream);
    case DType::q4_k:
      return launch_m<qb::Q4K>(y, ldy, xq, xd, xs, M, K, w, N, bias, stream);
    case DType::q5_k:
      return launch_m<qb::Q5K>(y, ldy, xq, xd, xs, M, K, w, N, bias, stream);
    case DType::q6_k:
      return launch_m<qb::Q6K>(y, ldy, xq, xd, xs, M, K, w, N, bias, stream);
    default:
      fail("[cuda matmul_wt] weight type ", dtype_name(w_type), " is not a block type");
  }
}

}  // namespace tessera::cuda::detail
