// Plain-loop reference kernels: the oracle in tests and the fallback where no SIMD kernel
// applies. Single-threaded and written for clarity. Shapes and contracts are those of the
// matching entry points in ops/ops.h.
#pragma once

#include <cstdint>

#include "ops/ops.h"

namespace tessera::cpu::ref {

void gemm(const ops::GemmArgs& g);
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t V);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t V);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int64_t N, int64_t C);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);
// The tanh GELU and its derivative at x, in double (gelu_forward's and glu_forward's oracle).
double gelu(double x);
double gelu_grad(double x);
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
void add(float* out, const float* a, const float* b, int64_t n);
// ops::attention_forward / backward in f64 loops (a.round_bf16 changes nothing here).
void attention_forward(float* out, float* lse, const float* qkv, const ops::AttentionArgs& a);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, const ops::AttentionArgs& a);
void softmax_xent(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                  int64_t Vp, float dlogits_scale);
void adamw(float* params, const float* grads, float* m, float* v, int64_t n,
           const ops::AdamWArgs& a);
double sum_squares(const float* x, int64_t n);
void scale(float* x, int64_t n, float s);

// Llama ops. rope_* evaluate their angles in double from table.theta and table.rotary_dim and
// ignore the table's stored values, so the reference stays independent of make_rope_table.

// Throws naming the parameter unless: table.rotary_dim even, in (0, D]; B, T, H >= 0; every
// position (positions[t], or pos0 + t) in [0, table.max_pos). `op` prefixes the message.
void check_rope_args(const char* op, const ops::RopeTable& table, const int32_t* positions,
                     int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N,
                     int64_t C, float eps);
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C);
void rope_forward(float* out, const float* inp, const ops::RopeTable& table,
                  const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                  int64_t D, ops::RopeLayout layout);
void rope_backward(float* dinp, const float* dout, const ops::RopeTable& table,
                   const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                   int64_t D, ops::RopeLayout layout);
// Per-head RMSNorm in place (ops::head_rmsnorm), sums in double.
void head_rmsnorm(float* x, int64_t ld, int64_t n, int64_t heads, int64_t D, const float* w,
                  float eps);
void head_rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, int64_t ld,
                           int64_t ld_x, int64_t n, int64_t heads, int64_t D, const float* w,
                           float eps);
// ops::moe_route in double (moe_ref.cc).
void moe_route(int32_t* ids, float* weights, const float* logits, int64_t n, int64_t E, int64_t k,
               bool normalize);
// ops::moe_route_backward in double, from the gradient's definition (moe_ref.cc).
void moe_route_backward(float* dlogits, const float* dweights, const int32_t* ids,
                        const float* logits, int64_t n, int64_t E, int64_t k, bool normalize);
void glu_forward(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                 ops::GluAct act);
void glu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                  int64_t N, int64_t F, ops::GluAct act);

// Quantized / low-precision weights (ref/quant.cc). y (M,N) = x (M,K) W^T [+ bias (N)], W (N,K)
// of type w_type with rows dtype_bytes(w_type, K) apart; ldy >= N. Block types quantize x to
// 8 bits per weight block and accumulate integer dot products per block; bf16 weights take x
// rounded to bf16 (f32 sums in k order).
// Arguments as ops::check_matmul_wt_args accepts them.
void matmul_wt(float* y, int64_t ldy, const float* x, int64_t M, int64_t K, const void* w,
               DType w_type, int64_t N, const float* bias);

// dx (M,K) (+)= dy (M,N) W (N,K), W of type w_type widened exactly; ldx >= K. Plain loops over
// whole rows of W, accumulated in double (the oracle of cpu::matmul_w).
void matmul_w(float* dx, int64_t ldx, const float* dy, int64_t M, int64_t N, const void* w,
              DType w_type, int64_t K, bool accumulate);

}  // namespace tessera::cpu::ref
