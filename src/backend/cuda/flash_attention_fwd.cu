// FlashAttention-2 forward: one thread block per 64-row query tile and head, K/V tiles streamed
// through shared memory with cp.async double buffering, online softmax in f32, mma.sync tensor
// cores for Q K^T and P V, log-sum-exp saved for the backward.
#include <cmath>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_common.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace {

using attn_index::kFwdBlockM;
using attn_index::kFwdBlockN;
using attn_index::swizzle;
using flash::a_frag_addr;
using flash::ldmatrix_x4;

using flash::FwdParams;

constexpr int kFwdWarps = kFwdBlockM / 16;  // each warp owns 16 query rows
constexpr int kFwdThreads = kFwdWarps * 32;

template <int kD>
constexpr int fwd_smem_bytes() {
  return (kFwdBlockM + 4 * kFwdBlockN) * kD * 2;  // Q, then 2 stages of K and of V
}

template <typename T, int kD>
__global__ void __launch_bounds__(kFwdThreads) flash_fwd_kernel(FwdParams p) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  constexpr int kBM = kFwdBlockM, kBN = kFwdBlockN;
  static_assert(kBM == 16 * kFwdWarps && kBN % 16 == 0, "tile shapes follow the mma shape");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBM * kD;      // 2 stages
  T* sV = sK + 2 * kBN * kD;  // 2 stages

  const int T_len = p.T;
  // Heaviest causal tiles (last rows) first, so the long blocks do not form the tail.
  const int q_tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int hq = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = hq / p.group;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int q0 = q_tile * kBM;

  const T* q_ptr = static_cast<const T*>(p.q) + b * p.ql.batch + hq * p.ql.head + q0 * p.ql.token;
  const T* k_ptr = static_cast<const T*>(p.k) + b * p.kl.batch + hk * p.kl.head;
  const T* v_ptr = static_cast<const T*>(p.v) + b * p.vl.batch + hk * p.vl.head;

  // K tiles t_first .. t_end - 1: from the one holding the window's first key (0 without one) to
  // the diagonal; iteration t visits tile t_first + t.
  const int t_first = attn_index::first_kv_tile_for_q_tile(q_tile, kBM, kBN, p.window);
  const int n_tiles = attn_index::kv_tiles_for_q_tile(q_tile, T_len, kBM, kBN, p.causal) - t_first;
  const int k_first = t_first * kBN;

  flash::load_tile_async<kBM, kD, kFwdThreads>(sQ, q_ptr, p.ql.token, T_len - q0);
  flash::load_tile_async<kBN, kD, kFwdThreads>(sK, k_ptr + k_first * p.kl.token, p.kl.token,
                                               T_len - k_first);
  flash::load_tile_async<kBN, kD, kFwdThreads>(sV, v_ptr + k_first * p.vl.token, p.vl.token,
                                               T_len - k_first);
  flash::cp_async_commit();

  uint32_t qf[kD / 16][4];
  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) scores
  float row_sum[2] = {0.f, 0.f};              // this lane's share; quad-reduced at the end
  const float scale_log2 = p.scale * flash::kLog2e;

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < n_tiles) {
      // The stage written here was last read in iteration t-1, which ended with a barrier.
      const int k_next = k_first + (t + 1) * kBN;
      flash::load_tile_async<kBN, kD, kFwdThreads>(
          sK + (stage ^ 1) * kBN * kD, k_ptr + k_next * p.kl.token, p.kl.token, T_len - k_next);
      flash::load_tile_async<kBN, kD, kFwdThreads>(
          sV + (stage ^ 1) * kBN * kD, v_ptr + k_next * p.vl.token, p.vl.token, T_len - k_next);
      flash::cp_async_commit();
      flash::cp_async_wait<1>();
    } else {
      flash::cp_async_wait<0>();
    }
    __syncthreads();

    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        ldmatrix_x4(qf[kk], a_frag_addr<kD>(sQ, warp * 16, kk * 16, lane));
    }

    const T* sKs = sK + stage * kBN * kD;
    const T* sVs = sV + stage * kBN * kD;

    // S (16 x kBN per warp) = Q K^T
    float s[kBN / 8][4];
    flash::mma_scores<T, kD, kBN>(s, qf, sKs, lane);

    const int k0 = k_first + t * kBN;
    if (attn_index::tile_needs_mask(q_tile, t_first + t, T_len, kBM, kBN, p.causal, p.window))
      flash::mask_scores(s, q0 + warp * 16 + lane / 4, k0 + (lane % 4) * 2, T_len, p.causal,
                         p.window);

    flash::online_softmax_step(s, o, row_max, row_sum, scale_log2);

    // O += P V, P rounded to 16 bits straight from the S accumulators.
    flash::mma_pv<T, kD, kBN>(o, s, sVs, lane);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  flash::store_forward_rows<T>(p, o, row_max, row_sum, q0 + warp * 16 + lane / 4, b, hq, lane);
}

template <typename T, int kD>
void launch_fwd(const FwdParams& p, int64_t B, cudaStream_t stream) {
  constexpr int smem = fwd_smem_bytes<kD>();
  TS_CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_kernel<T, kD>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(attn_index::ceil_div(p.T, kFwdBlockM), p.Hq, static_cast<unsigned>(B));
  flash_fwd_kernel<T, kD><<<grid, kFwdThreads, smem, stream>>>(p);
  TS_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace flash {
// Shared host-side validation of the shape and of one tensor's pointer and strides.
void check_shape(const char* op, const FlashAttentionShape& s) {
  TS_CHECK(s.B >= 1 && s.B <= 65535, "[", op, "] batch B=", s.B, " must be in [1, 65535]");
  TS_CHECK(s.T >= 1 && s.T <= (1 << 30), "[", op, "] sequence T=", s.T, " out of range");
  TS_CHECK(s.Hkv >= 1 && s.Hq >= 1 && s.Hq % s.Hkv == 0 && s.Hq <= 65535, "[", op,
           "] heads Hq=", s.Hq, " must be a positive multiple of Hkv=", s.Hkv);
  TS_CHECK(s.D == 64 || s.D == 128, "[", op, "] head dim D=", s.D, " must be 64 or 128");
  TS_CHECK(s.dtype == DType::bf16 || s.dtype == DType::f16, "[", op, "] dtype ",
           dtype_name(s.dtype), " must be bf16 or f16");
  TS_CHECK(std::isfinite(s.scale) && s.scale > 0, "[", op, "] scale=", s.scale,
           " must be finite and positive");
  TS_CHECK(s.window >= 0 && (s.window == 0 || s.causal), "[", op, "] window=", s.window,
           " must be >= 0, and 0 unless causal");
}
void check_tensor(const char* op, const char* name, const void* data, const AttnLayout& l) {
  TS_CHECK(data != nullptr, "[", op, "] ", name, " is null");
  TS_CHECK(reinterpret_cast<uintptr_t>(data) % 16 == 0, "[", op, "] ", name,
           " must be 16-byte aligned");
  TS_CHECK(l.batch % 8 == 0 && l.token % 8 == 0 && l.head % 8 == 0 && l.token > 0, "[", op, "] ",
           name, " strides (", l.batch, ", ", l.token, ", ", l.head,
           ") must be positive multiples of 8 elements");
}
}  // namespace flash

void flash_attention_forward(const FlashForwardArgs& a, cudaStream_t stream) {
  const char* op = "flash_attention_forward";
  const FlashAttentionShape& s = a.shape;
  flash::check_shape(op, s);
  flash::check_tensor(op, "q", a.q.data, a.q.layout);
  flash::check_tensor(op, "k", a.k.data, a.k.layout);
  flash::check_tensor(op, "v", a.v.data, a.v.layout);
  flash::check_tensor(op, "out", a.out.data, a.out.layout);
  TS_CHECK(a.lse != nullptr, "[", op, "] lse is null");
  FwdParams p{a.q.data,
              a.k.data,
              a.v.data,
              a.out.data,
              a.lse,
              a.q.layout,
              a.k.layout,
              a.v.layout,
              a.out.layout,
              static_cast<int>(s.T),
              static_cast<int>(s.Hq),
              static_cast<int>(s.Hq / s.Hkv),
              s.scale,
              s.causal,
              static_cast<int>(std::min(s.window, s.T))};  // a window past T hides nothing
  if (resolve_flash_kernel(a.kernel, FlashPass::forward) == FlashKernel::wgmma) {
    flash::launch_fwd_wgmma(p, static_cast<int>(s.D), s.dtype, s.B, stream);
    return;
  }
  const bool bf16 = s.dtype == DType::bf16;
  if (s.D == 64) {
    bf16 ? launch_fwd<__nv_bfloat16, 64>(p, s.B, stream) : launch_fwd<__half, 64>(p, s.B, stream);
  } else {
    bf16 ? launch_fwd<__nv_bfloat16, 128>(p, s.B, stream) : launch_fwd<__half, 128>(p, s.B, stream);
  }
}

}  // namespace tessera::cuda
