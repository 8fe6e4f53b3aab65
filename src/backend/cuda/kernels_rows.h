// Kernels that move, convert and route rows between the big ones: the paged cache append (alone
// or with RoPE), weights and activations widened to f16 for the prefill GEMMs, row gather and
// weighted scatter-add, mixture-of-experts routing, per-head RMSNorm of q and k.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "core/dtype.h"

namespace tessera::cuda {

// Writes row r of k and v (rows, Hkv * D) f32 into cache slot slot[r] (device array): block
// b = slot / block_tokens, token t = slot % block_tokens; head g's key goes to element
// b * block_stride + (g * block_tokens + t) * D + d of `layer_kv` (type kv_type: f32 or f16,
// rounded to nearest even), its value v_offset elements further. Slots are not checked on the
// device: the caller hands out slots inside the cache.
void kv_cache_append(void* layer_kv, DType kv_type, const float* k, const float* v,
                     const int32_t* slot, int64_t rows, int64_t Hkv, int64_t D,
                     int64_t block_tokens, int64_t block_stride, int64_t v_offset,
                     cudaStream_t stream);

// The decode step's RoPE and cache append in one launch (ops::rope_kv_append): q (rows, H, D,
// rows ldq floats apart) rotated at positions[r] (device array) into q_out (rows, H, D; may be q
// itself when ldq = H * D), k (rows, Hkv, D, ldk apart) rotated the same way, exactly as
// rope_forward rotates (same bits), and written with v (ldv apart) to the cache exactly as
// kv_cache_append writes them. A stride of 0 means a packed row. D must be even; the rotary dims
// come from the table (R <= D; R = 0 rotates nothing and needs no table or positions).
struct RopeAppendArgs {
  const float* q = nullptr;
  float* q_out = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0;
  int64_t rows = 0, H = 0, Hkv = 0, D = 0;
  RopeTableView table;
  RopeLayout layout = RopeLayout::half;
  const int32_t* positions = nullptr;
  void* layer_kv = nullptr;  // as kv_cache_append's
  DType kv_type = DType::f16;
  const int32_t* slot = nullptr;
  int64_t block_tokens = 0, block_stride = 0, v_offset = 0;
};
void rope_kv_append(const RopeAppendArgs& a, cudaStream_t stream);

// dst (N, K) f16 = the weight matrix w (N, K) in its stored type (f16 copies, bf16, q8_0, q4_0,
// q4_1, q5_0, q5_1, q4_k, q5_k, q6_k decode), each element computed in f32 exactly as
// core/dtype.h's to_f32 (no fused multiply-adds) and rounded to nearest even f16 (overflow gives
// inf; GGUF weights are far inside the f16 range). Lets prefill run its products as f16 tensor-core
// GEMMs.
void dequantize_to_f16(uint16_t* dst, const void* w, DType type, int64_t N, int64_t K,
                       cudaStream_t stream);

// dst (n) f16 = src (n) f32 rounded to nearest even.
void convert_f32_to_f16(uint16_t* dst, const float* src, int64_t n, cudaStream_t stream);
// dst (n) f32 = src (n) f16, exactly.
void convert_f16_to_f32(float* dst, const uint16_t* src, int64_t n, cudaStream_t stream);

// dst (n, C) = src rows index[0 .. n) (device array of row numbers into src (*, C)), f32.
void gather_rows(float* dst, const float* src, const int32_t* index, int64_t n, int64_t C,
                 cudaStream_t stream);
// Per-head RMSNorm in place (ops::head_rmsnorm: Qwen3's and Gemma 3's q/k norms, OLMoE's with
// one head of the whole width); device arrays.
void head_rmsnorm(float* x, int64_t ld, int64_t n, int64_t heads, int64_t D, const float* w,
                  float eps, cudaStream_t stream);
// Its backward (ops::head_rmsnorm_backward: dx may be dy); device arrays. workspace holds
// head_rmsnorm_backward_workspace(n, heads, D) floats. dw's sums run in a fixed order (no
// atomics), so a step repeats bit for bit.
int64_t head_rmsnorm_backward_workspace(int64_t n, int64_t heads, int64_t D);
void head_rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, int64_t ld,
                           int64_t ld_x, int64_t n, int64_t heads, int64_t D, const float* w,
                           float eps, float* workspace, cudaStream_t stream);
// dst[index[i]] += weight[i] * src[i] for rows i in order (ops::scatter_add_rows); device arrays.
void scatter_add_rows(float* dst, const float* src, const int32_t* index, const float* weight,
                      int64_t n, int64_t C, cudaStream_t stream);
// The mixture-of-experts router (ops::moe_route); device arrays.
void moe_route(int32_t* ids, float* weights, const float* logits, int64_t n, int64_t E, int64_t k,
               bool normalize, cudaStream_t stream);
// Its backward (ops::moe_route_backward); device arrays.
void moe_route_backward(float* dlogits, const float* dweights, const int32_t* ids,
                        const float* logits, int64_t n, int64_t E, int64_t k, bool normalize,
                        cudaStream_t stream);
// The backward of scatter_add_rows for src and weight (ops::scatter_add_rows_backward); device
// arrays.
void scatter_add_rows_backward(float* dsrc, float* dweight, const float* dy, const float* src,
                               const int32_t* index, const float* weight, int64_t n, int64_t C,
                               cudaStream_t stream);

}  // namespace tessera::cuda
