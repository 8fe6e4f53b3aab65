// Hugging Face folders -> DecoderModel (Llama, Qwen2, GPT-2; single file and sharded), the GGUF
// and HF writers, and the HF -> GGUF -> HF round trip being bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/decoder.h"
#include "model/decoder_save.h"
#include "model/hf_fixture.h"
#include "test_util/expect_error.h"

namespace tessera::model {
namespace {

using test::HfModel;

using test::expect_same_safetensors;
using test::rounded;
using test::values_of;

void expect_tensor(const WeightRef& w, const HfModel& m, const std::string& name,
                   DType stored = DType::f32) {
  ASSERT_TRUE(w.present()) << name;
  const test::HfTensor& t = m.tensors.at(name);
  EXPECT_EQ(w.shape, t.shape) << name;
  EXPECT_EQ(values_of(w), rounded(t.values, stored)) << name;
}

TEST(DecoderHf, LoadsLlamaUntied) {
  const HfModel hf = test::tiny_llama(false);
  const std::string dir = test::temp_folder("llama_untied");
  test::write_hf(hf, dir);
  const DecoderModel m = load_decoder_hf(dir);
  const DecoderConfig& c = m.config;
  EXPECT_EQ(c.arch, DecoderArch::llama);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rope_dim, 8);
  EXPECT_EQ(c.d_ff, 64);
  EXPECT_EQ(c.vocab, 64);
  EXPECT_EQ(c.max_ctx, 128);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_layout, ops::RopeLayout::half);
  EXPECT_EQ(c.rope_scaling, RopeScaling::none);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(m.source, dir);
  const DecoderLayer& l1 = m.weights.layers[1];
  expect_tensor(l1.wq, hf, "model.layers.1.self_attn.q_proj.weight");
  expect_tensor(l1.wk, hf, "model.layers.1.self_attn.k_proj.weight");
  expect_tensor(l1.w_down, hf, "model.layers.1.mlp.down_proj.weight");
  expect_tensor(l1.ffn_norm, hf, "model.layers.1.post_attention_layernorm.weight");
  expect_tensor(m.weights.output, hf, "lm_head.weight");
  expect_tensor(m.weights.out_norm, hf, "model.norm.weight");
  EXPECT_FALSE(l1.bq.present());
  EXPECT_NE(m.weights.output.data, m.weights.tok_embd.data);
}

TEST(DecoderHf, LoadsTiedShardedBf16) {
  const HfModel hf = test::tiny_llama(true);
  const std::string dir = test::temp_folder("llama_tied_sharded");
  test::write_hf(hf, dir, DType::bf16, 2);
  const DecoderModel m = load_decoder_hf(dir);
  EXPECT_TRUE(m.config.tied_embeddings);
  EXPECT_EQ(m.weights.output.data, m.weights.tok_embd.data);
  // Matrices stay bf16 in the mapped shards; norms become f32 for the kernels.
  EXPECT_EQ(m.weights.layers[0].wq.type, DType::bf16);
  EXPECT_EQ(m.weights.layers[0].attn_norm.type, DType::f32);
  expect_tensor(m.weights.tok_embd, hf, "model.embed_tokens.weight", DType::bf16);
  expect_tensor(m.weights.layers[0].wv, hf, "model.layers.0.self_attn.v_proj.weight", DType::bf16);
  expect_tensor(m.weights.layers[1].attn_norm, hf, "model.layers.1.input_layernorm.weight",
                DType::bf16);
}

TEST(DecoderHf, LoadsQwen2Biases) {
  const HfModel hf = test::tiny_llama(false, "Qwen2ForCausalLM");
  const std::string dir = test::temp_folder("qwen2");
  test::write_hf(hf, dir);
  const DecoderModel m = load_decoder_hf(dir);
  EXPECT_TRUE(m.config.qkv_bias);
  const DecoderLayer& l = m.weights.layers[0];
  expect_tensor(l.bq, hf, "model.layers.0.self_attn.q_proj.bias");
  expect_tensor(l.bk, hf, "model.layers.0.self_attn.k_proj.bias");
  expect_tensor(l.bv, hf, "model.layers.0.self_attn.v_proj.bias");
  EXPECT_FALSE(l.bo.present());
}

TEST(DecoderHf, LoadsGpt2TransposingConv1D) {
  const HfModel hf = test::tiny_gpt2("transformer.");
  const std::string dir = test::temp_folder("gpt2");
  test::write_hf(hf, dir);
  const DecoderModel m = load_decoder_hf(dir);
  const DecoderConfig& c = m.config;
  EXPECT_EQ(c.arch, DecoderArch::gpt2);
  EXPECT_EQ(c.d_ff, 128);  // n_inner null -> 4 * n_embd
  EXPECT_EQ(c.max_ctx, 16);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  const int64_t C = 32;
  const DecoderLayer& l = m.weights.layers[1];
  const std::vector<float>& attn = hf.tensors.at("transformer.h.1.attn.c_attn.weight").values;
  const std::vector<float> wk = values_of(l.wk);
  ASSERT_EQ(l.wk.shape, Shape({C, C}));
  // wk row r, column k = c_attn (in k, out C + r).
  for (int64_t r = 0; r < C; ++r)
    for (int64_t k = 0; k < C; ++k)
      ASSERT_EQ(wk[static_cast<size_t>(r * C + k)], attn[static_cast<size_t>(k * 3 * C + C + r)]);
  const std::vector<float>& fc = hf.tensors.at("transformer.h.1.mlp.c_fc.weight").values;
  const std::vector<float> up = values_of(l.w_up);
  ASSERT_EQ(l.w_up.shape, Shape({128, C}));
  EXPECT_EQ(up[5 * C + 7], fc[7 * 128 + 5]);
  const std::vector<float> bv = values_of(l.bv);
  const std::vector<float>& b = hf.tensors.at("transformer.h.1.attn.c_attn.bias").values;
  EXPECT_EQ(bv, std::vector<float>(b.begin() + 2 * C, b.end()));
  expect_tensor(m.weights.pos_embd, hf, "transformer.wpe.weight");
  expect_tensor(m.weights.out_norm_b, hf, "transformer.ln_f.bias");
}

// HF -> load -> GGUF -> the GGUF loader -> HF gives the original tensors bit for bit.
void round_trip(const HfModel& hf, const std::string& name) {
  const std::string a = test::temp_folder(name + "_a"), b = test::temp_folder(name + "_b");
  const std::string gguf = a + "/model.gguf";
  test::write_hf(hf, a);
  const DecoderModel m1 = load_decoder_hf(a);
  save_decoder_gguf(m1, gguf,
                    [](formats::GgufWriter& w) { w.set("tokenizer.ggml.model", "gpt2"); });
  const DecoderModel m2 = load_decoder_gguf(gguf);
  EXPECT_EQ(m2.config.n_layers, m1.config.n_layers);
  EXPECT_EQ(m2.config.n_kv_heads, m1.config.n_kv_heads);
  EXPECT_EQ(m2.config.d_ff, m1.config.d_ff);
  EXPECT_EQ(m2.config.max_ctx, m1.config.max_ctx);
  EXPECT_EQ(m2.config.tied_embeddings, m1.config.tied_embeddings);
  EXPECT_EQ(m2.config.qkv_bias, m1.config.qkv_bias);
  EXPECT_EQ(m2.config.norm_eps, m1.config.norm_eps);
  EXPECT_EQ(m2.config.sliding_window, m1.config.sliding_window);
  EXPECT_EQ(m2.gguf->get_string("tokenizer.ggml.model"), "gpt2");  // `extra` ran
  EXPECT_EQ(m2.config.qk_norm, m1.config.qk_norm);
  if (m1.config.qk_norm) {  // qwen3: rotate-half rows in GGUF too, as llama.cpp reads them
    EXPECT_EQ(m2.gguf->get_string("general.architecture"), "qwen3");
    EXPECT_EQ(m2.config.rope_layout, ops::RopeLayout::half);
    EXPECT_EQ(values_of(m2.weights.layers[1].k_norm), values_of(m1.weights.layers[1].k_norm));
  } else if (m1.config.arch == DecoderArch::llama) {
    EXPECT_EQ(m2.config.rope_layout, ops::RopeLayout::interleaved);
    // GGUF q row h*D + 2i + 1 is HF row h*D + D/2 + i (head 3, i = 1: rows 27 <- 29).
    const int64_t C = m1.config.d_model;
    const std::vector<float> q1 = values_of(m1.weights.layers[0].wq);
    const std::vector<float> q2 = values_of(m2.weights.layers[0].wq);
    for (int64_t k = 0; k < C; ++k) {
      EXPECT_EQ(q2[static_cast<size_t>(27 * C + k)], q1[static_cast<size_t>(29 * C + k)]);
      EXPECT_EQ(q2[static_cast<size_t>(26 * C + k)], q1[static_cast<size_t>(25 * C + k)]);
    }
  }
  save_decoder_hf(m2, b, DType::f32, "{\"model\": {}}");
  expect_same_safetensors(a, b);
  EXPECT_EQ(read_text_file(b + "/tokenizer.json"), "{\"model\": {}}");
  const DecoderModel m3 = load_decoder_hf(b);
  EXPECT_EQ(m3.config.arch, m1.config.arch);
  EXPECT_EQ(m3.config.qkv_bias, m1.config.qkv_bias);
  EXPECT_EQ(m3.config.norm_eps, m1.config.norm_eps);
  EXPECT_EQ(m3.config.sliding_window, m1.config.sliding_window);
  EXPECT_EQ(m3.config.rope_layout, ops::RopeLayout::half);
  EXPECT_EQ(m3.config.qk_norm, m1.config.qk_norm);
}

TEST(DecoderRoundTrip, LlamaUntied) {
  round_trip(test::tiny_llama(false), "rt_untied");
}
TEST(DecoderRoundTrip, LlamaTied) {
  round_trip(test::tiny_llama(true), "rt_tied");
}
// Mistral 7B v0.1's window survives HF -> GGUF -> HF; Qwen2's unused window is not applied, and
// its per-layer window is refused by name.
TEST(DecoderRoundTrip, MistralSlidingWindow) {
  HfModel hf = test::tiny_llama(false, "MistralForCausalLM");
  hf.config["sliding_window"] = 16;
  const std::string dir = test::temp_folder("mistral_window");
  test::write_hf(hf, dir);
  EXPECT_EQ(load_decoder_hf(dir).config.sliding_window, 16);
  round_trip(hf, "rt_mistral");
  HfModel qw = test::tiny_llama(false, "Qwen2ForCausalLM");
  qw.config["sliding_window"] = 32;
  qw.config["use_sliding_window"] = false;
  const std::string qdir = test::temp_folder("qwen2_window");
  test::write_hf(qw, qdir);
  EXPECT_EQ(load_decoder_hf(qdir).config.sliding_window, 0);
  qw.config["use_sliding_window"] = true;
  test::write_hf(qw, qdir);
  tessera::test::expect_error([&] { load_decoder_hf(qdir); }, "use_sliding_window");
}
TEST(DecoderRoundTrip, Qwen2) {
  round_trip(test::tiny_llama(false, "Qwen2ForCausalLM"), "rt_qw");
}
TEST(DecoderRoundTrip, Qwen3) {
  round_trip(test::tiny_llama(false, "Qwen3ForCausalLM"), "rt_qw3");
  // A Qwen3 folder whose layer lacks its q norm is refused naming the tensor.
  HfModel bad = test::tiny_llama(false, "Qwen3ForCausalLM");
  bad.tensors.erase("model.layers.1.self_attn.q_norm.weight");
  const std::string dir = test::temp_folder("qwen3_bad");
  test::write_hf(bad, dir);
  tessera::test::expect_error([&] { load_decoder_hf(dir); }, "model.layers.1.self_attn.q_norm");
}
// Phi-3: q, k, v fused in qkv_proj and gate, up in gate_up_proj (gate rows first) load as the
// same matrices as the Llama folder they were fused from; a folder is written back as Llama.
TEST(DecoderHf, Phi3FusedProjections) {
  const HfModel llama = test::tiny_llama(false);
  HfModel phi = llama;
  phi.config["architectures"] = {"Phi3ForCausalLM"};
  auto fuse = [&](const std::string& p, const std::vector<std::string>& parts,
                  const std::string& name) {
    test::HfTensor fused{Shape({0, 32}), {}};
    for (const std::string& part : parts) {
      const test::HfTensor& t = phi.tensors.at(p + part);
      fused.shape = Shape({fused.shape[0] + t.shape[0], t.shape[1]});
      fused.values.insert(fused.values.end(), t.values.begin(), t.values.end());
      phi.tensors.erase(p + part);
    }
    phi.tensors[p + name] = fused;
  };
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    fuse(p, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
         "self_attn.qkv_proj.weight");
    fuse(p, {"mlp.gate_proj.weight", "mlp.up_proj.weight"}, "mlp.gate_up_proj.weight");
  }
  const std::string a = test::temp_folder("phi3_a"), b = test::temp_folder("phi3_b");
  test::write_hf(llama, a);
  test::write_hf(phi, b);
  const DecoderModel ml = load_decoder_hf(a), mp = load_decoder_hf(b);
  for (size_t l = 0; l < 2; ++l) {
    const auto lm = ml.weights.layers[l].matrices(), pm = mp.weights.layers[l].matrices();
    for (size_t i = 0; i < lm.size(); ++i) EXPECT_EQ(values_of(*lm[i]), values_of(*pm[i])) << i;
  }
  EXPECT_TRUE(mp.weights.layers[0].wq.continued_by(mp.weights.layers[0].wk));  // one product
  // Phi-3.5's LongRoPE and Phi-4-mini's partial rotation: read (the attention factor from the
  // lengths when the config leaves it out, as transformers computes it), then HF -> GGUF (arch
  // phi3: rope_factors_short/long, gate and up fused in ffn_up) -> HF with every field kept.
  phi.config["partial_rotary_factor"] = 0.5;  // 4 of each head's 8 dimensions
  phi.config["original_max_position_embeddings"] = 64;
  phi.config["rope_scaling"] = {
      {"type", "longrope"}, {"short_factor", {1.0, 1.5}}, {"long_factor", {2.0, 8.0}}};
  test::write_hf(phi, b);
  const DecoderModel lr = load_decoder_hf(b);
  EXPECT_EQ(lr.config.rope_scaling, RopeScaling::longrope);
  EXPECT_EQ(lr.config.rope_dim, 4);
  EXPECT_EQ(lr.config.rope_original_max_ctx, 64);
  EXPECT_EQ(lr.config.rope_long_divisors, (std::vector<float>{2.0f, 8.0f}));
  EXPECT_NEAR(lr.config.rope_attn_factor, std::sqrt(1 + std::log(2.0) / std::log(64.0)), 1e-12);
  const std::string gguf = b + "/model.gguf", c = test::temp_folder("phi3_c");
  save_decoder_gguf(lr, gguf);
  const DecoderModel lg = load_decoder_gguf(gguf);
  EXPECT_EQ(lg.gguf->get_string("general.architecture"), "phi3");
  save_decoder_hf(lg, c, DType::f32, "{\"model\": {}}");
  for (const DecoderModel& back : {lg, load_decoder_hf(c)}) {
    EXPECT_EQ(back.config.rope_scaling, RopeScaling::longrope);
    EXPECT_EQ(back.config.rope_dim, 4);
    EXPECT_EQ(back.config.rope_original_max_ctx, 64);
    EXPECT_EQ(back.config.rope_freq_divisors, lr.config.rope_freq_divisors);
    EXPECT_EQ(back.config.rope_long_divisors, lr.config.rope_long_divisors);
    EXPECT_NEAR(back.config.rope_attn_factor, lr.config.rope_attn_factor, 1e-6);
    for (size_t l = 0; l < 2; ++l) {
      const auto want = lr.weights.layers[l].matrices(), got = back.weights.layers[l].matrices();
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(values_of(*got[i]), values_of(*want[i])) << i;
    }
  }
  phi.tensors.erase("model.layers.1.mlp.gate_up_proj.weight");
  test::write_hf(phi, b);
  tessera::test::expect_error([&] { load_decoder_hf(b); }, "model.layers.1.mlp.gate_up_proj");
}

// SmolLM3: no_rope_layers (1: the layer rotates) load as the layers without RoPE and are written
// back; a GGUF 'smollm3' file can only hold llama.cpp's every-fourth-layer rule, so another
// pattern is refused rather than written as that rule; the interval form builds the rule.
TEST(DecoderRoundTrip, SmolLM3) {
  HfModel hf = test::tiny_llama(true, "SmolLM3ForCausalLM");
  hf.config["no_rope_layers"] = {1, 0};
  const std::string a = test::temp_folder("rt_smollm3_a"), b = test::temp_folder("rt_smollm3_b");
  test::write_hf(hf, a);
  const DecoderModel m1 = load_decoder_hf(a);
  EXPECT_EQ(m1.config.nope_layers, (std::vector<uint8_t>{0, 1}));
  save_decoder_hf(m1, b, DType::f32, "{\"model\": {}}");
  expect_same_safetensors(a, b);
  EXPECT_EQ(load_decoder_hf(b).config.nope_layers, m1.config.nope_layers);
  tessera::test::expect_error([&] { save_decoder_gguf(m1, a + "/model.gguf"); }, "every fourth");
  // Two layers under the every-fourth rule: both rotate, and the file says smollm3.
  hf.config["no_rope_layers"] = {1, 1};
  test::write_hf(hf, a);
  save_decoder_gguf(load_decoder_hf(a), a + "/model.gguf");
  const DecoderModel g = load_decoder_gguf(a + "/model.gguf");
  EXPECT_EQ(g.gguf->get_string("general.architecture"), "smollm3");
  EXPECT_EQ(g.config.nope_layers, (std::vector<uint8_t>{0, 0}));
  hf.config.erase("no_rope_layers");
  hf.config["no_rope_layer_interval"] = 2;
  test::write_hf(hf, a);
  EXPECT_EQ(load_decoder_hf(a).config.nope_layers, (std::vector<uint8_t>{0, 1}));
  hf.config["no_rope_layers"] = {1, 2};
  test::write_hf(hf, a);
  tessera::test::expect_error([&] { load_decoder_hf(a); }, "no_rope_layers");
}
// Gemma 3: HF -> GGUF (arch gemma3, norms as 1 + w as llama.cpp's converter writes them) -> HF.
// Every matrix comes back bit for bit; a norm weight w to within the rounding of 1 + w in f32
// (2^-24 absolute), as the +1 is folded into the stored value and taken out again.
TEST(DecoderRoundTrip, Gemma3) {
  const HfModel hf = test::tiny_gemma3();
  const std::string a = test::temp_folder("rt_gemma_a"), b = test::temp_folder("rt_gemma_b");
  test::write_hf(hf, a);
  const DecoderModel m1 = load_decoder_hf(a);
  const DecoderConfig& c1 = m1.config;
  EXPECT_TRUE(c1.post_norms && c1.qk_norm && c1.tied_embeddings);
  EXPECT_EQ(c1.mlp_act, ops::GluAct::gelu_tanh);
  EXPECT_EQ(c1.local_layers, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(c1.window(0), 8);
  EXPECT_EQ(c1.window(1), 0);
  EXPECT_FLOAT_EQ(c1.embed_scale, std::sqrt(32.0f));
  EXPECT_FLOAT_EQ(c1.score_scale(), 0.25f);
  // HF's post_attention_layernorm is the attention branch's post-norm; the value 1 + w.
  const std::vector<float>& w =
      hf.tensors.at("model.layers.2.post_attention_layernorm.weight").values;
  EXPECT_EQ(values_of(m1.weights.layers[2].post_attn_norm)[3], 1.0f + w[3]);
  EXPECT_EQ(values_of(m1.weights.layers[2].ffn_norm)[3],
            1.0f + hf.tensors.at("model.layers.2.pre_feedforward_layernorm.weight").values[3]);

  const std::string gguf = a + "/model.gguf";
  save_decoder_gguf(m1, gguf);
  const DecoderModel m2 = load_decoder_gguf(gguf);
  EXPECT_EQ(m2.gguf->get_string("general.architecture"), "gemma3");
  const DecoderConfig& c2 = m2.config;
  EXPECT_EQ(c2.local_layers, c1.local_layers);
  EXPECT_EQ(c2.sliding_window, 8);
  EXPECT_EQ(c2.rope_theta_local, c1.rope_theta_local);
  EXPECT_EQ(c2.rope_layout, ops::RopeLayout::half);
  EXPECT_EQ(c2.score_scale(), c1.score_scale());
  EXPECT_EQ(c2.embed_scale, c1.embed_scale);
  EXPECT_EQ(values_of(m2.weights.layers[2].post_ffn_norm),
            values_of(m1.weights.layers[2].post_ffn_norm));

  save_decoder_hf(m2, b, DType::f32, "{}");
  const formats::SafetensorsReader rb(b + "/model.safetensors");
  EXPECT_EQ(rb.entries().size(), hf.tensors.size());
  for (const auto& [name, t] : hf.tensors) {
    const formats::SafetensorsEntry* e = rb.find(name);
    ASSERT_NE(e, nullptr) << name;
    ASSERT_EQ(e->shape, t.shape) << name;
    std::vector<float> got(t.values.size());
    to_f32(e->dtype, e->data, got.data(), e->shape.numel());
    if (!name.ends_with("norm.weight")) {
      EXPECT_EQ(got, t.values) << name;
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], t.values[i], 0x1p-24f) << name << " [" << i << "]";
  }
  const DecoderModel m3 = load_decoder_hf(b);
  EXPECT_EQ(m3.config.local_layers, c1.local_layers);
  EXPECT_EQ(m3.config.score_scale(), c1.score_scale());

  // What is not implemented is refused naming the key or field.
  const std::string capped_gguf = a + "/capped.gguf";
  save_decoder_gguf(m1, capped_gguf, [](formats::GgufWriter& gw) {
    gw.set("gemma3.final_logit_softcapping", 30.0f);
  });
  tessera::test::expect_error([&] { load_decoder_gguf(capped_gguf); },
                              "gemma3.final_logit_softcapping");
  HfModel capped = hf;
  capped.config["final_logit_softcapping"] = 30.0;
  const std::string d = test::temp_folder("gemma_capped");
  test::write_hf(capped, d);
  tessera::test::expect_error([&] { load_decoder_hf(d); }, "final_logit_softcapping");
  HfModel act = hf;
  act.config["hidden_activation"] = "silu";
  test::write_hf(act, d);
  tessera::test::expect_error([&] { load_decoder_hf(d); }, "hidden_activation");
  HfModel types = hf;
  types.config["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention"};
  test::write_hf(types, d);
  tessera::test::expect_error([&] { load_decoder_hf(d); }, "layer_types");
}

TEST(DecoderRoundTrip, TrainModel) {
  round_trip(test::tiny_gpt2(), "rt_gpt2");
}

TEST(DecoderSave, GgufNamesAndMetadata) {
  const std::string dir = test::temp_folder("gguf_meta");
  test::write_hf(test::tiny_llama(true), dir);
  save_decoder_gguf(load_decoder_hf(dir), dir + "/m.gguf");
  const formats::GgufFile f(dir + "/m.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 2u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 32u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), 64u);
  EXPECT_EQ(f.get_u32("llama.context_length"), 128u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 4u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), 8u);
  EXPECT_FLOAT_EQ(f.get_f32("llama.rope.freq_base"), 10000.0f);
  EXPECT_FLOAT_EQ(f.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(f.at("blk.1.attn_k.weight").shape(), Shape({16, 32}));
  EXPECT_EQ(f.at("blk.1.ffn_down.weight").shape(), Shape({32, 64}));
  EXPECT_EQ(f.at("token_embd.weight").shape(), Shape({64, 32}));
  EXPECT_EQ(f.find("output.weight"), nullptr);  // tied
  EXPECT_EQ(f.find("rope_freqs.weight"), nullptr);
}

TEST(DecoderSave, Gpt2FusesQkv) {
  const std::string dir = test::temp_folder("gguf_gpt2");
  test::write_hf(test::tiny_gpt2(), dir);
  const DecoderModel m = load_decoder_hf(dir);
  save_decoder_gguf(m, dir + "/m.gguf");
  const formats::GgufFile f(dir + "/m.gguf");
  EXPECT_EQ(f.get_string("general.architecture"), "gpt2");
  EXPECT_FLOAT_EQ(f.get_f32("gpt2.attention.layer_norm_epsilon"), 1e-5f);
  const formats::GgufTensorInfo& qkv = f.at("blk.0.attn_qkv.weight");
  ASSERT_EQ(qkv.shape(), Shape({96, 32}));
  // Row 32 + r of the fused matrix is wk row r.
  const auto* rows = reinterpret_cast<const float*>(qkv.data);
  EXPECT_EQ(std::memcmp(rows + 32 * 32, m.weights.layers[0].wk.data, 32 * 32 * 4), 0);
  EXPECT_EQ(f.at("position_embd.weight").shape(), Shape({16, 32}));
  EXPECT_NE(f.find("blk.1.ffn_up.bias"), nullptr);
}

TEST(DecoderSave, LlamaOutputBiasHfRoundTrip) {
  const std::string a = test::temp_folder("obias_a"), b = test::temp_folder("obias_b");
  test::write_hf(test::tiny_llama(false, "LlamaForCausalLM", true), a);
  const DecoderModel m = load_decoder_hf(a);
  EXPECT_TRUE(m.weights.layers[0].bo.present());
  save_decoder_hf(m, b, DType::f32);
  expect_same_safetensors(a, b);
  save_decoder_gguf(m, a + "/m.gguf");
  EXPECT_NE(formats::GgufFile(a + "/m.gguf").find("blk.1.attn_output.bias"), nullptr);
}

TEST(DecoderSave, Bf16FolderKeepsBytes) {
  const std::string a = test::temp_folder("bf16_a"), b = test::temp_folder("bf16_b");
  test::write_hf(test::tiny_llama(false), a, DType::bf16);
  save_decoder_hf(load_decoder_hf(a), b, DType::bf16);
  expect_same_safetensors(a, b);
}

TEST(DecoderSave, Llama3RopeScaling) {
  HfModel hf = test::tiny_llama(false);
  // With D 8 and theta 1e4 the four wavelengths (6.3, 63, 628, 6283) fall in the kept, smoothed
  // and slowed bands of original context 64 (bands at 64/4 = 16 and 64/1 = 64).
  hf.config["rope_scaling"] = {{"rope_type", "llama3"},
                               {"factor", 8.0},
                               {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0},
                               {"original_max_position_embeddings", 64}};
  const std::string a = test::temp_folder("llama3_a"), b = test::temp_folder("llama3_b");
  test::write_hf(hf, a);
  const DecoderModel m1 = load_decoder_hf(a);
  EXPECT_EQ(m1.config.rope_scaling, RopeScaling::llama3);
  EXPECT_EQ(m1.config.rope_original_max_ctx, 64);
  save_decoder_gguf(m1, a + "/m.gguf");
  const DecoderModel m2 = load_decoder_gguf(a + "/m.gguf");
  const std::vector<double> f1 = rope_inv_freqs(m1.config), f2 = rope_inv_freqs(m2.config);
  ASSERT_EQ(f1.size(), f2.size());
  for (size_t i = 0; i < f1.size(); ++i) EXPECT_NEAR(f2[i] / f1[i], 1.0, 1e-6) << i;
  EXPECT_LT(f1[3], f1[0] * 1e-3 / 7.9);  // the slowest pair is slowed by the factor
  // The GGUF keeps the parameters next to rope_freqs.weight, so it converts back exactly.
  EXPECT_EQ(m2.config.rope_scaling, RopeScaling::llama3);
  EXPECT_EQ(m2.config.rope_factor, m1.config.rope_factor);
  EXPECT_TRUE(m2.config.rope_freq_divisors.empty());
  save_decoder_hf(m2, b, DType::f32);
  save_decoder_hf(m1, b, DType::f32);
  const DecoderModel m3 = load_decoder_hf(b);
  EXPECT_EQ(m3.config.rope_scaling, RopeScaling::llama3);
  EXPECT_EQ(m3.config.rope_factor, 8.0);
}

// The rotary settings as transformers 4 writes them (top-level rope_theta / rope_scaling) and as
// transformers 5 does (rope_parameters) load to the same configuration and frequencies; both at
// once load when they agree. A v5 folder read as if its theta were absent would run with 10000.
TEST(DecoderHf, RopeParametersOfTransformers5) {
  struct Layouts {
    nlohmann::json v4_theta, v4_scaling, v5;
  };
  const nlohmann::json llama3 = {{"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 64}};
  nlohmann::json v5_llama3 = llama3;
  v5_llama3["rope_type"] = "llama3";
  v5_llama3["rope_theta"] = 500000.0;
  nlohmann::json v4_llama3 = llama3;
  v4_llama3["rope_type"] = "llama3";
  const std::vector<Layouts> cases = {
      {100000.0, nullptr, {{"rope_type", "default"}, {"rope_theta", 100000.0}}},
      {500000.0, v4_llama3, v5_llama3},
      {10000.0,
       {{"type", "linear"}, {"factor", 2.0}},
       {{"rope_type", "linear"}, {"rope_theta", 10000.0}, {"factor", 2.0}}}};
  int n = 0;
  // Qwen2 and Mistral folders read the same fields (transformers 5 writes them the same way).
  for (const char* arch : {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"})
    for (const Layouts& c : cases) {
      SCOPED_TRACE(cat(arch, " ", c.v5.dump()));
      HfModel v4 = test::tiny_llama(false, arch), v5 = v4, both = v4;
      v4.config["rope_theta"] = c.v4_theta;
      if (!c.v4_scaling.is_null()) v4.config["rope_scaling"] = c.v4_scaling;
      v5.config.erase("rope_theta");
      v5.config["rope_parameters"] = c.v5;
      both.config = v4.config;
      both.config["rope_parameters"] = c.v5;
      const std::string tag = std::to_string(n++);
      DecoderConfig cfg[3];
      int i = 0;
      for (const HfModel* hf : {&v4, &v5, &both}) {
        const std::string dir = test::temp_folder("rope_layout_" + tag + "_" + std::to_string(i));
        test::write_hf(*hf, dir);
        cfg[i++] = load_decoder_hf(dir).config;
      }
      EXPECT_EQ(cfg[0].rope_theta, c.v4_theta.get<double>());
      for (int k = 1; k < 3; ++k) {
        EXPECT_EQ(cfg[k].rope_theta, cfg[0].rope_theta) << k;
        EXPECT_EQ(cfg[k].rope_scaling, cfg[0].rope_scaling) << k;
        EXPECT_EQ(cfg[k].rope_factor, cfg[0].rope_factor) << k;
        EXPECT_EQ(cfg[k].rope_original_max_ctx, cfg[0].rope_original_max_ctx) << k;
        EXPECT_EQ(rope_inv_freqs(cfg[k]), rope_inv_freqs(cfg[0])) << k;
      }
    }
}

TEST(DecoderSave, LinearRopeScaling) {
  HfModel hf = test::tiny_llama(true);
  hf.config["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  const std::string a = test::temp_folder("linear_a"), b = test::temp_folder("linear_b");
  test::write_hf(hf, a);
  save_decoder_gguf(load_decoder_hf(a), a + "/m.gguf");
  EXPECT_EQ(formats::GgufFile(a + "/m.gguf").get_string("llama.rope.scaling.type"), "linear");
  const DecoderModel m = load_decoder_gguf(a + "/m.gguf");
  EXPECT_EQ(m.config.rope_scaling, RopeScaling::linear);
  EXPECT_EQ(m.config.rope_factor, 2.0);
  save_decoder_hf(m, b, DType::f32);
  const DecoderModel h = load_decoder_hf(b);
  EXPECT_EQ(h.config.rope_scaling, RopeScaling::linear);
  EXPECT_EQ(h.config.rope_factor, 2.0);
  expect_same_safetensors(a, b);
}

}  // namespace
}  // namespace tessera::model
