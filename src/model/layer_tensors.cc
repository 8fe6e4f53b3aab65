// The table of a decoder layer's tensors (layer_tensors.h), and the names derived from it.
#include "model/layer_tensors.h"

#include <array>
#include <string_view>

#include "core/error.h"

namespace tessera::model {
namespace {

using K = LayerTensorKind;
using D = LayerDim;
using L = DecoderLayer;
constexpr int8_t kNone = -1;
constexpr int8_t mat(LayerMatrix m) {
  return static_cast<int8_t>(m);
}

// A MoE layer's block in Hugging Face names: Qwen3-MoE's and OLMoE's experts and router live
// under the dense MLP's own "mlp.", Mixtral's under block_sparse_moe.
constexpr std::string_view kHfMlp = "mlp.";
constexpr std::string_view kHfMixtralMoe = "block_sparse_moe.";

// clang-format off
constexpr std::array kTable = {
  //          member             kind       rows       cols     gguf
  //          gguf_experts       hf         hf_gpt2    hf_mixtral  rope  matrix  lora_short
  LayerTensor{&L::attn_norm,      K::norm,   D::C,      D::none, "attn_norm.weight",
              nullptr,           "input_layernorm.weight", "ln_1.weight", nullptr,
              RopeRows::none, kNone, nullptr},
  LayerTensor{&L::attn_norm_b,    K::bias,   D::C,      D::none, "attn_norm.bias",
              nullptr,           nullptr, "ln_1.bias", nullptr, RopeRows::none, kNone, nullptr},
  LayerTensor{&L::wq,             K::matrix, D::Q,      D::C,    "attn_q.weight",
              nullptr,           "self_attn.q_proj.weight", nullptr, nullptr,
              RopeRows::q, mat(LayerMatrix::q), "q"},
  LayerTensor{&L::wk,             K::matrix, D::KV,     D::C,    "attn_k.weight",
              nullptr,           "self_attn.k_proj.weight", nullptr, nullptr,
              RopeRows::kv, mat(LayerMatrix::k), "k"},
  LayerTensor{&L::wv,             K::matrix, D::KV,     D::C,    "attn_v.weight",
              nullptr,           "self_attn.v_proj.weight", nullptr, nullptr,
              RopeRows::none, mat(LayerMatrix::v), "v"},
  LayerTensor{&L::bq,             K::bias,   D::Q,      D::none, "attn_q.bias",
              nullptr,           "self_attn.q_proj.bias", nullptr, nullptr,
              RopeRows::q, kNone, nullptr},
  LayerTensor{&L::bk,             K::bias,   D::KV,     D::none, "attn_k.bias",
              nullptr,           "self_attn.k_proj.bias", nullptr, nullptr,
              RopeRows::kv, kNone, nullptr},
  LayerTensor{&L::bv,             K::bias,   D::KV,     D::none, "attn_v.bias",
              nullptr,           "self_attn.v_proj.bias", nullptr, nullptr,
              RopeRows::none, kNone, nullptr},
  LayerTensor{&L::wo,             K::matrix, D::C,      D::Q,    "attn_output.weight",
              nullptr,           "self_attn.o_proj.weight", "attn.c_proj.weight", nullptr,
              RopeRows::none, mat(LayerMatrix::o), "o"},
  LayerTensor{&L::bo,             K::bias,   D::C,      D::none, "attn_output.bias",
              nullptr,           "self_attn.o_proj.bias", "attn.c_proj.bias", nullptr,
              RopeRows::none, kNone, nullptr},
  LayerTensor{&L::q_norm,         K::norm,   D::q_norm, D::none, "attn_q_norm.weight",
              nullptr,           "self_attn.q_norm.weight", nullptr, nullptr,
              RopeRows::none, kNone, nullptr},
  LayerTensor{&L::k_norm,         K::norm,   D::k_norm, D::none, "attn_k_norm.weight",
              nullptr,           "self_attn.k_norm.weight", nullptr, nullptr,
              RopeRows::none, kNone, nullptr},
  // Hugging Face name: hf_layer_name (Gemma 3's post_attention_layernorm).
  LayerTensor{&L::post_attn_norm, K::norm,   D::C,      D::none, "post_attention_norm.weight",
              nullptr,           nullptr, nullptr, nullptr, RopeRows::none, kNone, nullptr},
  LayerTensor{&L::ffn_norm,       K::norm,   D::C,      D::none, "ffn_norm.weight",
              nullptr,           "post_attention_layernorm.weight", "ln_2.weight", nullptr,
              RopeRows::none, kNone, nullptr},
  LayerTensor{&L::ffn_norm_b,     K::bias,   D::C,      D::none, "ffn_norm.bias",
              nullptr,           nullptr, "ln_2.bias", nullptr, RopeRows::none, kNone, nullptr},
  LayerTensor{&L::post_ffn_norm,  K::norm,   D::C,      D::none, "post_ffw_norm.weight",
              nullptr,           "post_feedforward_layernorm.weight", nullptr, nullptr,
              RopeRows::none, kNone, nullptr},
  LayerTensor{&L::ffn_router,     K::router, D::E,      D::C,    "ffn_gate_inp.weight",
              nullptr,           "mlp.gate.weight", nullptr, nullptr,
              RopeRows::none, kNone, nullptr},
  LayerTensor{&L::w_gate,         K::matrix, D::F,      D::C,    "ffn_gate.weight",
              "ffn_gate_exps.weight", "mlp.gate_proj.weight", nullptr, "w1",
              RopeRows::none, mat(LayerMatrix::gate), "gate"},
  LayerTensor{&L::w_up,           K::matrix, D::F,      D::C,    "ffn_up.weight",
              "ffn_up_exps.weight", "mlp.up_proj.weight", "mlp.c_fc.weight", "w3",
              RopeRows::none, mat(LayerMatrix::up), "up"},
  LayerTensor{&L::b_up,           K::bias,   D::F,      D::none, "ffn_up.bias",
              nullptr,           nullptr, "mlp.c_fc.bias", nullptr, RopeRows::none, kNone, nullptr},
  LayerTensor{&L::w_down,         K::matrix, D::C,      D::F,    "ffn_down.weight",
              "ffn_down_exps.weight", "mlp.down_proj.weight", "mlp.c_proj.weight", "w2",
              RopeRows::none, mat(LayerMatrix::down), "down"},
  LayerTensor{&L::b_down,         K::bias,   D::C,      D::none, "ffn_down.bias",
              nullptr,           nullptr, "mlp.c_proj.bias", nullptr,
              RopeRows::none, kNone, nullptr},
};
// clang-format on

// The Gemma 3 name of the MLP's input norm (hf_layer_name).
constexpr const char* kHfPreFfnNorm = "pre_feedforward_layernorm.weight";

int64_t dim(LayerDim d, const DecoderConfig& c) {
  switch (d) {
    case D::none:
      return 0;
    case D::C:
      return c.d_model;
    case D::F:
      return c.d_ff;
    case D::Q:
      return c.q_dim();
    case D::KV:
      return c.kv_dim();
    case D::E:
      return c.n_experts;
    case D::q_norm:
      return c.qk_norm_whole ? c.q_dim() : c.head_dim;
    case D::k_norm:
      return c.qk_norm_whole ? c.kv_dim() : c.head_dim;
  }
  return 0;
}

// The part of a Hugging Face MLP name after "mlp." (gate_proj.weight, gate.weight).
std::string_view after_mlp(const char* hf) {
  const std::string_view n(hf);
  TS_CHECK(n.starts_with(kHfMlp), "[model] '", n, "' is not an MLP tensor's name");
  return n.substr(kHfMlp.size());
}

}  // namespace

const FusedTensor kFusedQkv{"attn_qkv.weight", "self_attn.qkv_proj.weight", "attn.c_attn.weight"};
const FusedTensor kFusedQkvBias{"attn_qkv.bias", nullptr, "attn.c_attn.bias"};
const FusedTensor kFusedGateUp{nullptr, "mlp.gate_up_proj.weight", nullptr};

std::span<const LayerTensor> layer_tensors() {
  return kTable;
}

const LayerTensor& layer_tensor(WeightRef DecoderLayer::*member) {
  for (const LayerTensor& t : kTable)
    if (t.member == member) return t;
  fail("[model] a DecoderLayer member missing from the layer tensor table");
}

const LayerTensor& layer_tensor(LayerMatrix m) {
  for (const LayerTensor& t : kTable)
    if (t.matrix == static_cast<int8_t>(m)) return t;
  fail("[model] a layer matrix missing from the layer tensor table");
}

Shape layer_tensor_shape(const LayerTensor& t, const DecoderConfig& c) {
  if (t.cols == D::none) return Shape({dim(t.rows, c)});
  return Shape({dim(t.rows, c), dim(t.cols, c)});
}

std::string hf_layer_name(const std::string& p, const LayerTensor& t, const DecoderConfig& c) {
  if (t.member == &L::post_attn_norm) return p + layer_tensor(&L::ffn_norm).hf;
  if (c.post_norms && t.member == &L::ffn_norm) return p + kHfPreFfnNorm;
  if (t.kind == K::router) return hf_router_name(p, hf_moe_is_mixtral(c));
  TS_CHECK(t.hf != nullptr, "[model] layer tensor '", t.gguf, "' has no Hugging Face name");
  return p + t.hf;
}

std::string tensor_module(std::string_view name) {
  std::string_view n = name;
  constexpr std::string_view kWeight = ".weight";
  if (n.ends_with(kWeight)) n.remove_suffix(kWeight.size());
  return std::string(n);
}

std::string gguf_layer_prefix(int64_t i) {
  return cat("blk.", i, ".");
}
std::string hf_layer_prefix(int64_t i) {
  return cat("model.layers.", i, ".");
}
std::string hf_gpt2_layer_prefix(int64_t i) {
  return cat("h.", i, ".");
}

std::string hf_router_name(const std::string& p, bool mixtral) {
  const char* hf = layer_tensor(&L::ffn_router).hf;
  return mixtral ? cat(p, kHfMixtralMoe, after_mlp(hf)) : p + hf;
}

std::string hf_expert_name(const std::string& p, bool mixtral, int64_t e, LayerMatrix m) {
  TS_CHECK(m == LayerMatrix::gate || m == LayerMatrix::up || m == LayerMatrix::down,
           "[model] an expert has gate, up and down matrices only");
  const LayerTensor& t = layer_tensor(m);
  if (mixtral) return cat(p, kHfMixtralMoe, "experts.", e, ".", t.hf_mixtral, ".weight");
  return cat(p, kHfMlp, "experts.", e, ".", after_mlp(t.hf));
}

}  // namespace tessera::model
