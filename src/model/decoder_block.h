// One decoder layer's forward and backward passes (GPT-2 and the Llama family), written once
// against ops/. The engine runs the forward over a chunk of token rows whose keys and values go
// to the paged cache (DecoderForward); the trainer runs it over (B,T) rows that attend causally
// among themselves, keeps what the backward reads, and runs the backward (TrainModel). What differs
// between the two is only where the tensors live (BlockTensors) and how queries meet keys
// (BlockAttention).
#pragma once

#include <cstdint>
#include <vector>

#include "model/decoder.h"
#include "ops/context.h"
#include "ops/quant.h"

namespace tessera::model {

// The parts of a forward pass, each an ops::Scope of that name around its ops, so an observer
// (ops/op_tally.h) sums their time and bytes: the weight products by the matrices they read (q/k/v
// together, the attention output, the MLP's input matrices, its down matrix, the output head),
// and attention over the cache.
enum class Stage { qkv, attn_out, mlp_in, mlp_down, head, attention };
inline constexpr int kNumStages = 6;
const char* stage_name(Stage s);

// The host's part of a mixture-of-experts layer: the choices brought from the device and
// grouped by expert. Its owner keeps it across layers and steps, so that once sized a step
// allocates nothing.
struct MoeRouting {
  std::vector<int32_t> ids;              // (2 n k) as BlockTensors::moe_ids
  std::vector<float> weights;            // (2 n k) as BlockTensors::moe_weights
  std::vector<int64_t> start, next;      // (E + 1) expert e's rows [start[e], start[e + 1]); (E)
  std::vector<ops::WtProduct> products;  // one token's gate and up products of the chosen experts
  std::vector<int32_t> slot;             // (n k) each choice's row in the grouped order
  std::vector<float> ones;               // (n k) ones: the backward's unweighted scatter-add
};

// Where one layer's tensors live, for n rows (C = d_model, F = d_ff, QKV = q_dim + 2 kv_dim).
// The trainer points each layer at its own slots of the activation arena, which the backward
// reads; the engine points every layer at one scratch set and runs in place (mid == out == in,
// ff_act == ff_in), which the order of the ops below allows.
struct BlockTensors {
  const float* in = nullptr;   // (n,C) the residual stream entering the layer
  float* mid = nullptr;        // (n,C) the stream after the attention branch; may be in
  float* out = nullptr;        // (n,C) the stream after the MLP branch; may be mid
  float* branch = nullptr;     // (n,C) a branch's output before it joins the stream
  float* xn1 = nullptr;        // (n,C) attention norm output
  float* mean1 = nullptr;      // (n) its mean (layer norm only)
  float* rstd1 = nullptr;      // (n) its 1/std
  float* qkv = nullptr;        // (n,QKV) each row q | k | v
  float* att = nullptr;        // (n,q_dim) attention output
  float* xn2 = nullptr;        // (n,C) MLP norm output; may be xn1
  float* mean2 = nullptr;      // (n)
  float* rstd2 = nullptr;      // (n)
  float* ff_in = nullptr;      // (n,F) c_fc output (GPT-2) or gate projection (Llama)
  float* ff_up = nullptr;      // (n,F) up projection (Llama only)
  float* ff_act = nullptr;     // (n,F) GELU(ff_in) or SwiGLU(gate, up); may be ff_in
  float* lora_u = nullptr;     // (n, largest adapter rank): x A^T of an adapter; only when the
                               // layer has adapters (LoraRef), which the forward adds in place
  float* qk_raw = nullptr;     // (n, q_dim + kv_dim): q and k before their norms (qk_norm), kept
                               // for the backward; null where nothing is kept (the engine)
  float* post_rstd = nullptr;  // (n) the post-norms' 1/rms (post_norms); (2,n) with post_in
  float* post_in = nullptr;    // (2,n,C) the attention's then the MLP's branch output before its
                               // post-norm, kept for the backward (the trainer's) with both
                               // 1/rms in post_rstd; null: nothing kept (the engine)
  // bf16 copies of xn1, xn2 and ff_act (same shapes) that block_forward writes for the backward,
  // whose weight gradients read them instead of the f32 tensors (the trainer in bf16 precision,
  // where those products round their inputs to bf16 anyway: the same bits, half the bytes
  // kept); null: the f32 tensors are kept. xn2_bf16 and ff_act_bf16 only without experts.
  uint16_t* xn1_bf16 = nullptr;
  uint16_t* xn2_bf16 = nullptr;
  uint16_t* ff_act_bf16 = nullptr;
  // A bf16 step's activations (the trainer in bf16 precision): with round_ff_in, ff_in and ff_up
  // are rounded to bf16 in place as soon as written (ops::round_to_bf16), so the activation, its
  // recompute and the backward all read what a bf16 model's products give; ff_in_bf16 and
  // ff_up_bf16 (same shapes), where set, keep those bits for the backward, which widens them back
  // into ff_in and ff_up (then scratch that every layer shares). q, k, v and the attention output
  // are the attention's to round and keep (CausalAttention).
  bool round_ff_in = false;
  uint16_t* ff_in_bf16 = nullptr;
  uint16_t* ff_up_bf16 = nullptr;
  // Mixture of experts (DecoderConfig::moe; E experts, k used): ff_in, ff_up and ff_act then
  // hold (n k, F), one row per choice, grouped by expert. The backward reads all of these and
  // the routing's grouping as the forward left them (the trainer keeps them per layer, or
  // replays the whole layer); moe_x is not written for n == 1 (every choice reads xn2's row).
  float* router = nullptr;        // (n,E) the router's logits
  int32_t* moe_ids = nullptr;     // (2 n k) the choices (n,k), then their rows grouped by expert
  float* moe_weights = nullptr;   // (2 n k) the choices' weights (n,k), then grouped likewise
  float* moe_x = nullptr;         // (n k, C) the MLP input's rows, grouped by expert
  float* moe_y = nullptr;         // (n k, C) the experts' outputs, likewise
  MoeRouting* routing = nullptr;  // host scratch
  // Where the device keeps quantized activations (ops::QuantizedRows; the engine at a few rows),
  // the products' inputs as the products of this layer read them: xn1_q for q/k/v (written by
  // the layer before, NormChain), xn2_q for gate/up (GPT-2: c_fc), att_q for the attention
  // output's product, act_q for down (the gated MLP only). Null: the products quantize x
  // themselves. block_forward has each one's producer write it.
  const ops::QuantizedRows* xn1_q = nullptr;
  const ops::QuantizedRows* xn2_q = nullptr;
  const ops::QuantizedRows* att_q = nullptr;
  const ops::QuantizedRows* act_q = nullptr;
};

// How a layer's queries meet keys and values: att (n, q_dim) from qkv (n, QKV). It applies the
// rotary embedding itself where the model has one (it knows the rows' positions), and may
// rotate q and k inside qkv or in copies of its own. att_q (optional): att also quantized.
class BlockAttention {
 public:
  virtual ~BlockAttention() = default;
  virtual void attend(int64_t layer, float* qkv, float* att, int64_t n,
                      const ops::QuantizedRows* att_q) = 0;
};

// A norm of n rows that a fused op writes: its output and saved statistics (mean: layer norm
// only), and its weights.
struct NormInto {
  float* out = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
  const WeightRef* w = nullptr;
  const WeightRef* b = nullptr;
  const ops::QuantizedRows* q = nullptr;  // optional: out also quantized
};

// How a layer meets the norms beside it: with next.out set, the layer's last residual add also
// computes next (the next layer's attention norm, or the output norm after the last layer) of
// t.out in one ops::residual_norm; with in_normed, t.xn1 already holds this layer's attention norm
// of t.in (the layer before wrote it). The engine chains every forward; the trainer its forward
// pass, not the backward's replays (one set of buffers may serve every layer there).
struct NormChain {
  NormInto next;
  bool in_normed = false;
};

// Runs layer `layer` (weights w) on n rows of t.in, writing t.mid and t.out and every
// intermediate in t. With stop_after_ff_in it stops once ff_in (and ff_up) are written: a
// backward that keeps no MLP activations replays the layer that far (not a mixture of experts,
// whose backward also reads the experts' outputs: replay it whole). Each stage runs in its
// scope (Stage). Norm weights and biases must be f32. Adapters on a MoE layer's expert matrices
// are refused.
void block_forward(const ops::Context& ctx, const DecoderConfig& c, const DecoderLayer& w,
                   int64_t layer, int64_t n, const BlockTensors& t, BlockAttention& attention,
                   bool stop_after_ff_in = false, const NormChain& chain = {});

class CausalAttention;  // model/causal_attention.h

// Scratch a layer's backward writes (QKV = q_dim + 2 kv_dim, F = d_ff).
struct BlockGradScratch {
  float* dx = nullptr;      // (n,max(C,q_dim)) a branch input's gradient (attention's is q_dim)
  float* dbig = nullptr;    // (n,max(QKV,F)) dq|dk|dv, and the MLP's inner gradients
  float* dup = nullptr;     // (n,max(q_dim,F)) Llama's up-projection gradient, and q, k, v's
                            // gradients packed for separate matrices; may be null for GPT-2
  float* lora_u = nullptr;  // (n, largest adapter rank) each, when the layer has adapters
  float* lora_gu = nullptr;
  float* dpost = nullptr;  // (n,C) a branch output's gradient before its post-norm (post_norms)
  // Mixture of experts (n k choices, E experts); dbig and dup then hold (n k, F) each.
  float* moe_dy = nullptr;       // (n k, C) the experts' output gradients, then their inputs'
  float* moe_dw = nullptr;       // (3 n k) the router weights' gradients grouped, then per
                                 // choice (n, k), then ones
  float* moe_dlogits = nullptr;  // (n, E) the router logits' gradient
  int32_t* moe_slot = nullptr;   // (n k) each choice's grouped row (MoeRouting::slot)
};

// An adapter's part in a linear's backward: its weights w, the view of its gradients g (f32,
// added into; either part may be absent), and two (n, rank) scratch buffers.
struct LoraGrad {
  const LoraRef* w = nullptr;
  const LoraRef* g = nullptr;
  float* u = nullptr;
  float* gu = nullptr;
  bool present() const { return w != nullptr && w->present(); }
};

// The backward of block_forward over the tensors it left in t (ff_act recomputed by the caller
// if it was not kept; it may be s.dbig itself; with post-norms, t.post_in kept). On entry dresid
// (n,C) holds the gradient of the layer's output t.out; on exit that of its input t.in. Adds every
// weight's gradient into g, a view of the gradient buffer in the layout of w (as_decoder over it:
// f32, biases present where the weights have them); a tensor absent from g gets none (a frozen
// matrix: only its input's gradient is computed, through ops::matmul_w when it is stored
// quantized). Adapters of w get theirs in g.lora. attention: the layer's CausalAttention as the
// forward used it. round_bf16: the products take bf16 operands (bf16 precision; not the MoE
// router's, which the forward reads in f32). write_dense_dw: the gradients of q, k, v, o and (in a
// layer without experts) gate, up and down are written, not added (the first backward of a step:
// the buffer needs no zeroing and the products do not read it); every other gradient is added.
void block_backward(const ops::Context& ctx, const DecoderConfig& c, const DecoderLayer& w,
                    const DecoderLayer& g, int64_t n, const BlockTensors& t,
                    CausalAttention& attention, float* dresid, const BlockGradScratch& s,
                    bool round_bf16, bool write_dense_dw = false);

// Backward of y (n,N) = x (n,K) w^T + b [+ s (x A^T) B^T]: dw (N,K) += dy^T x unless dw is null
// (= with write_dw; x read from x_bf16, its bf16 copy, where that is not null);
// db (N) += column sums of dy unless null; an adapter's dA += s (dy B)^T x, dB += s dy^T (x A^T);
// then dx (n,K) = dy w [+ s (dy B) A], or += with accumulate_dx (skipped if dx is null; dx may
// alias x, which is read first). w in f32 or bf16, or with dw null any type matmul_wt reads.
// round_bf16: the products take bf16 operands (not the adapter's).
void linear_backward(const ops::Context& ctx, float* dx, bool accumulate_dx, const float* dy,
                     const float* x, int64_t n, const WeightRef& w, float* dw, float* db,
                     bool round_bf16, const LoraGrad& lora = {}, bool write_dw = false,
                     const uint16_t* x_bf16 = nullptr);

// u (n, r) = scale x (n, K) A^T: adapter a's input to its B, as the forward computes it and the
// backward recomputes it.
void lora_project(const ops::Context& ctx, const LoraRef& a, const float* x, int64_t n, float* u);

// y (n, ldy) += scale (x A^T) B^T for adapter a of a product of x (n, K): its rank-r term, u
// (n, r) scratch. Nothing when a is absent.
void lora_forward(const ops::Context& ctx, const LoraRef& a, float* y, int64_t ldy, const float* x,
                  int64_t n, float* u);

// dinp (n,C) += the norm's input gradient from dout (layer norm with mean and rstd for GPT-2,
// RMSNorm with rstd for Llama); its weight's (and bias's) gradients added into dw (db).
void norm_backward(const ops::Context& ctx, const DecoderConfig& c, float* dinp, const float* dout,
                   const float* inp, const float* mean, const float* rstd, int64_t n,
                   const WeightRef& w, const WeightRef& dw, const WeightRef& db);

// out (n,C) = the model's norm of inp (layer norm for GPT-2, RMSNorm for Llama) with weight w
// and bias b (GPT-2); saves mean (layer norm only) and rstd (n).
void norm_forward(const ops::Context& ctx, const DecoderConfig& c, float* out, float* mean,
                  float* rstd, const float* inp, int64_t n, const WeightRef& w, const WeightRef& b);

// y (n, w.rows()) = x (n, w.cols()) w^T + b, in the scope of `stage`; xq (optional): x as the
// op that wrote it also quantized it.
void linear_forward(const ops::Context& ctx, Stage stage, float* y, const float* x, int64_t n,
                    const WeightRef& w, const WeightRef& b, const ops::QuantizedRows* xq = nullptr);

}  // namespace tessera::model
