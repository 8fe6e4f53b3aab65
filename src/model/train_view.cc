// A training model (GPT-2 or Llama) seen as an inference DecoderModel: views into its flat
// parameter buffer, so the engine runs (and generates from) a model being trained without copying
// or converting it.
#include "core/error.h"
#include "model/decoder.h"
#include "model/train_model.h"
#include "model/train_model_impl.h"

namespace tessera::model {

DecoderModel as_decoder(const TrainModel& m) {
  return as_decoder(m, m.params());
}

void attach_lora_views(const TrainModel& m, const float* params, DecoderModel& d) {
  const LoraSpec& spec = m.lora();
  for (size_t l = 0; l < d.weights.layers.size(); ++l)
    for (LayerMatrix mat : spec.targets) {
      const auto li = static_cast<int64_t>(l);
      const TensorInfo& a = m.tensors().at(peft_a_name(li, mat));
      const TensorInfo& b = m.tensors().at(peft_b_name(li, mat));
      LoraRef& r = d.weights.layers[l].lora[static_cast<size_t>(mat)];
      r.a = WeightRef{params + a.offset, DType::f32, a.shape};
      r.b = WeightRef{params + b.offset, DType::f32, b.shape};
      r.scale = spec.scale();
    }
}

DecoderModel as_decoder(const TrainModel& m, const float* params) {
  if (m.is_lora()) {
    DecoderModel d = m.lora_base();
    attach_lora_views(m, params, d);
    return d;
  }
  DecoderModel d;
  d.config = m.config().decoder_config();
  const DecoderConfig& c = d.config;
  const TensorTable& table = m.tensors();
  auto ref = [&](const std::string& name, Shape shape) {
    const TensorInfo& t = table.at(name);
    TS_CHECK(t.dtype == DType::f32 && shape.numel() <= t.shape.numel(), "[model] tensor '", name,
             "' does not hold a ", shape.numel(), "-element f32 view");
    return WeightRef{params + t.offset, DType::f32, shape};
  };
  // A MoE layer's experts' matrices m (each of shape `each`), consecutive in the table, as the
  // one stacked matrix DecoderConfig describes.
  auto stacked = [&](const std::string& p, bool mixtral, LayerMatrix m, Shape each) {
    const int64_t E = c.n_experts;
    const WeightRef first = ref(hf_expert_name(p, mixtral, 0, m), each);
    for (int64_t e = 1; e < E; ++e)
      TS_CHECK(table.at(hf_expert_name(p, mixtral, e, m)).offset ==
                   table.at(hf_expert_name(p, mixtral, 0, m)).offset + e * each.numel(),
               "[model] tensor '", hf_expert_name(p, mixtral, e, m),
               "' does not follow its expert ", e - 1);
    return WeightRef{first.data, DType::f32, Shape({E * each[0], each[1]})};
  };
  // Rows [first, first + n) of a matrix, or elements of a vector.
  auto rows = [](const WeightRef& r, int64_t first, int64_t n) {
    const bool matrix = r.shape.rank() == 2;
    const int64_t stride = matrix ? r.cols() : 1;
    WeightRef s = r;
    s.data = static_cast<const float*>(r.data) + first * stride;
    s.shape = matrix ? Shape({n, r.cols()}) : Shape({n});
    return s;
  };
  const int64_t C = c.d_model;
  DecoderWeights& w = d.weights;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  if (c.arch == DecoderArch::gpt2) {
    w.tok_embd = ref("wte.weight", Shape({c.vocab, C}));  // the first V of the Vp padded rows
    w.pos_embd = ref("wpe.weight", Shape({c.max_ctx, C}));
    for (int64_t i = 0; i < c.n_layers; ++i) {
      const std::string p = hf_gpt2_layer_prefix(i);
      DecoderLayer& l = w.layers[static_cast<size_t>(i)];
      const WeightRef qkv = ref(p + kFusedQkv.hf_gpt2, Shape({3 * C, C}));  // q, k, v rows
      l.wq = rows(qkv, 0, C);
      l.wk = rows(qkv, C, C);
      l.wv = rows(qkv, 2 * C, C);
      const WeightRef qkv_b = ref(p + kFusedQkvBias.hf_gpt2, Shape({3 * C}));
      l.bq = rows(qkv_b, 0, C);
      l.bk = rows(qkv_b, C, C);
      l.bv = rows(qkv_b, 2 * C, C);
      using L = DecoderLayer;
      for (WeightRef L::*m : {&L::attn_norm, &L::attn_norm_b, &L::wo, &L::bo, &L::ffn_norm,
                              &L::ffn_norm_b, &L::w_up, &L::b_up, &L::w_down, &L::b_down}) {
        const LayerTensor& t = layer_tensor(m);
        l.*m = ref(p + t.hf_gpt2, layer_tensor_shape(t, c));
      }
    }
    w.out_norm = ref("ln_f.weight", Shape({C}));
    w.out_norm_b = ref("ln_f.bias", Shape({C}));
    w.output = w.tok_embd;
  } else {
    w.tok_embd = ref("model.embed_tokens.weight", Shape({c.vocab, C}));
    for (int64_t i = 0; i < c.n_layers; ++i) {
      const std::string p = hf_layer_prefix(i);
      DecoderLayer& l = w.layers[static_cast<size_t>(i)];
      for (const LayerTensor& t : layer_tensors()) {
        if (!trained_tensor(t, c)) continue;
        const Shape shape = layer_tensor_shape(t, c);
        l.*t.member =
            c.moe() && expert_stack(t)
                ? stacked(p, hf_moe_is_mixtral(c), static_cast<LayerMatrix>(t.matrix), shape)
                : ref(hf_layer_name(p, t, c), shape);
      }
    }
    w.out_norm = ref("model.norm.weight", Shape({C}));
    w.output = c.tied_embeddings ? w.tok_embd : ref("lm_head.weight", Shape({c.vocab, C}));
  }
  d.source = c.name;
  return d;
}

}  // namespace tessera::model
