// FlashAttention backward main pass for Hopper (sm_90a): one thread block per 128-key tile and
// KV head, two warpgroups of 64 keys each, 64-query steps over every query tile (and query head
// of the GQA group) whose Q, dO, LSE and D_i are fetched one step ahead. Per step and warpgroup,
// on wgmma.mma_async: S^T = K Q^T and dP^T = V dO^T from shared memory; P^T and dS^T in
// registers; dV += P^T dO and dK += dS^T Q with the register operand; dS written to shared memory
// for dQ = dS K, added to the f32 workspace with atomics (at D=128 each warpgroup takes half of
// dQ's columns over all 128 keys; at D=64 each its own keys over all columns). The D_i
// pre-pass and the dQ conversion are the mma.sync backward's (flash_attention_bwd.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_common.cuh"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace {

using flash::BwdParams;

constexpr int kBN = 128;  // keys per block, 64 per warpgroup
constexpr int kBM = 64;   // queries per step
constexpr int kThreads = 256;
constexpr int kAlign = 1024;

template <int kD>
constexpr int smem_bytes() {
  // K, V (kBN x kD), 2 stages of Q and dO (kBM x kD), dS (kBM x 64 per warpgroup), all 16-bit;
  // 2 stages of LSE and D_i (kBM floats each); slack to align the base.
  return (2 * kBN * kD + 4 * kBM * kD + 2 * kBM * 64) * 2 + 4 * kBM * 4 + kAlign;
}
static_assert(smem_bytes<128>() <= 232448, "a Hopper block may have at most 227 KiB");

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1) flash_bwd_wgmma_kernel(BwdParams p) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
#if TESSERA_HAS_WGMMA
  using E = flash::Elem<T>;
  using M = wgmma::Mma<T>;
  constexpr uint32_t kKVBytes = kBN * kD * 2, kQBytes = kBM * kD * 2, kDsBytes = kBM * 64 * 2;
  constexpr uint32_t kKVBlock = kBN * 128, kQBlock = kBM * 128;  // column-block strides

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = flash::smem_u32(smem_raw);
  const uint32_t base = (raw + kAlign - 1) & ~uint32_t(kAlign - 1);
  const uint32_t sK = base;
  const uint32_t sV = sK + kKVBytes;
  const uint32_t sQ = sV + kKVBytes;       // 2 stages
  const uint32_t sdO = sQ + 2 * kQBytes;   // 2 stages
  const uint32_t sdS = sdO + 2 * kQBytes;  // one 64-key block per warpgroup: [query][key]
  float* sLse = reinterpret_cast<float*>(smem_raw + (sdS + 2 * kDsBytes - raw));  // 2 stages
  float* sDsum = sLse + 2 * kBM;                                                  // 2 stages

  const int T_len = p.T;
  const int kv_tile = blockIdx.x;
  const int hk = blockIdx.y;
  const int b = blockIdx.z;
  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x % 128) / 32;  // in the warpgroup
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int k0 = kv_tile * kBN;
  const int key_local0 = warp * 16 + g;  // this lane's keys in the warpgroup: +0 and +8
  const int key0 = k0 + wg * 64 + key_local0;
  const float scale_log2 = p.scale * flash::kLog2e;

  flash::load_tile_sw128<kBN, kD, kThreads>(
      sK, static_cast<const T*>(p.k) + b * p.kl.batch + hk * p.kl.head + k0 * p.kl.token,
      p.kl.token, T_len - k0);
  flash::load_tile_sw128<kBN, kD, kThreads>(
      sV, static_cast<const T*>(p.v) + b * p.vl.batch + hk * p.vl.head + k0 * p.vl.token,
      p.vl.token, T_len - k0);
  flash::cp_async_commit();

  const attn_index::BwdSteps steps(kv_tile, T_len, kBM, kBN, p.causal, p.window, hk, p.group);
  const int n_steps = steps.count;
  // Step `step`'s Q and dO: cp.async into buffer `buf`, one commit group.
  auto fetch_tiles = [&](int step, int buf) {
    const int hq = steps.head(step);
    const int q0 = steps.q0(step, kBM);
    const T* q_head = static_cast<const T*>(p.q) + b * p.ql.batch + hq * p.ql.head;
    const T* do_head = static_cast<const T*>(p.dout) + b * p.dol.batch + hq * p.dol.head;
    flash::load_tile_sw128<kBM, kD, kThreads>(sQ + buf * kQBytes, q_head + q0 * p.ql.token,
                                              p.ql.token, T_len - q0);
    flash::load_tile_sw128<kBM, kD, kThreads>(sdO + buf * kQBytes, do_head + q0 * p.dol.token,
                                              p.dol.token, T_len - q0);
    flash::cp_async_commit();
  };
  // Step `step`'s LSE * log2(e) and D_i for query threadIdx.x (threads < kBM), read into
  // registers ahead of the barrier so their latency hides behind it.
  auto read_row_stats = [&](int step, float& lse_v, float& dsum_v) {
    const int hq = steps.head(step);
    const int row = steps.q0(step, kBM) + static_cast<int>(threadIdx.x);
    const int64_t at = (static_cast<int64_t>(b) * p.Hq + hq) * T_len + row;
    lse_v = row < T_len ? p.lse[at] * flash::kLog2e : 0.f;
    dsum_v = row < T_len ? p.dsum[at] : 0.f;
  };
  if (n_steps > 0) {
    fetch_tiles(0, 0);
    if (threadIdx.x < kBM) {
      float l, d;
      read_row_stats(0, l, d);
      sLse[threadIdx.x] = l;
      sDsum[threadIdx.x] = d;
    }
  }

  float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  }
  // This warpgroup's 64 keys: rows wg * 64.. of every column block of K and V.
  const uint32_t k_wg = sK + wg * 64 * 128;
  const uint32_t v_wg = sV + wg * 64 * 128;
  const uint32_t ds_wg = sdS + wg * kDsBytes;

  for (int step = 0; step < n_steps; ++step) {
    const int buf = step & 1;
    const int hq = steps.head(step);
    const int q0 = steps.q0(step, kBM);
    const bool more = step + 1 < n_steps;
    float lse_next = 0.f, dsum_next = 0.f;
    if (more && threadIdx.x < kBM) read_row_stats(step + 1, lse_next, dsum_next);
    flash::cp_async_wait<0>();  // this step's group (fetched during the last step) has landed
    wgmma::fence_async_shared();
    // Past this barrier every thread has finished the last step, the last reader of the other
    // buffer, which the next step's fetch refills while this one computes.
    __syncthreads();
    if (more) {
      fetch_tiles(step + 1, buf ^ 1);
      if (threadIdx.x < kBM) {
        sLse[(buf ^ 1) * kBM + threadIdx.x] = lse_next;
        sDsum[(buf ^ 1) * kBM + threadIdx.x] = dsum_next;
      }
    }
    const uint32_t sQb = sQ + buf * kQBytes, sdOb = sdO + buf * kQBytes;
    const float* lse = sLse + buf * kBM;
    const float* dsum = sDsum + buf * kBM;

    // S^T = K Q^T and dP^T = V dO^T: this warpgroup's 64 keys x 64 queries each.
    float st[8][4], dpt[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
    }
    wgmma::fence_operands(st);
    wgmma::fence_operands(dpt);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32u;
      const uint32_t blk = kk / 4;
      M::ss_n64(st, wgmma::sw128_desc(k_wg + blk * kKVBlock + off, 16, 1024),
                wgmma::sw128_desc(sQb + blk * kQBlock + off, 16, 1024), kk > 0 ? 1 : 0);
      M::ss_n64(dpt, wgmma::sw128_desc(v_wg + blk * kKVBlock + off, 16, 1024),
                wgmma::sw128_desc(sdOb + blk * kQBlock + off, 16, 1024), kk > 0 ? 1 : 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(st);
    wgmma::fence_operands(dpt);

    // P^T and dS^T in place (flash_common.cuh); dS also goes to shared memory as [query][key],
    // the K-major A operand of dQ = dS K.
    flash::backward_p_ds(st, dpt, key0, q0, c, lse, dsum, T_len, p.causal, p.window, scale_log2,
                         p.scale);
    unsigned char* ds_generic = smem_raw + (ds_wg - raw);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key_local = key_local0 + (e >= 2 ? 8 : 0);
        const int q_local = n * 8 + c * 2 + (e & 1);
        const uint32_t at = wgmma::sw128_offset(q_local, key_local / 8) + (key_local % 8) * 2;
        *reinterpret_cast<T*>(ds_generic + at) = E::from_float(dpt[n][e]);
      }
    }
    uint32_t pt[4][4], dst[4][4];  // k-step j: queries 16j..16j+15
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      flash::pack_a_step<T>(st, j, pt[j]);
      flash::pack_a_step<T>(dpt, j, dst[j]);
    }
    // The dS stores, visible to the tensor cores: at D=128 both warpgroups read both blocks (the
    // whole block waits), at D=64 each reads only its own (the warpgroup waits).
    wgmma::fence_async_shared();
    if constexpr (kD == 128) {
      __syncthreads();
    } else if (wg == 0) {
      asm volatile("bar.sync 1, 128;\n" ::: "memory");
    } else {
      asm volatile("bar.sync 2, 128;\n" ::: "memory");
    }

    // dV += P^T dO, dK += dS^T Q (k = the step's queries, B MN-major: rows of dO / Q), and a
    // 64-query x 64-column share of dQ = dS K (B MN-major: rows of K): at D=128 columns
    // wg * 64.. over all 128 keys, at D=64 all columns over this warpgroup's 64 keys.
    constexpr int kDqSteps = kD == 128 ? 8 : 4;
    const uint32_t dq_a = kD == 128 ? sdS : ds_wg;
    const uint32_t dq_b = kD == 128 ? sK + wg * kKVBlock : k_wg;
    const int dq_col0 = kD == 128 ? wg * 64 : 0;
    float dq[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
    wgmma::fence_operands(pt);
    wgmma::fence_operands(dst);
    wgmma::fence_operands(dv);
    wgmma::fence_operands(dk);
    wgmma::fence_operands(dq);
    wgmma::fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t d_do = wgmma::sw128_desc(sdOb + j * 16 * 128, kQBlock, 1024);
      const uint64_t d_q = wgmma::sw128_desc(sQb + j * 16 * 128, kQBlock, 1024);
      if constexpr (kD == 128) {
        M::rs_n128(dv, pt[j], d_do, 1);
        M::rs_n128(dk, dst[j], d_q, 1);
      } else {
        M::rs_n64(dv, pt[j], d_do, 1);
        M::rs_n64(dk, dst[j], d_q, 1);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kDqSteps; ++kk) {
      // Keys 16kk..: A's 64-key block kk / 4 (kDsBytes apart), B's rows 16kk.. of K.
      const uint64_t d_ds = wgmma::sw128_desc(dq_a + (kk / 4) * kDsBytes + (kk % 4) * 32, 16, 1024);
      const uint64_t d_k = wgmma::sw128_desc(dq_b + kk * 16 * 128, kKVBlock, 1024);
      M::template ss_n64<true>(dq, d_ds, d_k, kk > 0 ? 1 : 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(dv);
    wgmma::fence_operands(dk);
    wgmma::fence_operands(dq);
    wgmma::fence_operands(pt);
    wgmma::fence_operands(dst);

    // This warpgroup's share of dQ: rows = queries (16 per warp), 64 columns from dq_col0;
    // pairs of columns in one 8-byte atomic (sm_90).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + warp * 16 + g + r * 8;
      if (row < T_len) {
        float* out = p.dq_acc + ((static_cast<int64_t>(b) * T_len + row) * p.Hq + hq) * kD;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          const int col = dq_col0 + n * 8 + c * 2;
          atomicAdd(reinterpret_cast<float2*>(out + col),
                    make_float2(dq[n][2 * r], dq[n][2 * r + 1]));
        }
      }
    }
  }

  // dK, dV rows of this lane's keys.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + r * 8;
    if (key < T_len) {
      T* dk_row = static_cast<T*>(p.dk) + b * p.dkl.batch + key * p.dkl.token + hk * p.dkl.head;
      T* dv_row = static_cast<T*>(p.dv) + b * p.dvl.batch + key * p.dvl.token + hk * p.dvl.head;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        const int col = n * 8 + c * 2;
        *reinterpret_cast<uint32_t*>(dk_row + col) = E::pack(dk[n][2 * r], dk[n][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dv_row + col) = E::pack(dv[n][2 * r], dv[n][2 * r + 1]);
      }
    }
  }
#else
  // Built without sm_90a code: the host never launches this (flash_wgmma_available).
  __trap();
#endif
}

template <typename T, int kD>
void launch(const BwdParams& p, int64_t B, int64_t Hkv, cudaStream_t stream) {
  constexpr int smem = smem_bytes<kD>();
  TS_CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_wgmma_kernel<T, kD>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(attn_index::ceil_div(p.T, kBN), static_cast<unsigned>(Hkv),
                  static_cast<unsigned>(B));
  flash_bwd_wgmma_kernel<T, kD><<<grid, kThreads, smem, stream>>>(p);
  TS_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace flash {
void launch_bwd_wgmma(const BwdParams& p, int D, DType dtype, int64_t B, int64_t Hkv,
                      cudaStream_t stream) {
  const bool bf16 = dtype == DType::bf16;
  if (D == 64) {
    bf16 ? launch<__nv_bfloat16, 64>(p, B, Hkv, stream) : launch<__half, 64>(p, B, Hkv, stream);
  } else {
    bf16 ? launch<__nv_bfloat16, 128>(p, B, Hkv, stream) : launch<__half, 128>(p, B, Hkv, stream);
  }
}
}  // namespace flash

}  // namespace tessera::cuda
