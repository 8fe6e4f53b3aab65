// What the FlashAttention kernels (mma.sync and wgmma, forward and backward) share: cp.async
// tile loaders into both swizzled layouts, ldmatrix and mma.sync m16n8k16 wrappers, bf16/f16
// packing, the forward's mask / online-softmax / store steps, the backward's P and dS step, and
// the kernels' parameter structs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/wgmma.cuh"

namespace tessera::cuda::flash {

// Fragment layouts of mma.sync.m16n8k16 (PTX ISA), with g = lane / 4 and c = lane % 4:
//   A (16x16, row-major) regs a0..a3: (row g, cols 2c..2c+1), (row g+8, same cols),
//                                     (row g, cols 2c+8..), (row g+8, cols 2c+8..);
//   B (16x8, k x n) regs b0, b1: (k 2c..2c+1, col g), (k 2c+8.., col g);
//   C (16x8, f32) c0..c3: (row g, cols 2c, 2c+1), (row g+8, cols 2c, 2c+1).
// An S accumulator pair (n-tiles 2j, 2j+1) is therefore exactly the A fragment of the next
// product's k-step j, which is how P never leaves registers.

template <typename T>
struct Elem;

template <>
struct Elem<__nv_bfloat16> {
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

template <>
struct Elem<__half> {
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static float to_float(__half x) { return __half2float(x); }
  __device__ static __half from_float(float x) { return __float2half_rn(x); }
};

// Accumulator n-tiles 2j and 2j + 1 rounded to 16 bits: the A fragment of k-step j of the next
// product (the layout note above; the same for wgmma's register A operand).
template <typename T, int kN>
__device__ inline void pack_a_step(const float (&acc)[kN][4], int j, uint32_t (&a)[4]) {
  a[0] = Elem<T>::pack(acc[2 * j][0], acc[2 * j][1]);
  a[1] = Elem<T>::pack(acc[2 * j][2], acc[2 * j][3]);
  a[2] = Elem<T>::pack(acc[2 * j + 1][0], acc[2 * j + 1][1]);
  a[3] = Elem<T>::pack(acc[2 * j + 1][2], acc[2 * j + 1][3]);
}

__device__ inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives it.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// 16-byte global->shared copy; when !valid nothing is read and the chunk is zero-filled, so tail
// rows hold zeros (a garbage V row times P = 0 could still be NaN).
__device__ inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The thread-strided chunk loop both tile loaders share: 16-byte chunk c (kCols / 8 per row) of
// row r goes to shared address smem + dst_bytes(r, c); rows >= valid_rows become zeros (gmem
// itself must be readable: it stands in as the address of the zero-filled chunks).
template <int kRows, int kCols, int kThreads, typename T, typename DstBytes>
__device__ inline void copy_tile_async(uint32_t smem, const T* gmem, int64_t row_stride,
                                       int valid_rows, DstBytes dst_bytes) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = i / kChunksPerRow;
    const int c = i % kChunksPerRow;
    const bool valid = r < valid_rows;
    const T* src = valid ? gmem + r * row_stride + c * 8 : gmem;
    cp_async_16(smem + dst_bytes(r, c), src, valid);
  }
}

// Copies rows [0, kRows) x cols [0, kCols) of a global tile (row r at gmem + r * row_stride)
// into a swizzled shared tile; rows >= valid_rows become zeros. gmem itself must be readable
// (valid_rows >= 1), it stands in as the address of the zero-filled chunks.
template <int kRows, int kCols, int kThreads, typename T>
__device__ inline void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int valid_rows) {
  static_assert(kCols % 64 == 0, "swizzle needs rows of a multiple of 128 bytes");
  copy_tile_async<kRows, kCols, kThreads>(
      smem_u32(smem), gmem, row_stride, valid_rows, [](int r, int c) {
        return static_cast<uint32_t>(attn_index::swizzle(r, c * 8, kCols) * sizeof(T));
      });
}

// Copies rows [0, kRows) of a (rows x kD) global tile into the swizzled layout of wgmma.cuh
// (kD / 64 column blocks of kRows x 128 bytes); rows >= valid_rows become zeros. smem is a
// shared-space address, 1024-byte aligned.
template <int kRows, int kD, int kThreads, typename T>
__device__ inline void load_tile_sw128(uint32_t smem, const T* gmem, int64_t row_stride,
                                       int valid_rows) {
  copy_tile_async<kRows, kD, kThreads>(smem, gmem, row_stride, valid_rows, [](int r, int c) {
    return static_cast<uint32_t>((c / 8) * (kRows * 128)) + wgmma::sw128_offset(r, c % 8);
  });
}

// Address of the row a lane supplies for an A-operand ldmatrix_x4 of the 16x16 block at
// (row0, col0) of a row-major tile: lanes 0-15 rows 0-15 at col0, lanes 16-31 at col0 + 8.
template <int kCols, typename T>
__device__ inline uint32_t a_frag_addr(const T* tile, int row0, int col0, int lane) {
  return smem_u32(tile + attn_index::swizzle(row0 + (lane & 15), col0 + (lane >> 4) * 8, kCols));
}
// B operand (k x n) read from a tile stored as [n][k] (e.g. K rows for Q K^T): registers
// {b0, b1} of n-tile n0 and {b0, b1} of n-tile n0 + 8, for k-step k0.
template <int kCols, typename T>
__device__ inline uint32_t b_frag_addr_nk(const T* tile, int n0, int k0, int lane) {
  return smem_u32(tile + attn_index::swizzle(n0 + (lane & 7) + ((lane >> 4) << 3),
                                             k0 + ((lane >> 3) & 1) * 8, kCols));
}
// B operand (k x n) read with .trans from a tile stored as [k][n] (e.g. V rows for P V):
// registers {b0, b1} of n-tile n0 and {b0, b1} of n-tile n0 + 8, for k-step k0.
template <int kCols, typename T>
__device__ inline uint32_t b_frag_addr_kn(const T* tile, int k0, int n0, int lane) {
  return smem_u32(tile + attn_index::swizzle(k0 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                             n0 + (lane >> 4) * 8, kCols));
}

// ---- The mma.sync forward's two products over one K/V tile, for a warp's 16 query rows ----
// (the training forward and the paged prefill share them; tiles are swizzled [key][dim]).

// S (16 x kBN) = Q K^T from the warp's Q fragments (qf[kk]: dims 16kk..16kk+15).
template <typename T, int kD, int kBN>
__device__ inline void mma_scores(float (&s)[kBN / 8][4], const uint32_t (&qf)[kD / 16][4],
                                  const T* sK, int lane) {
#pragma unroll
  for (int n = 0; n < kBN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kBN / 16; ++np) {
      uint32_t bk[4];
      ldmatrix_x4(bk, b_frag_addr_nk<kD>(sK, np * 16, kk * 16, lane));
      Elem<T>::mma(s[2 * np], qf[kk], bk[0], bk[1]);
      Elem<T>::mma(s[2 * np + 1], qf[kk], bk[2], bk[3]);
    }
  }
}

// O (16 x kD) += P V, P rounded to 16 bits straight from the score accumulators.
template <typename T, int kD, int kBN>
__device__ inline void mma_pv(float (&o)[kD / 8][4], const float (&p)[kBN / 8][4], const T* sV,
                              int lane) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    uint32_t pa[4];
    pack_a_step<T>(p, kk, pa);
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t bv[4];
      ldmatrix_x4_trans(bv, b_frag_addr_kn<kD>(sV, kk * 16, dp * 16, lane));
      Elem<T>::mma(o[2 * dp], pa, bv[0], bv[1]);
      Elem<T>::mma(o[2 * dp + 1], pa, bv[2], bv[3]);
    }
  }
}

// Max and sum over the 4 lanes of a quad (the lanes that share an accumulator row).
__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

inline constexpr float kLog2e = 1.4426950408889634f;

// Forward kernel arguments (both the mma.sync and the sm_90a wgmma kernel).
struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  AttnLayout ql, kl, vl, ol;
  int T, Hq, group;
  float scale;
  bool causal;
  int window;  // 0: none (FlashAttentionShape::window)
};
// ---- Forward steps shared by the mma.sync and wgmma kernels (the same accumulator layout) ----
// A lane holds scores s[n][e] of rows row0 (e < 2) and row0 + 8 (e >= 2), keys col0 + 8n + (e & 1),
// with col0 = the tile's first key + 2 * (lane % 4).

// Masks keys past T, (causal) keys after the query and keys before its window with -inf.
template <int kN>
__device__ inline void mask_scores(float (&s)[kN][4], int row0, int col0, int T, bool causal,
                                   int window) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + (e >= 2 ? 8 : 0);
      const int col = col0 + n * 8 + (e & 1);
      if (col >= T || !attn_index::key_visible(row, col, causal, window)) s[n][e] = -INFINITY;
    }
  }
}

// The scores half of an online-softmax step for the lane's two rows: the running max (raw
// scores) moves to this tile's, s becomes P = exp(scale * (s - max)) in place, the lane's running
// sums are rescaled and grow by P's; corr receives the factor O's rows must be rescaled by.
template <int kN>
__device__ inline void softmax_update_scores(float (&s)[kN][4], float (&row_max)[2],
                                             float (&row_sum)[2], float scale_log2,
                                             float (&corr_out)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = row_max[r];
#pragma unroll
    for (int n = 0; n < kN; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mx = quad_max(mx);
    // A row with every score masked so far keeps p = 0 without forming inf - inf.
    const float base = (mx == -INFINITY ? 0.f : mx) * scale_log2;
    const float corr = exp2f(row_max[r] * scale_log2 - base);
    row_max[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        const float pe = exp2f(fmaf(s[n][e], scale_log2, -base));
        s[n][e] = pe;
        sum += pe;
      }
    }
    row_sum[r] = row_sum[r] * corr + sum;
    corr_out[r] = corr;
  }
}

// Rescales the lane's two rows of O by the factors of softmax_update_scores.
template <int kDn>
__device__ inline void rescale_rows(float (&o)[kDn][4], const float (&corr)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int n = 0; n < kDn; ++n) {
      o[n][2 * r] *= corr[r];
      o[n][2 * r + 1] *= corr[r];
    }
  }
}

// A whole online-softmax step: scores, sums and O together.
template <int kN, int kDn>
__device__ inline void online_softmax_step(float (&s)[kN][4], float (&o)[kDn][4],
                                           float (&row_max)[2], float (&row_sum)[2],
                                           float scale_log2) {
  float corr[2];
  softmax_update_scores(s, row_max, row_sum, scale_log2, corr);
  rescale_rows(o, corr);
}

// Writes the lane's two rows of O / l (16 bits) and, from lane 0 of each quad, their LSE.
template <typename T, int kDn>
__device__ inline void store_forward_rows(const FwdParams& p, const float (&o)[kDn][4],
                                          const float (&row_max)[2], const float (&row_sum)[2],
                                          int row0, int b, int hq, int lane) {
  using E = Elem<T>;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(row_sum[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = row0 + r * 8;
    if (row < p.T) {
      T* out_row = static_cast<T*>(p.out) + b * p.ol.batch + row * p.ol.token + hq * p.ol.head;
#pragma unroll
      for (int n = 0; n < kDn; ++n) {
        const int col = n * 8 + (lane % 4) * 2;
        *reinterpret_cast<uint32_t*>(out_row + col) =
            E::pack(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      }
      if (lane % 4 == 0) {
        p.lse[(static_cast<int64_t>(b) * p.Hq + hq) * p.T + row] =
            l > 0.f ? row_max[r] * p.scale + logf(l) : -INFINITY;
      }
    }
  }
}

// The wgmma forward (flash_attention_fwd_sm90.cu); B is the batch (the grid's z).
void launch_fwd_wgmma(const FwdParams& p, int D, DType dtype, int64_t B, cudaStream_t stream);

// ---- Backward steps shared by the mma.sync and wgmma kernels ----

// P^T = exp(S^T * scale - LSE), dS^T = P^T (dP^T - D_i) * scale, in place, for a lane holding
// keys key0 (e < 2) and key0 + 8 (e >= 2) by queries q0 + 8n + 2c + (e & 1) (c = lane % 4);
// lse (already times log2(e)) and dsum indexed by query within the step. The scale is folded
// into dS so dQ and dK need none; masked or out-of-range entries get P = dS = 0.
template <int kN>
__device__ inline void backward_p_ds(float (&st)[kN][4], float (&dpt)[kN][4], int key0, int q0,
                                     int c, const float* lse, const float* dsum, int T, bool causal,
                                     int window, float scale_log2, float scale) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + (e >= 2 ? 8 : 0);
      const int q_local = n * 8 + c * 2 + (e & 1);
      const int row = q0 + q_local;
      const bool valid = key < T && row < T && attn_index::key_visible(row, key, causal, window);
      const float pe = valid ? exp2f(fmaf(st[n][e], scale_log2, -lse[q_local])) : 0.f;
      st[n][e] = pe;
      dpt[n][e] = pe * (dpt[n][e] - dsum[q_local]) * scale;
    }
  }
}

// Backward main-pass arguments (both kernels); dsum and dq_acc live in the caller's workspace.
struct BwdParams {
  const void *q, *k, *v, *dout;
  const float* lse;
  float* dsum;    // (B,Hq,T)
  float* dq_acc;  // (B,T,Hq,D) f32, zeroed
  void *dk, *dv;
  AttnLayout ql, kl, vl, dol, dkl, dvl;
  int T, Hq, group;
  float scale;
  bool causal;
  int window;  // 0: none (FlashAttentionShape::window)
};
// The wgmma backward main pass (flash_attention_bwd_sm90.cu), after the D_i pre-pass and the
// zeroing of dq_acc, before the dQ conversion.
void launch_bwd_wgmma(const BwdParams& p, int D, DType dtype, int64_t B, int64_t Hkv,
                      cudaStream_t stream);

// Host-side argument checks shared by forward and backward (defined in flash_attention_fwd.cu);
// each throws naming the op and the offending parameter.
void check_shape(const char* op, const FlashAttentionShape& s);
void check_tensor(const char* op, const char* name, const void* data, const AttnLayout& l);

}  // namespace tessera::cuda::flash
