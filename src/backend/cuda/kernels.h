// Launch functions of Tessera's own CUDA training kernels: embedding, LayerNorm/RMSNorm (with
// fused residual add), GELU, SwiGLU, RoPE, fused softmax + cross-entropy, AdamW, global norm,
// scale and bf16 conversion. Raw device pointers, shapes as int64_t, one stream per call.
//
// Element types: a template parameter E is float or __nv_bfloat16 (the bf16 type of
// <cuda_bf16.h>; bf16 values cross this API as __nv_bfloat16). Every kernel computes in f32 and
// rounds bf16 results with f32_to_bf16_bits (bf16_convert.cuh), bit-identical to core/dtype.h.
// Norm weights and biases, mean/rstd, losses, weight gradients and optimizer state are f32.
// Kernels use 128-bit loads when the row length and every pointer allow it, scalar code
// otherwise. Arguments are checked on the host (tessera::Error naming the parameter); values
// that live on the device (token ids, targets, positions) cannot be, so each kernel says what an
// out-of-range one does: it never reads or writes out of bounds.
// Contracts and shapes follow ops/ops.h and the CPU reference kernels (backend/cpu/ref).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/quant_matvec.h"
#include "ops/ops.h"

namespace tessera::cuda {

// ---- Embedding ----

// out (B*T, C) = wte[tokens[b,t]] + wpe[t] (wpe (>=T, C), or null for token-only, Llama).
// tokens (B,T) on the device; wte (V,C). A token outside [0, V) yields a row of NaN.
template <typename E>
void embedding_forward(E* out, const int32_t* tokens, const E* wte, const E* wpe, int64_t B,
                       int64_t T, int64_t C, int64_t V, cudaStream_t stream);

// dwte (V,C) += dout rows scattered by token; dwpe (>=T,C) += dout summed over the batch (dwpe
// may be null). dout (B,T,C). No atomics: each column of dwte belongs to one thread per token
// class (token mod K), which adds that class's rows in increasing row order, and each (t, c) of
// dwpe to one thread looping over b. The result is the CPU reference's, bit for bit, and does
// not depend on the launch configuration. Rows whose token is outside [0, V) are skipped.
template <typename E>
void embedding_backward(float* dwte, float* dwpe, const E* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C, int64_t V, cudaStream_t stream);

// ---- LayerNorm (eps 1e-5) and RMSNorm; weights f32; rows up to C = 4096 * vector width ----

// out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) saved (either may be null).
template <typename E>
void layernorm_forward(E* out, float* mean, float* rstd, const E* inp, const float* w,
                       const float* b, int64_t N, int64_t C, cudaStream_t stream);
// res_out (N,C) = a + r (rounded to E), out = layernorm(res_out) as above. res_out may alias a.
template <typename E>
void layernorm_residual_forward(E* res_out, E* out, float* mean, float* rstd, const E* a,
                                const E* r, const float* w, const float* b, int64_t N, int64_t C,
                                cudaStream_t stream);
// out (N,C) = inp * rstd * w, rstd (N) = 1 / sqrt(mean(inp^2) + eps) saved (may be null).
// out may alias inp.
template <typename E>
void rmsnorm_forward(E* out, float* rstd, const E* inp, const float* w, int64_t N, int64_t C,
                     float eps, cudaStream_t stream);
// res_out (N,C) = a + r (rounded to E), out = rmsnorm(res_out). res_out may alias a.
template <typename E>
void rmsnorm_residual_forward(E* res_out, E* out, float* rstd, const E* a, const E* r,
                              const float* w, int64_t N, int64_t C, float eps, cudaStream_t stream);

// The next two write ops::QuantizedRows for the ops backend (residual_norm's and glu_forward's
// q_out); tests hold them to the unfused kernels.
// Norms in front of block-typed products (f32 rows, N <= 8): rmsnorm_forward,
// rmsnorm_residual_forward (r and res_out set), layernorm_forward or layernorm_residual_forward
// (layer_norm: b set, eps 1e-5) into out, whose rows are then also quantized into q (q.M == N,
// q.K == C; its block that of the products' weight type) exactly as matmul_wt would quantize out:
// the products then run through matmul_wt_quantized, one launch fewer per norm.
// mean (layer norm) and rstd are saved as the unfused norms save them where given (may be null).
void norm_quantize_f32(bool layer_norm, float* res_out, float* out, float* mean, float* rstd,
                       const float* a, const float* r, const float* w, const float* b, int64_t N,
                       int64_t C, float eps, const QuantizedActs& q, cudaStream_t stream);

// SwiGLU in front of a block-typed down product (f32, N <= 8 rows of F; gate, up
// and out rows F apart): out = silu(gate) * up as swiglu_forward computes it, whose rows are
// then also quantized into q (q.M == N, q.K == F) as matmul_wt would quantize out.
void swiglu_quantize_f32(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                         const QuantizedActs& q, cudaStream_t stream);

// f32 scratch the norm backward needs for its deterministic two-stage dw/db reduction; enough for
// any batch of up to N rows (so a buffer sized for the largest batch serves every smaller one).
int64_t norm_backward_workspace_floats(int64_t N, int64_t C);

// dinp (N,C) += d/dinp, dw (C) += sum_n dout * xhat, db (C) += sum_n dout; dout, inp (N,C);
// mean, rstd (N) from the forward. workspace: norm_backward_workspace_floats(N, C) floats.
// dinp must not alias dout or inp.
template <typename E>
void layernorm_backward(E* dinp, float* dw, float* db, const E* dout, const E* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C,
                        float* workspace, cudaStream_t stream);
// dinp (N,C) += d/dinp, dw (C) += sum_n dout * xhat; as layernorm_backward without mean and db.
template <typename E>
void rmsnorm_backward(E* dinp, float* dw, const E* dout, const E* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C, float* workspace,
                      cudaStream_t stream);

// ---- Activations ----

// out (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated as x * sigmoid(2u).
template <typename E>
void gelu_forward(E* out, const E* inp, int64_t n, cudaStream_t stream);
// dinp (n) = gelu'(inp) * dout (overwrites; dinp may alias dout).
template <typename E>
void gelu_backward(E* dinp, const E* inp, const E* dout, int64_t n, cudaStream_t stream);
// out (n) = a + b, each sum rounded once to E; out may alias a or b.
template <typename E>
void add(E* out, const E* a, const E* b, int64_t n, cudaStream_t stream);
// out (N,F) = silu(gate) * up; out may alias gate or up.
template <typename E>
void swiglu_forward(E* out, const E* gate, const E* up, int64_t N, int64_t F, cudaStream_t stream);
// dgate (N,F) = dout * up * silu'(gate), dup (N,F) = dout * silu(gate); overwritten, each may
// alias dout or its own input.
template <typename E>
void swiglu_backward(E* dgate, E* dup, const E* dout, const E* gate, const E* up, int64_t N,
                     int64_t F, cudaStream_t stream);
// The same with the tanh GELU for SiLU (GeGLU: ops::GluAct::gelu_tanh).
template <typename E>
void geglu_forward(E* out, const E* gate, const E* up, int64_t N, int64_t F, cudaStream_t stream);
template <typename E>
void geglu_backward(E* dgate, E* dup, const E* dout, const E* gate, const E* up, int64_t N,
                    int64_t F, cudaStream_t stream);

// ---- RoPE ----

// Same meaning as ops::RopeLayout: half pairs (i, i + R/2), interleaved pairs (2i, 2i+1).
enum class RopeLayout : uint8_t { half, interleaved };

// A RoPE table on the device: cos, sin (max_pos, rotary_dim / 2) f32, as ops::RopeTable's.
struct RopeTableView {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t max_pos = 0, rotary_dim = 0;
};

// out (B,T,H,D) = inp with the first R = rotary_dim dims of each head rotated by the angle of
// the token's position: positions[t] (device array (T)) or pos0 + t when positions is null.
// Dims [R, D) are copied. out may equal inp. A position outside [0, max_pos) yields NaN in the
// rotated dims of that token.
template <typename E>
void rope_forward(E* out, const E* inp, const RopeTableView& table, const int32_t* positions,
                  int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D, RopeLayout layout,
                  cudaStream_t stream);
// dinp (B,T,H,D) = dout rotated by the negative angles; dinp may equal dout.
template <typename E>
void rope_backward(E* dinp, const E* dout, const RopeTableView& table, const int32_t* positions,
                   int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D, RopeLayout layout,
                   cudaStream_t stream);

// ---- Fused softmax + cross-entropy ----

// logits (N,Vp) with V real columns; losses (N) f32 = -log softmax(logits)[target]; targets (N)
// on the device, < 0 means ignore (loss 0, gradient row 0). If dlogits_scale != 0 the logits are
// overwritten in place by dlogits_scale * (softmax - onehot(target)), padded columns [V, Vp)
// zeroed. One block per row reads the row twice (online max/sum, then the gradient) and writes
// it once. A target >= V yields a NaN loss and NaN gradients over the real columns (the padded
// columns [V, Vp) stay 0).
template <typename E>
void softmax_xent(float* losses, E* logits, const int32_t* targets, int64_t N, int64_t V,
                  int64_t Vp, float dlogits_scale, cudaStream_t stream);

// ---- Optimizer and gradient utilities ----

// One AdamW step on n parameters: params, m, v (n) f32 updated in place; grads (n) f32 or bf16.
// params_bf16 (n), if not null, receives the updated parameters rounded to bf16 in the same
// pass. Each element goes through the CPU reference's sequence of separately rounded f32
// operations (no FMA contraction), so f32 results equal backend/cpu/ref's bit for bit.
template <typename G>
void adamw(float* params, __nv_bfloat16* params_bf16, const G* grads, float* m, float* v, int64_t n,
           const ops::AdamWArgs& a, cudaStream_t stream);

// Doubles of scratch global_sum_squares needs for these tensor sizes.
int64_t global_sum_squares_workspace(const int64_t* sizes, int count);
// out (1 double, device) = sum over the count tensors ptrs[k] (sizes[k] elements) of x^2,
// squares and sums in double. Two stages, fixed order, no atomics: deterministic, and the
// partition depends on the sizes only. ptrs and sizes are host arrays of device pointers.
template <typename G>
void global_sum_squares(double* out, const G* const* ptrs, const int64_t* sizes, int count,
                        double* workspace, cudaStream_t stream);

// x (n) *= s.
template <typename E>
void scale(E* x, int64_t n, float s, cudaStream_t stream);

// dst (n) = bf16 of src (nearest even, NaN stays NaN; core/dtype.h's bits), and back.
void convert_f32_to_bf16(__nv_bfloat16* dst, const float* src, int64_t n, cudaStream_t stream);
void convert_bf16_to_f32(float* dst, const __nv_bfloat16* src, int64_t n, cudaStream_t stream);
// x (n) = its round-to-nearest-even bf16 value, in place; keep (n), unless null, = the bits.
void round_to_bf16(float* x, __nv_bfloat16* keep, int64_t n, cudaStream_t stream);

}  // namespace tessera::cuda
