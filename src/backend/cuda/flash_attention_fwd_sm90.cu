// FlashAttention forward for Hopper (sm_90a): one thread block per 128-row query tile and head,
// two warpgroups of 64 rows each, K/V tiles of 128 keys streamed through 128-byte-swizzled shared
// memory by cp.async in three stages (two tiles in flight while one is computed, one barrier per
// tile and one before the last product), each tile's softmax overlapping the previous tile's P V
// product, S = Q K^T and O += P V on wgmma.mma_async (Q, K, V read by the tensor cores straight
// from shared memory, P from registers), online softmax in f32, log-sum-exp saved for the backward.
// Same arithmetic as the mma.sync kernel (f32 scores, P rounded to 16 bits, f32 O; O is corrected
// after, not before, adding a tile's product), on tiles four times larger.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_common.cuh"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace {

using flash::FwdParams;

constexpr int kBM = 128, kBN = 128;    // query rows, keys per tile
constexpr int kWarpgroups = kBM / 64;  // each warpgroup owns 64 query rows
constexpr int kThreads = kWarpgroups * 128;
constexpr int kAlign = 1024;  // the 128-byte swizzle repeats every 1024 bytes
constexpr int kStages = 3;

template <int kD>
constexpr int smem_bytes() {
  // Q, then the stages of K and of V, plus slack to align the base: 230,400 B at D=128, within
  // Hopper's 227 KiB per block.
  return (kBM + 2 * kStages * kBN) * kD * 2 + kAlign;
}
static_assert(smem_bytes<128>() <= 232448, "a Hopper block may have at most 227 KiB");

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1) flash_fwd_wgmma_kernel(FwdParams p) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
#if TESSERA_HAS_WGMMA
  using M = wgmma::Mma<T>;
  constexpr int kTileBytes = kBN * kD * 2;  // one K or V stage
  constexpr int kBlockBytes = kBN * 128;    // one 64-wide column block of a K/V stage

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (flash::smem_u32(smem_raw) + kAlign - 1) & ~uint32_t(kAlign - 1);
  const uint32_t sQ = base;
  const uint32_t sK = sQ + kBM * kD * 2;  // kStages stages
  const uint32_t sV = sK + kStages * kTileBytes;

  const int T_len = p.T;
  // Heaviest causal tiles (last rows) first, so the long blocks do not form the tail.
  const int q_tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int hq = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = hq / p.group;
  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x % 128) / 32;  // in the warpgroup
  const int lane = threadIdx.x % 32;
  const int q0 = q_tile * kBM;
  const int row0 = q0 + wg * 64 + warp * 16 + lane / 4;  // this lane's rows: row0, row0 + 8

  const T* q_ptr = static_cast<const T*>(p.q) + b * p.ql.batch + hq * p.ql.head + q0 * p.ql.token;
  const T* k_ptr = static_cast<const T*>(p.k) + b * p.kl.batch + hk * p.kl.head;
  const T* v_ptr = static_cast<const T*>(p.v) + b * p.vl.batch + hk * p.vl.head;

  // K tiles t_first .. from the one holding the window's first key (0 without one) to the
  // diagonal; tile index j below counts from t_first (K tile t_first + j).
  const int t_first = attn_index::first_kv_tile_for_q_tile(q_tile, kBM, kBN, p.window);
  const int n_tiles = attn_index::kv_tiles_for_q_tile(q_tile, T_len, kBM, kBN, p.causal) - t_first;
  const int key_first = t_first * kBN;

  // Copy group j holds K tile j and V tile j - 1 (group 0 also Q, group n_tiles only V tile
  // n_tiles - 1): iteration t reads K_t for S and V_{t-1} for the product of the previous tile's
  // P. Groups 0 and 1 are issued here, group t + 2 in iteration t; tile j sits in stage j % 3.
  auto load_group = [&](int j) {
    if (j < n_tiles) {
      const int k_first = key_first + j * kBN;
      flash::load_tile_sw128<kBN, kD, kThreads>(sK + (j % kStages) * kTileBytes,
                                                k_ptr + k_first * p.kl.token, p.kl.token,
                                                T_len - k_first);
    }
    if (j >= 1) {
      const int v_first = key_first + (j - 1) * kBN;
      flash::load_tile_sw128<kBN, kD, kThreads>(sV + ((j - 1) % kStages) * kTileBytes,
                                                v_ptr + v_first * p.vl.token, p.vl.token,
                                                T_len - v_first);
    }
    flash::cp_async_commit();
  };
  flash::load_tile_sw128<kBM, kD, kThreads>(sQ, q_ptr, p.ql.token, T_len - q0);
  load_group(0);
  load_group(1);

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float s[kBN / 8][4];
  uint32_t pa[kBN / 16][4];                   // the previous tile's P, 16 bits, register A
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) scores
  float row_sum[2] = {0.f, 0.f};              // this lane's share; quad-reduced at the end
  const float scale_log2 = p.scale * flash::kLog2e;
  // This warpgroup's 64 rows of Q: column block kk / 4, k-step kk % 4 inside it.
  const uint32_t q_wg = sQ + wg * 64 * 128;

  // The pieces of iteration t. S_t = Q K_t^T (64 x 128 per warpgroup, kD / 16 k-steps; the
  // first overwrites S, scale-d 0).
  auto issue_s = [&](int t) {
    const uint32_t sKs = sK + (t % kStages) * kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;
      const uint64_t da = wgmma::sw128_desc(q_wg + (kk / 4) * (kBM * 128) + off, 16, 1024);
      const uint64_t db = wgmma::sw128_desc(sKs + (kk / 4) * kBlockBytes + off, 16, 1024);
      M::ss_n128(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma::commit();
  };
  // O += P V_j: keys 16i..16i+15 are rows of V (128 bytes apart in each column block), column
  // blocks of D kBlockBytes apart.
  auto issue_pv = [&](int j) {
    const uint32_t sVs = sV + (j % kStages) * kTileBytes;
#pragma unroll
    for (int i = 0; i < kBN / 16; ++i) {
      const uint64_t dv = wgmma::sw128_desc(sVs + i * 16 * 128, kBlockBytes, 1024);
      if constexpr (kD == 128) {
        M::rs_n128(o, pa[i], dv, 1);
      } else {
        M::rs_n64(o, pa[i], dv, 1);
      }
    }
    wgmma::commit();
  };
  // Waits for group t's copies and makes them visible; past the barrier every thread has
  // finished iteration t - 1, whose products (waited for) were the last readers of K_{t-1} and
  // V_{t-2}, the stages group t + 2 refills.
  auto next_tile_data = [&](int t) {
    if (t + 1 <= n_tiles) {
      flash::cp_async_wait<1>();
    } else {
      flash::cp_async_wait<0>();
    }
    wgmma::fence_async_shared();
    __syncthreads();
    if (t + 2 <= n_tiles) load_group(t + 2);
  };
  // Tile t's softmax on S (landed), leaving the O correction in corr.
  auto softmax = [&](int t, float(&corr)[2]) {
    wgmma::fence_operands(s);
    if (attn_index::tile_needs_mask(q_tile, t_first + t, T_len, kBM, kBN, p.causal, p.window))
      flash::mask_scores(s, row0, key_first + t * kBN + (lane % 4) * 2, T_len, p.causal, p.window);
    flash::softmax_update_scores(s, row_max, row_sum, scale_log2, corr);
  };
  // P rounded to 16 bits straight from the S accumulators (k-step j = pair 2j, 2j + 1).
  auto pack_p = [&] {
#pragma unroll
    for (int j = 0; j < kBN / 16; ++j) {
      flash::pack_a_step<T>(s, j, pa[j]);
    }
  };
  // Ends the last tile's live range of S (an in-out operand) and leaves no register unset.
  auto zero_s = [&] {
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  };

  // Tile 0: S and its softmax (O is still zero, nothing to correct).
  {
    next_tile_data(0);
    zero_s();
    wgmma::fence_operands(s);
    wgmma::fence();
    issue_s(0);
    wgmma::wait<0>();
    float corr[2];
    softmax(0, corr);
    pack_p();
  }
  // Tiles 1..: S_t and O += P_{t-1} V_{t-1} issued back to back; tile t's softmax runs while the
  // second product is still on the tensor cores (FlashAttention-3's intra-warpgroup overlap),
  // and O is corrected only once that product has landed.
  for (int t = 1; t < n_tiles; ++t) {
    next_tile_data(t);
    zero_s();
    wgmma::fence_operands(s);
    wgmma::fence_operands(pa);
    wgmma::fence_operands(o);
    wgmma::fence();
    issue_s(t);
    issue_pv(t - 1);
    wgmma::wait<1>();  // S_t has landed; the product behind it may be pending
    float corr[2];
    softmax(t, corr);
    wgmma::wait<0>();
    wgmma::fence_operands(o);
    wgmma::fence_operands(pa);
    flash::rescale_rows(o, corr);
    pack_p();
  }
  // The last tile's product.
  next_tile_data(n_tiles);
  wgmma::fence_operands(pa);
  wgmma::fence_operands(o);
  wgmma::fence();
  issue_pv(n_tiles - 1);
  wgmma::wait<0>();
  wgmma::fence_operands(o);

  flash::store_forward_rows<T>(p, o, row_max, row_sum, row0, b, hq, lane);
#else
  // Built without sm_90a code: the host never launches this (flash_wgmma_available).
  __trap();
#endif
}

template <typename T, int kD>
void launch(const FwdParams& p, int64_t B, cudaStream_t stream) {
  constexpr int smem = smem_bytes<kD>();
  TS_CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_wgmma_kernel<T, kD>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(attn_index::ceil_div(p.T, kBM), p.Hq, static_cast<unsigned>(B));
  flash_fwd_wgmma_kernel<T, kD><<<grid, kThreads, smem, stream>>>(p);
  TS_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace flash {
void launch_fwd_wgmma(const FwdParams& p, int D, DType dtype, int64_t B, cudaStream_t stream) {
  const bool bf16 = dtype == DType::bf16;
  if (D == 64) {
    bf16 ? launch<__nv_bfloat16, 64>(p, B, stream) : launch<__half, 64>(p, B, stream);
  } else {
    bf16 ? launch<__nv_bfloat16, 128>(p, B, stream) : launch<__half, 128>(p, B, stream);
  }
}
}  // namespace flash

}  // namespace tessera::cuda
