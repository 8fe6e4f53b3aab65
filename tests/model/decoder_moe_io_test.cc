// Hugging Face mixture-of-experts folders (Qwen3MoeForCausalLM, OlmoeForCausalLM,
// MixtralForCausalLM) -> DecoderModel: the config, each expert's tensors at its rows of the
// stacked matrices, the router in f32; HF -> GGUF -> HF round trips bit for bit; the HF-loaded
// and GGUF-loaded models give the same logits; what is not implemented is refused by key or
// tensor name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "infer/tiny_model.h"
#include "model/decoder.h"
#include "model/decoder_forward.h"
#include "model/decoder_save.h"
#include "model/hf_fixture.h"
#include "ops/paged_attention.h"
#include "test_util/expect_error.h"

namespace tessera::model {
namespace {

using test::HfModel;

using test::expect_same_safetensors;
using test::rounded;
using test::values_of;

// One family: its HF architecture, what its config means, and the GGUF architecture it is
// written as.
struct Family {
  std::string arch;
  bool expert_norm, qk_norm, qk_norm_whole;
  std::string gguf_arch;
  HfModel hf() const { return test::tiny_moe(arch); }
  bool mixtral() const { return arch == "MixtralForCausalLM"; }
};
const Family kQwen3Moe{"Qwen3MoeForCausalLM", true, true, false, "qwen3moe"};
const Family kOlmoe{"OlmoeForCausalLM", false, true, true, "olmoe"};
const Family kMixtral{"MixtralForCausalLM", true, false, false, "llama"};

// HF's name of layer l's router, or of expert e's matrix `which` (gate, up or down).
std::string router_name(const Family& f, int64_t l) {
  return cat("model.layers.", l, f.mixtral() ? ".block_sparse_moe" : ".mlp", ".gate.weight");
}
std::string expert_name(const Family& f, int64_t l, int64_t e, const std::string& which) {
  const std::string mixtral_name = which == "gate" ? "w1" : which == "up" ? "w3" : "w2";
  return cat("model.layers.", l, f.mixtral() ? ".block_sparse_moe" : ".mlp", ".experts.", e, ".",
             f.mixtral() ? mixtral_name : which + "_proj", ".weight");
}

// The config a MoE folder of family f (the fixture's sizes) loads as.
void expect_moe_config(const DecoderConfig& c, const Family& f) {
  EXPECT_EQ(c.arch, DecoderArch::llama);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.n_experts_used, 2);
  EXPECT_EQ(c.d_ff, 16);  // one expert's width
  EXPECT_EQ(c.expert_norm, f.expert_norm);
  EXPECT_EQ(c.qk_norm, f.qk_norm);
  EXPECT_EQ(c.qk_norm_whole, f.qk_norm_whole);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
}

// Expert e's rows of the stacked matrices are the folder's tensors of expert e (as stored in
// `stored`); the router is f32.
void expect_experts(const DecoderModel& m, const HfModel& hf, const Family& f,
                    DType stored = DType::f32) {
  const int64_t C = m.config.d_model, F = m.config.d_ff, E = m.config.n_experts;
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    const DecoderLayer& L = m.weights.layers[static_cast<size_t>(l)];
    ASSERT_EQ(L.w_gate.shape, Shape({E * F, C}));
    ASSERT_EQ(L.w_up.shape, Shape({E * F, C}));
    ASSERT_EQ(L.w_down.shape, Shape({E * C, F}));
    EXPECT_EQ(L.w_gate.type, stored);
    EXPECT_EQ(L.ffn_router.type, DType::f32);
    EXPECT_EQ(L.ffn_router.shape, Shape({E, C}));
    EXPECT_EQ(values_of(L.ffn_router), rounded(hf.tensors.at(router_name(f, l)).values, stored));
    for (int64_t e = 0; e < E; ++e) {
      const auto want = [&](const char* which) {
        return rounded(hf.tensors.at(expert_name(f, l, e, which)).values, stored);
      };
      EXPECT_EQ(values_of(row_slice(L.w_gate, e * F, F)), want("gate"))
          << "layer " << l << " " << e;
      EXPECT_EQ(values_of(row_slice(L.w_up, e * F, F)), want("up")) << "layer " << l << " " << e;
      EXPECT_EQ(values_of(row_slice(L.w_down, e * C, C)), want("down"))
          << "layer " << l << " " << e;
    }
  }
}

// Every matrix and vector of a equals b's, value for value (same shapes and types).
void expect_same_weights(const DecoderModel& a, const DecoderModel& b) {
  auto same = [](const WeightRef& x, const WeightRef& y, const std::string& what) {
    ASSERT_EQ(x.present(), y.present()) << what;
    if (!x.present()) return;
    EXPECT_EQ(x.type, y.type) << what;
    ASSERT_EQ(x.shape, y.shape) << what;
    EXPECT_EQ(std::memcmp(x.data, y.data, static_cast<size_t>(x.bytes())), 0) << what;
  };
  same(a.weights.tok_embd, b.weights.tok_embd, "tok_embd");
  same(a.weights.out_norm, b.weights.out_norm, "out_norm");
  same(a.weights.output, b.weights.output, "output");
  ASSERT_EQ(a.weights.layers.size(), b.weights.layers.size());
  for (size_t l = 0; l < a.weights.layers.size(); ++l) {
    const DecoderLayer &x = a.weights.layers[l], &y = b.weights.layers[l];
    for (int i = 0; i < kLayerMatrices; ++i)
      same(*x.matrices()[static_cast<size_t>(i)], *y.matrices()[static_cast<size_t>(i)],
           cat("layer ", l, " matrix ", i));
    for (int i = 0; i < DecoderLayer::kVectors; ++i)
      same(*x.vectors()[static_cast<size_t>(i)], *y.vectors()[static_cast<size_t>(i)],
           cat("layer ", l, " vector ", i));
  }
}

void expect_same_config(const DecoderConfig& a, const DecoderConfig& b) {
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.max_ctx, b.max_ctx);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.qk_norm_whole, b.qk_norm_whole);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.n_experts_used, b.n_experts_used);
  EXPECT_EQ(a.expert_norm, b.expert_norm);
}

// Logits (T, V) of one sequence through the engine's forward pass (DecoderForward on the CPU,
// the whole sequence as one chunk in one cache block).
std::vector<float> forward_logits(const DecoderModel& m, const std::vector<int32_t>& tokens) {
  const DecoderConfig& c = m.config;
  const auto T = static_cast<int64_t>(tokens.size());
  const int64_t BT = 16;  // one block holds the sequence
  const ops::Context ctx;
  DecoderForward fwd(m, ctx, T, BT);
  const int64_t half = c.n_kv_heads * BT * c.head_dim;
  std::vector<float> cache(static_cast<size_t>(c.n_layers * 2 * half));
  PagedKv kv;
  kv.base = reinterpret_cast<uint8_t*>(cache.data());
  kv.layer_stride = 2 * half;
  kv.n_blocks = 1;
  kv.layout.Hkv = c.n_kv_heads;
  kv.layout.D = c.head_dim;
  kv.layout.kv_type = DType::f32;
  kv.layout.k_transposed = ops::paged_keys_transposed(ctx.device);
  kv.layout.block_tokens = BT;
  kv.layout.block_stride = c.n_layers * 2 * half;
  kv.layout.v_offset = half;
  const int32_t table[1] = {0};
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::vector<const int32_t*> tables(static_cast<size_t>(T), table);
  std::vector<uint8_t> want(static_cast<size_t>(T), 1);
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  DecoderRows rows;
  rows.n = T;
  rows.tokens = tokens.data();
  rows.pos = pos.data();
  rows.tables = tables.data();
  rows.want_logits = want.data();
  std::vector<float> logits(static_cast<size_t>(T * c.vocab));
  EXPECT_EQ(fwd.forward(rows, kv, logits.data()), T);
  return logits;
}

// HF folder -> load (checked against the fixture) -> GGUF -> load -> HF folder -> load: the
// config and every matrix survive, the second folder holds the first one's tensors bit for bit
// under the family's names, and all three models give the same logits (the GGUF Mixtral's q/k
// rows are permuted for interleaved RoPE, which reorders sums: equal to rounding there), which are
// the float64 forward's.
void round_trip(const Family& f, const std::string& name) {
  const HfModel hf = f.hf();
  const std::string a = test::temp_folder(name + "_a"), b = test::temp_folder(name + "_b");
  test::write_hf(hf, a);
  const DecoderModel m1 = load_decoder_hf(a);
  expect_moe_config(m1.config, f);
  expect_experts(m1, hf, f);
  if (f.qk_norm) {
    const int64_t q = f.qk_norm_whole ? 32 : 8, k = f.qk_norm_whole ? 16 : 8;
    EXPECT_EQ(m1.weights.layers[1].q_norm.shape, Shape({q}));
    EXPECT_EQ(m1.weights.layers[1].k_norm.shape, Shape({k}));
    EXPECT_EQ(values_of(m1.weights.layers[1].k_norm),
              hf.tensors.at("model.layers.1.self_attn.k_norm.weight").values);
  }

  const std::string gguf = a + "/model.gguf";
  save_decoder_gguf(m1, gguf);
  const DecoderModel m2 = load_decoder_gguf(gguf);
  EXPECT_EQ(m2.gguf->get_string("general.architecture"), f.gguf_arch);
  expect_same_config(m2.config, m1.config);
  EXPECT_EQ(m2.config.rope_layout,
            f.mixtral() ? ops::RopeLayout::interleaved : ops::RopeLayout::half);
  for (size_t l = 0; l < 2; ++l) {
    const DecoderLayer &x = m1.weights.layers[l], &y = m2.weights.layers[l];
    EXPECT_EQ(values_of(y.ffn_router), values_of(x.ffn_router));
    EXPECT_EQ(values_of(y.w_gate), values_of(x.w_gate));
    EXPECT_EQ(values_of(y.w_up), values_of(x.w_up));
    EXPECT_EQ(values_of(y.w_down), values_of(x.w_down));
    if (!f.mixtral()) {
      EXPECT_EQ(values_of(y.wq), values_of(x.wq));
    }
  }

  save_decoder_hf(m2, b, DType::f32);
  expect_same_safetensors(a, b);
  const nlohmann::json cfg = nlohmann::json::parse(read_text_file(b + "/config.json"));
  EXPECT_EQ(cfg["architectures"][0], f.arch);
  const DecoderModel m3 = load_decoder_hf(b);
  expect_same_config(m3.config, m1.config);
  expect_same_weights(m3, m1);

  const std::vector<int32_t> tokens = tessera::test::random_tokens(12, m1.config.vocab, 5);
  const std::vector<float> l1 = forward_logits(m1, tokens), l2 = forward_logits(m2, tokens);
  EXPECT_EQ(forward_logits(m3, tokens), l1);
  const std::vector<double> want = tessera::test::reference_logits(m1, tokens);
  ASSERT_EQ(l1.size(), want.size());
  for (size_t i = 0; i < l1.size(); ++i) {
    if (f.mixtral())
      ASSERT_NEAR(l2[i], l1[i], 1e-5 * (1 + std::fabs(l1[i]))) << "logit " << i;
    else
      ASSERT_EQ(l2[i], l1[i]) << "logit " << i;
    ASSERT_NEAR(l1[i], want[i], 2e-4 * (1 + std::fabs(want[i]))) << "logit " << i;
  }
}

TEST(DecoderMoeHf, Qwen3MoeRoundTrip) {
  round_trip(kQwen3Moe, "moe_qwen3");
}
TEST(DecoderMoeHf, OlmoeRoundTrip) {
  round_trip(kOlmoe, "moe_olmoe");
}
TEST(DecoderMoeHf, MixtralRoundTrip) {
  round_trip(kMixtral, "moe_mixtral");
}

// config.json's model_type names the family when 'architectures' is absent; transformers'
// default for norm_topk_prob (false) applies when the key is absent.
TEST(DecoderMoeHf, ModelTypeAndDefaults) {
  HfModel hf = test::tiny_qwen3moe();
  hf.config.erase("architectures");
  hf.config.erase("norm_topk_prob");
  const std::string dir = test::temp_folder("moe_model_type");
  test::write_hf(hf, dir);
  const DecoderModel m = load_decoder_hf(dir);
  EXPECT_TRUE(m.config.qk_norm && !m.config.qk_norm_whole);
  EXPECT_FALSE(m.config.expert_norm);
  EXPECT_EQ(m.config.n_experts, 4);
}

// A bf16 folder's experts stay bf16 in the stacked matrices (the router becomes f32), and the
// folder written back in bf16 holds the same bytes.
TEST(DecoderMoeHf, Bf16ExpertsKeepTheirType) {
  const HfModel hf = test::tiny_olmoe();
  const std::string a = test::temp_folder("moe_bf16_a"), b = test::temp_folder("moe_bf16_b");
  test::write_hf(hf, a, DType::bf16, 2);
  const DecoderModel m = load_decoder_hf(a);
  expect_experts(m, hf, kOlmoe, DType::bf16);
  save_decoder_hf(m, b, DType::bf16);
  const formats::SafetensorsReader rb(b + "/model.safetensors");
  EXPECT_EQ(rb.entries().size(), hf.tensors.size());
  for (const auto& [name, t] : hf.tensors) {
    const formats::SafetensorsEntry* e = rb.find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, DType::bf16) << name;
    std::vector<float> got(t.values.size());
    to_f32(e->dtype, e->data, got.data(), e->shape.numel());
    EXPECT_EQ(got, rounded(t.values, DType::bf16)) << name;
  }
}

// What is not implemented, or missing, is refused naming the key or the tensor.
TEST(DecoderMoeHf, RefusesByKeyAndTensor) {
  const std::string dir = test::temp_folder("moe_refused");
  auto refused = [&](const HfModel& hf, const std::string& part) {
    test::write_hf(hf, dir);
    tessera::test::expect_error([&] { load_decoder_hf(dir); }, part);
  };
  HfModel dense = test::tiny_qwen3moe();
  dense.config["mlp_only_layers"] = {0};
  refused(dense, "mlp_only_layers");
  HfModel step = test::tiny_qwen3moe();
  step.config["decoder_sparse_step"] = 2;
  refused(step, "decoder_sparse_step");
  HfModel shared = test::tiny_qwen3moe();
  shared.config["shared_expert_intermediate_size"] = 32;
  refused(shared, "shared_expert_intermediate_size");
  HfModel too_many = test::tiny_qwen3moe();
  too_many.config["num_experts_per_tok"] = 5;
  refused(too_many, "num_experts_per_tok");
  HfModel clipped = test::tiny_olmoe();
  clipped.config["clip_qkv"] = 8.0;
  refused(clipped, "clip_qkv");

  HfModel missing = test::tiny_mixtral();
  const std::string gone = expert_name(kMixtral, 1, 2, "up");
  ASSERT_EQ(missing.tensors.erase(gone), 1u);
  refused(missing, gone);
  // An expert beyond num_local_experts is not part of the model.
  HfModel extra = test::tiny_mixtral();
  extra.tensors[expert_name(kMixtral, 0, 4, "gate")] =
      extra.tensors.at(expert_name(kMixtral, 0, 3, "gate"));
  refused(extra, "experts.4.w1");
  // OLMoE's q norm is of the whole q: a per-head one is refused naming the tensor.
  HfModel per_head = test::tiny_olmoe();
  per_head.tensors["model.layers.0.self_attn.q_norm.weight"].shape = Shape({8});
  per_head.tensors["model.layers.0.self_attn.q_norm.weight"].values.resize(8);
  refused(per_head, "model.layers.0.self_attn.q_norm.weight");
}

// The writer names the family from the options and refuses what the family cannot say:
// Mixtral always renormalizes the chosen experts' weights.
TEST(DecoderMoeHf, WriterRefusesRoutingMixtralCannotExpress) {
  const std::string a = test::temp_folder("moe_write_a"), b = test::temp_folder("moe_write_b");
  test::write_hf(test::tiny_mixtral(), a);
  DecoderModel m = load_decoder_hf(a);
  m.config.expert_norm = false;
  tessera::test::expect_error([&] { save_decoder_hf(m, b, DType::f32); }, "MixtralForCausalLM");
}

}  // namespace
}  // namespace tessera::model
