// The model the trainer trains, GPT-2 or a Llama shape: configuration and presets, one flat
// parameter buffer with a tensor table, and an explicit forward/backward over ops/ (the shared
// decoder layer) with an activation arena planned for (B, T, recompute). The same object serves
// training, evaluation, sampling and tests. In LoRA mode the parameters are adapters on a frozen
// base model whose weights stay in their stored type.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "ops/context.h"
#include "ops/memory.h"

namespace tessera::model {

// The shape of a model to train: GPT-2 (learned positions, LayerNorm, GELU, biases, tied head)
// or the Llama family (RoPE, RMSNorm, SwiGLU, grouped key/value heads, optional q/k/v biases,
// tied or untied head, and the layer options of `options`: Qwen3, SmolLM3, Gemma 3, scaled or
// partial RoPE, mixtures of experts (Mixtral, Qwen3-MoE, OLMoE)). decoder_config() gives the
// inference description of the same model.
struct TrainConfig {
  DecoderArch arch = DecoderArch::gpt2;
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  int64_t n_kv_head = 0;              // Llama: key/value heads (0: n_head)
  int64_t d_ff = 0;                   // MLP width (0: 4 n_embd)
  int64_t vocab_size = 50257;         // real vocabulary V
  int64_t padded_vocab_size = 50304;  // Vp: V rounded up to a multiple of 128 for aligned GEMMs
  int64_t max_seq = 1024;             // positions in wpe (GPT-2), the longest sequence (Llama)
  double rope_theta = 10000.0;        // Llama
  float norm_eps = 1e-5f;             // Llama's RMSNorm (GPT-2's LayerNorm: 1e-5)
  bool tied = true;                   // the head is the token embedding
  bool qkv_bias = false;              // Llama: q/k/v carry biases (Qwen2); GPT-2 always
  // Llama: the q/k rows' rotary order (half: Hugging Face's; interleaved: a GGUF file's).
  ops::RopeLayout rope_layout = ops::RopeLayout::half;
  // Llama: every layer option beyond the shape above (head_dim, q/k norms, RoPE scaling and
  // partial rotary, layers without RoPE, Gemma 3's post-norms, scales, GeGLU and local layers),
  // as inference describes them: a model loaded from a file keeps its whole DecoderConfig here,
  // a preset a default one (none of them). decoder_config() takes everything from it but the
  // fields above, which stay the model's shape; head_dim 0 there means n_embd / n_head, rope_dim
  // 0 head_dim.
  DecoderConfig options;

  // Presets: gpt2-tiny, gpt2-mini, gpt2-small (124M), gpt2-medium, gpt2-large, gpt2-xl, and the
  // Llama shapes llama:tiny, llama:smollm2-135m, llama:smollm2-360m, llama:tinyllama-1.1b.
  // Throws naming the preset if unknown. vocab sets vocab_size and the padded size.
  static TrainConfig preset(const std::string& name, int64_t vocab);
  static int64_t pad_vocab(int64_t v) { return (v + 127) / 128 * 128; }
  void validate() const;  // throws naming the field on a bad size or combination
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t ff() const { return d_ff > 0 ? d_ff : 4 * n_embd; }
  int64_t head_dim() const { return options.head_dim > 0 ? options.head_dim : n_embd / n_head; }
  // The model as the inference engine and the shared layer code describe it.
  DecoderConfig decoder_config() const;
};

enum class Precision { f32, bf16 };
// Which activations a training forward pass keeps for backward. none: all; gelu: all but the
// GELU outputs, recomputed in backward; block: only each block's input, the block replayed in
// backward (largest saving).
enum class Recompute : uint8_t { none, gelu, block };
// Parse a precision or recompute name; throw naming it as `what` (a command line: its flag).
Precision parse_precision(const std::string& s, const std::string& what = "precision");
Recompute parse_recompute(const std::string& s, const std::string& what = "recompute");

class TrainModel {
 public:
  TrainModel(const TrainConfig& cfg, const ops::Context& ctx);
  // LoRA mode: base's weights frozen in their stored type (copied to ctx's device where that is
  // not the CPU), and as the parameters an adapter A (r,K), B (N,r) on each of spec's matrices in
  // every layer, named as PEFT names them (lora.h); config() is base's shape with no vocabulary
  // padding. f32 precision only. Throws naming base.source where the spec does not fit.
  TrainModel(DecoderModel base, const LoraSpec& spec, const ops::Context& ctx);
  ~TrainModel();

  bool is_lora() const;
  const LoraSpec& lora() const;           // rank 0 unless in LoRA mode
  const DecoderModel& lora_base() const;  // LoRA mode's base (host memory); throws otherwise

  const TrainConfig& config() const { return cfg_; }
  // Tensor names follow Hugging Face GPT-2: wte.weight, wpe.weight, h.{i}.ln_1.weight,
  // h.{i}.attn.c_attn.weight, ..., ln_f.weight. Weights are stored (out, in) = (N, K).
  const TensorTable& tensors() const { return table_; }
  int64_t num_params() const { return table_.total_elems(); }
  // The flat parameter and gradient buffers, in the memory of the context's device (host memory
  // on the CPU; ops::HostMirror reads or writes them from the host elsewhere).
  float* params() { return params_.as<float>(); }
  const float* params() const { return params_.as<float>(); }
  // After zero_grads() the gradients read as zero. The zeroing waits for the next
  // forward_backward, whose products write the layers' matrices and the head instead of adding
  // to them (it zeroes the rest: 25 ms of a 1.4 s SmolLM2 step on 2 cores spared, and every
  // matrix's read of its gradient), unless grads() is asked for first.
  float* grads();
  void zero_grads();

  // GPT-2 initialization: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2L), zero
  // biases, unit layernorm weights. LoRA: A uniform in +-1/sqrt(K) (PEFT's default), B zero, so
  // training starts from the base model exactly. Deterministic for a seed.
  void init_weights(uint64_t seed);
  // Elements of t that are not vocabulary padding: the rows of the embedding (and of an untied
  // head) past the vocabulary stay zero.
  int64_t unpadded_elems(const TensorInfo& t) const;
  // Whether AdamW should decay this tensor (matrices and embeddings yes; biases, norms no).
  static bool decays(const TensorInfo& t) { return t.shape.rank() >= 2; }

  // Plans the activation arena for up to (B, T); it is allocated once, at the first step after
  // plan(), so planning alone (e.g. to report memory) commits nothing. Steps never allocate.
  void plan(int64_t B, int64_t T, Precision precision, Recompute recompute);
  size_t activation_bytes() const;

  // Forward pass; tokens and targets are host arrays. With targets, returns the mean
  // cross-entropy (ignoring targets < 0; the head and the loss run a chunk of rows at a time, so
  // the arena holds one chunk's logits); without, returns 0 and leaves logits (B,T,Vp) in the
  // device's memory at logits() (a buffer of its own, allocated by the first such call: not a
  // step's memory).
  float forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // Forward and backward of mean loss * loss_scale, accumulating into grads(). Returns the mean
  // loss (unscaled). loss_scale is 1/grad_accum for gradient accumulation.
  float forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                         float loss_scale);
  const float* logits() const;
  // A mixture of experts: layer l's choices (B T, k) in the last forward (host memory), for
  // diagnostics and for tests that must see the choice hold. Throws if the model has no experts
  // or has not run.
  std::vector<int32_t> expert_choices(int64_t layer) const;

  // Must be called after params() change (optimizer step, load) when precision is bf16: refreshes
  // the bf16 copy of the weight matrices that the GEMMs read.
  void params_updated();

  // Model FLOPs for one token of training (6N + attention), used for MFU.
  double flops_per_token_train(int64_t T) const;

  // Where its ops run (device, threads), as given at construction.
  const ops::Context& context() const { return ctx_; }

 private:
  void allocate_parameters();  // params_ and grads_ for table_, zeroed
  struct Impl;
  TrainConfig cfg_;
  ops::Context ctx_;
  TensorTable table_;
  ops::Buffer params_, grads_;
  bool grads_zero_pending_ = false;  // zero_grads() called, not yet carried out
  std::unique_ptr<Impl> impl_;
};

// Loads a model to train from what the inference loaders read (load_decoder: a GGUF file or a
// Hugging Face folder; GPT-2 or Llama family; f32, f16, bf16 or quantized weights, widened to
// the f32 masters); throws naming the file, field or tensor on any mismatch (plan() refuses a
// sliding window shorter than its sequences, check_lora_spec LoRA on experts' matrices).
std::unique_ptr<TrainModel> load_trainable(const std::string& path, const ops::Context& ctx);

// Checks that training implements what c describes (what it does not is refused by name,
// citing `from`) and returns it as a TrainConfig (vocabulary padded; every layer option kept in
// its `options`).
TrainConfig trainable_config(const DecoderConfig& c, const std::string& from);

// A LoRA model (TrainModel's LoRA mode) on the model at `path` (GGUF or HF folder, any stored
// type), loaded as it is stored.
std::unique_ptr<TrainModel> load_lora_trainable(const std::string& path, const LoraSpec& spec,
                                                const ops::Context& ctx);

// The model as an inference DecoderModel (f32 weights) whose weights view m's parameters: the
// engine runs it without a copy, and save_decoder_hf writes it as a Hugging Face folder
// (model/decoder_save.h; load_trainable reads such a folder back). In LoRA mode: the base model
// (host memory) with its adapters viewing the parameters (save_peft_adapter writes them). m must
// outlive it, and the view sees parameter updates as they happen.
DecoderModel as_decoder(const TrainModel& m);
// The same view into `params`: a flat buffer laid out as m's parameters (a host copy of a
// device's, say), which must outlive the view.
DecoderModel as_decoder(const TrainModel& m, const float* params);

}  // namespace tessera::model
