// The one table of a decoder layer's tensors by role: the DecoderLayer member, its names in GGUF
// and Hugging Face files, its kind and shape. Loaders, writers, the quantizer, the training
// model's parameter table and LoRA all take a layer tensor's names from here.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "model/decoder.h"

namespace tessera::model {

enum class LayerTensorKind : uint8_t { norm, bias, matrix, router };

// A dimension of a layer tensor's shape, resolved against a DecoderConfig (layer_tensor_shape).
enum class LayerDim : uint8_t {
  none,    // vectors have no second dimension
  C,       // d_model
  F,       // d_ff (of one expert in a MoE layer)
  Q,       // q_dim
  KV,      // kv_dim
  E,       // n_experts
  q_norm,  // head_dim, or q_dim for whole-vector q/k norms (OLMoE)
  k_norm,  // head_dim, or kv_dim
};

// Which heads a tensor's rows belong to where the RoPE layout reorders them (GGUF's llama files
// store q and k rows permuted for interleaved rotation).
enum class RopeRows : uint8_t { none, q, kv };

struct LayerTensor {
  WeightRef DecoderLayer::*member;
  LayerTensorKind kind;
  LayerDim rows, cols;       // (rows, cols) of a matrix, (rows) of a vector; per expert for stacks
  const char* gguf;          // llama.cpp's name after "blk.{i}."
  const char* gguf_experts;  // a MoE layer's stacked experts (one 3-D tensor), or nullptr
  const char* hf;            // Llama-family name after "model.layers.{i}." (nullptr: none)
  const char* hf_gpt2;       // GPT-2's name after "h.{i}." (nullptr: fused into c_attn, or none)
  const char* hf_mixtral;    // Mixtral's module of each expert (w1, w3, w2), or nullptr
  RopeRows rope;
  int8_t matrix;           // LayerMatrix of the seven matrices, else -1
  const char* lora_short;  // LoRA's target name of a matrix ("q", ..., "down"), else nullptr
};

// Every tensor of a layer, once, in the training model's (Hugging Face's) parameter order: the
// order in which its table, the GPT-2 layout included, lays the tensors out.
std::span<const LayerTensor> layer_tensors();
// The entry of a member, or of one of the seven matrices.
const LayerTensor& layer_tensor(WeightRef DecoderLayer::*member);
const LayerTensor& layer_tensor(LayerMatrix m);

// The entry's shape in a model of config c (one expert's for a MoE layer's stacks).
Shape layer_tensor_shape(const LayerTensor& t, const DecoderConfig& c);

// The entry's Hugging Face name in a Llama-family layer with prefix p ("model.layers.{i}.") of a
// model of config c. Gemma 3 (post_norms) calls the attention's post-norm
// post_attention_layernorm, the name the other families give the MLP's input norm, whose name
// then becomes pre_feedforward_layernorm. The router is named as hf_router_name says (a MoE
// layer's experts have a name each: hf_expert_name).
std::string hf_layer_name(const std::string& p, const LayerTensor& t, const DecoderConfig& c);
// Whether a MoE layer keeps the entry as its experts' stacked matrices (gate, up, down).
inline bool expert_stack(const LayerTensor& t) {
  return t.gguf_experts != nullptr;
}
// The name without its ".weight" (quantizer statistics, PEFT module names).
std::string tensor_module(std::string_view name);

// Tensors some files hold fused, as consecutive row blocks of one tensor: q, k and v (GPT-2's
// c_attn, Phi-3's qkv_proj and GGUF attn_qkv) and their biases (GPT-2), Phi-3's gate and up
// (GGUF keeps them under ffn_up's own name). nullptr: no file holds that fusion under that name.
struct FusedTensor {
  const char* gguf;
  const char* hf;
  const char* hf_gpt2;
};
extern const FusedTensor kFusedQkv, kFusedQkvBias, kFusedGateUp;

// The layer prefix of each naming scheme, for layer i.
std::string gguf_layer_prefix(int64_t i);
std::string hf_layer_prefix(int64_t i);
std::string hf_gpt2_layer_prefix(int64_t i);

}  // namespace tessera::model
