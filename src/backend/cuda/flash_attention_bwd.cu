// FlashAttention-2 backward: D = rowsum(dO * O) pre-pass, one thread block per 64-key tile and
// KV head that recomputes P from Q, K and the saved LSE for every query tile (and every query
// head of the GQA group), keeps dK/dV in registers, adds dQ with f32 atomics; a last pass
// converts dQ to 16 bits. The next step's Q, dO, LSE and D_i are fetched into a second buffer
// while the current step computes.

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_common.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace {

using attn_index::kBwdBlockM;
using attn_index::kBwdBlockN;
using flash::a_frag_addr;
using flash::b_frag_addr_kn;
using flash::b_frag_addr_nk;
using flash::ldmatrix_x4;
using flash::ldmatrix_x4_trans;

constexpr int kBwdWarps = kBwdBlockN / 16;  // each warp owns 16 keys
constexpr int kBwdThreads = kBwdWarps * 32;

using flash::BwdParams;

// dsum[b,h,t] = sum_d dO * O, one warp per (b, t, h) row.
template <typename T>
__global__ void dot_do_o_kernel(const T* out, AttnLayout ol, const T* dout, AttnLayout dol,
                                float* dsum, int64_t rows, int T_len, int Hq, int D) {
  using E = flash::Elem<T>;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int h = static_cast<int>(row % Hq);
  const int t = static_cast<int>((row / Hq) % T_len);
  const int64_t b = row / (static_cast<int64_t>(Hq) * T_len);
  const T* o = out + b * ol.batch + t * ol.token + h * ol.head;
  const T* g = dout + b * dol.batch + t * dol.token + h * dol.head;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32) acc += E::to_float(o[d]) * E::to_float(g[d]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) dsum[(b * Hq + h) * T_len + t] = acc;
}

// dq (strided 16-bit) = dq_acc (B,T,Hq,D) f32.
template <typename T>
__global__ void convert_dq_kernel(T* dq, AttnLayout l, const float* acc, int64_t n, int T_len,
                                  int Hq, int D) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int d = static_cast<int>(i % D);
  const int h = static_cast<int>((i / D) % Hq);
  const int t = static_cast<int>((i / (static_cast<int64_t>(D) * Hq)) % T_len);
  const int64_t b = i / (static_cast<int64_t>(D) * Hq * T_len);
  dq[b * l.batch + t * l.token + h * l.head + d] = flash::Elem<T>::from_float(acc[i]);
}

template <int kD>
constexpr int bwd_smem_bytes() {
  // K, V (kBN x D), 2 stages of Q and dO (kBM x D), dS (kBM x kBN), all 16-bit; 2 stages of LSE
  // and D_i (kBM floats each).
  return (2 * kBwdBlockN * kD + 4 * kBwdBlockM * kD + kBwdBlockM * kBwdBlockN) * 2 +
         4 * kBwdBlockM * 4;
}

template <typename T, int kD>
__global__ void __launch_bounds__(kBwdThreads) flash_bwd_kernel(BwdParams p) {
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  constexpr int kBM = kBwdBlockM, kBN = kBwdBlockN;
  static_assert(kBN == 16 * kBwdWarps, "one 16-key slab per warp");
  static_assert(kBM == 32 && kBwdWarps == 4, "dQ step splits 32 rows x D over 2 x 2 warps");
  using E = flash::Elem<T>;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kBN * kD;
  T* sQ2 = sV + kBN * kD;                                    // 2 stages
  T* sdO2 = sQ2 + 2 * kBM * kD;                              // 2 stages
  T* sdS = sdO2 + 2 * kBM * kD;                              // dS as [query][key]
  float* sLse2 = reinterpret_cast<float*>(sdS + kBM * kBN);  // LSE * log2(e), 2 stages
  float* sDsum2 = sLse2 + 2 * kBM;                           // 2 stages

  const int T_len = p.T;
  const int kv_tile = blockIdx.x;
  const int hk = blockIdx.y;
  const int b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int k0 = kv_tile * kBN;
  const float scale_log2 = p.scale * flash::kLog2e;

  flash::load_tile_async<kBN, kD, kBwdThreads>(
      sK, static_cast<const T*>(p.k) + b * p.kl.batch + hk * p.kl.head + k0 * p.kl.token,
      p.kl.token, T_len - k0);
  flash::load_tile_async<kBN, kD, kBwdThreads>(
      sV, static_cast<const T*>(p.v) + b * p.vl.batch + hk * p.vl.head + k0 * p.vl.token,
      p.vl.token, T_len - k0);
  flash::cp_async_commit();

  float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  }

  const attn_index::BwdSteps steps(kv_tile, T_len, kBM, kBN, p.causal, p.window, hk, p.group);
  const int n_steps = steps.count;
  // Fetches step `step`'s Q, dO (cp.async, one commit group) and LSE, D_i (plain loads) into
  // buffer `buf`.
  auto fetch = [&](int step, int buf) {
    const int hq = steps.head(step);
    const int q0 = steps.q0(step, kBM);
    const T* q_head = static_cast<const T*>(p.q) + b * p.ql.batch + hq * p.ql.head;
    const T* do_head = static_cast<const T*>(p.dout) + b * p.dol.batch + hq * p.dol.head;
    flash::load_tile_async<kBM, kD, kBwdThreads>(sQ2 + buf * kBM * kD, q_head + q0 * p.ql.token,
                                                 p.ql.token, T_len - q0);
    flash::load_tile_async<kBM, kD, kBwdThreads>(sdO2 + buf * kBM * kD, do_head + q0 * p.dol.token,
                                                 p.dol.token, T_len - q0);
    flash::cp_async_commit();
    if (threadIdx.x < kBM) {
      const int64_t row_base = (static_cast<int64_t>(b) * p.Hq + hq) * T_len;
      const int row = q0 + static_cast<int>(threadIdx.x);
      sLse2[buf * kBM + threadIdx.x] = row < T_len ? p.lse[row_base + row] * flash::kLog2e : 0.f;
      sDsum2[buf * kBM + threadIdx.x] = row < T_len ? p.dsum[row_base + row] : 0.f;
    }
  };
  if (n_steps > 0) fetch(0, 0);  // commit group 1 (K and V are group 0)

  for (int step = 0; step < n_steps; ++step) {
    const int buf = step & 1;
    const int hq = steps.head(step);
    const int q0 = steps.q0(step, kBM);
    // The other buffer was last read in step - 1, which ended with a barrier.
    if (step + 1 < n_steps) {
      fetch(step + 1, buf ^ 1);
      flash::cp_async_wait<1>();
    } else {
      flash::cp_async_wait<0>();
    }
    __syncthreads();
    {
      const T* sQ = sQ2 + buf * kBM * kD;
      const T* sdO = sdO2 + buf * kBM * kD;
      const float* sLse = sLse2 + buf * kBM;
      const float* sDsum = sDsum2 + buf * kBM;

      // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x kBM queries.
      float st[kBM / 8][4], dpt[kBM / 8][4];
#pragma unroll
      for (int n = 0; n < kBM / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ak[4], av[4];
        ldmatrix_x4(ak, a_frag_addr<kD>(sK, warp * 16, kk * 16, lane));
        ldmatrix_x4(av, a_frag_addr<kD>(sV, warp * 16, kk * 16, lane));
#pragma unroll
        for (int np = 0; np < kBM / 16; ++np) {
          uint32_t bq[4], bo[4];
          ldmatrix_x4(bq, b_frag_addr_nk<kD>(sQ, np * 16, kk * 16, lane));
          ldmatrix_x4(bo, b_frag_addr_nk<kD>(sdO, np * 16, kk * 16, lane));
          E::mma(st[2 * np], ak, bq[0], bq[1]);
          E::mma(st[2 * np + 1], ak, bq[2], bq[3]);
          E::mma(dpt[2 * np], av, bo[0], bo[1]);
          E::mma(dpt[2 * np + 1], av, bo[2], bo[3]);
        }
      }

      // P^T and dS^T in place (flash_common.cuh).
      flash::backward_p_ds(st, dpt, k0 + warp * 16 + g, q0, c, sLse, sDsum, T_len, p.causal,
                           p.window, scale_log2, p.scale);

      // dV += P^T dO and dK += dS^T Q (k = this tile's queries).
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t pa[4], sa[4];
        flash::pack_a_step<T>(st, kk, pa);
        flash::pack_a_step<T>(dpt, kk, sa);
#pragma unroll
        for (int dp = 0; dp < kD / 16; ++dp) {
          uint32_t bo[4], bq[4];
          ldmatrix_x4_trans(bo, b_frag_addr_kn<kD>(sdO, kk * 16, dp * 16, lane));
          ldmatrix_x4_trans(bq, b_frag_addr_kn<kD>(sQ, kk * 16, dp * 16, lane));
          E::mma(dv[2 * dp], pa, bo[0], bo[1]);
          E::mma(dv[2 * dp + 1], pa, bo[2], bo[3]);
          E::mma(dk[2 * dp], sa, bq[0], bq[1]);
          E::mma(dk[2 * dp + 1], sa, bq[2], bq[3]);
        }
      }

      // dS to shared memory as [query][key] (the A operand of dQ = dS K).
#pragma unroll
      for (int n = 0; n < kBM / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key_local = warp * 16 + g + (e >= 2 ? 8 : 0);
          const int q_local = n * 8 + c * 2 + (e & 1);
          sdS[attn_index::swizzle(q_local, key_local, kBN)] = E::from_float(dpt[n][e]);
        }
      }
      __syncthreads();

      // dQ (kBM x D) += dS (kBM x kBN) K (kBN x D): warp w takes rows (w % 2) * 16 and the
      // column half (w / 2) * D/2.
      {
        constexpr int kHalf = kD / 2;
        const int m0 = (warp % 2) * 16;
        const int n_base = (warp / 2) * kHalf;
        float dq[kHalf / 8][4];
#pragma unroll
        for (int n = 0; n < kHalf / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) {
          uint32_t as[4];
          ldmatrix_x4(as, a_frag_addr<kBN>(sdS, m0, kk * 16, lane));
#pragma unroll
          for (int dp = 0; dp < kHalf / 16; ++dp) {
            uint32_t bk[4];
            ldmatrix_x4_trans(bk, b_frag_addr_kn<kD>(sK, kk * 16, n_base + dp * 16, lane));
            E::mma(dq[2 * dp], as, bk[0], bk[1]);
            E::mma(dq[2 * dp + 1], as, bk[2], bk[3]);
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = q0 + m0 + g + r * 8;
          if (row < T_len) {
            float* dst = p.dq_acc + ((static_cast<int64_t>(b) * T_len + row) * p.Hq + hq) * kD;
#pragma unroll
            for (int n = 0; n < kHalf / 8; ++n) {
              const int col = n_base + n * 8 + c * 2;
              atomicAdd(dst + col, dq[n][2 * r]);
              atomicAdd(dst + col + 1, dq[n][2 * r + 1]);
            }
          }
        }
      }
    }
    __syncthreads();  // sdS and this step's buffer are rewritten next
  }

  // dK, dV rows of this warp's keys.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = k0 + warp * 16 + g + r * 8;
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
}

template <typename T, int kD>
void launch_bwd(const FlashBackwardArgs& a, const BwdParams& p, FlashKernel kernel,
                cudaStream_t stream) {
  const FlashAttentionShape& s = a.shape;
  const int64_t rows = s.B * s.T * s.Hq;
  {
    const int threads = 256;
    const int64_t blocks = (rows * 32 + threads - 1) / threads;
    dot_do_o_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<const T*>(a.out.data), a.out.layout, static_cast<const T*>(a.dout.data),
        a.dout.layout, p.dsum, rows, p.T, p.Hq, kD);
    TS_CUDA_CHECK_LAUNCH();
  }
  TS_CUDA_CHECK(cudaMemsetAsync(p.dq_acc, 0, rows * kD * sizeof(float), stream));
  if (kernel == FlashKernel::wgmma) {
    flash::launch_bwd_wgmma(p, kD, s.dtype, s.B, s.Hkv, stream);
  } else {
    constexpr int smem = bwd_smem_bytes<kD>();
    TS_CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_kernel<T, kD>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(attn_index::ceil_div(p.T, kBwdBlockN), static_cast<unsigned>(s.Hkv),
                    static_cast<unsigned>(s.B));
    flash_bwd_kernel<T, kD><<<grid, kBwdThreads, smem, stream>>>(p);
    TS_CUDA_CHECK_LAUNCH();
  }
  {
    const int64_t n = rows * kD;
    const int threads = 256;
    convert_dq_kernel<T>
        <<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
            static_cast<T*>(a.dq.data), a.dq.layout, p.dq_acc, n, p.T, p.Hq, kD);
    TS_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

size_t flash_attention_backward_workspace_bytes(const FlashAttentionShape& s) {
  // dQ accumulator (B,T,Hq,D) then D_i (B,Hq,T), both f32.
  return static_cast<size_t>(s.B * s.T * s.Hq * (s.D + 1)) * sizeof(float);
}

void flash_attention_backward(const FlashBackwardArgs& a, cudaStream_t stream) {
  const char* op = "flash_attention_backward";
  const FlashAttentionShape& s = a.shape;
  flash::check_shape(op, s);
  flash::check_tensor(op, "q", a.q.data, a.q.layout);
  flash::check_tensor(op, "k", a.k.data, a.k.layout);
  flash::check_tensor(op, "v", a.v.data, a.v.layout);
  flash::check_tensor(op, "out", a.out.data, a.out.layout);
  flash::check_tensor(op, "dout", a.dout.data, a.dout.layout);
  flash::check_tensor(op, "dq", a.dq.data, a.dq.layout);
  flash::check_tensor(op, "dk", a.dk.data, a.dk.layout);
  flash::check_tensor(op, "dv", a.dv.data, a.dv.layout);
  TS_CHECK(a.lse != nullptr, "[", op, "] lse is null");
  TS_CHECK(a.workspace != nullptr && reinterpret_cast<uintptr_t>(a.workspace) % 16 == 0, "[", op,
           "] workspace must be a 16-byte aligned buffer of ",
           flash_attention_backward_workspace_bytes(s), " bytes");
  float* dq_acc = static_cast<float*>(a.workspace);
  float* dsum = dq_acc + s.B * s.T * s.Hq * s.D;
  BwdParams p{a.q.data,
              a.k.data,
              a.v.data,
              a.dout.data,
              a.lse,
              dsum,
              dq_acc,
              a.dk.data,
              a.dv.data,
              a.q.layout,
              a.k.layout,
              a.v.layout,
              a.dout.layout,
              a.dk.layout,
              a.dv.layout,
              static_cast<int>(s.T),
              static_cast<int>(s.Hq),
              static_cast<int>(s.Hq / s.Hkv),
              s.scale,
              s.causal,
              static_cast<int>(std::min(s.window, s.T))};  // a window past T hides nothing
  // Chosen before anything is queued, so a refused choice leaves the stream untouched.
  const FlashKernel kernel = resolve_flash_kernel(a.kernel, FlashPass::backward);
  const bool bf16 = s.dtype == DType::bf16;
  if (s.D == 64) {
    bf16 ? launch_bwd<__nv_bfloat16, 64>(a, p, kernel, stream)
         : launch_bwd<__half, 64>(a, p, kernel, stream);
  } else {
    bf16 ? launch_bwd<__nv_bfloat16, 128>(a, p, kernel, stream)
         : launch_bwd<__half, 128>(a, p, kernel, stream);
  }
}

}  // namespace tessera::cuda
