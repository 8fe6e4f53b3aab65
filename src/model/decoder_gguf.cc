// Loads a decoder model from GGUF: llama.cpp's metadata keys and tensor names for the llama,
// qwen2, qwen3, gemma3, qwen3moe, olmoe, smollm3, phi3 and gpt2 architectures; weights stay in
// their stored type and point into the file.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/decoder.h"
#include "model/layer_tensors.h"

namespace tessera::model {
namespace {

class GgufDecoderReader {
 public:
  GgufDecoderReader(const formats::GgufFile& f, const std::string& arch) : f_(f), arch_(arch) {}

  int64_t get_int(const std::string& key) const { return f_.get_int(arch_ + "." + key); }
  int64_t get_int_or(const std::string& key, int64_t fallback) const {
    return f_.has(arch_ + "." + key) ? get_int(key) : fallback;
  }
  double get_float_or(const std::string& key, double fallback) const {
    const formats::GgufValue* v = f_.find_value(arch_ + "." + key);
    if (!v) return fallback;
    if (const float* x = v->get_if<float>()) return *x;
    if (const double* x = v->get_if<double>()) return *x;
    fail("[gguf] ", f_.path(), ": key '", arch_, ".", key, "' should be a float, is ",
         formats::gguf_type_name(v->type()));
  }

  // Tensor `name` with PyTorch-order shape `expected` (empty: any); absent -> empty ref unless
  // required.
  WeightRef tensor(const std::string& name, const Shape& expected, bool required = true) const {
    const formats::GgufTensorInfo* t = f_.find(name);
    if (!t) {
      TS_CHECK(!required, "[gguf] ", f_.path(), ": missing tensor '", name, "'");
      return {};
    }
    TS_CHECK(t->dtype.has_value(), "[gguf] ", f_.path(), ": tensor '", name, "' has type ",
             t->type_name, ", which the engine cannot compute with");
    const Shape shape = t->shape();
    TS_CHECK(expected.rank() == 0 || shape == expected, "[gguf] ", f_.path(), ": tensor '", name,
             "' has shape ", shape.str(), ", expected ", expected.str());
    TS_CHECK(shape.rank() < 2 || shape[shape.rank() - 1] % traits(*t->dtype).block_elems == 0,
             "[gguf] ", f_.path(), ": tensor '", name, "' rows are not whole blocks");
    used_.insert(name);
    return WeightRef{t->data, *t->dtype, shape};
  }

  // Throws naming the first tensor of the file that no tensor() call read (other than `also`):
  // a model that ran without it would not be the model the file holds.
  void check_all_used(int64_t n_layers, std::initializer_list<const char*> also) const {
    for (const formats::GgufTensorInfo& t : f_.tensors()) {
      if (used_.contains(t.name) || std::find(also.begin(), also.end(), t.name) != also.end())
        continue;
      int64_t block = -1;
      if (t.name.starts_with("blk.")) block = std::atoll(t.name.c_str() + 4);
      if (block >= n_layers)
        fail("[gguf] ", f_.path(), ": tensor '", t.name, "' is not used: ", arch_,
             ".block_count says ", n_layers, " blocks");
      fail("[gguf] ", f_.path(), ": tensor '", t.name, "' is not used by a ", arch_,
           " model as this file's metadata describes it (the engine has no place for it); "
           "refusing to run without it");
    }
  }

 private:
  const formats::GgufFile& f_;
  std::string arch_;
  mutable std::set<std::string> used_;
};

// A mixture-of-experts model's router settings (llama.cpp's expert_* keys): expert_count and
// expert_used_count, the experts' width (expert_feed_forward_length where the file has it,
// Qwen3-MoE), and whether the chosen experts' weights are renormalized (expert_weights_norm, or
// the architecture's rule: yes for Mixtral and Qwen3-MoE, no for OLMoE). What llama.cpp's other
// MoE families add is refused by key.
void read_experts(const formats::GgufFile& f, const GgufDecoderReader& r, const std::string& arch,
                  DecoderConfig* c) {
  c->n_experts = r.get_int_or("expert_count", 0);
  const bool moe_arch = arch == "qwen3moe" || arch == "olmoe";
  if (c->n_experts == 0) {
    TS_CHECK(!moe_arch, "[gguf] ", f.path(), ": ", arch, ".expert_count is missing or 0");
    return;
  }
  TS_CHECK(moe_arch || arch == "llama" || arch == "mistral", "[gguf] ", f.path(), ": ", arch,
           ".expert_count is set; experts are supported for llama (Mixtral), qwen3moe, olmoe");
  c->n_experts_used = r.get_int("expert_used_count");
  c->d_ff = r.get_int_or("expert_feed_forward_length", c->d_ff);
  const std::string norm_key = arch + ".expert_weights_norm";
  c->expert_norm = arch != "olmoe";
  if (f.has(norm_key)) {
    const bool* b = f.find_value(norm_key)->get_if<bool>();
    TS_CHECK(b != nullptr, "[gguf] ", f.path(), ": ", norm_key, " must be a boolean");
    c->expert_norm = *b;
  }
  for (const char* key : {"expert_shared_count", "expert_shared_feed_forward_length",
                          "leading_dense_block_count", "expert_group_count"})
    TS_CHECK(r.get_int_or(key, 0) == 0, "[gguf] ", f.path(), ": ", arch, ".", key,
             " is set; shared experts, dense leading layers and expert groups are not "
             "implemented");
  const double scale = r.get_float_or("expert_weights_scale", 0.0);
  TS_CHECK(scale == 0.0 || scale == 1.0, "[gguf] ", f.path(), ": ", arch,
           ".expert_weights_scale is ", scale, "; scaled expert weights are not implemented");
  TS_CHECK(r.get_int_or("expert_gating_func", 1) == 1, "[gguf] ", f.path(), ": ", arch,
           ".expert_gating_func is not softmax (1); other gating is not implemented");
}

// Gemma 3's options, as llama.cpp reads them: post-norms, GeGLU, embeddings scaled by
// sqrt(width), five local (sliding-window) layers to each global one unless the file lists them
// (attention.sliding_window_pattern), local RoPE base rope.freq_base_swa (10000 if absent), and
// attention scaled by 1/sqrt(head_dim) unless attention.scale says otherwise (llama.cpp's rule for
// the 62-layer 27B model: 1/sqrt(width / heads)). Soft-capping is refused.
void read_gemma3(const formats::GgufFile& f, const GgufDecoderReader& r, DecoderConfig* c) {
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
    TS_CHECK(r.get_float_or(key, 0.0) == 0.0, "[gguf] ", f.path(), ": gemma3.", key,
             " is set; logit soft-capping is not implemented");
  c->post_norms = true;
  c->mlp_act = ops::GluAct::gelu_tanh;
  c->embed_scale = std::sqrt(static_cast<float>(c->d_model));
  c->attn_scale = r.get_float_or("attention.scale", 0.0);
  if (c->attn_scale == 0.0 && c->n_layers == 62)
    c->attn_scale = 1.0 / std::sqrt(static_cast<double>(c->d_model / c->n_heads));
  TS_CHECK(c->sliding_window > 0, "[gguf] ", f.path(),
           ": gemma3.attention.sliding_window is missing or 0");
  c->rope_theta_local = r.get_float_or("rope.freq_base_swa", 10000.0);
  c->local_layers.assign(static_cast<size_t>(c->n_layers), 0);
  const std::string pattern_key = "gemma3.attention.sliding_window_pattern";
  if (f.has(pattern_key)) {
    const formats::GgufArray& a = f.get_array(pattern_key);
    TS_CHECK(static_cast<int64_t>(a.items.size()) == c->n_layers, "[gguf] ", f.path(), ": ",
             pattern_key, " has ", a.items.size(), " entries for ", c->n_layers, " layers");
    for (size_t i = 0; i < a.items.size(); ++i) {
      const bool* b = a.items[i].get_if<bool>();
      TS_CHECK(b != nullptr, "[gguf] ", f.path(), ": ", pattern_key, " must hold booleans");
      c->local_layers[i] = *b ? 1 : 0;
    }
  } else {
    for (int64_t i = 0; i < c->n_layers; ++i) c->local_layers[static_cast<size_t>(i)] = i % 6 < 5;
  }
}

// YaRN as llama.cpp reads it: rope.scaling.factor, the pretrained length
// (rope.scaling.original_context_length, else the context length), cos and sin scaled by
// 0.1 ln(factor) + 1 times rope.scaling.attn_factor. DeepSeek's log multiplier and an
// extrapolation mix other than 1 are refused by key.
void read_yarn(const formats::GgufFile& f, const GgufDecoderReader& r, const std::string& arch,
               DecoderConfig* c) {
  c->rope_scaling = RopeScaling::yarn;
  c->rope_factor = r.get_float_or("rope.scaling.factor", 0.0);
  TS_CHECK(c->rope_factor > 0, "[gguf] ", f.path(), ": ", arch,
           ".rope.scaling.factor must be present and positive for YaRN");
  c->rope_original_max_ctx = r.get_int_or("rope.scaling.original_context_length", c->max_ctx);
  const double log_mul = r.get_float_or("rope.scaling.yarn_log_multiplier", 0.0);
  TS_CHECK(log_mul == 0.0, "[gguf] ", f.path(), ": ", arch, ".rope.scaling.yarn_log_multiplier is ",
           log_mul, " (DeepSeek's attention factor); not implemented");
  const double mix = r.get_float_or("rope.scaling.yarn_ext_factor", 1.0);
  TS_CHECK(mix == 1.0, "[gguf] ", f.path(), ": ", arch, ".rope.scaling.yarn_ext_factor is ", mix,
           "; only 1 is implemented");
  c->yarn_beta_fast = r.get_float_or("rope.scaling.yarn_beta_fast", c->yarn_beta_fast);
  c->yarn_beta_slow = r.get_float_or("rope.scaling.yarn_beta_slow", c->yarn_beta_slow);
  const double mscale = c->rope_factor > 1 ? 0.1 * std::log(c->rope_factor) + 1 : 1.0;
  c->rope_attn_factor = mscale * r.get_float_or("rope.scaling.attn_factor", 1.0);
}

// An f32 tensor of rope_dim / 2 per-pair frequency divisors (rope_freqs, LongRoPE's factors).
std::vector<float> rope_factors(const formats::GgufFile& f, const std::string& name,
                                int64_t rope_dim) {
  const formats::GgufTensorInfo* t = f.find(name);
  TS_CHECK(t && t->ggml_type == formats::GgmlType::f32 && t->n_elements == rope_dim / 2, "[gguf] ",
           f.path(), ": tensor '", name, "' must be present, f32, with rope_dim/2 values");
  std::vector<float> v(static_cast<size_t>(t->n_elements));
  std::memcpy(v.data(), t->data, v.size() * sizeof(float));
  return v;
}

DecoderConfig read_config(const formats::GgufFile& f, const std::string& arch) {
  GgufDecoderReader r(f, arch);
  DecoderConfig c;
  c.arch = arch == "gpt2" ? DecoderArch::gpt2 : DecoderArch::llama;
  c.name = f.has("general.name") ? f.get_string("general.name") : f.path();
  c.n_layers = r.get_int("block_count");
  c.d_model = r.get_int("embedding_length");
  c.d_ff = r.get_int("feed_forward_length");
  c.n_heads = r.get_int("attention.head_count");
  c.n_kv_heads = r.get_int_or("attention.head_count_kv", c.n_heads);
  c.max_ctx = r.get_int("context_length");
  TS_CHECK(c.n_heads > 0, "[gguf] ", f.path(), ": ", arch, ".attention.head_count must be > 0");
  c.head_dim = r.get_int_or("attention.key_length", c.d_model / c.n_heads);
  c.sliding_window = r.get_int_or("attention.sliding_window", 0);
  const formats::GgufTensorInfo* embd = f.find("token_embd.weight");
  TS_CHECK(embd && embd->dims.size() == 2, "[gguf] ", f.path(),
           ": missing 2-D tensor 'token_embd.weight'");
  c.vocab = r.get_int_or("vocab_size", embd->dims[1]);
  if (c.arch == DecoderArch::gpt2) {
    c.norm_eps = static_cast<float>(r.get_float_or("attention.layer_norm_epsilon", 1e-5));
    c.qkv_bias = true;
  } else {
    c.norm_eps = static_cast<float>(r.get_float_or("attention.layer_norm_rms_epsilon", 1e-5));
    c.rope_theta = r.get_float_or("rope.freq_base", 10000.0);
    c.rope_dim = r.get_int_or("rope.dimension_count", c.head_dim);
    // llama.cpp's converter permutes llama q/k rows for the interleaved ("normal") rotation;
    // qwen2 files keep the rotate-half ("neox") order.
    // qwen3 likewise, and RMS-normalizes each head of q and k.
    // gemma3 likewise, with q/k norms too.
    // qwen3moe and olmoe too (olmoe normalizes q and k each as a whole, not per head).
    const bool gemma3 = arch == "gemma3";
    const bool qk_arch = arch == "qwen3" || arch == "qwen3moe" || arch == "olmoe" || gemma3;
    // phi3 too (its q, k, v and gate, up come fused).
    c.rope_layout = arch == "qwen2" || arch == "phi3" || qk_arch ? ops::RopeLayout::half
                                                                 : ops::RopeLayout::interleaved;
    const std::string q_norm = gguf_layer_prefix(0) + layer_tensor(&DecoderLayer::q_norm).gguf;
    c.qk_norm = f.find(q_norm) != nullptr;
    c.qk_norm_whole = arch == "olmoe";
    TS_CHECK(!c.qk_norm || qk_arch, "[gguf] ", f.path(), ": tensor '", q_norm, "' in a ", arch,
             " file (q/k norms are Qwen3's, OLMoE's and Gemma 3's)");
    TS_CHECK(c.qk_norm || !qk_arch, "[gguf] ", f.path(), ": a ", arch, " file without '", q_norm,
             "'");
    read_experts(f, r, arch, &c);
    if (arch == "smollm3")  // llama.cpp's rule (no key): every fourth layer has no RoPE
      for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % 4 == 0);
    if (gemma3) read_gemma3(f, r, &c);
    const std::string scaling_key = arch + ".rope.scaling.type";
    if (f.has(scaling_key)) {
      const std::string& type = f.get_string(scaling_key);
      if (type == "linear") {
        c.rope_scaling = RopeScaling::linear;
        c.rope_factor = r.get_float_or("rope.scaling.factor", 1.0);
      } else if (type == "yarn") {
        read_yarn(f, r, arch, &c);
      } else {
        TS_CHECK(type == "none", "[gguf] ", f.path(), ": ", scaling_key, " '", type,
                 "' is not supported (linear, yarn or none)");
      }
    }
    if (f.has(arch + ".rope.scaling.llama3_factor")) {
      // Our writer keeps Llama 3 scaling as its parameters (next to rope_freqs.weight for
      // llama.cpp), so the model converts back to an HF config exactly.
      c.rope_scaling = RopeScaling::llama3;
      c.rope_factor = r.get_float_or("rope.scaling.llama3_factor", 1.0);
      c.rope_low_freq_factor = r.get_float_or("rope.scaling.low_freq_factor", 1.0);
      c.rope_high_freq_factor = r.get_float_or("rope.scaling.high_freq_factor", 4.0);
      c.rope_original_max_ctx = r.get_int_or("rope.scaling.original_context_length", 8192);
    } else if (f.find("rope_factors_short.weight") || f.find("rope_factors_long.weight")) {
      // LongRoPE (Phi-3.5, Phi-4-mini), as llama.cpp reads it: short factors up to
      // rope.scaling.original_context_length, long ones beyond, cos and sin scaled by
      // rope.scaling.attn_factor.
      c.rope_scaling = RopeScaling::longrope;
      c.rope_original_max_ctx = r.get_int("rope.scaling.original_context_length");
      c.rope_attn_factor = r.get_float_or("rope.scaling.attn_factor", 1.0);
      c.rope_freq_divisors = rope_factors(f, "rope_factors_short.weight", c.rope_dim);
      c.rope_long_divisors = rope_factors(f, "rope_factors_long.weight", c.rope_dim);
    } else if (f.find("rope_freqs.weight")) {
      c.rope_freq_divisors = rope_factors(f, "rope_freqs.weight", c.rope_dim);
    }
    c.qkv_bias = f.find(gguf_layer_prefix(0) + layer_tensor(&DecoderLayer::bq).gguf) != nullptr;
  }
  c.tied_embeddings = f.find("output.weight") == nullptr;
  c.validate(f.path());
  return c;
}

}  // namespace

DecoderModel load_decoder_gguf(const std::string& path, const DecoderLoadOptions& opts) {
  formats::GgufOptions gopts;
  gopts.mmap = opts.mmap;
  auto file = std::make_shared<const formats::GgufFile>(path, gopts);
  const formats::GgufFile& f = *file;
  const std::string& arch = f.get_string("general.architecture");
  TS_CHECK(arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3" ||
               arch == "mistral" || arch == "qwen3moe" || arch == "olmoe" || arch == "smollm3" ||
               arch == "phi3" || arch == "gpt2",
           "[gguf] ", path, ": general.architecture '", arch,
           "' is not supported (llama, qwen2, qwen3, gemma3, mistral, qwen3moe, olmoe, smollm3, "
           "phi3, gpt2)");

  DecoderModel m;
  m.config = read_config(f, arch);
  m.gguf = file;
  m.owners.push_back(file);
  m.source = path;
  const DecoderConfig& c = m.config;
  const int64_t C = c.d_model, F = c.d_ff, Q = c.q_dim(), KV = c.kv_dim();
  GgufDecoderReader r(f, arch);
  DecoderWeights& w = m.weights;
  const bool gpt2 = c.arch == DecoderArch::gpt2;

  w.tok_embd = r.tensor("token_embd.weight", Shape({c.vocab, C}));
  if (gpt2) w.pos_embd = r.tensor("position_embd.weight", Shape({c.max_ctx, C}));
  w.layers.resize(static_cast<size_t>(c.n_layers));
  using L = DecoderLayer;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = gguf_layer_prefix(i);
    DecoderLayer& l = w.layers[static_cast<size_t>(i)];
    auto load = [&](WeightRef L::*m, bool required = true) {
      const LayerTensor& t = layer_tensor(m);
      l.*m = r.tensor(p + t.gguf, layer_tensor_shape(t, c), required);
    };
    load(&L::attn_norm);
    load(&L::ffn_norm);
    load(&L::wo);
    if (c.moe()) {  // the experts' matrices stacked, (E, F, C) seen as (E F, C)
      const int64_t E = c.n_experts;
      load(&L::ffn_router);
      for (WeightRef L::*m : {&L::w_gate, &L::w_up, &L::w_down}) {
        const LayerTensor& t = layer_tensor(m);
        const Shape each = layer_tensor_shape(t, c);
        WeightRef s = r.tensor(p + t.gguf_experts, Shape({E, each[0], each[1]}));
        s.shape = Shape({E * each[0], each[1]});
        l.*m = s;
      }
    } else if (arch == "phi3") {  // ffn_up holds the gate's rows, then the up rows
      const WeightRef gate_up = r.tensor(p + layer_tensor(&L::w_up).gguf, Shape({2 * F, C}));
      l.w_gate = row_slice(gate_up, 0, F);
      l.w_up = row_slice(gate_up, F, F);
      load(&L::w_down);
    } else {
      load(&L::w_up);
      load(&L::w_down);
    }
    if (gpt2) {
      load(&L::attn_norm_b);
      load(&L::ffn_norm_b);
      const WeightRef qkv = r.tensor(p + kFusedQkv.gguf, Shape({3 * C, C}));
      const WeightRef qkv_b = r.tensor(p + kFusedQkvBias.gguf, Shape({3 * C}));
      split_qkv(qkv, C, C, &l.wq, &l.wk, &l.wv);
      split_qkv(qkv_b, C, C, &l.bq, &l.bk, &l.bv);
      load(&L::bo);
      load(&L::b_up);
      load(&L::b_down);
    } else {
      if (f.find(p + kFusedQkv.gguf)) {  // phi3's fused q, k, v
        const WeightRef qkv = r.tensor(p + kFusedQkv.gguf, Shape({Q + 2 * KV, C}));
        split_qkv(qkv, Q, KV, &l.wq, &l.wk, &l.wv);
      } else {
        load(&L::wq);
        load(&L::wk);
        load(&L::wv);
      }
      if (!c.moe() && arch != "phi3") load(&L::w_gate);
      load(&L::bo, false);  // Llama attention_bias
      if (c.qk_norm) {
        load(&L::q_norm);
        load(&L::k_norm);
      }
      if (c.post_norms) {
        load(&L::post_attn_norm);
        load(&L::post_ffn_norm);
      }
      if (c.qkv_bias) {
        load(&L::bq);
        load(&L::bk);
        load(&L::bv);
      }
    }
    // Norm weights and biases are used as f32 vectors by the kernels.
    for (const WeightRef* v : l.vectors())
      TS_CHECK(!v->present() || v->type == DType::f32, "[gguf] ", path, ": ", p,
               " norm/bias tensors must be F32 (got ", dtype_name(v->type), ")");
  }
  w.out_norm = r.tensor("output_norm.weight", Shape({C}));
  if (gpt2) w.out_norm_b = r.tensor("output_norm.bias", Shape({C}));
  TS_CHECK(
      w.out_norm.type == DType::f32 && (!w.out_norm_b.present() || w.out_norm_b.type == DType::f32),
      "[gguf] ", path, ": output_norm must be F32");
  w.output = c.tied_embeddings ? w.tok_embd : r.tensor("output.weight", Shape({c.vocab, C}));
  // rope_freqs.weight was checked by read_config (or stands beside the Llama 3 keys it follows).
  r.check_all_used(c.n_layers,
                   {"rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight"});
  if (f.has("tokenizer.ggml.tokens")) {
    const size_t n_tokens = f.get_array("tokenizer.ggml.tokens").items.size();
    TS_CHECK(static_cast<int64_t>(n_tokens) == c.vocab, "[gguf] ", path,
             ": tokenizer.ggml.tokens has ", n_tokens, " tokens but the model's vocabulary (",
             "token_embd.weight's rows) is ", c.vocab);
  }
  if (opts.cpu_layout && !opts.mmap) use_cpu_layout(m);
  return m;
}

}  // namespace tessera::model
