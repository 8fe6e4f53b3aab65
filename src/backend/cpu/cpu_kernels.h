// Multi-threaded SIMD CPU kernels (Google Highway, dispatched at run time per whole op).
// Shapes and contracts are those of the matching entry points in ops/ops.h; each is tested
// against its reference in backend/cpu/ref.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace tessera::cpu {

void gemm(ThreadPool& pool, const ops::GemmArgs& g);
void embedding_forward(ThreadPool& pool, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C, int64_t V);
void embedding_backward(ThreadPool& pool, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t V);
void layernorm_forward(ThreadPool& pool, float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int64_t N, int64_t C);
void layernorm_backward(ThreadPool& pool, float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd,
                        int64_t N, int64_t C);
void gelu_forward(ThreadPool& pool, float* out, const float* inp, int64_t n);
void gelu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, int64_t n);
void add(ThreadPool& pool, float* out, const float* a, const float* b, int64_t n);
// ops::attention_forward / backward (ops.h). round_bf16: the products on AVX512-BF16 where the
// CPU has it (attention_bf16.h), else f32. A window skips the key tiles it hides.
void attention_forward(ThreadPool& pool, float* out, float* lse, const float* qkv,
                       const ops::AttentionArgs& a);
void attention_backward(ThreadPool& pool, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, const ops::AttentionArgs& a);
void softmax_xent(ThreadPool& pool, float* losses, float* logits, const int32_t* targets, int64_t N,
                  int64_t V, int64_t Vp, float dlogits_scale);
void adamw(ThreadPool& pool, float* params, const float* grads, float* m, float* v, int64_t n,
           const ops::AdamWArgs& a);
double sum_squares(ThreadPool& pool, const float* x, int64_t n);
void scale(ThreadPool& pool, float* x, int64_t n, float s);
void convert_f32_to_bf16(ThreadPool& pool, uint16_t* dst, const float* src, int64_t n);
void convert_bf16_to_f32(ThreadPool& pool, float* dst, const uint16_t* src, int64_t n);
void round_to_bf16(ThreadPool& pool, float* x, uint16_t* keep, int64_t n);

// Llama ops (backend/cpu/llama_ops.cc).
void rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp, const float* w,
                     int64_t N, int64_t C, float eps);
void rmsnorm_backward(ThreadPool& pool, float* dinp, float* dw, const float* dout, const float* inp,
                      const float* w, const float* rstd, int64_t N, int64_t C);
void rope_forward(ThreadPool& pool, float* out, const float* inp, const ops::RopeTable& table,
                  const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                  int64_t D, ops::RopeLayout layout);
void rope_backward(ThreadPool& pool, float* dinp, const float* dout, const ops::RopeTable& table,
                   const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                   int64_t D, ops::RopeLayout layout);
// Per-head RMSNorm in place (ops::head_rmsnorm; backend/cpu/llama_ops.cc), rows over the threads.
void head_rmsnorm(ThreadPool& pool, float* x, int64_t ld, int64_t n, int64_t heads, int64_t D,
                  const float* w, float eps);
// ops::moe_route (moe.cc).
void moe_route(ThreadPool& pool, int32_t* ids, float* weights, const float* logits, int64_t n,
               int64_t E, int64_t k, bool normalize);
void moe_route_backward(ThreadPool& pool, float* dlogits, const float* dweights, const int32_t* ids,
                        const float* logits, int64_t n, int64_t E, int64_t k, bool normalize);
// ops::glu_forward / glu_backward (llama_ops.cc).
void glu_forward(ThreadPool& pool, float* out, const float* gate, const float* up, int64_t N,
                 int64_t F, ops::GluAct act);
void glu_backward(ThreadPool& pool, float* dgate, float* dup, const float* dout, const float* gate,
                  const float* up, int64_t N, int64_t F, ops::GluAct act);

// Quantized / low-precision weights (backend/cpu/quant_matmul.cc); contract of
// ref::matmul_wt. Two routes, chosen by matmul_wt_takes_packed_gemm:
// - integer kernels (decode, small batches): x quantized to 8-bit blocks, rows of W split over
//   threads in fixed chunks; M <= 4 streams W once, larger M reuses each decoded weight block
//   across 4 activation rows. A row's result does not depend on M.
// - packed f32 GEMM (prefill): cpu::gemm_wt, W widened while packed, x unquantized. Rows of a
//   large product are therefore a little more accurate than the same rows computed in a small
//   one (and not bit-identical to them). bf16 weights where the CPU has AVX512-BF16 take the bf16
//   dot-product kernel instead.
// bf16 weights take x rounded to bf16 on every route (ops::matmul_wt), so there the routes
// differ only in the f32 summation order of the same exact products.
void matmul_wt(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
               const void* w, DType w_type, int64_t N, const float* bias);
// Whether matmul_wt computes M rows against w_type weights through the packed GEMM.
bool matmul_wt_takes_packed_gemm(DType w_type, int64_t M);
// Several products of one x (cpu/wt_product.h), each equal to matmul_wt's bit for bit; x is
// quantized once and all rows are shared out in one hand-off where the kernels allow.
void matmul_wt_group(ThreadPool& pool, const float* x, int64_t M, int64_t K,
                     const ops::WtProduct* products, int64_t n_products);

// Contract of ref::matmul_w (backend/cpu/matmul_w.cc): W widened kMatmulWPanel rows at a time
// into scratch, each panel one f32 GEMM accumulating into dx.
void matmul_w(ThreadPool& pool, float* dx, int64_t ldx, const float* dy, int64_t M, int64_t N,
              const void* w, DType w_type, int64_t K, bool accumulate);

}  // namespace tessera::cpu
