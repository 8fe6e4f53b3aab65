// Device-independent op entry points used by model/, train/ and infer/. Each checks its
// arguments, then dispatches to a backend (CPU reference, CPU SIMD, or CUDA). Pointers refer to
// memory on ctx.device. Shapes use the letters of ARCHITECTURE.md: N rows (= B*T), C width,
// V vocab, Vp padded vocab, H heads, D head dim (C = H*D).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "ops/context.h"

namespace tessera::ops {

enum class Trans : uint8_t { N, T };

// c (M,N) = op(a) (M,K) * op(b) (K,N) [+ bias (N)] [+ c if accumulate].
// a and b are f32 or bf16 (bf16 means: values are bf16, products accumulate in f32); c is f32.
// op(x) = x for Trans::N (row-major, leading dimension ld), x^T for Trans::T.
// The three training forms: y = x W^T (a=x N, b=W T); dx = dy W (a=dy N, b=W N);
// dW += dy^T x (a=dy T, b=x N, accumulate).
struct GemmArgs {
  Trans trans_a = Trans::N, trans_b = Trans::N;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  DType a_type = DType::f32;
  int64_t lda = 0;
  const void* b = nullptr;
  DType b_type = DType::f32;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;  // (N) or null
  bool accumulate = false;
  // bf16 compute: f32 inputs are rounded to bf16 while packing, so the product sees exactly the
  // values a bf16 matmul would (mixed precision with f32 accumulation).
  bool round_bf16 = false;
};
void gemm(const Context& ctx, const GemmArgs& g);

// out (N,C) = wte[tokens] + wpe[position]; tokens (B,T), wte (V,C), wpe (maxT,C) or null (a
// model without learned positions: out = wte[tokens]); N = B*T.
// Every token must lie in [0, V): the CPU throws naming the first that does not; a device that
// cannot check its memory from the host writes that row as NaN.
void embedding_forward(const Context& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C, int64_t V);
// dwte (V,C) += scatter of dout by token; dwpe (maxT,C) += sum over batch, unless null. dout
// (B,T,C). A token
// outside [0, V): the CPU throws before writing anything, a device skips the row.
void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t V);

// out (N,C) = (inp - mean) * rstd * w + b; saves mean (N), rstd (N). eps = 1e-5.
void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int64_t N, int64_t C);
// The backward of a norm over rows (layernorm_forward, rmsnorm_forward): dinp (N,C) += the
// input's gradient from dout (N,C), dw (C) += the weight's, db (C) += the bias's (layer norm);
// inp (N,C) the forward's input, mean (layer norm) and rstd (N) its saved statistics.
struct NormBackwardArgs {
  float* dinp = nullptr;
  float* dw = nullptr;
  float* db = nullptr;  // layer norm only
  const float* dout = nullptr;
  const float* inp = nullptr;
  const float* w = nullptr;
  const float* mean = nullptr;  // layer norm only
  const float* rstd = nullptr;
  int64_t N = 0, C = 0;
};
void layernorm_backward(const Context& ctx, const NormBackwardArgs& a);

// GELU with the tanh approximation (GPT-2): out (n) = gelu(inp).
void gelu_forward(const Context& ctx, float* out, const float* inp, int64_t n);
// dinp (n) = gelu'(inp) * dout (overwrites; dinp may alias dout).
void gelu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout, int64_t n);

// out (n) = a + b (out may alias a or b).
void add(const Context& ctx, float* out, const float* a, const float* b, int64_t n);

// Causal self-attention, FlashAttention style, with grouped key/value heads and an optional
// sliding window. Each row of qkv (B,T,C+2*Hkv*D) holds q (H heads of D = C/H), then k and v
// (Hkv heads each), as GPT-2's c_attn output (Hkv = H) or a Llama layer's q/k/v products; query
// head h reads key/value head h / (H/Hkv). Query i of a sequence sees its keys j <= i, and with
// window W > 0 only the last W of them, itself included: i - W < j <= i (a window of T or more
// hides nothing and gives the unwindowed result bit for bit). out (B,T,C); lse (B,H,T) is the
// per-row log-sum-exp of the scaled scores, the only statistic kept for backward. Scale
// 1/sqrt(D). With round_bf16 the products (Q K^T and P V; in backward also dO V^T, P^T dO, dS^T Q
// and dS K) take bf16 operands rounded to nearest even with f32 accumulation, where the device
// has bf16 products (on the CPU: AVX512-BF16; elsewhere, and in the reference kernels, the flag
// changes nothing); the softmax and its statistics stay f32 either way.
struct AttentionArgs {
  int64_t B = 0, T = 0, C = 0, H = 0, Hkv = 0;
  int64_t window = 0;  // W above; 0: none (every earlier key)
  bool round_bf16 = false;
  // The first key query i sees: i - W + 1 with a window, at least 0.
  int64_t first_key(int64_t i) const { return window > 0 && i + 1 > window ? i + 1 - window : 0; }
};
// Throws naming `op` and the field unless the sizes are consistent (the op and every kernel of
// it check the same).
void check_attention_args(const char* op, const AttentionArgs& a);
void attention_forward(const Context& ctx, float* out, float* lse, const float* qkv,
                       const AttentionArgs& a);
// dqkv (B,T,C+2*Hkv*D) = gradient (overwrites; a key/value head's sums over its query heads);
// dout, out (B,T,C); lse (B,H,T). Recomputes the scores. No pointer may alias another.
void attention_backward(const Context& ctx, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, const AttentionArgs& a);
// The (query, key) pairs one head of one sequence scores: T (T+1) / 2 without a window, fewer
// with one (row i sees min(i+1, W) keys). The cost functions and the kernels' tests count them.
double attention_pairs(int64_t T, int64_t window);

// db (n) += column sums of dy (m,n) (a linear layer's bias gradient); each column is summed in
// row order, so the result does not depend on the threads.
void bias_grad(const Context& ctx, float* db, const float* dy, int64_t m, int64_t n);

// Fused softmax + cross-entropy over logits (N,Vp) of which the first V columns are real.
// losses (N) = -log softmax(logits)[target]. If dlogits_scale != 0, overwrites logits in place
// with d(loss_sum * dlogits_scale)/dlogits (padded columns get 0), so the full logits are never
// written twice. targets (N) in [0, V); a target < 0 means "ignore": loss 0 and gradient 0.
void softmax_xent(const Context& ctx, float* losses, float* logits, const int32_t* targets,
                  int64_t N, int64_t V, int64_t Vp, float dlogits_scale);

// AdamW with decoupled weight decay on n parameters; step t counts from 1.
// m, v updated in place; params -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * params).
struct AdamWArgs {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  int64_t t = 1;
  float grad_scale = 1.0f;  // grads are multiplied by this first (clipping)
};
void adamw(const Context& ctx, float* params, const float* grads, float* m, float* v, int64_t n,
           const AdamWArgs& a);
// Step t's bias corrections as every backend applies them, computed in double and rounded once:
// m_hat = m inv_bc1 and sqrt(v_hat) = sqrt(v) rsqrt_bc2, so that an update costs one division and
// one square root per parameter (with three divisions the pass ran at 52 GB/s in cache, barely
// above its 40-47 from DRAM, on a 2-core Xeon; now 70). The update, in f32 with every operation
// rounded:
// p -= lr ((m inv_bc1) / (sqrt(v) rsqrt_bc2 + eps) + weight_decay p).
struct AdamWBias {
  float inv_bc1, rsqrt_bc2;
};
AdamWBias adamw_bias(const AdamWArgs& a);

// Returns sum of x[i]^2 in double precision (for the global gradient norm).
double sum_squares(const Context& ctx, const float* x, int64_t n);
// x (n) *= s.
void scale(const Context& ctx, float* x, int64_t n, float s);
// dst (n) = round-to-nearest-even bf16 of src.
void convert_f32_to_bf16(const Context& ctx, uint16_t* dst, const float* src, int64_t n);
// dst (n) = src (n) widened to f32 (exact).
void convert_bf16_to_f32(const Context& ctx, float* dst, const uint16_t* src, int64_t n);
// x (n) = its round-to-nearest-even bf16 value, in place (as core's f32_to_bf16, NaN quieted);
// keep (n), unless null, = those values' bf16 bits. A bf16 step's activations: the ops after
// read the rounded values, and the backward widens keep back (convert_bf16_to_f32) to the
// same bits. keep must not overlap x.
void round_to_bf16(const Context& ctx, float* x, uint16_t* keep, int64_t n);

// ---- Moving rows ----

// dst (rows, cols) with row stride ld_dst = src (rows, cols) with row stride ld_src; both in the
// device's memory, not overlapping.
void copy_rows(const Context& ctx, float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
               int64_t rows, int64_t cols);
// dst (n, C) = rows index[0 .. n) of src (*, C); index (n) in the device's memory (the CPU
// checks each entry against src_rows; a device kernel is trusted with it).
void gather_rows(const Context& ctx, float* dst, const float* src, const int32_t* index, int64_t n,
                 int64_t C, int64_t src_rows);
// dst[index[i]] (C) += weight[i] * src[i] (C) for i in [0, n), in the order of i (an index may
// repeat); dst (dst_rows, C), src (n, C), index and weight (n) in the device's memory (the CPU
// checks each index against dst_rows). Mixture-of-experts layers add each expert's output rows
// into their tokens' rows with it.
void scatter_add_rows(const Context& ctx, float* dst, const float* src, const int32_t* index,
                      const float* weight, int64_t n, int64_t C, int64_t dst_rows);
// The backward of scatter_add_rows for src and weight: for i in [0, n), with g = dy[index[i]]
// (C), dsrc[i] (C) = weight[i] g and dweight[i] = dot(g, src[i]) (both overwritten). dy
// (dy_rows, C), src and dsrc (n, C), index, weight and dweight (n) in the device's memory (the CPU
// checks each index against dy_rows). dsrc may be src (each row is read before it is written);
// nothing else may alias. A mixture-of-experts layer's backward takes its experts' output
// gradients and the router weights' gradients from the layer's output gradient with it.
void scatter_add_rows_backward(const Context& ctx, float* dsrc, float* dweight, const float* dy,
                               const float* src, const int32_t* index, const float* weight,
                               int64_t n, int64_t C, int64_t dy_rows);

// Cost model for the profiler (OpCost, ops/observe.h): floating-point operations and bytes
// moved by one call.
OpCost gemm_cost(const GemmArgs& g);
OpCost attention_forward_cost(const AttentionArgs& a);
OpCost attention_backward_cost(const AttentionArgs& a);

// ---- Llama family: RMSNorm, rotary position embedding (RoPE), gated MLP activations ----

// out (N,C) = inp * rstd * w; saves rstd (N) = 1 / sqrt(mean(inp^2) + eps). out may alias inp.
void rmsnorm_forward(const Context& ctx, float* out, float* rstd, const float* inp, const float* w,
                     int64_t N, int64_t C, float eps);
// NormBackwardArgs without mean and db (accumulates, like layernorm_backward).
void rmsnorm_backward(const Context& ctx, const NormBackwardArgs& a);
// Activation rows (rows, cols) quantized for the products of weights of type for_type, in the
// device's own format (CUDA: the int8 blocks and scales its matvec kernels read), in its memory.
// An op that produces rows a product reads next (a norm, the gated MLP's activation, the
// attention) may also write them so (its q_out), and matmul_wt_group then reads them in place of
// x: one quantization pass fewer per product input. quantized_rows_bytes (ops/quant.h) says
// where a device has such a format.
struct QuantizedRows {
  void* data = nullptr;
  DType for_type = DType::f32;
  int64_t rows = 0, cols = 0;
};

// The residual add fused into the norm after it (a branch joining the stream, then the next
// norm): x_out (N,C) = a + r, then out (N,C) = the norm of x_out as layernorm_forward (w, b,
// eps 1e-5; saves mean and rstd) or rmsnorm_forward (w, eps; saves rstd) compute it. Same bits as
// add then the norm. x_out may be a (in place); out must not overlap a, r or x_out.
enum class NormKind : uint8_t { layer, rms };
struct ResidualNormArgs {
  NormKind kind = NormKind::rms;
  float* x_out = nullptr;  // (N,C)
  float* out = nullptr;    // (N,C)
  float* mean = nullptr;   // (N), layer norm only
  float* rstd = nullptr;   // (N)
  const float* a = nullptr;
  const float* r = nullptr;
  const float* w = nullptr;  // (C)
  const float* b = nullptr;  // (C) or null, layer norm only
  int64_t N = 0, C = 0;
  float eps = 1e-5f;                     // RMSNorm's
  const QuantizedRows* q_out = nullptr;  // optional: out also quantized, (N, C)
};
void residual_norm(const Context& ctx, const ResidualNormArgs& a);
// In place, per head (Qwen3's q and k norms): x holds n rows of stride ld, each starting with
// `heads` slices of D floats; every slice s becomes s / sqrt(mean(s^2) + eps) * w, w (D).
void head_rmsnorm(const Context& ctx, float* x, int64_t ld, int64_t n, int64_t heads, int64_t D,
                  const float* w, float eps);
// Its backward: with x the input (n rows of stride ld_x) and dy the output's gradient (stride ld),
// each slice's dx = r (dy w - xhat mean(dy w xhat)), r and xhat = x r recomputed from x, written
// over dy's slices (dx stride ld; dx may be dy); dw (D) += sum over slices of dy xhat.
struct HeadNormBackwardArgs {
  float* dx = nullptr;
  float* dw = nullptr;
  const float* dy = nullptr;
  const float* x = nullptr;
  int64_t ld = 0, ld_x = 0, n = 0, heads = 0, D = 0;
  const float* w = nullptr;
  float eps = 0;
};
void head_rmsnorm_backward(const Context& ctx, const HeadNormBackwardArgs& a);

// Which dimensions of a head are rotated together, with R = rotary_dim and i in [0, R/2):
// half: pairs (i, i + R/2), the "rotate half" layout of Llama/NeoX in HF checkpoints;
// interleaved: pairs (2i, 2i+1), the GPT-J layout (GGUF Llama files permute q/k for it).
// Pair i turns by the angle pos * theta^(-2i/R) in both layouts.
enum class RopeLayout : uint8_t { half, interleaved };

// cos/sin (max_pos, R/2) of pos * theta^(-2i/R) for pos in [0, max_pos): computed in double and
// rounded once, built once by the caller (per model and context length), so that rope calls
// neither allocate nor evaluate sin/cos. Host memory.
struct RopeTable {
  int64_t max_pos = 0, rotary_dim = 0;
  double theta = 0;              // 0 when built from explicit frequencies
  std::vector<double> inv_freq;  // (R/2) per-pair inverse frequencies (the reference uses these)
  double scale = 1.0;            // cos and sin are multiplied by it (LongRoPE's attention factor)
  std::vector<float> cos, sin;
  // cos then sin, (2, max_pos, R/2), in the memory of the device that runs the rope ops, where
  // that is not the CPU (the owner uploads them and keeps the buffer); null on the CPU.
  const float* device = nullptr;
};
// Throws on rotary_dim odd or <= 0, max_pos < 0, theta <= 0.
RopeTable make_rope_table(int64_t max_pos, int64_t rotary_dim, double theta);
// Same from explicit per-pair inverse frequencies (rotary_dim = 2 * size), for scaled RoPE;
// cos and sin multiplied by scale (> 0).
RopeTable make_rope_table(int64_t max_pos, const std::vector<double>& inv_freqs,
                          double scale = 1.0);

// Rotates the first R = table.rotary_dim dimensions of every head; out (B,T,H,D), inp (B,T,H,D)
// (out may equal inp; dimensions [R, D) are copied). Token t of every batch row sits at position
// positions[t] (positions (T), each in [0, table.max_pos)), or at pos0 + t if positions is null.
// (A decode batch of sequences at different positions is B = 1, T = number of sequences.)
void rope_forward(const Context& ctx, float* out, const float* inp, const RopeTable& table,
                  const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                  int64_t D, RopeLayout layout);
// dinp (B,T,H,D) = dout rotated by the negative angles (the rotation is orthogonal); overwrites,
// dinp may equal dout.
void rope_backward(const Context& ctx, float* dinp, const float* dout, const RopeTable& table,
                   const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                   int64_t D, RopeLayout layout);

// The gated MLP activations: act(gate) * up with act SiLU (SwiGLU: Llama, Qwen) or the tanh
// GELU (GeGLU: Gemma's gelu_pytorch_tanh).
enum class GluAct : uint8_t { silu, gelu_tanh };
const char* glu_act_name(GluAct a);

// out (N,F) = act(gate) * up, silu(x) = x / (1 + exp(-x)), gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi)
// (x + 0.044715 x^3))); gate, up (N,F). out may alias either. q_out (optional): out also
// quantized, (N, F).
void glu_forward(const Context& ctx, float* out, const float* gate, const float* up, int64_t N,
                 int64_t F, GluAct act, const QuantizedRows* q_out = nullptr);
// dgate (N,F) = dout * up * act'(gate), dup (N,F) = dout * act(gate) (both overwritten; each
// may alias dout, or its own input).
void glu_backward(const Context& ctx, float* dgate, float* dup, const float* dout,
                  const float* gate, const float* up, int64_t N, int64_t F, GluAct act);

// ---- Mixture of experts ----

// The router of a mixture-of-experts layer, for each of n rows of logits (n, E): p =
// softmax(row); ids (n, k) = the k experts of largest p, largest first (ties: the lower id
// first); weights (n, k) = their p, divided by the sum of the k when normalize (Mixtral,
// Qwen3-MoE; OLMoE keeps them as they are). 1 <= k <= E. Softmax before or after the top-k
// is the same choice: softmax over the top k logits equals normalize = true.
void moe_route(const Context& ctx, int32_t* ids, float* weights, const float* logits, int64_t n,
               int64_t E, int64_t k, bool normalize);
// Its backward: dlogits (n, E) = the gradient of the logits (n, E) from dweights (n, k), that
// of the weights moe_route gave for its choices ids (n, k) over the same logits (p = softmax(row)
// recomputed). The choice itself is piecewise constant: gradient flows only through the chosen
// weights. With s = sum_j dweights_j w_j: without normalize (w_j = p[ids_j]) dlogits_e = p_e (g_e
// - s), g_e = dweights_j where e = ids_j, else 0; with normalize (w the softmax of the chosen
// logits) dlogits[ids_j] = w_j (dweights_j - s) and the others 0. Overwrites dlogits; no
// aliasing.
void moe_route_backward(const Context& ctx, float* dlogits, const float* dweights,
                        const int32_t* ids, const float* logits, int64_t n, int64_t E, int64_t k,
                        bool normalize);

OpCost rmsnorm_forward_cost(int64_t N, int64_t C);
OpCost rope_cost(int64_t B, int64_t T, int64_t H, int64_t D, int64_t rotary_dim);
OpCost glu_forward_cost(int64_t N, int64_t F);

}  // namespace tessera::ops
