// Loads a Hugging Face decoder folder (config.json + model.safetensors or a sharded index) into
// a DecoderModel: Llama/Mistral/Qwen2/Qwen3/Gemma 3/SmolLM3/Phi-3 and GPT-2 tensor names, GPT-2's
// Conv1D transposes, Phi-3's fused projections, and the mixtures of experts (Mixtral, Qwen3-MoE,
// OLMoE), whose per-expert tensors are stacked into one matrix each. The rotary settings are
// read by model/hf_rope.cc.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/safetensors.h"
#include "model/decoder.h"
#include "model/hf_config.h"
#include "model/layer_tensors.h"

namespace tessera::model {
namespace {

using hf_detail::ConfigFields;
using hf_detail::read_rope;
using nlohmann::json;

json read_json(const std::string& path) {
  TS_CHECK(file_exists(path), "[hf] ", path, ": file not found");
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail("[hf] ", path, ": not valid JSON: ", e.what());
  }
  TS_CHECK(j.is_object(), "[hf] ", path, ": must be a JSON object");
  return j;
}

// The architecture named by config.json: architectures[0], else model_type.
std::string hf_architecture(const json& j, const std::string& path) {
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    return j["architectures"][0].get<std::string>();
  TS_CHECK(j.contains("model_type") && j["model_type"].is_string(), "[hf] ", path,
           ": missing field 'architectures' (and no 'model_type')");
  const std::string t = j["model_type"].get<std::string>();
  if (t == "llama") return "LlamaForCausalLM";
  if (t == "mistral") return "MistralForCausalLM";
  if (t == "qwen2") return "Qwen2ForCausalLM";
  if (t == "qwen3") return "Qwen3ForCausalLM";
  if (t == "gemma3_text") return "Gemma3ForCausalLM";
  if (t == "gpt2") return "GPT2LMHeadModel";
  if (t == "mixtral") return "MixtralForCausalLM";
  if (t == "qwen3_moe") return "Qwen3MoeForCausalLM";
  if (t == "olmoe") return "OlmoeForCausalLM";
  if (t == "smollm3") return "SmolLM3ForCausalLM";
  if (t == "phi3") return "Phi3ForCausalLM";
  fail("[hf] ", path, ": field 'model_type' is \"", t,
       "\", not llama, mistral, qwen2, qwen3, gemma3_text, gpt2, mixtral, qwen3_moe, olmoe, "
       "smollm3 or phi3");
}

// SmolLM3's layers without RoPE: no_rope_layers (per layer, 1: the layer rotates), or else
// every no_rope_layer_interval-th layer (default 4) without, as transformers builds the list.
void read_nope_layers(const ConfigFields& f, DecoderConfig* c) {
  if (f.has("no_rope_layers") && !f.at("no_rope_layers").is_null()) {
    const json& a = f.at("no_rope_layers");
    TS_CHECK(a.is_array() && static_cast<int64_t>(a.size()) == c->n_layers, "[hf] ", f.path(),
             ": field 'no_rope_layers' must list one 0 or 1 per layer (", c->n_layers, ")");
    for (const json& v : a) {
      TS_CHECK(v.is_number_integer() && (v == 0 || v == 1), "[hf] ", f.path(),
               ": field 'no_rope_layers' holds ", v.dump(), ", not 0 or 1");
      c->nope_layers.push_back(v == 0 ? 1 : 0);
    }
    return;
  }
  const int64_t every = f.get_int_or("no_rope_layer_interval", 4);
  TS_CHECK(every > 0, "[hf] ", f.path(), ": field 'no_rope_layer_interval' must be positive");
  for (int64_t l = 0; l < c->n_layers; ++l) c->nope_layers.push_back((l + 1) % every == 0);
}

DecoderConfig llama_config(const ConfigFields& f, const std::string& arch) {
  DecoderConfig c;
  c.arch = DecoderArch::llama;
  c.d_model = f.get_int("hidden_size");
  // Qwen3-MoE's intermediate_size is the width of dense layers it may mix in (refused); its
  // experts' width is moe_intermediate_size.
  c.d_ff = f.get_int(arch == "Qwen3MoeForCausalLM" ? "moe_intermediate_size" : "intermediate_size");
  c.n_layers = f.get_int("num_hidden_layers");
  c.n_heads = f.get_int("num_attention_heads");
  c.n_kv_heads = f.get_int_or("num_key_value_heads", c.n_heads);
  TS_CHECK(c.n_heads % c.n_kv_heads == 0, "[hf] ", f.path(), ": field 'num_key_value_heads' (",
           c.n_kv_heads, ") does not divide 'num_attention_heads' (", c.n_heads, ")");
  TS_CHECK(f.has("head_dim") || c.d_model % c.n_heads == 0, "[hf] ", f.path(),
           ": field 'hidden_size' is not a multiple of 'num_attention_heads' and no 'head_dim'");
  c.head_dim = f.get_int_or("head_dim", c.d_model / c.n_heads);
  c.vocab = f.get_int("vocab_size");
  c.max_ctx = f.get_int("max_position_embeddings");
  c.norm_eps = static_cast<float>(f.get_float_or("rms_norm_eps", 1e-6));
  c.rope_dim = c.head_dim;
  c.rope_layout = ops::RopeLayout::half;
  c.tied_embeddings = f.get_bool_or("tie_word_embeddings", false);
  // Mistral 7B v0.1 attends over a 4096-token window (later Mistrals set it to null). Qwen2
  // carries a window it does not use unless use_sliding_window, and then only on some layers.
  const bool qwen =
      arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  // OLMoE has no sliding window.
  if (arch != "Gemma3ForCausalLM" && arch != "OlmoeForCausalLM" &&
      f.get_bool_or("use_sliding_window", !qwen) && f.has("sliding_window") &&
      !f.at("sliding_window").is_null()) {
    TS_CHECK(!qwen, "[hf] ", f.path(),
             ": 'use_sliding_window' is true; Qwen's per-layer sliding window is not supported");
    c.sliding_window = f.get_int("sliding_window");
  }
  // Qwen2 always has q/k/v biases (and none on o); Llama's attention_bias (and Qwen3's) puts one
  // on all four. Qwen3 normalizes each head of q and k.
  c.qkv_bias = arch == "Qwen2ForCausalLM" || f.get_bool_or("attention_bias", false);
  c.qk_norm = arch == "Qwen3ForCausalLM" || arch == "Gemma3ForCausalLM" ||
              arch == "Qwen3MoeForCausalLM" || arch == "OlmoeForCausalLM";
  TS_CHECK(!f.get_bool_or("mlp_bias", false), "[hf] ", f.path(),
           ": field 'mlp_bias' is true; MLP biases are not supported for Llama models");
  // Gemma names its activation 'hidden_activation' (GeGLU's tanh GELU), the others 'hidden_act'.
  const bool gemma = arch == "Gemma3ForCausalLM";
  const char* act_key = gemma ? "hidden_activation" : "hidden_act";
  const char* act = gemma ? "gelu_pytorch_tanh" : "silu";
  if (f.has(act_key))
    TS_CHECK(f.at(act_key) == act, "[hf] ", f.path(), ": field '", act_key, "' is ",
             f.at(act_key).dump(), "; only ", act, " is supported for ", arch);
  read_rope(f, &c);
  if (arch == "SmolLM3ForCausalLM") read_nope_layers(f, &c);
  return c;
}

// Gemma 3 (Gemma3ForCausalLM, the text model): a Llama-family layer with q/k norms, post-norms,
// GeGLU, scaled embeddings, attention scaled by query_pre_attn_scalar^-1/2, and local layers
// (layer_types, or every sliding_window_pattern-th layer global) with their own RoPE base.
DecoderConfig gemma3_config(const ConfigFields& f) {
  DecoderConfig c = llama_config(f, "Gemma3ForCausalLM");
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
    TS_CHECK(!f.has(key), "[hf] ", f.path(), ": field '", key,
             "' is set; logit soft-capping is not implemented");
  TS_CHECK(!f.get_bool_or("use_bidirectional_attention", false), "[hf] ", f.path(),
           ": field 'use_bidirectional_attention' is true; only causal attention is supported");
  c.tied_embeddings = f.get_bool_or("tie_word_embeddings", true);
  c.post_norms = true;
  c.mlp_act = ops::GluAct::gelu_tanh;
  c.embed_scale = std::sqrt(static_cast<float>(c.d_model));
  c.attn_scale = 1.0 / std::sqrt(f.get_float_or("query_pre_attn_scalar", 256.0));
  c.sliding_window = f.get_int("sliding_window");
  if (!f.has("rope_parameters"))
    c.rope_theta_local = f.get_float_or("rope_local_base_freq", 10000.0);
  c.local_layers.assign(static_cast<size_t>(c.n_layers), 0);
  if (f.has("layer_types")) {
    const json& types = f.at("layer_types");
    TS_CHECK(types.is_array() && static_cast<int64_t>(types.size()) == c.n_layers, "[hf] ",
             f.path(), ": field 'layer_types' must list one type per layer (", c.n_layers, ")");
    for (size_t i = 0; i < types.size(); ++i) {
      TS_CHECK(types[i] == "sliding_attention" || types[i] == "full_attention", "[hf] ", f.path(),
               ": field 'layer_types' entry ", i, " is ", types[i].dump(),
               "; supported: sliding_attention, full_attention");
      c.local_layers[i] = types[i] == "sliding_attention";
    }
  } else {
    const int64_t period = f.get_int_or("sliding_window_pattern", 6);
    for (int64_t i = 0; i < c.n_layers; ++i)
      c.local_layers[static_cast<size_t>(i)] = (i + 1) % period != 0;
  }
  return c;
}

// Mixtures of experts, every layer's MLP n_experts SwiGLU experts of which the router picks
// num_experts_per_tok: Mixtral (a Mistral with num_local_experts experts of intermediate_size,
// the chosen experts' weights always renormalized), Qwen3-MoE (a Qwen3 with num_experts experts
// of moe_intermediate_size; norm_topk_prob) and OLMoE (num_experts of intermediate_size, q and k
// each RMS-normalized as a whole vector; norm_topk_prob). Dense layers between the MoE ones,
// shared experts and OLMoE's q/k/v clipping are refused by key.
DecoderConfig moe_config(const ConfigFields& f, const std::string& arch) {
  DecoderConfig c = llama_config(f, arch);
  const bool mixtral = arch == "MixtralForCausalLM";
  c.n_experts = f.get_int(mixtral ? "num_local_experts" : "num_experts");
  c.n_experts_used = f.get_int("num_experts_per_tok");
  TS_CHECK(c.n_experts_used <= c.n_experts, "[hf] ", f.path(), ": field 'num_experts_per_tok' (",
           c.n_experts_used, ") exceeds the expert count (", c.n_experts, ")");
  // transformers' default for both Qwen3-MoE and OLMoE is false; Mixtral always renormalizes.
  c.expert_norm = mixtral || f.get_bool_or("norm_topk_prob", false);
  c.qk_norm_whole = arch == "OlmoeForCausalLM";
  if (f.has("mlp_only_layers")) {
    const json& dense = f.at("mlp_only_layers");
    TS_CHECK(dense.is_array(), "[hf] ", f.path(), ": field 'mlp_only_layers' must be a list");
    TS_CHECK(dense.empty(), "[hf] ", f.path(), ": field 'mlp_only_layers' is ", dense.dump(),
             "; dense layers between the mixture-of-experts layers are not supported");
  }
  TS_CHECK(f.get_int_or("decoder_sparse_step", 1) == 1, "[hf] ", f.path(),
           ": field 'decoder_sparse_step' is ", f.at("decoder_sparse_step").dump(),
           "; only every layer a mixture-of-experts layer (1) is supported");
  for (const char* key :
       {"shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts"})
    TS_CHECK(!f.has(key) || f.at(key) == 0, "[hf] ", f.path(), ": field '", key, "' is ",
             f.at(key).dump(), "; shared experts are not implemented");
  TS_CHECK(!f.has("clip_qkv"), "[hf] ", f.path(), ": field 'clip_qkv' is ", f.at("clip_qkv").dump(),
           "; clipping q, k and v is not implemented");
  return c;
}

DecoderConfig gpt2_config(const ConfigFields& f) {
  DecoderConfig c;
  c.arch = DecoderArch::gpt2;
  c.d_model = f.get_int("n_embd");
  c.n_layers = f.get_int("n_layer");
  c.n_heads = f.get_int("n_head");
  c.n_kv_heads = c.n_heads;
  TS_CHECK(c.d_model % c.n_heads == 0, "[hf] ", f.path(),
           ": field 'n_embd' is not a multiple of 'n_head'");
  c.head_dim = c.d_model / c.n_heads;
  c.d_ff = f.get_int_or("n_inner", 4 * c.d_model);
  c.vocab = f.get_int("vocab_size");
  c.max_ctx = f.get_int(f.has("n_positions") ? "n_positions" : "n_ctx");
  c.norm_eps = static_cast<float>(f.get_float_or("layer_norm_epsilon", 1e-5));
  c.tied_embeddings = f.get_bool_or("tie_word_embeddings", true);
  c.qkv_bias = true;
  if (f.has("activation_function")) {
    const json& a = f.at("activation_function");
    TS_CHECK(a == "gelu_new" || a == "gelu_pytorch_tanh", "[hf] ", f.path(),
             ": field 'activation_function' is ", a.dump(),
             "; only the tanh GELU (gelu_new) is supported");
  }
  // Attention scaled by 1/sqrt(head_dim) and nothing else, as GPT-2 was trained; the variants
  // transformers offers change every score and are refused rather than ignored.
  TS_CHECK(f.get_bool_or("scale_attn_weights", true), "[hf] ", f.path(),
           ": field 'scale_attn_weights' is false; only attention scaled by 1/sqrt(head_dim) is "
           "supported");
  TS_CHECK(!f.get_bool_or("scale_attn_by_inverse_layer_idx", false), "[hf] ", f.path(),
           ": field 'scale_attn_by_inverse_layer_idx' is true; per-layer attention scaling is not "
           "supported");
  return c;
}

// Every tensor of the folder's safetensors file(s), by name, each found exactly once.
class FolderTensors {
 public:
  explicit FolderTensors(const std::string& folder) {
    const std::string single = folder + "/model.safetensors";
    index_path_ = folder + "/model.safetensors.index.json";
    if (file_exists(single)) {
      where_ = single;
      add_shard(single);
      return;
    }
    TS_CHECK(file_exists(index_path_), "[hf] ", folder,
             ": neither model.safetensors nor model.safetensors.index.json found");
    where_ = index_path_;
    const json idx = read_json(index_path_);
    TS_CHECK(idx.contains("weight_map") && idx["weight_map"].is_object(), "[hf] ", index_path_,
             ": missing object field 'weight_map'");
    std::map<std::string, size_t> shard_of_file;
    std::vector<std::pair<std::string, std::string>> listed;
    for (const auto& [name, file] : idx["weight_map"].items()) {
      TS_CHECK(file.is_string(), "[hf] ", index_path_, ": weight_map entry '", name,
               "' is not a file name");
      const std::string shard = file.get<std::string>();
      // Shards are plain names inside the folder: a hostile index must not reach other files.
      TS_CHECK(
          !shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
          "[hf] ", index_path_, ": weight_map entry '", name, "' names shard '", shard,
          "', which is not a file name inside the folder");
      if (!shard_of_file.count(shard)) {
        const std::string path = folder + "/" + shard;
        TS_CHECK(file_exists(path), "[hf] ", index_path_, ": shard '", shard,
                 "' (listed for tensor '", name, "') not found");
        shard_of_file[shard] = readers_.size();
        add_shard(path);
      }
      listed.emplace_back(name, shard);
    }
    TS_CHECK(!readers_.empty(), "[hf] ", index_path_, ": weight_map is empty");
    for (const auto& [name, shard] : listed) {
      const auto it = by_name_.find(name);
      TS_CHECK(it != by_name_.end() && it->second.reader == shard_of_file[shard], "[hf] ",
               index_path_, ": tensor '", name, "' is not in its listed shard '", shard, "'");
    }
  }

  const std::string& where() const { return where_; }
  const std::vector<std::shared_ptr<const formats::SafetensorsReader>>& readers() const {
    return readers_;
  }

  // The entry named `name` and the file holding it, or nullptr; marks it used.
  const formats::SafetensorsEntry* find(const std::string& name, std::string* file) {
    const auto it = by_name_.find(name);
    if (it == by_name_.end()) return nullptr;
    used_.insert(name);
    if (file) *file = readers_[it->second.reader]->path();
    return it->second.entry;
  }
  bool contains(const std::string& name) const { return by_name_.count(name) != 0; }

  // Fails on any tensor no loader step used, except buffers HF checkpoints may carry.
  void check_all_used(const std::set<std::string>& ignorable_suffixes) const {
    for (const auto& [name, loc] : by_name_) {
      if (used_.count(name)) continue;
      bool ignorable = false;
      for (const std::string& s : ignorable_suffixes) ignorable |= name.ends_with(s);
      TS_CHECK(ignorable, "[hf] ", readers_[loc.reader]->path(), ": unexpected tensor '", name,
               "' (not part of this model's configuration)");
    }
  }

 private:
  struct Location {
    size_t reader;
    const formats::SafetensorsEntry* entry;
  };
  void add_shard(const std::string& path) {
    auto r = std::make_shared<const formats::SafetensorsReader>(path);
    for (const formats::SafetensorsEntry& e : r->entries()) {
      const auto [it, inserted] = by_name_.emplace(e.name, Location{readers_.size(), &e});
      TS_CHECK(inserted, "[hf] ", path, ": tensor '", e.name, "' also appears in ",
               readers_[it->second.reader]->path());
    }
    readers_.push_back(std::move(r));
  }

  std::string where_, index_path_;
  std::vector<std::shared_ptr<const formats::SafetensorsReader>> readers_;
  std::map<std::string, Location> by_name_;
  std::set<std::string> used_;
};

// Builds WeightRefs from the folder's tensors: matrices stay in the file when no transform is
// needed; vectors become f32 (the kernels read norms and biases as f32).
class WeightBuilder {
 public:
  WeightBuilder(FolderTensors& t, DecoderModel& m) : t_(t), m_(m) {}

  const formats::SafetensorsEntry& entry(const std::string& name, const Shape& expected,
                                         std::string* file) {
    const formats::SafetensorsEntry* e = t_.find(name, file);
    TS_CHECK(e != nullptr, "[hf] ", t_.where(), ": missing tensor '", name, "'");
    TS_CHECK(e->shape == expected, "[hf] ", *file, ": tensor '", name, "' has shape ",
             e->shape.str(), ", expected ", expected.str());
    TS_CHECK(e->dtype == DType::f32 || e->dtype == DType::bf16 || e->dtype == DType::f16, "[hf] ",
             *file, ": tensor '", name, "' has dtype ", dtype_name(e->dtype),
             "; weights must be F32, BF16 or F16");
    return *e;
  }

  WeightRef matrix(const std::string& name, const Shape& expected) {
    std::string file;
    const formats::SafetensorsEntry& e = entry(name, expected, &file);
    const size_t elem = static_cast<size_t>(traits(e.dtype).block_bytes);
    if (reinterpret_cast<uintptr_t>(e.data) % elem == 0) return {e.data, e.dtype, expected};
    uint8_t* dst = alloc(e.bytes);  // misaligned in the file: kernels need aligned elements
    std::memcpy(dst, e.data, static_cast<size_t>(e.bytes));
    return {dst, e.dtype, expected};
  }

  // offset is added to every value (Gemma stores its norm weights w for a scale of 1 + w).
  WeightRef vector_f32(const std::string& name, int64_t n, float offset = 0.0f) {
    float* dst = widened(name, Shape({n}));
    if (offset != 0.0f)
      for (int64_t i = 0; i < n; ++i) dst[i] += offset;
    return {dst, DType::f32, Shape({n})};
  }

  // A matrix widened to f32 (the MoE router: small, and read whole by every token).
  WeightRef matrix_f32(const std::string& name, const Shape& shape) {
    return {widened(name, shape), DType::f32, shape};
  }

  // The matrices `names` (each of shape `each`) stacked into one owned matrix (rows of names[0],
  // then of names[1], ...): a MoE layer's experts, which HF stores one tensor each. They keep
  // their dtype when all share it, else all become f32.
  WeightRef stacked(const std::vector<std::string>& names, const Shape& each) {
    std::vector<const formats::SafetensorsEntry*> parts;
    std::string file;
    for (const std::string& name : names) parts.push_back(&entry(name, each, &file));
    DType type = parts.front()->dtype;
    for (const formats::SafetensorsEntry* e : parts)
      if (e->dtype != type) type = DType::f32;
    const int64_t n = each.numel(), bytes = dtype_bytes(type, n);
    const auto count = static_cast<int64_t>(parts.size());
    uint8_t* dst = alloc(bytes * count);
    for (int64_t i = 0; i < count; ++i) {
      const formats::SafetensorsEntry& e = *parts[static_cast<size_t>(i)];
      if (e.dtype == type)
        std::memcpy(dst + i * bytes, e.data, static_cast<size_t>(bytes));
      else  // a 16-bit entry widened (aligned, as in widened())
        to_f32(e.dtype, e.data, reinterpret_cast<float*>(dst + i * bytes), n);
    }
    return {dst, type, Shape({count * each[0], each[1]})};
  }

  // HF Conv1D stores (in, out); returns the (out, in) transpose in the stored dtype.
  WeightRef conv1d(const std::string& name, int64_t in, int64_t out) {
    std::string file;
    const formats::SafetensorsEntry& e = entry(name, Shape({in, out}), &file);
    const int64_t elem = traits(e.dtype).block_bytes;
    uint8_t* dst = alloc(e.bytes);
    for (int64_t r = 0; r < in; ++r)
      for (int64_t c = 0; c < out; ++c)
        std::memcpy(dst + (c * in + r) * elem, e.data + (r * out + c) * elem,
                    static_cast<size_t>(elem));
    return {dst, e.dtype, Shape({out, in})};
  }

 private:
  float* widened(const std::string& name, const Shape& shape) {
    std::string file;
    const formats::SafetensorsEntry& e = entry(name, shape, &file);
    auto* dst = reinterpret_cast<float*>(alloc(shape.numel() * 4));
    // f32 is read with memcpy; 16-bit entries are always 2-byte aligned (every dtype the reader
    // accepts has an even size, and the data section starts 8-byte aligned).
    to_f32(e.dtype, e.data, dst, shape.numel());
    return dst;
  }
  uint8_t* alloc(int64_t bytes) {
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(bytes));
    m_.owners.push_back(buf);
    return buf->data();
  }
  FolderTensors& t_;
  DecoderModel& m_;
};

// The output head: lm_head.weight, or the embedding when tied. A tied checkpoint may still
// carry an lm_head.weight (transformers then uses the embedding); one whose values differ from
// the embedding's is refused, as it is not clear which head the file means.
WeightRef output_head(const DecoderConfig& c, FolderTensors& t, WeightBuilder& b,
                      const WeightRef& tok_embd) {
  const Shape shape({c.vocab, c.d_model});
  if (!c.tied_embeddings) return b.matrix("lm_head.weight", shape);
  if (!t.contains("lm_head.weight")) return tok_embd;
  std::string file;
  const formats::SafetensorsEntry& e = b.entry("lm_head.weight", shape, &file);
  const int64_t n = shape.numel();
  std::vector<float> head(static_cast<size_t>(n)), embd(static_cast<size_t>(n));
  to_f32(e.dtype, e.data, head.data(), n);
  to_f32(tok_embd.type, tok_embd.data, embd.data(), n);
  TS_CHECK(head == embd, "[hf] ", file,
           ": tensor 'lm_head.weight' differs from the token embedding, but config.json ties "
           "them ('tie_word_embeddings'); refusing to guess which head is meant");
  return tok_embd;
}

// A MoE layer's router (widened to f32) and its experts stacked as DecoderConfig describes,
// named as hf_router_name and hf_expert_name say.
void load_experts(const DecoderConfig& c, const std::string& p, bool mixtral, WeightBuilder& b,
                  DecoderLayer& l) {
  const LayerTensor& router = layer_tensor(&DecoderLayer::ffn_router);
  l.ffn_router = b.matrix_f32(hf_router_name(p, mixtral), layer_tensor_shape(router, c));
  for (LayerMatrix m : {LayerMatrix::gate, LayerMatrix::up, LayerMatrix::down}) {
    const LayerTensor& t = layer_tensor(m);
    std::vector<std::string> names;
    for (int64_t e = 0; e < c.n_experts; ++e) names.push_back(hf_expert_name(p, mixtral, e, m));
    l.*t.member = b.stacked(names, layer_tensor_shape(t, c));
  }
}

void load_llama_weights(const DecoderConfig& c, const std::string& arch, bool o_bias,
                        FolderTensors& t, WeightBuilder& b, DecoderWeights& w) {
  using L = DecoderLayer;
  const int64_t C = c.d_model, F = c.d_ff, Q = c.q_dim(), KV = c.kv_dim();
  w.tok_embd = b.matrix("model.embed_tokens.weight", Shape({c.vocab, C}));
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = hf_layer_prefix(i);
    DecoderLayer& l = w.layers[static_cast<size_t>(i)];
    auto name = [&](WeightRef L::*m) { return hf_layer_name(p, layer_tensor(m), c); };
    auto shape = [&](WeightRef L::*m) { return layer_tensor_shape(layer_tensor(m), c); };
    auto matrix = [&](WeightRef L::*m) { l.*m = b.matrix(name(m), shape(m)); };
    // offset is added to every value (vector_f32).
    auto vector = [&](WeightRef L::*m, float offset = 0.0f) {
      l.*m = b.vector_f32(name(m), shape(m)[0], offset);
    };
    // Gemma's norms scale by 1 + w (llama.cpp's converter adds the 1 as well), and its
    // post_attention_layernorm is the attention branch's post-norm, not the MLP's input norm
    // (hf_layer_name).
    const float one = c.post_norms ? 1.0f : 0.0f;
    vector(&L::attn_norm, one);
    if (c.post_norms) {
      vector(&L::post_attn_norm, one);
      vector(&L::ffn_norm, one);
      vector(&L::post_ffn_norm, one);
    } else {
      vector(&L::ffn_norm);
    }
    const bool phi3 = arch == "Phi3ForCausalLM";  // q, k, v and gate, up fused
    if (phi3) {
      const WeightRef qkv = b.matrix(p + kFusedQkv.hf, Shape({Q + 2 * KV, C}));
      split_qkv(qkv, Q, KV, &l.wq, &l.wk, &l.wv);
    } else {
      for (WeightRef L::*m : {&L::wq, &L::wk, &L::wv}) matrix(m);
    }
    matrix(&L::wo);
    if (c.qkv_bias)
      for (WeightRef L::*m : {&L::bq, &L::bk, &L::bv}) vector(m);
    if (o_bias) vector(&L::bo);
    if (c.qk_norm) {  // OLMoE: q and k each normalized as a whole vector
      vector(&L::q_norm, one);
      vector(&L::k_norm, one);
    }
    if (c.moe()) {
      load_experts(c, p, arch == "MixtralForCausalLM", b, l);
      continue;
    }
    if (phi3) {  // gate rows first, as Phi3MLP chunks them
      const WeightRef gate_up = b.matrix(p + kFusedGateUp.hf, Shape({2 * F, C}));
      l.w_gate = row_slice(gate_up, 0, F);
      l.w_up = row_slice(gate_up, F, F);
    } else {
      matrix(&L::w_gate);
      matrix(&L::w_up);
    }
    matrix(&L::w_down);
  }
  w.out_norm = b.vector_f32("model.norm.weight", C, c.post_norms ? 1.0f : 0.0f);
  w.output = output_head(c, t, b, w.tok_embd);
}

void load_gpt2_weights(const DecoderConfig& c, FolderTensors& t, WeightBuilder& b,
                       DecoderWeights& w) {
  using L = DecoderLayer;
  const int64_t C = c.d_model;
  // Checkpoints saved from GPT2LMHeadModel prefix the body with "transformer.".
  const std::string pre = t.contains("transformer.wte.weight") ? "transformer." : "";
  w.tok_embd = b.matrix(pre + "wte.weight", Shape({c.vocab, C}));
  w.pos_embd = b.matrix(pre + "wpe.weight", Shape({c.max_ctx, C}));
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = pre + hf_gpt2_layer_prefix(i);
    DecoderLayer& l = w.layers[static_cast<size_t>(i)];
    // Conv1D matrices are stored (in, out) and read as their (out, in) transpose.
    auto load = [&](WeightRef L::*m) {
      const LayerTensor& lt = layer_tensor(m);
      const Shape s = layer_tensor_shape(lt, c);
      l.*m = lt.kind == LayerTensorKind::matrix ? b.conv1d(p + lt.hf_gpt2, s[1], s[0])
                                                : b.vector_f32(p + lt.hf_gpt2, s[0]);
    };
    load(&L::attn_norm);
    load(&L::attn_norm_b);
    const WeightRef qkv = b.conv1d(p + kFusedQkv.hf_gpt2, C, 3 * C);  // (3C, C): q, k, v rows
    split_qkv(qkv, C, C, &l.wq, &l.wk, &l.wv);
    const WeightRef qkv_b = b.vector_f32(p + kFusedQkvBias.hf_gpt2, 3 * C);
    split_qkv(qkv_b, C, C, &l.bq, &l.bk, &l.bv);
    for (WeightRef L::*m :
         {&L::wo, &L::bo, &L::ffn_norm, &L::ffn_norm_b, &L::w_up, &L::b_up, &L::w_down, &L::b_down})
      load(m);
  }
  w.out_norm = b.vector_f32(pre + "ln_f.weight", C);
  w.out_norm_b = b.vector_f32(pre + "ln_f.bias", C);
  w.output = output_head(c, t, b, w.tok_embd);
}

}  // namespace

DecoderModel load_decoder_hf(const std::string& folder) {
  const std::string cfg_path = folder + "/config.json";
  const json j = read_json(cfg_path);
  const ConfigFields f(j, cfg_path);
  const std::string arch = hf_architecture(j, cfg_path);
  DecoderModel m;
  m.source = folder;
  bool o_bias = false;
  if (arch == "GPT2LMHeadModel") {
    m.config = gpt2_config(f);
  } else {
    const bool moe =
        arch == "MixtralForCausalLM" || arch == "Qwen3MoeForCausalLM" || arch == "OlmoeForCausalLM";
    TS_CHECK(moe || arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" ||
                 arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM" ||
                 arch == "Gemma3ForCausalLM" || arch == "SmolLM3ForCausalLM" ||
                 arch == "Phi3ForCausalLM",
             "[hf] ", cfg_path, ": field 'architectures' names ", arch,
             "; supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
             "Qwen3ForCausalLM, Gemma3ForCausalLM, SmolLM3ForCausalLM, Phi3ForCausalLM, "
             "MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, GPT2LMHeadModel");
    m.config = arch == "Gemma3ForCausalLM" ? gemma3_config(f)
               : moe                       ? moe_config(f, arch)
                                           : llama_config(f, arch);
    o_bias = arch != "Qwen2ForCausalLM" && m.config.qkv_bias;
  }
  DecoderConfig& c = m.config;
  c.name = j.contains("_name_or_path") && j["_name_or_path"].is_string() &&
                   !j["_name_or_path"].get<std::string>().empty()
               ? j["_name_or_path"].get<std::string>()
               : folder;
  c.validate(cfg_path);

  FolderTensors tensors(folder);
  for (const auto& r : tensors.readers()) m.owners.push_back(r);
  WeightBuilder builder(tensors, m);
  if (c.arch == DecoderArch::gpt2)
    load_gpt2_weights(c, tensors, builder, m.weights);
  else
    load_llama_weights(c, arch, o_bias, tensors, builder, m.weights);
  tensors.check_all_used({".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"});
  return m;
}

}  // namespace tessera::model
