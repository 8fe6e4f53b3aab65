// Private state of TrainModel (parameter offsets, the activation arena's buffers, bf16 weight copy)
// shared by train_model.cc (setup, planning) and train_step.cc (forward/backward). Not a public
// header.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/arena.h"
#include "model/decoder_block.h"
#include "model/decoder_forward.h"
#include "model/layer_tensors.h"
#include "model/train_model.h"
#include "ops/memory.h"
#include "ops/ops.h"

namespace tessera::model {

// Whether a Llama-shaped training model's parameter table holds layer tensor t (in the table's
// order, as layer_tensors() gives it): no GPT-2-only tensor and no o bias (the training model
// has none); the others as the config's options say. A MoE layer holds its experts' matrices
// per expert (hf_expert_name), consecutive, after the router.
inline bool trained_tensor(const LayerTensor& t, const DecoderConfig& c) {
  using L = DecoderLayer;
  const auto m = t.member;
  if (t.hf == nullptr && m != &L::post_attn_norm) return false;  // GPT-2's own
  if (m == &L::bo) return false;
  if (m == &L::bq || m == &L::bk || m == &L::bv) return c.qkv_bias;
  if (m == &L::q_norm || m == &L::k_norm) return c.qk_norm;
  if (m == &L::post_attn_norm || m == &L::post_ffn_norm) return c.post_norms;
  if (m == &L::ffn_router) return c.moe();
  return true;
}

// One block's saved activations (N = B*T rows; C, QKV = q_dim + 2 kv_dim, F from the config). With
// Recompute::block every layer points at the same shared set; with Recompute::gelu every layer's
// `gelu` points at one shared buffer. In bf16 precision (Recompute::none and gelu) a layer keeps
// as bf16 what it keeps of the products' inputs (ln1_bf16, ln2_bf16, gelu_bf16 with none; the
// last two only without experts) and q/k/v, the attention output and the MLP's input products
// (qkv_bf16, atty_bf16, fch_bf16, fup_bf16: rounded to bf16 when written, in every policy, so the
// copies hold their values exactly). The f32 ln1, ln2 (one buffer), gelu (dbig), qkv, atty, fch
// and fup are then shared by all layers: the forward computes in them, and the backward widens a
// layer's copies of the last four back into them.
struct LayerActs {
  float* ln1;        // (N,C) ln_1 output
  float* ln1_mean;   // (N)
  float* ln1_rstd;   // (N)
  float* qkv;        // (N,QKV)
  float* atty;       // (N,q_dim) attention output before c_proj
  float* lse;        // (B,H,T) attention log-sum-exp
  float* resid_mid;  // (N,C) residual stream after the attention branch
  float* ln2;        // (N,C)
  float* ln2_mean;   // (N)
  float* ln2_rstd;   // (N)
  float* fch;        // (N,F) c_fc output (GELU input), or Llama's gate projection
  float* fup;        // (N,F) Llama's up projection; null for GPT-2
  float* gelu;       // (N,F) GELU output, or Llama's SwiGLU(gate, up)
  float* qk_raw;     // (N,q_dim+kv_dim) q and k before their norms (Qwen3), else null
  float* post_in;    // (2,N,C) the branches' outputs before their post-norms (Gemma 3), else null
  float* post_rstd;  // (2,N) their 1/rms, else null
  // A mixture of experts' (k of E experts a row; fch, fup and gelu then hold (N k, F)), else null:
  // the router's logits (N,E), the choices and their grouping (2 N k each), the grouped inputs
  // and the experts' outputs (N k, C). Kept for the backward (BlockTensors), never recomputed
  // there; Recompute::block replays the whole layer to rebuild them.
  float* router;
  int32_t* moe_ids;
  float *moe_weights, *moe_x, *moe_y;
  uint16_t *ln1_bf16, *ln2_bf16, *gelu_bf16;  // bf16 copies kept for the backward, else null
  uint16_t *qkv_bf16, *atty_bf16, *fch_bf16, *fup_bf16;  // likewise
};

// Points d's adapters (m's LoRA spec, every layer) at m's tensors in `params`, a buffer laid out
// as m's parameters.
void attach_lora_views(const TrainModel& m, const float* params, DecoderModel& d);

struct TrainModel::Impl {
  explicit Impl(TrainModel& m) : model(m) {}

  TrainModel& model;
  // Offsets of the embedding, GPT-2's position table (-1 for Llama) and the head (the
  // embedding's offset when tied); -1 in LoRA mode.
  int64_t wte = 0, wpe = -1, head = 0;

  // LoRA mode: the frozen base (host memory, which the embedding lookups read) and its weights
  // on the device (the host model itself on the CPU); the frozen norms' weight gradients go to
  // norm_sink (2C floats, never read): the norm ops always produce them.
  LoraSpec lora;
  DecoderModel base;
  DeviceModel base_device;
  ops::Buffer norm_sink;
  std::vector<float> embed_rows;  // (max_n, C) host staging of the embedding rows
  float* lora_u = nullptr;        // (N, r) adapter scratch: x A^T
  float* lora_gu = nullptr;       // (N, r): (dy B) in the backward
  bool is_lora() const { return lora.rank > 0; }

  // Activation plan; capacity is max_n = B*T rows with T <= max_t.
  bool planned = false;
  int64_t max_n = 0, max_t = 0;
  Precision precision = Precision::f32;
  Recompute recompute = Recompute::none;
  ArenaPlan plan;
  ops::Buffer arena;                // on the device, allocated by ensure_arena() at the first step
  std::function<void(char*)> bind;  // points the buffers below into an arena at `base`
  std::vector<float*> resid;        // L+1 residual streams (N,C): resid[l] is block l's input
  std::vector<LayerActs> acts;
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;
  // The head's rows per pass: the loss and the head's backward run over the rows in chunks of
  // kHeadRows, so the arena holds (kHeadRows, Vp) logits, not (N, Vp) (GPT-2 small at B=8 T=512:
  // 0.21 GB, not 0.82). A multiple of the GEMMs' depth block (256), so the head gradient's
  // products add the same blocks in the same order as one product over every row would.
  static constexpr int64_t kHeadRows = 1024;
  float* logits = nullptr;  // (min(N, kHeadRows), Vp): one chunk's logits, then its dlogits
  ops::Buffer full_logits;  // (N,Vp), allocated by the first forward without targets
  const float* last_logits = nullptr;  // what logits() returns: full_logits after such a forward
  float* losses = nullptr;             // (N)
  // Scratch reused by every layer: forward branch outputs and backward activation gradients.
  float* scratch_c = nullptr;  // (N,max(C,q_dim)): c_proj outputs, backward's dx
  float* dresid = nullptr;     // (N,C): gradient of the residual stream
  float* dbig = nullptr;       // (N,max(QKV,F)): dqkv / dfch; doubles as the shared GELU buffer
  float* dup = nullptr;        // (N,max(q_dim,F)): Llama's up-projection gradient; else null
  float* dpost = nullptr;      // (N,C): a branch's gradient before its post-norm; else null
  float* rot = nullptr;        // (N,max(q_dim,kv_dim)): Llama's rotation scratch; else null
  // A mixture of experts' backward scratch (BlockGradScratch's moe_*; dbig and dup then hold
  // (N k, F)), else null; and each layer's host routing, which its forward writes and its
  // backward reads (BlockTensors::routing; mutable: tensors() hands it out).
  float *moe_dy = nullptr, *moe_dw = nullptr, *moe_dlogits = nullptr;
  int32_t* moe_slot = nullptr;
  mutable std::vector<MoeRouting> routing;
  ops::RopeTable rope;        // Llama's rotary table for positions 0..max_t-1
  ops::RopeTable rope_local;  // the local layers' (DecoderConfig::local), where there are any
  ops::Buffer rope_device;    // each table's cos then sin, on a device that is not the CPU

  // bf16 copy of params (same offsets), bf16 precision only; on the device.
  ops::Buffer params_bf16;
  // A step's tokens and targets (max_n each) where the device is not the CPU; host arrays are
  // read in place on the CPU.
  ops::Buffer ints;
  // The model as the shared decoder layer reads it (block_forward): views of params, whose
  // matrices point into params_bf16 in bf16 precision; and the same view of the gradients
  // (block_backward adds into it). Set by plan().
  DecoderModel view, grad_view;

  bool bf16() const { return precision == Precision::bf16; }
  // The weight operand a GEMM reads: the bf16 copy in bf16 precision, else the f32 master.
  const void* weight(int64_t off) const;
  DType weight_type() const { return bf16() ? DType::bf16 : DType::f32; }
  // The step's tokens (and targets, if not null) as the ops read them: the host arrays on the
  // CPU, their copy in `ints` elsewhere. Returns {tokens, targets}.
  std::pair<const int32_t*, const int32_t*> device_ints(const int32_t* tokens,
                                                        const int32_t* targets, int64_t n);
  // The sum of the N losses whose targets are >= 0, and their count.
  std::pair<double, int64_t> loss_sum(const int32_t* targets, int64_t N) const;
  const float* p(int64_t off) const { return model.params() + off; }
  float* g(int64_t off) { return model.grads_.as<float>() + off; }
  // What zero_grads() leaves to the first forward_backward of a step: zeroes every gradient but
  // those its products write (block_backward's write_dense_dw, the head), and in LoRA mode all.
  void zero_unwritten_grads();
  // [begin, end) element ranges of the gradients the first backward writes (sorted; cached).
  std::vector<std::pair<int64_t, int64_t>> written_grads;

  // Runs block l (block_forward, attention causal among each sequence's T rows) on resid[l] and
  // writes resid[l+1], keeping block l's activations. With `recompute_only` (backward's replay
  // under Recompute::block) it stops after c_fc: backward recomputes GELU itself and needs
  // neither the MLP output nor resid[l+1].
  // chained: the forward pass's run of the layers, each layer's last residual add fused with the
  // next norm (NormChain); the backward's replays run each layer on its own.
  void layer_forward(int64_t l, int64_t B, int64_t T, bool recompute_only, bool chained = false);
  // Where block l's tensors live (its slots of the arena, the shared scratch).
  BlockTensors tensors(int64_t l) const;
  // Points view at params (and the bf16 copy's matrices in bf16 precision).
  void make_view();
  // write_dense_dw: the first backward of a step (block_backward's).
  void layer_backward(int64_t l, int64_t B, int64_t T, bool write_dense_dw = false);
  // Layer l's rotary table: the local or the global one; null for GPT-2 and layers without RoPE.
  const ops::RopeTable* rope_table(int64_t l) const;
  // Embedding, all blocks and ln_f into lnf (N,C). tokens: on the device; host_tokens: the same
  // on the host (LoRA mode looks the base's rows up there).
  void forward_to_lnf(const int32_t* tokens, const int32_t* host_tokens, int64_t B, int64_t T);
  // out (n,Vp) = lnf rows [r0, r0+n) head^T: the head (tied: the embedding), over the padded
  // vocabulary rows too (zero weights).
  void head_rows(int64_t r0, int64_t n, float* out);
  // The head's weights as the products read them.
  WeightRef head_weight() const;
  void ensure_arena();
  void check_inputs(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) const;
};

}  // namespace tessera::model
