// Prompt attention over the paged KV cache on tensor cores: one thread block per (tile of up to
// 64 query rows sharing a block table, query head), 64-key tiles gathered from the cache blocks
// by cp.async into double-buffered shared memory, Q K^T and P V on mma.sync with the training
// forward's steps (flash_common.cuh), each row masked by its own key count; and the host-side
// planner that cuts a chunk's rows into such tiles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/flash_common.cuh"
#include "backend/cuda/runtime.h"
#include "core/error.h"

namespace tessera::cuda {
namespace {

// The training forward's tile shape: 4 warps of 16 query rows, 64 keys per tile.
constexpr int kBM = attn_index::kFwdBlockM, kBN = attn_index::kFwdBlockN;
constexpr int kWarps = kBM / 16;
constexpr int kThreads = kWarps * 32;
static_assert(kBM == kPrefillTileRows, "a planned tile fills one block");

struct PrefillParams {
  float* out;      // (rows, H, D)
  const float* q;  // (rows, H, D)
  int H, group;
  const void* kv;
  int block_tokens;
  int64_t block_stride, v_offset;
  const int32_t* block_tables;
  int64_t table_stride;
  const int32_t* n_keys;
  const int32_t* first_key;  // null: every row from key 0
  const PagedPrefillTile* tiles;
  float scale;
};

template <int kD>
constexpr int prefill_smem_bytes() {
  return (kBM + 4 * kBN) * kD * 2;  // Q, then 2 stages of K and of V
}

// The tile's query rows of one head (row r at q + r * row_stride), times the softmax scale and
// rounded to T, into the swizzled Q tile; rows >= rows become zeros. Plain loads and stores:
// q is f32, which cp.async could not convert. Scaling first keeps large queries inside f16.
template <typename T, int kD>
__device__ inline void load_q_rows(T* sQ, const float* q, int64_t row_stride, int rows,
                                   float scale) {
  using E = flash::Elem<T>;
  constexpr int kChunksPerRow = kD / 8;
  for (int i = static_cast<int>(threadIdx.x); i < kBM * kChunksPerRow; i += kThreads) {
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    uint4 packed = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) {
      const float4* src = reinterpret_cast<const float4*>(q + r * row_stride + c * 8);
      const float4 a = src[0], b = src[1];
      packed.x = E::pack(a.x * scale, a.y * scale);
      packed.y = E::pack(a.z * scale, a.w * scale);
      packed.z = E::pack(b.x * scale, b.y * scale);
      packed.w = E::pack(b.z * scale, b.w * scale);
    }
    *reinterpret_cast<uint4*>(sQ + attn_index::swizzle(r, c * 8, kD)) = packed;
  }
}

// Keys k0 .. k0 + kBN - 1 of one KV head (kv_head: that head's first element in block 0) and
// their values, gathered through the block table into one stage of the swizzled K and V tiles;
// keys >= k0 + valid become zeros (their scores are masked, and a zero V row times P = 0 cannot
// make a NaN). One table read serves a chunk's key and its value.
template <typename T, int kD>
__device__ inline void load_kv_tile_async(T* sK, T* sV, const PrefillParams& p, const T* kv_head,
                                          const int32_t* table, int k0, int valid) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kBN * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
  const uint32_t k_base = flash::smem_u32(sK), v_base = flash::smem_u32(sV);
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    const bool ok = r < valid;
    const T* src = kv_head;  // a readable stand-in for the zero-filled chunks
    if (ok) {
      const int j = k0 + r;
      src = kv_head + static_cast<int64_t>(table[j / p.block_tokens]) * p.block_stride +
            (j % p.block_tokens) * kD + c * 8;
    }
    const uint32_t dst = static_cast<uint32_t>(attn_index::swizzle(r, c * 8, kD) * sizeof(T));
    flash::cp_async_16(k_base + dst, src, ok);
    flash::cp_async_16(v_base + dst, ok ? src + p.v_offset : src, ok);
  }
}

// Masks the keys outside [first, nk) of each of the lane's two rows (e < 2: row g, else row
// g + 8): within a prompt nk is the causal mask, and it also covers the tile's tail; first is a
// sliding window's start.
__device__ inline void mask_outside_keys(float (&s)[kBN / 8][4], int col0, const int (&first)[2],
                                         const int (&nk)[2]) {
#pragma unroll
  for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + n * 8 + (e & 1);
      if (col < first[e >> 1] || col >= nk[e >> 1]) s[n][e] = -INFINITY;
    }
  }
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) paged_prefill_kernel(PrefillParams p) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBM * kD;      // 2 stages
  T* sV = sK + 2 * kBN * kD;  // 2 stages
  allow_dependent_launch();
  grid_dependency_wait();  // q, the cache and the tiles come from the work before

  const PagedPrefillTile tile = p.tiles[blockIdx.x];
  const int hq = blockIdx.y;
  const int hk = hq / p.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = p.block_tables + static_cast<int64_t>(tile.row0) * p.table_stride;
  const T* kv_head = static_cast<const T*>(p.kv) + static_cast<int64_t>(hk) * p.block_tokens * kD;
  // Key tiles t_first .. n_tiles - 1: none wholly before every row's window.
  const int n_tiles = attn_index::ceil_div(tile.max_keys, kBN);
  const int t_first = tile.min_first / kBN;

  load_kv_tile_async<T, kD>(sK, sV, p, kv_head, table, t_first * kBN,
                            tile.max_keys - t_first * kBN);
  flash::cp_async_commit();
  const int64_t q_stride = static_cast<int64_t>(p.H) * kD;
  load_q_rows<T, kD>(sQ, p.q + static_cast<int64_t>(tile.row0) * q_stride + hq * kD, q_stride,
                     tile.rows, p.scale);

  // The lane's two query rows within the tile, and which keys each sees (none: past the
  // tile's rows, never stored).
  const int row_lo = warp * 16 + lane / 4;
  int nk[2], first[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + 8 * r;
    nk[r] = row < tile.rows ? p.n_keys[tile.row0 + row] : 0;
    first[r] = row < tile.rows && p.first_key ? p.first_key[tile.row0 + row] : 0;
  }

  uint32_t qf[kD / 16][4];
  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // scores already carry the scale
  float row_sum[2] = {0.f, 0.f};              // this lane's share; quad-reduced at the end

  for (int t = t_first; t < n_tiles; ++t) {
    const int stage = (t - t_first) & 1;
    if (t + 1 < n_tiles) {
      // The stage written here was last read in iteration t-1, which ended with a barrier.
      const int k_next = (t + 1) * kBN;
      load_kv_tile_async<T, kD>(sK + (stage ^ 1) * kBN * kD, sV + (stage ^ 1) * kBN * kD, p,
                                kv_head, table, k_next, tile.max_keys - k_next);
      flash::cp_async_commit();
      flash::cp_async_wait<1>();
    } else {
      flash::cp_async_wait<0>();
    }
    __syncthreads();  // (the first time it also orders the plain Q stores before the reads)

    if (t == t_first) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        flash::ldmatrix_x4(qf[kk], flash::a_frag_addr<kD>(sQ, warp * 16, kk * 16, lane));
    }

    float s[kBN / 8][4];
    flash::mma_scores<T, kD, kBN>(s, qf, sK + stage * kBN * kD, lane);
    // Tiles wholly inside every row's keys need no mask.
    if ((t + 1) * kBN > tile.min_keys || t * kBN < tile.max_first)
      mask_outside_keys(s, t * kBN + (lane % 4) * 2, first, nk);
    flash::online_softmax_step(s, o, row_max, row_sum, flash::kLog2e);
    flash::mma_pv<T, kD, kBN>(o, s, sV + stage * kBN * kD, lane);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = flash::quad_sum(row_sum[r]);  // every lane: the shuffles need the quad
    const int row = row_lo + 8 * r;
    if (row < tile.rows) {
      const float inv = l > 0.f ? 1.f / l : 0.f;
      float* dst =
          p.out + static_cast<int64_t>(tile.row0 + row) * q_stride + hq * kD + (lane % 4) * 2;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) =
            make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
  }
}

template <typename T, int kD>
void launch_prefill(const PrefillParams& p, int64_t tiles, cudaStream_t stream) {
  constexpr int smem = prefill_smem_bytes<kD>();
  // Once per device: a later call may be inside a graph capture.
  static PerDeviceFlag smem_set;
  smem_set.get([] {
    TS_CUDA_CHECK(cudaFuncSetAttribute(paged_prefill_kernel<T, kD>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  });
  launch_dependent(paged_prefill_kernel<T, kD>,
                   dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.H)), dim3(kThreads),
                   smem, stream, p);
}

}  // namespace

PagedPrefillPlan plan_paged_prefill(int64_t rows, const int32_t* n_keys, const int32_t* first_key,
                                    const int32_t* tables, int64_t table_stride, int64_t min_rows) {
  TS_CHECK(rows >= 0 && rows <= (int64_t{1} << 31) - 1 && table_stride >= 1 && min_rows >= 1,
           "[plan_paged_prefill] rows=", rows, ", table_stride=", table_stride,
           " and min_rows=", min_rows, " out of range");
  PagedPrefillPlan plan;
  auto same_table = [&](int64_t a, int64_t b) {
    return std::equal(tables + a * table_stride, tables + (a + 1) * table_stride,
                      tables + b * table_stride);
  };
  for (int64_t r = 0; r < rows;) {
    int64_t end = r + 1;
    while (end < rows && same_table(end, r)) ++end;
    if (end - r >= min_rows) {
      for (int64_t t0 = r; t0 < end; t0 += kPrefillTileRows) {
        const int64_t t1 = std::min(end, t0 + kPrefillTileRows);
        const auto [lo, hi] = std::minmax_element(n_keys + t0, n_keys + t1);
        PagedPrefillTile t{static_cast<int32_t>(t0), static_cast<int32_t>(t1 - t0), *lo, *hi, 0, 0};
        if (first_key) {
          const auto [flo, fhi] = std::minmax_element(first_key + t0, first_key + t1);
          t.min_first = *flo;
          t.max_first = *fhi;
        }
        plan.tiles.push_back(t);
      }
    } else {
      for (int64_t i = r; i < end; ++i) plan.decode_rows.push_back(static_cast<int32_t>(i));
    }
    r = end;
  }
  // Longest tiles first, so they do not form the tail.
  std::stable_sort(
      plan.tiles.begin(), plan.tiles.end(),
      [](const PagedPrefillTile& a, const PagedPrefillTile& b) { return a.max_keys > b.max_keys; });
  return plan;
}

namespace detail {
void paged_prefill_attention(const PagedDecodeArgs& a, cudaStream_t stream) {
  // paged_decode_attention has checked the arguments.
  PrefillParams p{};
  p.out = a.out;
  p.q = a.q;
  p.H = static_cast<int>(a.H);
  p.group = static_cast<int>(a.H / a.Hkv);
  p.kv = a.kv;
  TS_CHECK(a.block_tokens <= (int64_t{1} << 30),
           "[paged_decode_attention] block_tokens=", a.block_tokens,
           " too large for the prefill tiles");
  p.block_tokens = static_cast<int>(a.block_tokens);
  p.block_stride = a.block_stride;
  p.v_offset = a.v_offset;
  p.block_tables = a.block_tables;
  p.table_stride = a.table_stride;
  p.n_keys = a.n_keys;
  p.first_key = a.first_key;
  p.tiles = a.prefill_tiles;
  p.scale = a.scale;
  const bool bf16 = a.kv_dtype == DType::bf16;
  const int64_t n = a.n_prefill_tiles;
  if (a.D == 64) {
    bf16 ? launch_prefill<__nv_bfloat16, 64>(p, n, stream)
         : launch_prefill<__half, 64>(p, n, stream);
  } else {
    bf16 ? launch_prefill<__nv_bfloat16, 128>(p, n, stream)
         : launch_prefill<__half, 128>(p, n, stream);
  }
}
}  // namespace detail

}  // namespace tessera::cuda
