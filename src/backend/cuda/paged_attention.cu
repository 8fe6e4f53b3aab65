// Decode attention over the paged KV cache: one block per (query row, group of query heads
// sharing a KV head, key split), online softmax per lane group, flash-decoding partials merged
// by a combine kernel when the keys are split; whichever writes the output can also quantize it
// for the next product.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/matvec_common.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

struct DecodeParams {
  float* out;
  const float* q;
  int H, Hkv, group, chunks_per_kv;  // chunks_per_kv = group / kG
  const void* kv;
  int64_t block_tokens, block_stride, v_offset;
  const int32_t* block_tables;
  int64_t table_stride;
  const int32_t* n_keys;
  const int32_t* first_key;  // null: every row from key 0
  float scale_log2;
  int splits, keys_per_split;
  float* part_o;    // (rows, H, splits, D) normalised partial outputs
  float* part_lse;  // (rows, H, splits) log2-domain log-sum-exp of each split
  // Non-null: out quantized in blocks of 32 as well (QuantizedActs layout, K = H * D).
  int8_t* xq;
  float* xd;
  int32_t* xs;
  const int32_t* row_map;  // non-null: block x takes query row row_map[x]
};

// Quantizes the 32 outputs starting at flat element e0 of out (rows, H * D); lane holds v.
__device__ __forceinline__ void quantize_out_block(const DecodeParams& p, int64_t e0, float v,
                                                   int lane) {
  const float vals[1] = {v};
  quantize_act_block<32>(vals, lane, p.xq + e0, p.xd + e0 / 32, p.xs + e0 / 32);
}

// kVec consecutive cache elements (16 bytes) to f32.
template <typename T, int kVec>
__device__ inline void load_vec(const T* p, float (&f)[kVec]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  if constexpr (std::is_same_v<T, float>) {
    static_assert(kVec == 4);
    f[0] = __uint_as_float(raw.x);
    f[1] = __uint_as_float(raw.y);
    f[2] = __uint_as_float(raw.z);
    f[3] = __uint_as_float(raw.w);
  } else {
    static_assert(kVec == 8);
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        f[i] = __bfloat162float(h[i]);
      } else {
        f[i] = __half2float(h[i]);
      }
    }
  }
}

// Each group of kLanes lanes reads one key (16 bytes per lane) and keeps its own running
// (max, sum, acc) per head; the block then merges its kSubs streams through shared memory.
template <typename T, int kD, int kG>
__global__ void __launch_bounds__(kDecodeThreads) paged_decode_kernel(DecodeParams p) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kLanes = kD / kVec;
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a key's lanes stay inside one warp");
  constexpr int kKeysPerWarp = 32 / kLanes;
  constexpr int kSubs = kDecodeWarps * kKeysPerWarp;

  __shared__ float s_m[kSubs][kG], s_l[kSubs][kG];
  __shared__ float s_acc[kSubs][kG][kD];
  allow_dependent_launch();
  grid_dependency_wait();  // q and the cache come from the kernels before (dependent_launch.cuh)

  const int row = p.row_map ? p.row_map[blockIdx.x] : static_cast<int>(blockIdx.x);
  const int hk = blockIdx.y / p.chunks_per_kv;
  const int h0 = hk * p.group + static_cast<int>(blockIdx.y % p.chunks_per_kv) * kG;
  const int split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub_in_warp = lane / kLanes;
  const int sub = warp * kKeysPerWarp + sub_in_warp;
  const int d0 = (lane % kLanes) * kVec;

  // Splits cover the row's own keys: from its first (a sliding window's start) to n_keys.
  const int nk = p.n_keys[row];
  const int start = (p.first_key ? p.first_key[row] : 0) + split * p.keys_per_split;
  const int end = min(nk, start + p.keys_per_split);

  float q[kG][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      q[g][i] = p.q[(static_cast<int64_t>(row) * p.H + h0 + g) * kD + d0 + i] * p.scale_log2;
  }
  float m[kG], l[kG], acc[kG][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[g][i] = 0.f;
  }

  const T* kv = static_cast<const T*>(p.kv);
  const int32_t* table = p.block_tables + row * p.table_stride;
  // The loop bound is uniform across the warp (shuffles need every lane); a lane group whose
  // key is past the end computes on key `start` and discards the result.
#pragma unroll 2
  for (int base = start + warp * kKeysPerWarp; base < end; base += kSubs) {
    const int j = base + sub_in_warp;
    const bool valid = j < end;
    const int jj = valid ? j : start;
    const int64_t blk = table[jj / p.block_tokens];
    const T* kp = kv + blk * p.block_stride + (hk * p.block_tokens + jj % p.block_tokens) * kD + d0;
    float kf[kVec], vf[kVec];
    load_vec<T, kVec>(kp, kf);
    load_vec<T, kVec>(kp + p.v_offset, vf);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) s = fmaf(q[g][i], kf[i], s);
#pragma unroll
      for (int off = kLanes / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (valid) {
        const float m_new = fmaxf(m[g], s);
        const float corr = exp2f(m[g] - m_new);
        const float pe = exp2f(s - m_new);
        l[g] = l[g] * corr + pe;
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[g][i] = fmaf(acc[g][i], corr, pe * vf[i]);
        m[g] = m_new;
      }
    }
  }

#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (lane % kLanes == 0) {
      s_m[sub][g] = m[g];
      s_l[sub][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) s_acc[sub][g][d0 + i] = acc[g][i];
  }
  __syncthreads();

  // Each thread's outputs, kept for the quantizer (which needs a block of 32 in one warp).
  constexpr int kPer = (kG * kD + kDecodeThreads - 1) / kDecodeThreads;
  float kept[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    kept[i] = 0.f;
    const int idx = threadIdx.x + i * kDecodeThreads;
    if (idx >= kG * kD) continue;  // (not break: kept stays in registers only if fully unrolled)
    const int g = idx / kD, d = idx % kD;
    float mx = -INFINITY;
    for (int s = 0; s < kSubs; ++s) mx = fmaxf(mx, s_m[s][g]);
    float sum = 0.f, a = 0.f;
    if (mx != -INFINITY) {  // an empty split (start >= n_keys) leaves every stream empty
      for (int s = 0; s < kSubs; ++s) {
        const float w = exp2f(s_m[s][g] - mx);
        sum += s_l[s][g] * w;
        a += s_acc[s][g][d] * w;
      }
    }
    const float o = sum > 0.f ? a / sum : 0.f;
    kept[i] = o;
    const int64_t rh = static_cast<int64_t>(row) * p.H + h0 + g;
    if (p.splits == 1) {
      p.out[rh * kD + d] = o;
    } else {
      p.part_o[(rh * p.splits + split) * kD + d] = o;
      if (d == 0) p.part_lse[rh * p.splits + split] = sum > 0.f ? mx + log2f(sum) : -INFINITY;
    }
  }
  if (p.splits == 1 && p.xq != nullptr) {  // uniform over the grid
    // The group's kG heads are contiguous in out: stage their outputs in s_acc (everyone has
    // finished reading it), then one warp per block of 32.
    float* s_o = &s_acc[0][0][0];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = threadIdx.x + i * kDecodeThreads;
      if (idx < kG * kD) s_o[idx] = kept[i];
    }
    __syncthreads();
    const int64_t e_group = (static_cast<int64_t>(row) * p.H + h0) * kD;
    for (int blk = warp; blk < kG * kD / 32; blk += kDecodeWarps)
      quantize_out_block(p, e_group + 32 * blk, s_o[32 * blk + lane], lane);
  }
}

// out[row, h] = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse); one block per (row, h).
// With p.xq set, each warp whose 32 dims are all inside D also quantizes them (D % 32 == 0).
__global__ void paged_decode_combine_kernel(DecodeParams p, int D) {
  allow_dependent_launch();
  grid_dependency_wait();
  const int64_t rh =
      p.row_map ? static_cast<int64_t>(p.row_map[blockIdx.x / p.H]) * p.H + blockIdx.x % p.H
                : static_cast<int64_t>(blockIdx.x);
  const int splits = p.splits;
  const float* lse = p.part_lse + rh * splits;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, lse[s]);
  const int lane = threadIdx.x % 32, warp_d = threadIdx.x / 32 * 32;
  for (int d0 = 0; d0 < D; d0 += blockDim.x) {
    const int d = d0 + threadIdx.x;
    float o = 0.f;
    if (d < D) {
      float sum = 0.f, a = 0.f;
      for (int s = 0; s < splits; ++s) {
        if (lse[s] == -INFINITY) continue;
        const float w = exp2f(lse[s] - mx);
        sum += w;
        a += w * p.part_o[(rh * splits + s) * D + d];
      }
      o = sum > 0.f ? a / sum : 0.f;
      p.out[rh * D + d] = o;
    }
    if (p.xq != nullptr && d0 + warp_d < D) quantize_out_block(p, rh * D + d0 + warp_d, o, lane);
  }
}

template <typename T, int kD, int kG>
void launch_decode(const DecodeParams& p, int64_t rows, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(p.Hkv * p.chunks_per_kv),
                  static_cast<unsigned>(p.splits));
  launch_dependent(paged_decode_kernel<T, kD, kG>, grid, dim3(kDecodeThreads), 0, stream, p);
}

template <typename T, int kD>
void launch_decode_g(const DecodeParams& p, int kg, int64_t rows, cudaStream_t stream) {
  switch (kg) {
    case 8:
      return launch_decode<T, kD, 8>(p, rows, stream);
    case 4:
      return launch_decode<T, kD, 4>(p, rows, stream);
    case 2:
      return launch_decode<T, kD, 2>(p, rows, stream);
    default:
      return launch_decode<T, kD, 1>(p, rows, stream);
  }
}

template <typename T>
void launch_decode_d(const DecodeParams& p, int kg, int64_t D, int64_t rows, cudaStream_t stream) {
  if (D == 64) {
    launch_decode_g<T, 64>(p, kg, rows, stream);
  } else {
    launch_decode_g<T, 128>(p, kg, rows, stream);
  }
}

}  // namespace

int64_t paged_decode_workspace_floats(int64_t rows, int64_t H, int64_t D, int64_t max_splits) {
  return rows * H * max_splits * (D + 1);
}

void paged_decode_attention(const PagedDecodeArgs& a, cudaStream_t stream) {
  const char* op = "paged_decode_attention";
  TS_CHECK(a.out && a.q && a.kv && a.block_tables && a.n_keys, "[", op,
           "] out, q, kv, block_tables and n_keys must be device pointers");
  TS_CHECK(a.rows >= 1 && a.rows <= (int64_t{1} << 31) - 1, "[", op, "] rows=", a.rows,
           " out of range");
  TS_CHECK(a.Hkv >= 1 && a.H >= a.Hkv && a.H % a.Hkv == 0, "[", op, "] heads H=", a.H,
           " must be a positive multiple of Hkv=", a.Hkv);
  TS_CHECK(a.D == 64 || a.D == 128, "[", op, "] head dim D=", a.D, " must be 64 or 128");
  TS_CHECK(a.kv_dtype == DType::f32 || a.kv_dtype == DType::f16 || a.kv_dtype == DType::bf16, "[",
           op, "] kv_dtype ", dtype_name(a.kv_dtype), " must be f32, f16 or bf16");
  TS_CHECK(a.block_tokens >= 1 && a.table_stride >= 1, "[", op, "] block_tokens=", a.block_tokens,
           " and table_stride=", a.table_stride, " must be positive");
  TS_CHECK(a.max_keys >= 1 && a.max_keys <= a.table_stride * a.block_tokens, "[", op,
           "] max_keys=", a.max_keys, " must be in [1, table_stride * block_tokens]");
  const int64_t esize = a.kv_dtype == DType::f32 ? 4 : 2;
  TS_CHECK(reinterpret_cast<uintptr_t>(a.kv) % 16 == 0 && (a.block_stride * esize) % 16 == 0 &&
               (a.v_offset * esize) % 16 == 0,
           "[", op, "] kv, block_stride=", a.block_stride, " and v_offset=", a.v_offset,
           " must be 16-byte aligned");
  TS_CHECK(a.v_offset >= a.Hkv * a.block_tokens * a.D && a.block_stride >= 1, "[", op,
           "] v_offset=", a.v_offset, " overlaps the keys of a block");
  TS_CHECK(std::isfinite(a.scale), "[", op, "] scale must be finite");
  TS_CHECK(a.max_span >= 0 && a.max_span <= a.max_keys && (a.max_span == 0 || a.first_key), "[", op,
           "] max_span=", a.max_span, " must be in [0, max_keys=", a.max_keys,
           "], and set only with first_key");
  if (const QuantizedActs* qo = a.quantize_out) {
    TS_CHECK(qo->block == 32, "[", op, "] quantize_out takes activation blocks of 32, not ",
             qo->block);
    TS_CHECK(qo->M == a.rows && qo->K == a.H * a.D && qo->q && qo->d && qo->s, "[", op,
             "] quantize_out is for (", qo->M, ", ", qo->K, ") activations, the output is (",
             a.rows, ", ", a.H * a.D, ")");
  }
  TS_CHECK(a.n_prefill_tiles >= 0 && a.n_prefill_tiles <= a.rows &&
               (a.n_prefill_tiles == 0 || a.prefill_tiles != nullptr),
           "[", op, "] n_prefill_tiles=", a.n_prefill_tiles, " must be in [0, rows=", a.rows,
           "] with prefill_tiles set");
  TS_CHECK(a.decode_rows == nullptr || (a.n_decode_rows >= 0 && a.n_decode_rows <= a.rows), "[", op,
           "] n_decode_rows=", a.n_decode_rows, " must be in [0, rows=", a.rows, "]");
  TS_CHECK(a.n_prefill_tiles == 0 || a.decode_rows != nullptr, "[", op,
           "] prefill tiles need the decode_rows list of the other rows");
  if (a.n_prefill_tiles > 0) {
    TS_CHECK(a.kv_dtype == DType::f16 || a.kv_dtype == DType::bf16, "[", op,
             "] prefill tiles need a 16-bit cache, not ", dtype_name(a.kv_dtype));
    TS_CHECK(a.quantize_out == nullptr, "[", op, "] prefill tiles cannot quantize_out");
    TS_CHECK(a.H <= 65535 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0, "[", op,
             "] prefill tiles need H <= 65535 and a 16-byte aligned q");
  }

  const int kg = attn_index::decode_heads_per_block(a.H / a.Hkv);
  DecodeParams p{};
  p.out = a.out;
  p.q = a.q;
  p.H = static_cast<int>(a.H);
  p.Hkv = static_cast<int>(a.Hkv);
  p.group = static_cast<int>(a.H / a.Hkv);
  p.chunks_per_kv = p.group / kg;
  p.kv = a.kv;
  p.block_tokens = a.block_tokens;
  p.block_stride = a.block_stride;
  p.v_offset = a.v_offset;
  p.block_tables = a.block_tables;
  p.table_stride = a.table_stride;
  p.n_keys = a.n_keys;
  p.first_key = a.first_key;
  p.scale_log2 = a.scale * kLog2e;

  if (a.n_prefill_tiles > 0) detail::paged_prefill_attention(a, stream);
  const int64_t decode_rows = a.decode_rows ? a.n_decode_rows : a.rows;
  if (decode_rows == 0) return;
  p.row_map = a.decode_rows;

  // The workspace is indexed by the original row (row_map's values), so it covers every row.
  const int64_t max_splits =
      a.workspace ? a.workspace_floats / (a.rows * a.H * (a.D + 1)) : int64_t{1};
  int device = 0, sms = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const attn_index::SplitPlan plan = attn_index::plan_paged_splits(
      decode_rows * a.Hkv * p.chunks_per_kv, a.max_span > 0 ? a.max_span : a.max_keys, sms,
      std::min<int64_t>(max_splits, 65535));
  p.splits = static_cast<int>(plan.splits);
  p.keys_per_split = static_cast<int>(plan.keys_per_split);
  p.part_o = a.workspace;
  p.part_lse = a.workspace ? a.workspace + a.rows * a.H * p.splits * a.D : nullptr;
  p.xq = a.quantize_out ? a.quantize_out->q : nullptr;
  p.xd = a.quantize_out ? a.quantize_out->d : nullptr;
  p.xs = a.quantize_out ? a.quantize_out->s : nullptr;

  switch (a.kv_dtype) {
    case DType::f32:
      launch_decode_d<float>(p, kg, a.D, decode_rows, stream);
      break;
    case DType::f16:
      launch_decode_d<__half>(p, kg, a.D, decode_rows, stream);
      break;
    default:
      launch_decode_d<__nv_bfloat16>(p, kg, a.D, decode_rows, stream);
      break;
  }
  if (p.splits > 1) {
    launch_dependent(paged_decode_combine_kernel, dim3(static_cast<unsigned>(decode_rows * a.H)),
                     dim3(128), 0, stream, p, static_cast<int>(a.D));
  }
}

}  // namespace tessera::cuda
