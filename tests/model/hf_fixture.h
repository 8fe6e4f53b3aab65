// Test fixture: tiny random decoder models written as Hugging Face folders (config.json +
// safetensors, optionally sharded with an index), with the values kept for comparison.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/safetensors.h"
#include "model/decoder.h"

namespace tessera::model::test {

struct HfTensor {
  Shape shape;
  std::vector<float> values;
};

// A model in HF layout: config.json and every tensor by its HF name (GPT-2 Conv1D (in, out)).
struct HfModel {
  nlohmann::json config;
  std::map<std::string, HfTensor> tensors;

  void add(const std::string& name, Shape shape, std::mt19937& rng, float scale = 0.5f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    for (float& x : v) x = dist(rng);
    tensors[name] = {std::move(shape), std::move(v)};
  }
};

// Llama family: C 32 = 4 heads x D 8, 2 kv heads, F 64, 2 layers, V 64. `arch` Qwen2ForCausalLM
// adds q/k/v biases; `o_bias` makes a Llama with attention_bias (biases on q, k, v and o).
inline HfModel tiny_llama(bool tied, const std::string& arch = "LlamaForCausalLM",
                          bool o_bias = false) {
  std::mt19937 rng(tied ? 11 : 7);
  HfModel m;
  const int64_t C = 32, KV = 16, F = 64, V = 64, L = 2;
  const bool qwen2 = arch == "Qwen2ForCausalLM", qwen3 = arch == "Qwen3ForCausalLM";
  m.config = {{"architectures", {arch}},
              {"hidden_size", C},
              {"intermediate_size", F},
              {"num_hidden_layers", L},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"vocab_size", V},
              {"max_position_embeddings", 128},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"tie_word_embeddings", tied},
              {"attention_bias", o_bias},
              {"hidden_act", "silu"}};
  m.add("model.embed_tokens.weight", {V, C}, rng);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    m.add(p + "input_layernorm.weight", {C}, rng);
    m.add(p + "post_attention_layernorm.weight", {C}, rng);
    m.add(p + "self_attn.q_proj.weight", {C, C}, rng);
    m.add(p + "self_attn.k_proj.weight", {KV, C}, rng);
    m.add(p + "self_attn.v_proj.weight", {KV, C}, rng);
    m.add(p + "self_attn.o_proj.weight", {C, C}, rng);
    if (qwen2 || o_bias) {
      m.add(p + "self_attn.q_proj.bias", {C}, rng);
      m.add(p + "self_attn.k_proj.bias", {KV}, rng);
      m.add(p + "self_attn.v_proj.bias", {KV}, rng);
    }
    if (o_bias) m.add(p + "self_attn.o_proj.bias", {C}, rng);
    if (qwen3) {  // per-head norms of q and k (head_dim 8)
      m.add(p + "self_attn.q_norm.weight", {8}, rng);
      m.add(p + "self_attn.k_norm.weight", {8}, rng);
    }
    m.add(p + "mlp.gate_proj.weight", {F, C}, rng);
    m.add(p + "mlp.up_proj.weight", {F, C}, rng);
    m.add(p + "mlp.down_proj.weight", {C, F}, rng);
  }
  m.add("model.norm.weight", {C}, rng);
  if (!tied) m.add("lm_head.weight", {V, C}, rng);
  return m;
}

// Gemma 3 (Gemma3ForCausalLM): the Llama shape above with q/k norms, four norms per layer (stored
// as w for a scale of 1 + w), GeGLU, a tied head, 3 layers of which layer 1 is global and the
// others local over 8 positions.
inline HfModel tiny_gemma3() {
  std::mt19937 rng(13);
  HfModel m;
  const int64_t C = 32, KV = 16, F = 64, V = 64, L = 3;
  m.config = {{"architectures", {"Gemma3ForCausalLM"}},
              {"model_type", "gemma3_text"},
              {"hidden_size", C},
              {"intermediate_size", F},
              {"num_hidden_layers", L},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 8},
              {"vocab_size", V},
              {"max_position_embeddings", 128},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0},
              {"rope_local_base_freq", 10000.0},
              {"query_pre_attn_scalar", 16},
              {"sliding_window", 8},
              {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"final_logit_softcapping", nullptr},
              {"attn_logit_softcapping", nullptr}};
  m.add("model.embed_tokens.weight", {V, C}, rng);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    for (const char* n : {"input_layernorm", "post_attention_layernorm",
                          "pre_feedforward_layernorm", "post_feedforward_layernorm"})
      m.add(p + n + ".weight", {C}, rng, 0.1f);
    m.add(p + "self_attn.q_proj.weight", {C, C}, rng);
    m.add(p + "self_attn.k_proj.weight", {KV, C}, rng);
    m.add(p + "self_attn.v_proj.weight", {KV, C}, rng);
    m.add(p + "self_attn.o_proj.weight", {C, C}, rng);
    m.add(p + "self_attn.q_norm.weight", {8}, rng, 0.1f);
    m.add(p + "self_attn.k_norm.weight", {8}, rng, 0.1f);
    m.add(p + "mlp.gate_proj.weight", {F, C}, rng);
    m.add(p + "mlp.up_proj.weight", {F, C}, rng);
    m.add(p + "mlp.down_proj.weight", {C, F}, rng);
  }
  m.add("model.norm.weight", {C}, rng, 0.1f);
  return m;
}

// Mixtures of experts in HF layout: C 32 = 4 heads x D 8, 2 kv heads, 2 layers, V 64, untied,
// 4 experts of width F 16 of which 2 are used per token; each expert its own tensors. `arch`:
// Qwen3MoeForCausalLM (per-head q/k norms, norm_topk_prob true), OlmoeForCausalLM (q/k norms of
// the whole q (32) and k (16), norm_topk_prob false) or MixtralForCausalLM (block_sparse_moe
// names, w1 gate, w3 up, w2 down).
inline HfModel tiny_moe(const std::string& arch) {
  std::mt19937 rng(arch.size() + 17);
  HfModel m;
  const int64_t C = 32, KV = 16, F = 16, V = 64, L = 2, E = 4;
  const bool mixtral = arch == "MixtralForCausalLM", olmoe = arch == "OlmoeForCausalLM";
  m.config = {
      {"architectures", {arch}},        {"hidden_size", C},         {"num_hidden_layers", L},
      {"num_attention_heads", 4},       {"num_key_value_heads", 2}, {"vocab_size", V},
      {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-5},     {"rope_theta", 10000.0},
      {"tie_word_embeddings", false},   {"hidden_act", "silu"},     {"num_experts_per_tok", 2}};
  if (mixtral) {
    m.config["model_type"] = "mixtral";
    m.config["intermediate_size"] = F;
    m.config["num_local_experts"] = E;
    m.config["sliding_window"] = nullptr;
  } else if (olmoe) {
    m.config["model_type"] = "olmoe";
    m.config["intermediate_size"] = F;
    m.config["num_experts"] = E;
    m.config["norm_topk_prob"] = false;
    m.config["clip_qkv"] = nullptr;
    m.config["attention_bias"] = false;
  } else {
    m.config["model_type"] = "qwen3_moe";
    m.config["head_dim"] = 8;
    m.config["intermediate_size"] = 64;  // dense layers' width: unused, every layer is MoE
    m.config["moe_intermediate_size"] = F;
    m.config["num_experts"] = E;
    m.config["norm_topk_prob"] = true;
    m.config["decoder_sparse_step"] = 1;
    m.config["mlp_only_layers"] = nlohmann::json::array();
    m.config["use_sliding_window"] = false;
  }
  m.add("model.embed_tokens.weight", {V, C}, rng);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    m.add(p + "input_layernorm.weight", {C}, rng);
    m.add(p + "post_attention_layernorm.weight", {C}, rng);
    m.add(p + "self_attn.q_proj.weight", {C, C}, rng);
    m.add(p + "self_attn.k_proj.weight", {KV, C}, rng);
    m.add(p + "self_attn.v_proj.weight", {KV, C}, rng);
    m.add(p + "self_attn.o_proj.weight", {C, C}, rng);
    if (!mixtral) {
      m.add(p + "self_attn.q_norm.weight", {olmoe ? C : 8}, rng);
      m.add(p + "self_attn.k_norm.weight", {olmoe ? KV : 8}, rng);
    }
    const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    m.add(moe + "gate.weight", {E, C}, rng);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = cat(moe, "experts.", e, ".");
      m.add(x + (mixtral ? "w1" : "gate_proj") + ".weight", {F, C}, rng);
      m.add(x + (mixtral ? "w3" : "up_proj") + ".weight", {F, C}, rng);
      m.add(x + (mixtral ? "w2" : "down_proj") + ".weight", {C, F}, rng);
    }
  }
  m.add("model.norm.weight", {C}, rng);
  m.add("lm_head.weight", {V, C}, rng);
  return m;
}
inline HfModel tiny_qwen3moe() {
  return tiny_moe("Qwen3MoeForCausalLM");
}
inline HfModel tiny_olmoe() {
  return tiny_moe("OlmoeForCausalLM");
}
inline HfModel tiny_mixtral() {
  return tiny_moe("MixtralForCausalLM");
}

// GPT-2: C 32, 4 heads, F 128 (n_inner null = 4C), 2 layers, V 64, 16 positions; tied head.
inline HfModel tiny_gpt2(const std::string& prefix = "") {
  std::mt19937 rng(5);
  HfModel m;
  const int64_t C = 32, F = 128, V = 64, L = 2, P = 16;
  m.config = {{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"n_embd", C},
              {"n_layer", L},
              {"n_head", 4},
              {"n_inner", nullptr},
              {"n_positions", P},
              {"vocab_size", V},
              {"layer_norm_epsilon", 1e-5},
              {"activation_function", "gelu_new"}};
  m.add(prefix + "wte.weight", {V, C}, rng);
  m.add(prefix + "wpe.weight", {P, C}, rng);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = cat(prefix, "h.", i, ".");
    m.add(p + "ln_1.weight", {C}, rng);
    m.add(p + "ln_1.bias", {C}, rng);
    m.add(p + "attn.c_attn.weight", {C, 3 * C}, rng);
    m.add(p + "attn.c_attn.bias", {3 * C}, rng);
    m.add(p + "attn.c_proj.weight", {C, C}, rng);
    m.add(p + "attn.c_proj.bias", {C}, rng);
    m.add(p + "ln_2.weight", {C}, rng);
    m.add(p + "ln_2.bias", {C}, rng);
    m.add(p + "mlp.c_fc.weight", {C, F}, rng);
    m.add(p + "mlp.c_fc.bias", {F}, rng);
    m.add(p + "mlp.c_proj.weight", {F, C}, rng);
    m.add(p + "mlp.c_proj.bias", {C}, rng);
  }
  m.add(prefix + "ln_f.weight", {C}, rng);
  m.add(prefix + "ln_f.bias", {C}, rng);
  return m;
}

// The test process's scratch folder, removed when the process exits.
inline const std::string& scratch_root() {
  struct Root {
    std::string path = cat(::testing::TempDir(), "/decoder_io_", ::getpid());
    ~Root() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Root root;
  return root.path;
}

// A fresh empty folder in the scratch folder.
inline std::string temp_folder(const std::string& name) {
  const std::string d = scratch_root() + "/" + name;
  std::filesystem::remove_all(d);
  make_dirs(d);
  return d;
}

// Writes `m` into `folder` with tensors stored as `dtype`; shards > 1 splits the tensors round
// robin over model-0000k-of-0000n.safetensors files listed by model.safetensors.index.json.
inline void write_hf(const HfModel& m, const std::string& folder, DType dtype = DType::f32,
                     int shards = 1) {
  std::vector<formats::SafetensorsWriter> writers(static_cast<size_t>(shards));
  std::vector<std::vector<uint8_t>> bytes;
  bytes.reserve(m.tensors.size());
  nlohmann::json weight_map = nlohmann::json::object();
  auto shard_name = [&](int k) {
    return shards == 1 ? std::string("model.safetensors")
                       : cat("model-0000", k + 1, "-of-0000", shards, ".safetensors");
  };
  int k = 0;
  for (const auto& [name, t] : m.tensors) {
    bytes.emplace_back(static_cast<size_t>(dtype_bytes(dtype, t.shape.numel())));
    from_f32(dtype, t.values.data(), bytes.back().data(), t.shape.numel());
    writers[static_cast<size_t>(k)].add(name, dtype, t.shape, bytes.back().data());
    weight_map[name] = shard_name(k);
    k = (k + 1) % shards;
  }
  for (int s = 0; s < shards; ++s)
    writers[static_cast<size_t>(s)].write(folder + "/" + shard_name(s));
  if (shards > 1)
    write_file_atomic(
        folder + "/model.safetensors.index.json",
        nlohmann::json({{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}).dump(1));
  write_file_atomic(folder + "/config.json", m.config.dump(2));
}

// Every tensor of folder a's model.safetensors is in folder b's with the same bytes.
inline void expect_same_safetensors(const std::string& a, const std::string& b) {
  const formats::SafetensorsReader ra(a + "/model.safetensors"), rb(b + "/model.safetensors");
  EXPECT_EQ(ra.entries().size(), rb.entries().size());
  for (const formats::SafetensorsEntry& e : ra.entries()) {
    const formats::SafetensorsEntry* f = rb.find(e.name);
    ASSERT_NE(f, nullptr) << e.name;
    EXPECT_EQ(f->dtype, e.dtype) << e.name;
    EXPECT_EQ(f->shape, e.shape) << e.name;
    ASSERT_EQ(f->bytes, e.bytes) << e.name;
    EXPECT_EQ(std::memcmp(f->data, e.data, static_cast<size_t>(e.bytes)), 0) << e.name;
  }
}

// A weight's values as f32 (any stored type).
inline std::vector<float> values_of(const WeightRef& w) {
  std::vector<float> v(static_cast<size_t>(w.shape.numel()));
  to_f32(w.type, w.data, v.data(), w.shape.numel());
  return v;
}

// Values after a trip through `dtype` (what a bf16 folder holds).
inline std::vector<float> rounded(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> b(static_cast<size_t>(dtype_bytes(dtype, static_cast<int64_t>(v.size()))));
  from_f32(dtype, v.data(), b.data(), static_cast<int64_t>(v.size()));
  std::vector<float> out(v.size());
  to_f32(dtype, b.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}

}  // namespace tessera::model::test
