// Decoder model writer for Hugging Face folders: config.json (Llama, Qwen2, Qwen3, Gemma 3, GPT-2,
// or Mixtral, Qwen3-MoE and OLMoE keys) and model.safetensors in f32, bf16 or f16, with q/k rows
// in HF's rotate-half order and each expert of a MoE layer as its own tensors.
#include <charconv>
#include <cstring>
#include <list>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/safetensors.h"
#include "model/decoder_save.h"
#include "model/decoder_save_impl.h"
#include "model/layer_tensors.h"

namespace tessera::model {
namespace {

using namespace save_detail;
using nlohmann::json;

// Adds tensors to a SafetensorsWriter in one dtype, holding converted copies until write().
class HfTensorSink {
 public:
  HfTensorSink(formats::SafetensorsWriter& w, DType dtype) : w_(w), dtype_(dtype) {}
  void ref(const std::string& name, const WeightRef& r) {
    if (r.type == dtype_) return w_.add(name, dtype_, r.shape, r.data);
    values(name, r.shape, as_f32(r));
  }
  void values(const std::string& name, const Shape& shape, const std::vector<float>& v) {
    keep_.emplace_back(static_cast<size_t>(dtype_bytes(dtype_, shape.numel())));
    from_f32(dtype_, v.data(), keep_.back().data(), shape.numel());
    w_.add(name, dtype_, shape, keep_.back().data());
  }
  // Rows of r in the order `src` gives (q/k back to rotate-half order).
  void rows(const std::string& name, const WeightRef& r, const std::vector<int64_t>& src) {
    if (r.shape.rank() == 1) {
      std::vector<float> v = as_f32(r);
      const WeightRef f{v.data(), DType::f32, r.shape};
      const std::vector<uint8_t> b = gather_rows(f, src);
      std::memcpy(v.data(), b.data(), b.size());
      return values(name, r.shape, v);
    }
    keep_.push_back(gather_rows(r, src));
    ref(name, WeightRef{keep_.back().data(), r.type, r.shape});
  }

 private:
  formats::SafetensorsWriter& w_;
  DType dtype_;
  std::list<std::vector<uint8_t>> keep_;
};

// The shortest decimal that reads back as the same float (1e-05, not 9.99999974737875e-06).
double float_for_json(float x) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x);
  return std::stod(std::string(buf, res.ptr));
}

const char* torch_dtype_name(DType t) {
  return t == DType::bf16 ? "bfloat16" : t == DType::f16 ? "float16" : "float32";
}

// A mixture of experts (j holds the Llama/Qwen3 keys): OLMoE when q and k are normalized as
// whole vectors, Qwen3-MoE with per-head q/k norms, else Mixtral.
void moe_hf_config(const DecoderConfig& c, bool o_bias, json& j) {
  const std::string arch = c.qk_norm_whole ? "OlmoeForCausalLM"
                           : c.qk_norm     ? "Qwen3MoeForCausalLM"
                                           : "MixtralForCausalLM";
  TS_CHECK(!c.post_norms, "[save] post-norms and experts together are not those of ", arch);
  j["architectures"] = json::array({arch});
  j["num_experts_per_tok"] = c.n_experts_used;
  j.erase("mlp_bias");
  if (arch == "MixtralForCausalLM") {
    TS_CHECK(c.expert_norm,
             "[save] MixtralForCausalLM always renormalizes the chosen experts' "
             "weights; this model does not (OLMoE-style routing)");
    TS_CHECK(!c.qkv_bias && !o_bias, "[save] MixtralForCausalLM has no attention biases");
    j["model_type"] = "mixtral";
    j["num_local_experts"] = c.n_experts;
    j.erase("attention_bias");
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    return;
  }
  TS_CHECK(c.qkv_bias == o_bias, "[save] ", arch, " puts a bias on all of q, k, v, o or on none");
  j["num_experts"] = c.n_experts;
  j["norm_topk_prob"] = c.expert_norm;
  if (arch == "OlmoeForCausalLM") {
    TS_CHECK(c.sliding_window == 0, "[save] OlmoeForCausalLM has no sliding window");
    j["model_type"] = "olmoe";
    j["clip_qkv"] = nullptr;
    j.erase("use_sliding_window");
    return;
  }
  j["model_type"] = "qwen3_moe";
  j.erase("intermediate_size");  // the width of dense layers, of which this model has none
  j["moe_intermediate_size"] = c.d_ff;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = json::array();
}

json llama_hf_config(const DecoderConfig& c, bool o_bias, DType dtype) {
  // Qwen2 carries q/k/v biases without an o bias; Llama's attention_bias puts one on all four.
  // Qwen3 is the model with q/k norms.
  const bool qwen3 = c.qk_norm, qwen2 = !qwen3 && c.qkv_bias && !o_bias;
  json j = {{"architectures",
             {qwen3   ? "Qwen3ForCausalLM"
              : qwen2 ? "Qwen2ForCausalLM"
                      : "LlamaForCausalLM"}},
            {"model_type", qwen3   ? "qwen3"
                           : qwen2 ? "qwen2"
                                   : "llama"},
            {"hidden_size", c.d_model},
            {"intermediate_size", c.d_ff},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"num_key_value_heads", c.n_kv_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab},
            {"max_position_embeddings", c.max_ctx},
            {"rms_norm_eps", float_for_json(c.norm_eps)},
            {"rope_theta", c.rope_theta},
            {"tie_word_embeddings", c.tied_embeddings},
            {"hidden_act", "silu"},
            {"torch_dtype", torch_dtype_name(dtype)},
            {"rope_scaling", nullptr}};
  if (qwen3) {
    TS_CHECK(c.qkv_bias == o_bias, "[save] Qwen3 puts a bias on all of q, k, v, o or on none");
    j["attention_bias"] = o_bias;
    j["use_sliding_window"] = false;
  } else if (!qwen2) {
    j["attention_bias"] = o_bias;
    j["mlp_bias"] = false;
    if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  } else {
    j["use_sliding_window"] = false;
  }
  if (c.post_norms) {  // Gemma 3, the family with post-norms
    TS_CHECK(c.qk_norm && !c.qkv_bias && !o_bias && c.mlp_act == ops::GluAct::gelu_tanh &&
                 !c.local_layers.empty() &&
                 c.embed_scale == std::sqrt(static_cast<float>(c.d_model)),
             "[save] the model's layer options are not those of Gemma3ForCausalLM");
    j["architectures"] = json::array({"Gemma3ForCausalLM"});
    j["model_type"] = "gemma3_text";
    j.erase("hidden_act");
    j.erase("use_sliding_window");
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["attention_bias"] = false;
    const double s = c.score_scale();
    j["query_pre_attn_scalar"] = float_for_json(static_cast<float>(1.0 / (s * s)));
    j["sliding_window"] = c.sliding_window;
    j["rope_local_base_freq"] = c.rope_theta_local;
    json types = json::array();
    for (uint8_t local : c.local_layers)
      types.push_back(local ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    j["final_logit_softcapping"] = nullptr;
    j["attn_logit_softcapping"] = nullptr;
  } else {
    TS_CHECK(c.mlp_act == ops::GluAct::silu && c.local_layers.empty() && c.embed_scale == 1.0f &&
                 c.attn_scale == 0.0,
             "[save] the model's layer options are not those of ",
             j["architectures"][0].get<std::string>());
  }
  if (!c.nope_layers.empty()) {  // SmolLM3, the family with layers without RoPE
    TS_CHECK(
        !c.qk_norm && !c.post_norms && !c.moe() && !c.qkv_bias && !o_bias && c.sliding_window == 0,
        "[save] the model's layer options are not those of SmolLM3ForCausalLM");
    j["architectures"] = json::array({"SmolLM3ForCausalLM"});
    j["model_type"] = "smollm3";
    j["use_sliding_window"] = false;
    json rotates = json::array();
    for (uint8_t nope : c.nope_layers) rotates.push_back(nope ? 0 : 1);
    j["no_rope_layers"] = rotates;
  }
  TS_CHECK(!c.qk_norm_whole || c.moe(),
           "[save] whole-vector q/k norms are OLMoE's; a model without experts has no Hugging "
           "Face architecture with them here");
  if (c.moe()) moe_hf_config(c, o_bias, j);
  if (c.rope_scaling == RopeScaling::linear)
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_factor}};
  if (c.rope_scaling == RopeScaling::llama3)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_max_ctx}};
  if (c.rope_scaling == RopeScaling::yarn)
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", c.rope_factor},
                         {"original_max_position_embeddings", c.rope_original_max_ctx},
                         {"attention_factor", c.rope_attn_factor},
                         {"beta_fast", c.yarn_beta_fast},
                         {"beta_slow", c.yarn_beta_slow}};
  if (c.rope_scaling == RopeScaling::longrope) {
    // Phi-3 keeps the pretrained length at the top level; the attention factor is written out
    // rather than left to transformers' default (from the two lengths' ratio).
    j["original_max_position_embeddings"] = c.rope_original_max_ctx;
    j["rope_scaling"] = {{"rope_type", "longrope"},
                         {"short_factor", c.rope_freq_divisors},
                         {"long_factor", c.rope_long_divisors},
                         {"original_max_position_embeddings", c.rope_original_max_ctx},
                         {"attention_factor", c.rope_attn_factor}};
  }
  if (c.rope_dim != c.head_dim)
    j["partial_rotary_factor"] = static_cast<double>(c.rope_dim) / static_cast<double>(c.head_dim);
  return j;
}

json gpt2_hf_config(const DecoderConfig& c, DType dtype) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_embd", c.d_model},
          {"n_layer", c.n_layers},
          {"n_head", c.n_heads},
          {"n_inner", c.d_ff},
          {"n_positions", c.max_ctx},
          {"n_ctx", c.max_ctx},
          {"vocab_size", c.vocab},
          {"layer_norm_epsilon", float_for_json(c.norm_eps)},
          {"activation_function", "gelu_new"},
          {"tie_word_embeddings", c.tied_embeddings},
          {"torch_dtype", torch_dtype_name(dtype)}};
}

// A MoE layer's router and each expert's matrices as their own tensors (the rows of the stacked
// matrices that are expert e's), named as load_decoder_hf reads them (hf_router_name,
// hf_expert_name; Mixtral's names where moe_hf_config chose Mixtral).
void write_hf_experts(const DecoderConfig& c, const DecoderLayer& l, const std::string& p,
                      HfTensorSink& s, const std::string& path) {
  const int64_t E = c.n_experts;
  require(l.ffn_router, p + "router", path);
  const bool mixtral = hf_moe_is_mixtral(c);
  s.ref(hf_router_name(p, mixtral), l.ffn_router);
  for (int64_t e = 0; e < E; ++e)
    for (LayerMatrix m : {LayerMatrix::gate, LayerMatrix::up, LayerMatrix::down})
      s.ref(hf_expert_name(p, mixtral, e, m), expert_rows(l.*layer_tensor(m).member, e, E));
}

void write_hf_llama(const DecoderModel& m, HfTensorSink& s, bool o_bias, const std::string& path) {
  using L = DecoderLayer;
  const DecoderConfig& c = m.config;
  const bool permute = c.rope_layout == ops::RopeLayout::interleaved;
  const auto q_order = rope_row_source(c.n_heads, c.head_dim, c.rope_dim, false);
  const auto k_order = rope_row_source(c.n_kv_heads, c.head_dim, c.rope_dim, false);
  auto norm = [&](const std::string& name, const WeightRef& r) {
    if (!c.post_norms) return s.ref(name, r);
    std::vector<float> v = as_f32(r);
    for (float& x : v) x -= 1.0f;
    s.values(name, r.shape, v);
  };
  for (size_t i = 0; i < m.weights.layers.size(); ++i) {
    const DecoderLayer& l = m.weights.layers[i];
    const std::string p = hf_layer_prefix(static_cast<int64_t>(i));
    auto name = [&](WeightRef L::*t) { return hf_layer_name(p, layer_tensor(t), c); };
    auto need = [&](WeightRef L::*t) { require(l.*t, tensor_module(name(t)), path); };
    // q and k rows (and biases) back in rotate-half order.
    auto put = [&](WeightRef L::*t) {
      const RopeRows rope = layer_tensor(t).rope;
      if (!permute || rope == RopeRows::none) return s.ref(name(t), l.*t);
      s.rows(name(t), l.*t, rope == RopeRows::q ? q_order : k_order);
    };
    for (WeightRef L::*t : {&L::wq, &L::wk, &L::wv, &L::wo, &L::w_gate, &L::w_up, &L::w_down})
      need(t);
    // Gemma: norms stored as w for a scale of 1 + w (norm). The q/k norms are in rotate-half
    // order (validate): their weights need no permutation.
    std::vector<WeightRef L::*> norms = {&L::attn_norm, &L::ffn_norm};
    if (c.post_norms) norms.insert(norms.end(), {&L::post_attn_norm, &L::post_ffn_norm});
    if (c.qk_norm) norms.insert(norms.end(), {&L::q_norm, &L::k_norm});
    for (WeightRef L::*t : norms) need(t);
    for (WeightRef L::*t : norms) norm(name(t), l.*t);
    for (WeightRef L::*t : {&L::wq, &L::wk, &L::wv, &L::wo}) put(t);
    // HF's attention_bias puts a bias on all four projections: missing ones are written as zeros.
    for (WeightRef L::*t : {&L::bq, &L::bk, &L::bv, &L::bo}) {
      const Shape shape = layer_tensor_shape(layer_tensor(t), c);
      if ((l.*t).present())
        put(t);
      else if (o_bias)
        s.values(name(t), shape, std::vector<float>(static_cast<size_t>(shape.numel())));
    }
    if (c.moe()) {
      write_hf_experts(c, l, p, s, path);
      continue;
    }
    for (WeightRef L::*t : {&L::w_gate, &L::w_up, &L::w_down}) put(t);
  }
  s.ref("model.embed_tokens.weight", m.weights.tok_embd);
  norm("model.norm.weight", m.weights.out_norm);
}

void write_hf_gpt2(const DecoderModel& m, HfTensorSink& s, const std::string& path) {
  using L = DecoderLayer;
  const DecoderConfig& c = m.config;
  const DecoderWeights& w = m.weights;
  const int64_t C = c.d_model;
  require(w.pos_embd, "position embedding", path);
  s.ref("wte.weight", w.tok_embd);
  s.ref("wpe.weight", w.pos_embd);
  // HF's Conv1D stores its weight (in, out), the transpose of ours.
  auto conv1d = [&](const std::string& name, const std::vector<float>& v, int64_t out, int64_t in) {
    s.values(name, Shape({in, out}), transpose(v, out, in));
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayer& l = w.layers[i];
    const std::string p = hf_gpt2_layer_prefix(static_cast<int64_t>(i));
    for (WeightRef L::*t :
         {&L::attn_norm, &L::attn_norm_b, &L::wq, &L::wk, &L::wv, &L::bq, &L::bk, &L::bv, &L::wo,
          &L::bo, &L::ffn_norm, &L::ffn_norm_b, &L::w_up, &L::b_up, &L::w_down, &L::b_down}) {
      const LayerTensor& lt = layer_tensor(t);  // q, k, v: named as GGUF's, being fused
      require(l.*t, p + tensor_module(lt.hf_gpt2 ? lt.hf_gpt2 : lt.gguf), path);
    }
    std::vector<float> qkv, qkv_b;
    for (const WeightRef* r : {&l.wq, &l.wk, &l.wv}) {
      const std::vector<float> v = as_f32(*r);
      qkv.insert(qkv.end(), v.begin(), v.end());
    }
    for (const WeightRef* r : {&l.bq, &l.bk, &l.bv}) {
      const std::vector<float> v = as_f32(*r);
      qkv_b.insert(qkv_b.end(), v.begin(), v.end());
    }
    conv1d(p + kFusedQkv.hf_gpt2, qkv, 3 * C, C);
    s.values(p + kFusedQkvBias.hf_gpt2, Shape({3 * C}), qkv_b);
    for (WeightRef L::*t : {&L::attn_norm, &L::attn_norm_b, &L::wo, &L::bo, &L::ffn_norm,
                            &L::ffn_norm_b, &L::w_up, &L::b_up, &L::w_down, &L::b_down}) {
      const LayerTensor& lt = layer_tensor(t);
      if (lt.kind != LayerTensorKind::matrix) {
        s.ref(p + lt.hf_gpt2, l.*t);
        continue;
      }
      const Shape shape = layer_tensor_shape(lt, c);
      conv1d(p + lt.hf_gpt2, as_f32(l.*t), shape[0], shape[1]);
    }
  }
  require(w.out_norm_b, "ln_f.bias", path);
  s.ref("ln_f.weight", w.out_norm);
  s.ref("ln_f.bias", w.out_norm_b);
}

}  // namespace

void save_decoder_hf(const DecoderModel& m, const std::string& folder, DType dtype,
                     const std::string& tokenizer_json) {
  const DecoderConfig& c = m.config;
  c.validate(folder);
  TS_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, "[save] ", folder,
           ": safetensors dtype must be f32, bf16 or f16, not ", dtype_name(dtype));
  TS_CHECK(static_cast<int64_t>(m.weights.layers.size()) == c.n_layers, "[save] ", folder,
           ": model has ", m.weights.layers.size(), " layers, config says ", c.n_layers);
  // LongRoPE's divisors are its short factors, which config.json holds.
  bool plain_freqs = true;
  for (float d : c.rope_freq_divisors) plain_freqs &= d == 1.0f;
  plain_freqs |= c.rope_scaling == RopeScaling::longrope;
  TS_CHECK(plain_freqs, "[save] ", folder,
           ": the model's per-pair RoPE divisors (GGUF rope_freqs.weight) cannot be expressed "
           "in config.json");
  const DecoderWeights& w = m.weights;
  require(w.tok_embd, "token embedding", folder);
  require(w.out_norm, "output norm", folder);
  bool o_bias = false;
  for (const DecoderLayer& l : w.layers) o_bias |= l.bo.present();
  make_dirs(folder);
  formats::SafetensorsWriter writer;
  writer.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  HfTensorSink sink(writer, dtype);
  json cfg;
  if (c.arch == DecoderArch::gpt2) {
    write_hf_gpt2(m, sink, folder);
    cfg = gpt2_hf_config(c, dtype);
  } else {
    write_hf_llama(m, sink, o_bias, folder);
    cfg = llama_hf_config(c, o_bias, dtype);
  }
  if (!c.tied_embeddings) {
    require(w.output, "output", folder);
    sink.ref("lm_head.weight", w.output);
  }
  cfg["_name_or_path"] = c.name;
  writer.write(folder + "/model.safetensors");
  write_file_atomic(folder + "/config.json", cfg.dump(2) + "\n");
  if (!tokenizer_json.empty()) write_file_atomic(folder + "/tokenizer.json", tokenizer_json);
}

}  // namespace tessera::model
