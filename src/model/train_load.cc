// Loads any model the inference loaders read (a GGUF file or a Hugging Face folder, GPT-2 or
// Llama family, weights in any stored type) into a training model (init_from, sample): the
// file is read and checked by load_decoder, its shape becomes the training model's and every
// weight is widened to the f32 masters. Folders are written by save_decoder_hf on as_decoder(m)
// (model/decoder_save.h).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/train_model.h"

namespace tessera::model {

TrainConfig trainable_config(const DecoderConfig& c, const std::string& from) {
  TrainConfig cfg;
  cfg.arch = c.arch;
  if (c.arch == DecoderArch::gpt2) {
    TS_CHECK(std::fabs(c.norm_eps - 1e-5f) <= 1e-12f, "[train] ", from,
             ": field 'layer_norm_epsilon' is ", c.norm_eps, "; the kernels use 1e-5");
    TS_CHECK(c.tied_embeddings, "[train] ", from,
             ": field 'tie_word_embeddings' is false; the training model ties GPT-2's head to wte");
  } else {
    cfg.options = c;  // every layer option, as inference describes it
    cfg.n_kv_head = c.n_kv_heads;
    cfg.rope_theta = c.rope_theta;
    cfg.rope_layout = c.rope_layout;
    cfg.norm_eps = c.norm_eps;
    cfg.tied = c.tied_embeddings;
    cfg.qkv_bias = c.qkv_bias;
  }
  cfg.n_layer = c.n_layers;
  cfg.n_head = c.n_heads;
  cfg.n_embd = c.d_model;
  cfg.d_ff = c.d_ff;
  cfg.vocab_size = c.vocab;
  cfg.padded_vocab_size = TrainConfig::pad_vocab(c.vocab);
  cfg.max_seq = c.max_ctx;
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail("[train] ", from, ": ", e.what());
  }
  return cfg;
}

namespace {
// Where a model's shape came from, for errors: a folder's config.json, or the GGUF file itself.
std::string shape_source(const std::string& path) {
  return std::filesystem::is_directory(path) ? path + "/config.json" : path;
}
}  // namespace

std::unique_ptr<TrainModel> load_lora_trainable(const std::string& path, const LoraSpec& spec,
                                                const ops::Context& ctx) {
  DecoderModel base = load_decoder(path);
  trainable_config(base.config, shape_source(path));  // refused by name
  return std::make_unique<TrainModel>(std::move(base), spec, ctx);
}

std::unique_ptr<TrainModel> load_trainable(const std::string& path, const ops::Context& ctx) {
  const DecoderModel src = load_decoder(path);
  const TrainConfig cfg = trainable_config(src.config, shape_source(path));

  // Every tensor of the loaded model into the same tensor of the training model's view (whose
  // embedding, and untied head, have padding rows beyond the vocabulary: zero).
  auto model = std::make_unique<TrainModel>(cfg, ctx);  // parameters zero
  ops::HostMirror<float> host(ctx, model->params(), model->num_params(),
                              ops::HostMirror<float>::write);
  std::memset(host.data(), 0, static_cast<size_t>(model->num_params()) * sizeof(float));
  const DecoderModel dst = as_decoder(*model);
  std::vector<std::pair<const WeightRef*, const WeightRef*>> pairs = {
      {&src.weights.tok_embd, &dst.weights.tok_embd},
      {&src.weights.pos_embd, &dst.weights.pos_embd},
      {&src.weights.out_norm, &dst.weights.out_norm},
      {&src.weights.out_norm_b, &dst.weights.out_norm_b}};
  if (!cfg.tied) pairs.emplace_back(&src.weights.output, &dst.weights.output);
  for (size_t l = 0; l < src.weights.layers.size(); ++l) {
    const DecoderLayer& a = src.weights.layers[l];
    const DecoderLayer& b = dst.weights.layers[l];
    const auto am = a.matrices(), bm = b.matrices();
    for (size_t k = 0; k < am.size(); ++k) pairs.emplace_back(am[k], bm[k]);
    const auto av = a.vectors(), bv = b.vectors();
    for (size_t k = 0; k < av.size(); ++k) pairs.emplace_back(av[k], bv[k]);
  }
  for (const auto& [from_w, to] : pairs) {
    TS_CHECK(from_w->present() == to->present(), "[train] ", path, ": a tensor the training model ",
             to->present() ? "needs is missing" : "lacks is present");
    if (!to->present()) continue;
    TS_CHECK(from_w->shape == to->shape, "[train] ", path,
             ": a tensor does not fit the training "
             "model (",
             from_w->shape.str(), " for ", to->shape.str(), ")");
    float* out = host.data() + (static_cast<const float*>(to->data) - model->params());
    to_f32(from_w->type, from_w->data, out, from_w->shape.numel());  // any plain stored type
  }
  host.flush();
  model->params_updated();
  return model;
}

}  // namespace tessera::model
