// Loads a Hugging Face GPT-2 folder into a training model (--init-from): model.safetensors (HF
// names, Conv1D weights stored (in, out), wte with V rows) and config.json (HF GPT-2 keys). The
// folder is written by save_decoder_hf on as_decoder(m) (model/decoder_save.h).
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/safetensors.h"
#include "model/gpt2.h"

namespace tessera::model {

namespace {

using nlohmann::json;

// HF's Conv1D layers (c_attn, c_proj, c_fc) store their weight (in, out); ours is (out, in).
bool is_conv1d_weight(const std::string& name) {
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}

// dst (cols, rows) = src (rows, cols)^T.
void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// Causal-mask buffers some checkpoints carry; the attention kernel builds the mask itself.
bool is_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

int64_t get_int(const json& cfg, const std::string& path, const char* key) {
  TS_CHECK(cfg.contains(key), "[gpt2] ", path, ": missing field '", key, "'");
  const json& v = cfg[key];
  TS_CHECK(v.is_number_integer(), "[gpt2] ", path, ": field '", key, "' must be an integer, got ",
           v.dump());
  return v.get<int64_t>();
}

}  // namespace

std::unique_ptr<Gpt2> load_gpt2(const std::string& dir, const ops::Context& ctx) {
  const std::string cfg_path = dir + "/config.json";
  TS_CHECK(file_exists(cfg_path), "[gpt2] ", cfg_path, ": file not found");
  json jc;
  try {
    jc = json::parse(read_text_file(cfg_path));
  } catch (const json::exception& e) {
    fail("[gpt2] ", cfg_path, ": not valid JSON: ", e.what());
  }
  TS_CHECK(jc.is_object(), "[gpt2] ", cfg_path, ": must be a JSON object");
  if (jc.contains("model_type"))
    TS_CHECK(jc["model_type"] == "gpt2", "[gpt2] ", cfg_path, ": field 'model_type' is ",
             jc["model_type"].dump(), ", expected \"gpt2\"");
  if (jc.contains("activation_function")) {
    const json& a = jc["activation_function"];
    TS_CHECK(a == "gelu_new" || a == "gelu_pytorch_tanh", "[gpt2] ", cfg_path,
             ": field 'activation_function' is ", a.dump(),
             "; only the tanh GELU (gelu_new) is supported");
  }
  if (jc.contains("layer_norm_epsilon")) {
    const json& e = jc["layer_norm_epsilon"];
    TS_CHECK(e.is_number() && std::fabs(e.get<double>() - 1e-5) <= 1e-12, "[gpt2] ", cfg_path,
             ": field 'layer_norm_epsilon' is ", e.dump(), "; the kernels use 1e-5");
  }
  Gpt2Config cfg;
  cfg.n_layer = get_int(jc, cfg_path, "n_layer");
  cfg.n_head = get_int(jc, cfg_path, "n_head");
  cfg.n_embd = get_int(jc, cfg_path, "n_embd");
  cfg.vocab_size = get_int(jc, cfg_path, "vocab_size");
  cfg.max_seq = get_int(jc, cfg_path, jc.contains("n_positions") ? "n_positions" : "n_ctx");
  TS_CHECK(cfg.vocab_size > 0 && cfg.vocab_size <= (int64_t{1} << 24), "[gpt2] ", cfg_path,
           ": field 'vocab_size' must be in [1, 2^24], got ", cfg.vocab_size);
  cfg.padded_vocab_size = Gpt2Config::pad_vocab(cfg.vocab_size);
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail("[gpt2] ", cfg_path, ": ", e.what());
  }

  const std::string st_path = dir + "/model.safetensors";
  TS_CHECK(file_exists(st_path), "[gpt2] ", st_path, ": file not found");
  formats::SafetensorsReader r(st_path);
  // Before allocating anything sized by config.json (which could claim a huge model), require
  // the file to hold exactly the parameter count the config describes: memory then stays
  // bounded by the file's size. Sizes are bounded by validate(), so this cannot overflow.
  {
    const int64_t C = cfg.n_embd;
    const int64_t expect =
        (cfg.vocab_size + cfg.max_seq) * C + cfg.n_layer * (12 * C * C + 13 * C) + 2 * C;
    int64_t have = 0;
    for (const formats::SafetensorsEntry& e : r.entries())
      if (!is_buffer(e.name) && !e.name.ends_with("lm_head.weight")) have += e.shape.numel();
    TS_CHECK(have == expect, "[gpt2] ", st_path, ": holds ", have, " parameter values but ",
             cfg_path, " describes a model with ", expect);
  }
  auto model = std::make_unique<Gpt2>(cfg, ctx);
  const TensorTable& table = model->tensors();
  float* params = model->params();
  std::memset(params, 0, static_cast<size_t>(model->num_params()) * sizeof(float));
  std::set<std::string> seen;
  const formats::SafetensorsEntry* lm_head = nullptr;
  std::vector<float> tmp;
  for (const formats::SafetensorsEntry& e : r.entries()) {
    std::string name = e.name;
    if (name.starts_with("transformer.")) name = name.substr(12);
    if (is_buffer(name)) continue;
    if (name == "lm_head.weight") {
      lm_head = &e;
      continue;
    }
    const TensorInfo* t = table.find(name);
    TS_CHECK(t != nullptr, "[gpt2] ", st_path, ": tensor '", e.name,
             "': not a GPT-2 parameter of this config");
    TS_CHECK(seen.insert(name).second, "[gpt2] ", st_path, ": tensor '", e.name,
             "': appears twice (with and without the 'transformer.' prefix)");
    float* dst = params + t->offset;
    if (name == "wte.weight") {
      r.read_f32(e.name, {cfg.vocab_size, cfg.n_embd}, dst);  // padding rows stay zero
    } else if (is_conv1d_weight(name)) {
      const int64_t rows = t->shape[0], cols = t->shape[1];
      tmp.resize(static_cast<size_t>(rows * cols));
      r.read_f32(e.name, {cols, rows}, tmp.data());
      transpose(dst, tmp.data(), cols, rows);
    } else {
      r.read_f32(e.name, t->shape, dst);
    }
  }
  for (const TensorInfo& t : table.tensors())
    TS_CHECK(seen.count(t.name), "[gpt2] ", st_path, ": missing tensor '", t.name, "'");
  if (lm_head != nullptr) {
    // The lm head is tied to wte; an untied head cannot be represented, so it must match.
    tmp.resize(static_cast<size_t>(cfg.vocab_size * cfg.n_embd));
    r.read_f32(lm_head->name, {cfg.vocab_size, cfg.n_embd}, tmp.data());
    TS_CHECK(std::memcmp(tmp.data(), params + table.at("wte.weight").offset,
                         tmp.size() * sizeof(float)) == 0,
             "[gpt2] ", st_path, ": tensor '", lm_head->name,
             "': differs from wte.weight, but GPT-2 ties the lm head to the embedding");
  }
  model->params_updated();
  return model;
}

}  // namespace tessera::model
