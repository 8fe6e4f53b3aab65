// Decoder-only transformers for inference (Llama family and GPT-2) as one description: the
// configuration, and weights that stay in their stored type (f32/f16/bf16/q8_0/q4_0/q4_1/q4_k/
// q6_k), usually pointing straight into a memory-mapped GGUF or safetensors file.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace tessera::formats {
class GgufFile;
}  // namespace tessera::formats

namespace tessera::model {

enum class DecoderArch : uint8_t {
  llama,  // RMSNorm, RoPE, gated MLP, GQA; covers Llama 1-3, SmolLM2, Mistral, Qwen2 (q/k/v
          // bias), Qwen3 (q/k norms), Gemma 3 (q/k norms, post-norms, GeGLU, local layers),
          // SmolLM3 (layers without RoPE), Mixtral, Qwen3-MoE and OLMoE (experts)
  gpt2,   // LayerNorm with bias, learned positions, GELU MLP, biases everywhere
};

// Rotary frequency scaling (HF config.json rope_scaling / GGUF <arch>.rope.scaling.*).
enum class RopeScaling : uint8_t { none, linear, llama3, longrope, yarn };

// Every field is also listed in the training checkpoint's record of it (train/checkpoint.cc).
struct DecoderConfig {
  DecoderArch arch = DecoderArch::llama;
  std::string name;        // free text (general.name or the folder)
  int64_t n_layers = 0;    // L
  int64_t d_model = 0;     // C
  int64_t n_heads = 0;     // H
  int64_t n_kv_heads = 0;  // Hkv; H % Hkv == 0
  int64_t head_dim = 0;    // D (usually C / H)
  int64_t d_ff = 0;        // F
  int64_t vocab = 0;       // V (rows of the embedding and of the output head)
  int64_t max_ctx = 0;     // positions the model was trained for
  float norm_eps = 1e-5f;
  // RoPE (llama): rotary_dim <= head_dim; layout half for HF tensors, interleaved for GGUF
  // llama tensors (llama.cpp's converter permutes q/k rows for it).
  double rope_theta = 10000.0;
  int64_t rope_dim = 0;
  ops::RopeLayout rope_layout = ops::RopeLayout::half;
  RopeScaling rope_scaling = RopeScaling::none;
  double rope_factor = 1.0;              // linear, llama3 and yarn
  double rope_low_freq_factor = 1.0;     // llama3
  double rope_high_freq_factor = 4.0;    // llama3
  int64_t rope_original_max_ctx = 8192;  // llama3, longrope and yarn: the pretrained length
  // YaRN (Qwen2.5/Qwen3 long context): pairs turning fewer than yarn_beta_slow times over the
  // pretrained length are slowed by rope_factor, pairs turning more than yarn_beta_fast times
  // are kept, the band between blended linearly in the pair index; cos and sin are scaled by
  // rope_attn_factor (0.1 ln(factor) + 1 unless a file says otherwise).
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  // Per-pair divisors of the inverse frequencies (GGUF rope_freqs.weight, as Llama 3.1 files
  // carry their scaling); empty when absent. LongRoPE (Phi-3.5, Phi-4-mini): these are its
  // short factors, for runs sized up to rope_original_max_ctx positions, and
  // rope_long_divisors are for longer ones (rope_inv_freqs picks by the run's context, as
  // llama.cpp does); cos and sin are scaled by rope_attn_factor.
  std::vector<float> rope_freq_divisors;
  std::vector<float> rope_long_divisors;
  double rope_attn_factor = 1.0;
  // Each position attends to at most this many most recent positions, itself included
  // (Mistral 7B v0.1: 4096); 0: all earlier positions.
  int64_t sliding_window = 0;
  bool tied_embeddings = false;  // output head = token embedding
  bool qkv_bias = false;         // q/k/v projections carry a bias (Qwen2, GPT-2)
  // Each head of q and of k is RMS-normalized (weights q_norm, k_norm of head_dim) before RoPE
  // (Qwen3); its files keep the rotate-half row order.
  bool qk_norm = false;
  // Gemma 3. Each branch's output is RMS-normalized (weights post_attn_norm, post_ffn_norm)
  // before it joins the stream; the MLP's gate goes through mlp_act; looked-up embedding rows
  // are multiplied by embed_scale (sqrt(d_model)); attention scores by attn_scale (0:
  // 1/sqrt(head_dim)). Layers marked in local_layers attend over the last sliding_window
  // positions and rotate with rope_theta_local, unscaled; the others attend over every earlier
  // position with rope_theta and the rope scaling. Empty local_layers: every layer is alike
  // (sliding_window, if set, applies to all).
  bool post_norms = false;
  ops::GluAct mlp_act = ops::GluAct::silu;
  float embed_scale = 1.0f;
  double attn_scale = 0.0;
  std::vector<uint8_t> local_layers;  // (n_layers) 1: local, or empty
  double rope_theta_local = 10000.0;
  // Layers marked here apply no rotary embedding to q and k (SmolLM3: every fourth layer);
  // empty: every layer rotates.
  std::vector<uint8_t> nope_layers;  // (n_layers) 1: no RoPE, or empty
  // q and k each RMS-normalized as one vector of q_dim / kv_dim (OLMoE) instead of per head
  // (qk_norm must be set too; q_norm (q_dim), k_norm (kv_dim)).
  bool qk_norm_whole = false;
  // Mixture of experts (Mixtral, Qwen3-MoE, OLMoE): every layer's MLP is n_experts SwiGLU experts
  // of width d_ff, stored stacked (w_gate, w_up (n_experts * d_ff, C), w_down (n_experts * C,
  // d_ff): expert e's rows start at e * d_ff, e * C), of which the router (ffn_router (n_experts,
  // C)) picks n_experts_used for each token (ops::moe_route; expert_norm: the chosen experts'
  // probabilities renormalized to sum to 1). 0 experts: a dense MLP.
  int64_t n_experts = 0;
  int64_t n_experts_used = 0;
  bool expert_norm = true;

  bool moe() const { return n_experts > 0; }
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Whether layer l is a local (sliding-window) layer of a model that mixes them.
  bool local(int64_t l) const {
    return !local_layers.empty() && local_layers[static_cast<size_t>(l)] != 0;
  }
  // Whether layer l rotates q and k (RoPE).
  bool rotary(int64_t l) const {
    return nope_layers.empty() || nope_layers[static_cast<size_t>(l)] == 0;
  }
  // The window layer l attends over (0: every earlier position).
  int64_t window(int64_t l) const { return local_layers.empty() || local(l) ? sliding_window : 0; }
  // The scale of the attention scores.
  float score_scale() const {
    return attn_scale > 0 ? static_cast<float>(attn_scale)
                          : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  // Throws Error naming the field when a value is missing, non-positive or inconsistent.
  void validate(const std::string& source) const;
};

// Per-pair inverse frequencies of RoPE after scaling (rope_dim / 2 values); local: those of the
// local layers (rope_theta_local, no scaling). ctx: the positions a run is sized for (LongRoPE
// takes its long factors beyond rope_original_max_ctx; 0: the short ones).
std::vector<double> rope_inv_freqs(const DecoderConfig& cfg, bool local = false, int64_t ctx = 0);

// A weight matrix or vector in its stored type. Matrices are (rows, cols) row-major with cols
// the input dimension (y = x W^T), so each row is a whole number of quant blocks.
struct WeightRef {
  const void* data = nullptr;
  DType type = DType::f32;
  Shape shape;  // (rows, cols) or (n)
  bool present() const { return data != nullptr; }
  int64_t rows() const { return shape.rank() == 2 ? shape[0] : 1; }
  int64_t cols() const { return shape[shape.rank() - 1]; }
  int64_t bytes() const { return dtype_bytes(type, shape.numel()); }
  // Whether next starts in memory where this ends, with this type and rank (and row width): next
  // continues this as more rows of one stored matrix, or more elements of one vector (GPT-2's
  // c_attn seen as q, k and v).
  bool continued_by(const WeightRef& next) const {
    const int r = shape.rank();
    return present() && next.present() && next.type == type && next.shape.rank() == r &&
           (r == 1 || (r == 2 && next.cols() == cols())) &&
           next.data == static_cast<const uint8_t*>(data) + bytes();
  }
};

// Rows [row0, row0 + rows) of a matrix (elements of a vector), as a view.
WeightRef row_slice(const WeightRef& w, int64_t row0, int64_t rows);
// q (q_rows), k and v (kv_rows each) as consecutive row blocks of one fused matrix or vector
// (GPT-2's attn_qkv / c_attn, Phi-3's attn_qkv / qkv_proj).
void split_qkv(const WeightRef& fused, int64_t q_rows, int64_t kv_rows, WeightRef* q, WeightRef* k,
               WeightRef* v);
// Expert e of a MoE layer's stacked matrix (its rows / n_experts rows from e's).
WeightRef expert_rows(const WeightRef& stacked, int64_t e, int64_t n_experts);

// A low-rank adapter (LoRA) on one matrix W (N,K): the product x W^T becomes
// x W^T + scale (x A^T) B^T, with A (r,K) and B (N,r) in f32 and scale = alpha / r.
struct LoraRef {
  WeightRef a, b;
  float scale = 0.0f;
  bool present() const { return a.present(); }
  int64_t rank() const { return a.rows(); }
};

// The seven matrices of a layer, in the order of DecoderLayer::matrices() and ::lora.
enum class LayerMatrix : uint8_t { q, k, v, o, gate, up, down };
inline constexpr int kLayerMatrices = 7;

// Hugging Face's names of a MoE layer's tensors, the layer's prefix p ("model.layers.{i}.")
// first: the router (hf_router_name) and expert e's gate, up or down matrix (hf_expert_name; m
// one of those three). Mixtral's are block_sparse_moe.gate.weight and
// block_sparse_moe.experts.{e}.w1 (gate), w3 (up), w2 (down); Qwen3-MoE's and OLMoE's
// mlp.gate.weight and mlp.experts.{e}.gate_proj, up_proj, down_proj. The loader, the writer and
// the training model's tensor table all name them through these.
std::string hf_router_name(const std::string& p, bool mixtral);
std::string hf_expert_name(const std::string& p, bool mixtral, int64_t e, LayerMatrix m);
// Whether a MoE model writes Mixtral's names: the writer's choice of architecture (Qwen3-MoE and
// OLMoE have q/k norms, Mixtral none).
inline bool hf_moe_is_mixtral(const DecoderConfig& c) {
  return !c.qk_norm;
}

// Every tensor member is in the table of model/layer_tensors.h once, with its names in GGUF and
// Hugging Face files, its kind and its shape; a new member goes there too.
struct DecoderLayer {
  WeightRef attn_norm, attn_norm_b;         // (C); _b gpt2 only
  WeightRef wq, wk, wv, wo;                 // (q_dim,C) (kv_dim,C) (kv_dim,C) (C,q_dim)
  WeightRef bq, bk, bv, bo;                 // optional biases
  WeightRef ffn_norm, ffn_norm_b;           // (C)
  WeightRef w_gate, w_up, w_down;           // (F,C) (F,C) (C,F); gate absent for gpt2;
                                            // MoE: the experts' stacked (DecoderConfig)
  WeightRef b_up, b_down;                   // gpt2 biases of fc and proj
  WeightRef q_norm, k_norm;                 // (head_dim) per-head norms of q and k (qk_norm only)
  WeightRef post_attn_norm, post_ffn_norm;  // (C) norms of the branches' outputs (post_norms)
  WeightRef ffn_router;                     // (n_experts, C) the MoE router (moe() only), f32

  // Adapters on the matrices, indexed by LayerMatrix; absent unless a LoRA adapter is applied
  // (model/lora.h).
  std::array<LoraRef, kLayerMatrices> lora;

  // The seven matrices, for the loops that treat them alike (w_gate not present for gpt2).
  std::array<WeightRef*, kLayerMatrices> matrices() {
    return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down};
  }
  std::array<const WeightRef*, kLayerMatrices> matrices() const {
    return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down};
  }
  // The vectors (norms, biases, q/k norms, post-norms; each absent where the family has none),
  // for the loops that treat them alike: f32 checks, conversion, upload, counting.
  // The router is kept with them: a small f32 matrix read whole by every token.
  static constexpr int kVectors = 15;
  std::array<WeightRef*, kVectors> vectors() {
    return {&attn_norm,
            &attn_norm_b,
            &ffn_norm,
            &ffn_norm_b,
            &bq,
            &bk,
            &bv,
            &bo,
            &b_up,
            &b_down,
            &q_norm,
            &k_norm,
            &post_attn_norm,
            &post_ffn_norm,
            &ffn_router};
  }
  std::array<const WeightRef*, kVectors> vectors() const {
    return {&attn_norm,
            &attn_norm_b,
            &ffn_norm,
            &ffn_norm_b,
            &bq,
            &bk,
            &bv,
            &bo,
            &b_up,
            &b_down,
            &q_norm,
            &k_norm,
            &post_attn_norm,
            &post_ffn_norm,
            &ffn_router};
  }
  const LoraRef& adapter(LayerMatrix m) const { return lora[static_cast<size_t>(m)]; }
  bool has_adapters() const {
    for (const LoraRef& a : lora)
      if (a.present()) return true;
    return false;
  }
};

struct DecoderWeights {
  WeightRef tok_embd;  // (V, C)
  WeightRef pos_embd;  // (max_ctx, C), gpt2 only
  std::vector<DecoderLayer> layers;
  WeightRef out_norm, out_norm_b;  // (C)
  WeightRef output;                // (V, C); equals tok_embd when tied
};

// A loaded model: configuration, weights and whatever owns their bytes (mapped files, buffers).
struct DecoderModel {
  DecoderConfig config;
  DecoderWeights weights;
  std::vector<std::shared_ptr<const void>> owners;  // keep mapped files / buffers alive
  std::shared_ptr<const formats::GgufFile> gguf;    // set when loaded from GGUF (tokenizer source)
  std::string source;                               // path it was loaded from

  // Bytes of all weights a decode step of one token reads (every matrix and vector once; the
  // embedding table counts one row, as only one row per token is read; of a MoE layer's experts,
  // n_experts_used).
  int64_t weight_bytes_per_token() const;
  int64_t total_weight_bytes() const;
};

struct DecoderLoadOptions {
  // GGUF: map the file instead of reading it into memory (see ARCHITECTURE.md section 2: on
  // these VMs mapped weights can be dropped from the page cache and fault back in every token).
  bool mmap = false;
  // For the CPU engine: rearrange q4_0 / q4_1 / q8_0 / f16 matrices into the CPU matmul's
  // preferred layout (use_cpu_layout) once, after reading. Not with mmap (the mapping is
  // read-only); the CUDA engine and the file writers take the plain layouts.
  bool cpu_layout = false;
};

// Rearranges, in place, every matrix of m that ops::cpu_preferred_layout would read faster in
// another layout (q4_0 / q4_1 / q8_0 into q4_0x8 / q4_1x8 / q8_0x8, f16 into f16x16, where the
// AVX2 kernels run),
// and retypes its WeightRef. The token embedding is included (the engine looks its rows up with
// ops::dequantize_row, which reads every layout); a matrix sharing its bytes, such as a tied
// head, takes the new type without being rearranged twice. m must own writable weight bytes (a
// GGUF read into memory, a synthetic model); a GGUF's own tensor views of the rearranged bytes
// are stale afterwards. Returns the bytes rearranged.
int64_t use_cpu_layout(DecoderModel& m);

// Loads a GGUF file (general.architecture llama, qwen2, gpt2, ...); weights point into it.
DecoderModel load_decoder_gguf(const std::string& path, const DecoderLoadOptions& opts = {});
// Loads a Hugging Face folder: config.json, model.safetensors or model.safetensors.index.json
// with its shards (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// Gemma3ForCausalLM, GPT2LMHeadModel, and the mixtures of experts MixtralForCausalLM,
// Qwen3MoeForCausalLM and OlmoeForCausalLM, whose per-expert tensors are copied into the stacked
// matrices).
DecoderModel load_decoder_hf(const std::string& folder);
// Either of the above, chosen by whether `path` is a directory.
DecoderModel load_decoder(const std::string& path, const DecoderLoadOptions& opts = {});

}  // namespace tessera::model
