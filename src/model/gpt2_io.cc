// Loads a Hugging Face GPT-2 folder into a training model (--init-from, sample): the folder is
// read and checked by load_decoder_hf (config.json fields, tensor names and shapes, Conv1D
// transposes, f32/bf16/f16), then copied into the training model's f32 parameters. Folders are
// written by save_decoder_hf on as_decoder(m) (model/decoder_save.h).
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/gpt2.h"

namespace tessera::model {

std::unique_ptr<Gpt2> load_gpt2(const std::string& dir, const ops::Context& ctx) {
  const DecoderModel src = load_decoder_hf(dir);
  const DecoderConfig& c = src.config;
  const std::string cfg_path = dir + "/config.json";
  TS_CHECK(c.arch == DecoderArch::gpt2, "[gpt2] ", cfg_path,
           ": not a GPT-2 model (training takes GPT2LMHeadModel folders)");
  TS_CHECK(c.d_ff == 4 * c.d_model, "[gpt2] ", cfg_path, ": field 'n_inner' is ", c.d_ff,
           "; the training model's MLP is 4 * n_embd = ", 4 * c.d_model);
  TS_CHECK(std::fabs(c.norm_eps - 1e-5f) <= 1e-12f, "[gpt2] ", cfg_path,
           ": field 'layer_norm_epsilon' is ", c.norm_eps, "; the kernels use 1e-5");
  TS_CHECK(c.tied_embeddings, "[gpt2] ", cfg_path,
           ": field 'tie_word_embeddings' is false; the training model ties its head to wte");
  Gpt2Config cfg;
  cfg.n_layer = c.n_layers;
  cfg.n_head = c.n_heads;
  cfg.n_embd = c.d_model;
  cfg.vocab_size = c.vocab;
  cfg.padded_vocab_size = Gpt2Config::pad_vocab(c.vocab);
  cfg.max_seq = c.max_ctx;
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail("[gpt2] ", cfg_path, ": ", e.what());
  }

  // Every tensor of the loaded model into the same tensor of the training model's view (whose
  // q, k and v are rows of c_attn, and whose wte has padding rows beyond the vocabulary: zero).
  auto model = std::make_unique<Gpt2>(cfg, ctx);  // parameters zero
  ops::HostMirror<float> host(ctx, model->params(), model->num_params(),
                              ops::HostMirror<float>::write);
  std::memset(host.data(), 0, static_cast<size_t>(model->num_params()) * sizeof(float));
  const DecoderModel dst = as_decoder(*model);
  std::vector<std::pair<const WeightRef*, const WeightRef*>> pairs = {
      {&src.weights.tok_embd, &dst.weights.tok_embd},
      {&src.weights.pos_embd, &dst.weights.pos_embd},
      {&src.weights.out_norm, &dst.weights.out_norm},
      {&src.weights.out_norm_b, &dst.weights.out_norm_b}};
  for (size_t l = 0; l < src.weights.layers.size(); ++l) {
    const DecoderLayer& a = src.weights.layers[l];
    const DecoderLayer& b = dst.weights.layers[l];
    for (auto [x, y] : {std::pair{&a.attn_norm, &b.attn_norm},
                        {&a.attn_norm_b, &b.attn_norm_b},
                        {&a.wq, &b.wq},
                        {&a.wk, &b.wk},
                        {&a.wv, &b.wv},
                        {&a.bq, &b.bq},
                        {&a.bk, &b.bk},
                        {&a.bv, &b.bv},
                        {&a.wo, &b.wo},
                        {&a.bo, &b.bo},
                        {&a.ffn_norm, &b.ffn_norm},
                        {&a.ffn_norm_b, &b.ffn_norm_b},
                        {&a.w_up, &b.w_up},
                        {&a.b_up, &b.b_up},
                        {&a.w_down, &b.w_down},
                        {&a.b_down, &b.b_down}})
      pairs.emplace_back(x, y);
  }
  for (const auto& [from, to] : pairs) {
    TS_CHECK(from->present() && from->shape == to->shape, "[gpt2] ", dir,
             ": a tensor does not fit the training model (", from->shape.str(), " for ",
             to->shape.str(), ")");
    float* out = host.data() + (static_cast<const float*>(to->data) - model->params());
    to_f32(from->type, from->data, out, from->shape.numel());
  }
  host.flush();
  model->params_updated();
  return model;
}

}  // namespace tessera::model
