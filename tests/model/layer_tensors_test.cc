// The layer tensor table: every DecoderLayer tensor once, no name twice within a naming scheme,
// and the names derived from it (Gemma 3's norms, the MoE router and experts) as the files have
// them.
#include "model/layer_tensors.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace tessera::model {
namespace {

using L = DecoderLayer;

// Every tensor member of a DecoderLayer, through the two accessors the other loops use.
std::set<const WeightRef*> members(const DecoderLayer& l) {
  std::set<const WeightRef*> out;
  for (const WeightRef* r : l.matrices()) out.insert(r);
  for (const WeightRef* r : l.vectors()) out.insert(r);
  return out;
}

TEST(LayerTensors, EveryMemberOnce) {
  const DecoderLayer l;
  const std::set<const WeightRef*> all = members(l);
  // A member added to DecoderLayer without the accessors (and the table) changes its size.
  EXPECT_EQ(sizeof(DecoderLayer),
            all.size() * sizeof(WeightRef) + sizeof(std::array<LoraRef, kLayerMatrices>));
  std::set<const WeightRef*> seen;
  for (const LayerTensor& t : layer_tensors()) {
    const WeightRef* r = &(l.*t.member);
    EXPECT_TRUE(all.contains(r)) << t.gguf;
    EXPECT_TRUE(seen.insert(r).second) << t.gguf << " twice";
  }
  EXPECT_EQ(seen.size(), all.size());
}

TEST(LayerTensors, MatricesAreInLayerMatrixOrder) {
  DecoderLayer l;
  const auto mats = l.matrices();
  int next = 0;
  for (const LayerTensor& t : layer_tensors()) {
    EXPECT_EQ(t.matrix >= 0, t.kind == LayerTensorKind::matrix) << t.gguf;
    EXPECT_EQ(t.matrix >= 0, t.lora_short != nullptr) << t.gguf;
    if (t.matrix < 0) continue;
    EXPECT_EQ(t.matrix, next++) << t.gguf;  // the quantizer's and LoRA's order
    EXPECT_EQ(&(l.*t.member), mats[static_cast<size_t>(t.matrix)]) << t.gguf;
    EXPECT_EQ(&layer_tensor(static_cast<LayerMatrix>(t.matrix)), &t);
  }
  EXPECT_EQ(next, kLayerMatrices);
}

TEST(LayerTensors, NoNameTwice) {
  std::set<std::string> gguf, hf, gpt2;
  DecoderConfig gemma;
  gemma.post_norms = true;
  const DecoderConfig plain;
  for (const LayerTensor& t : layer_tensors()) {
    EXPECT_TRUE(gguf.insert(t.gguf).second) << t.gguf;
    if (t.gguf_experts) {
      EXPECT_TRUE(gguf.insert(t.gguf_experts).second) << t.gguf_experts;
    }
    if (t.hf_gpt2) {
      EXPECT_TRUE(gpt2.insert(t.hf_gpt2).second) << t.hf_gpt2;
    }
  }
  // Within one model's names (Gemma 3 renames two norms): each name once.
  for (const DecoderConfig* c : {&plain, static_cast<const DecoderConfig*>(&gemma)}) {
    std::set<std::string> names;
    for (const LayerTensor& t : layer_tensors()) {
      if (t.member == &L::post_attn_norm && !c->post_norms) continue;
      if (t.hf == nullptr && t.member != &L::post_attn_norm) continue;  // GPT-2's own
      const std::string n = hf_layer_name("", t, *c);
      EXPECT_TRUE(names.insert(n).second) << n;
    }
  }
  for (const FusedTensor* f : {&kFusedQkv, &kFusedQkvBias, &kFusedGateUp}) {
    if (f->gguf) {
      EXPECT_TRUE(gguf.insert(f->gguf).second) << f->gguf;
    }
    if (f->hf_gpt2) {
      EXPECT_TRUE(gpt2.insert(f->hf_gpt2).second) << f->hf_gpt2;
    }
  }
}

TEST(LayerTensors, NamesAsTheFilesHaveThem) {
  const std::string p = "model.layers.2.";
  DecoderConfig c;
  EXPECT_EQ(hf_layer_name(p, layer_tensor(&L::ffn_norm), c),
            "model.layers.2.post_attention_layernorm.weight");
  c.post_norms = true;
  EXPECT_EQ(hf_layer_name(p, layer_tensor(&L::ffn_norm), c),
            "model.layers.2.pre_feedforward_layernorm.weight");
  EXPECT_EQ(hf_layer_name(p, layer_tensor(&L::post_attn_norm), c),
            "model.layers.2.post_attention_layernorm.weight");
  EXPECT_EQ(hf_router_name(p, false), "model.layers.2.mlp.gate.weight");
  EXPECT_EQ(hf_router_name(p, true), "model.layers.2.block_sparse_moe.gate.weight");
  EXPECT_EQ(hf_expert_name(p, false, 3, LayerMatrix::up),
            "model.layers.2.mlp.experts.3.up_proj.weight");
  EXPECT_EQ(hf_expert_name(p, true, 3, LayerMatrix::up),
            "model.layers.2.block_sparse_moe.experts.3.w3.weight");
  EXPECT_EQ(tensor_module(layer_tensor(LayerMatrix::q).hf), "self_attn.q_proj");
  EXPECT_EQ(gguf_layer_prefix(4) + layer_tensor(&L::bk).gguf, "blk.4.attn_k.bias");
}

TEST(LayerTensors, ShapesFollowTheConfig) {
  DecoderConfig c;
  c.d_model = 8;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 3;
  c.d_ff = 16;
  c.n_experts = 5;
  EXPECT_EQ(layer_tensor_shape(layer_tensor(LayerMatrix::o), c), Shape({8, 12}));
  EXPECT_EQ(layer_tensor_shape(layer_tensor(LayerMatrix::down), c), Shape({8, 16}));
  EXPECT_EQ(layer_tensor_shape(layer_tensor(&L::bk), c), Shape({6}));
  EXPECT_EQ(layer_tensor_shape(layer_tensor(&L::ffn_router), c), Shape({5, 8}));
  EXPECT_EQ(layer_tensor_shape(layer_tensor(&L::k_norm), c), Shape({3}));
  c.qk_norm_whole = true;
  EXPECT_EQ(layer_tensor_shape(layer_tensor(&L::k_norm), c), Shape({6}));
}

}  // namespace
}  // namespace tessera::model
