// LoRA adapters: targets and names, PEFT's adapter files, and merging adapters into the weights.
#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "core/interleave.h"
#include "formats/safetensors.h"
#include "model/decoder_save_impl.h"
#include "model/layer_tensors.h"
#include "ops/ops.h"

namespace tessera::model {

namespace {

using nlohmann::json;
constexpr const char* kPrefix = "base_model.model.";

// The matrix's module, named as Hugging Face's layer names it: "self_attn.q_proj", ...
std::string module_name(LayerMatrix m) {
  return tensor_module(layer_tensor(m).hf);
}

// The module's own name in PEFT's target_modules: "q_proj", ..., "down_proj".
std::string proj_name(int i) {
  const std::string module = module_name(static_cast<LayerMatrix>(i));
  return module.substr(module.find('.') + 1);
}

const WeightRef& matrix(const DecoderLayer& l, LayerMatrix m) {
  return *l.matrices()[static_cast<size_t>(m)];
}

// For q and k of a model in GGUF's interleaved RoPE order, the row order between it and Hugging
// Face's (to_interleaved: HF -> the model's); empty when rows stay as they are.
std::vector<int64_t> rope_rows(const DecoderConfig& c, LayerMatrix m, bool to_interleaved) {
  const RopeRows rope = layer_tensor(m).rope;
  if (c.rope_layout != ops::RopeLayout::interleaved || rope == RopeRows::none) return {};
  const int64_t heads = rope == RopeRows::q ? c.n_heads : c.n_kv_heads;
  return save_detail::rope_row_source(heads, c.head_dim, c.rope_dim, to_interleaved);
}

}  // namespace

const char* lora_target_name(LayerMatrix m) {
  return layer_tensor(m).lora_short;
}

std::vector<LayerMatrix> parse_lora_targets(const std::string& list, const std::string& flag) {
  bool want[kLayerMatrices] = {};
  size_t start = 0;
  TS_CHECK(!list.empty(), flag, ": empty list (give some of q,k,v,o,gate,up,down, or all)");
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, end - start);
    bool found = item == "all";
    for (int i = 0; i < kLayerMatrices; ++i) {
      if (item == "all" || item == lora_target_name(static_cast<LayerMatrix>(i)) ||
          item == proj_name(i))
        want[i] = found = true;
    }
    TS_CHECK(found, flag, ": '", item,
             "' is not a matrix of a layer (q, k, v, o, gate, up, down, their _proj names, or "
             "all)");
    start = end + 1;
  }
  std::vector<LayerMatrix> out;
  for (int i = 0; i < kLayerMatrices; ++i)
    if (want[i]) out.push_back(static_cast<LayerMatrix>(i));
  return out;
}

std::string lora_module_name(int64_t layer, LayerMatrix m) {
  return hf_layer_prefix(layer) + module_name(m);
}
std::string peft_a_name(int64_t layer, LayerMatrix m) {
  return cat(kPrefix, lora_module_name(layer, m), ".lora_A.weight");
}
std::string peft_b_name(int64_t layer, LayerMatrix m) {
  return cat(kPrefix, lora_module_name(layer, m), ".lora_B.weight");
}

void check_lora_spec(const DecoderConfig& c, const LoraSpec& spec, const std::string& source) {
  TS_CHECK(c.arch == DecoderArch::llama, "[lora] ", source,
           ": LoRA is implemented for the Llama family; GPT-2's q, k and v are one matrix "
           "(c_attn), which PEFT adapts as one module");
  TS_CHECK(!spec.targets.empty(), "[lora] ", source, ": no target matrices");
  TS_CHECK(spec.alpha > 0 && std::isfinite(spec.alpha), "[lora] alpha ", spec.alpha,
           " must be positive");
  const int64_t dims[kLayerMatrices][2] = {{c.q_dim(), c.d_model},  {c.kv_dim(), c.d_model},
                                           {c.kv_dim(), c.d_model}, {c.d_model, c.q_dim()},
                                           {c.d_ff, c.d_model},     {c.d_ff, c.d_model},
                                           {c.d_model, c.d_ff}};
  for (LayerMatrix m : spec.targets) {
    TS_CHECK(!c.moe() || m == LayerMatrix::q || m == LayerMatrix::k || m == LayerMatrix::v ||
                 m == LayerMatrix::o,
             "[lora] ", source, ": LoRA on a mixture-of-experts layer's expert matrices (",
             lora_target_name(m), ") is not implemented; adapt q, k, v, o");
    const int64_t* d = dims[static_cast<size_t>(m)];
    const int64_t limit = std::min(d[0], d[1]);
    TS_CHECK(spec.rank >= 1 && spec.rank <= limit, "[lora] rank ", spec.rank, " for ",
             lora_target_name(m), " (", d[0], " x ", d[1], ") of ", source, ": must be in [1, ",
             limit, "]");
  }
}

void save_peft_adapter(const DecoderModel& m, const LoraSpec& spec, const std::string& base,
                       const std::string& dir) {
  const DecoderConfig& c = m.config;
  formats::SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> permuted;  // referenced by w until write()
  permuted.reserve(m.weights.layers.size() * kLayerMatrices);
  std::vector<std::string> modules;
  for (size_t l = 0; l < m.weights.layers.size(); ++l) {
    const DecoderLayer& layer = m.weights.layers[l];
    for (int i = 0; i < kLayerMatrices; ++i) {
      const auto mi = static_cast<LayerMatrix>(i);
      const LoraRef& a = layer.adapter(mi);
      if (!a.present()) continue;
      TS_CHECK(a.a.type == DType::f32 && a.b.type == DType::f32, "[lora] adapters are f32");
      const auto li = static_cast<int64_t>(l);
      w.add(peft_a_name(li, mi), DType::f32, a.a.shape, a.a.data);
      const std::vector<int64_t> order = rope_rows(c, mi, /*to_interleaved=*/false);
      if (order.empty()) {
        w.add(peft_b_name(li, mi), DType::f32, a.b.shape, a.b.data);
      } else {
        permuted.push_back(save_detail::gather_rows(a.b, order));
        w.add(peft_b_name(li, mi), DType::f32, a.b.shape, permuted.back().data());
      }
      if (std::find(modules.begin(), modules.end(), proj_name(i)) == modules.end())
        modules.push_back(proj_name(i));
    }
  }
  TS_CHECK(!modules.empty(), "[lora] the model has no adapters to save");
  w.set_metadata("format", "pt");
  const bool integral = spec.alpha == std::floor(spec.alpha);
  const json cfg = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base},
      {"r", spec.rank},
      {"lora_alpha", integral ? json(static_cast<int64_t>(spec.alpha)) : json(spec.alpha)},
      {"lora_dropout", 0.0},
      {"target_modules", modules},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"use_rslora", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
      {"revision", nullptr},
  };
  make_dirs(dir);
  w.write((std::filesystem::path(dir) / "adapter_model.safetensors").string());
  write_file_atomic((std::filesystem::path(dir) / "adapter_config.json").string(),
                    cfg.dump(2) + "\n");
}

LoraSpec apply_peft_adapter(DecoderModel& m, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  TS_CHECK(fs::is_regular_file(cfg_path), "[lora] ", dir, ": no adapter_config.json there");
  TS_CHECK(fs::is_regular_file(st_path), "[lora] ", dir, ": no adapter_model.safetensors there");
  json j;
  try {
    j = json::parse(read_text_file(cfg_path));
  } catch (const json::exception& e) {
    fail("[lora] ", cfg_path, ": not JSON (", e.what(), ")");
  }
  TS_CHECK(j.is_object(), "[lora] ", cfg_path, ": not a JSON object");
  auto field = [&](const char* key) -> const json& {
    TS_CHECK(j.contains(key), "[lora] ", cfg_path, ": field '", key, "' is missing");
    return j.at(key);
  };
  auto flag_off = [&](const char* key) {
    return !j.contains(key) || j.at(key).is_null() || (j.at(key).is_boolean() && !j.at(key)) ||
           (j.at(key).is_object() && j.at(key).empty()) ||
           (j.at(key).is_array() && j.at(key).empty());
  };
  TS_CHECK(field("peft_type").is_string() && field("peft_type") == "LORA", "[lora] ", cfg_path,
           ": field 'peft_type' is not \"LORA\"");
  TS_CHECK(field("r").is_number_integer() && field("r").get<int64_t>() > 0, "[lora] ", cfg_path,
           ": field 'r' is not a positive integer");
  TS_CHECK(field("lora_alpha").is_number() && field("lora_alpha").get<double>() > 0, "[lora] ",
           cfg_path, ": field 'lora_alpha' is not a positive number");
  for (const char* key : {"use_dora", "modules_to_save", "rank_pattern", "alpha_pattern",
                          "fan_in_fan_out", "layers_to_transform"})
    TS_CHECK(flag_off(key), "[lora] ", cfg_path, ": field '", key,
             "' is set; only plain LoRA adapters on every layer apply here");
  TS_CHECK(!j.contains("bias") || j.at("bias") == "none", "[lora] ", cfg_path,
           ": field 'bias' is not \"none\" (trained biases are not applied here)");
  LoraSpec spec;
  spec.rank = field("r").get<int64_t>();
  spec.alpha = field("lora_alpha").get<double>();
  spec.targets.clear();
  const bool rslora =
      j.contains("use_rslora") && j.at("use_rslora").is_boolean() && j.at("use_rslora").get<bool>();
  const float scale =
      static_cast<float>(spec.alpha / (rslora ? std::sqrt(static_cast<double>(spec.rank))
                                              : static_cast<double>(spec.rank)));

  const DecoderConfig& c = m.config;
  TS_CHECK(c.arch == DecoderArch::llama, "[lora] ", dir,
           ": adapters apply to Llama-family models; this model is GPT-2");
  for (const DecoderLayer& l : m.weights.layers)
    TS_CHECK(!l.has_adapters(), "[lora] ", dir, ": the model already has an adapter applied");
  const formats::SafetensorsReader st(st_path);
  // module name -> (layer, matrix)
  std::map<std::string, std::pair<int64_t, LayerMatrix>> modules;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int i = 0; i < kLayerMatrices; ++i)
      modules[lora_module_name(l, static_cast<LayerMatrix>(i))] = {l, static_cast<LayerMatrix>(i)};
  struct Found {
    const formats::SafetensorsEntry *a = nullptr, *b = nullptr;
  };
  std::map<std::pair<int64_t, int>, Found> found;
  for (const formats::SafetensorsEntry& e : st.entries()) {
    const std::string& n = e.name;
    const bool is_a = n.ends_with(".lora_A.weight"), is_b = n.ends_with(".lora_B.weight");
    TS_CHECK(n.starts_with(kPrefix) && (is_a || is_b), "[lora] ", st_path, ": tensor '", n,
             "' is not a LoRA A or B matrix of PEFT's layout");
    const std::string module =
        n.substr(std::string(kPrefix).size(),
                 n.size() - std::string(kPrefix).size() - std::string(".lora_A.weight").size());
    const auto it = modules.find(module);
    TS_CHECK(it != modules.end(), "[lora] ", st_path, ": tensor '", n, "' adapts '", module,
             "', which the model does not have");
    Found& f = found[{it->second.first, static_cast<int>(it->second.second)}];
    (is_a ? f.a : f.b) = &e;
  }
  TS_CHECK(!found.empty(), "[lora] ", st_path, ": no adapter tensors");
  int64_t floats = 0;
  for (const auto& [key, f] : found) {
    const DecoderLayer& layer = m.weights.layers[static_cast<size_t>(key.first)];
    const auto mi = static_cast<LayerMatrix>(key.second);
    const std::string module = lora_module_name(key.first, mi);
    TS_CHECK(f.a && f.b, "[lora] ", st_path, ": module '", module, "' has lora_", f.a ? "A" : "B",
             " without lora_", f.a ? "B" : "A");
    const WeightRef& w = matrix(layer, mi);
    TS_CHECK(w.present(), "[lora] ", st_path, ": the model has no matrix for '", module, "'");
    const Shape want_a({spec.rank, w.cols()}), want_b({w.rows(), spec.rank});
    TS_CHECK(f.a->shape == want_a && f.b->shape == want_b, "[lora] ", st_path, ": module '", module,
             "' has A ", f.a->shape.str(), " and B ", f.b->shape.str(), "; the model needs ",
             want_a.str(), " and ", want_b.str());
    floats += want_a.numel() + want_b.numel();
    if (std::find(spec.targets.begin(), spec.targets.end(), mi) == spec.targets.end())
      spec.targets.push_back(mi);
  }
  std::sort(spec.targets.begin(), spec.targets.end());
  auto store = std::make_shared<std::vector<float>>(static_cast<size_t>(floats));
  float* at = store->data();
  for (const auto& [key, f] : found) {
    DecoderLayer& layer = m.weights.layers[static_cast<size_t>(key.first)];
    const auto mi = static_cast<LayerMatrix>(key.second);
    LoraRef& r = layer.lora[static_cast<size_t>(mi)];
    r.a = WeightRef{at, DType::f32, f.a->shape};
    st.read_f32(f.a->name, f.a->shape, at);
    at += f.a->shape.numel();
    r.b = WeightRef{at, DType::f32, f.b->shape};
    st.read_f32(f.b->name, f.b->shape, at);
    const std::vector<int64_t> order = rope_rows(c, mi, /*to_interleaved=*/true);
    if (!order.empty()) {
      const std::vector<uint8_t> rows = save_detail::gather_rows(r.b, order);
      std::copy(rows.begin(), rows.end(), reinterpret_cast<uint8_t*>(at));
    }
    // The scale folded into B once: the forward then adds (x A^T) B^T with no scaling op.
    for (int64_t i = 0; i < f.b->shape.numel(); ++i) at[i] *= scale;
    at += f.b->shape.numel();
    r.scale = 1.0f;
  }
  m.owners.push_back(store);
  return spec;
}

int64_t merge_adapters(DecoderModel& m, bool keep_types) {
  int64_t merged = 0;
  const ops::Context ctx;  // host memory: the CPU
  for (DecoderLayer& layer : m.weights.layers) {
    for (int i = 0; i < kLayerMatrices; ++i) {
      LoraRef& a = layer.lora[static_cast<size_t>(i)];
      if (!a.present()) continue;
      WeightRef& w = *layer.matrices()[static_cast<size_t>(i)];
      TS_CHECK(!is_interleaved(w.type), "[lora] cannot merge into a ", dtype_name(w.type),
               " matrix (a CPU layout); load the model without it");
      const int64_t N = w.rows(), K = w.cols(), r = a.rank();
      std::vector<float> wf = save_detail::as_f32(w);
      std::vector<float> sb(static_cast<size_t>(N * r));  // scale B
      const auto* b = static_cast<const float*>(a.b.data);
      for (int64_t j = 0; j < N * r; ++j) sb[static_cast<size_t>(j)] = a.scale * b[j];
      ops::GemmArgs g;  // W (N,K) += (s B) (N,r) A (r,K)
      g.m = N, g.n = K, g.k = r;
      g.a = sb.data(), g.lda = r;
      g.b = a.a.data, g.ldb = K;
      g.c = wf.data(), g.ldc = K;
      g.accumulate = true;
      ops::gemm(ctx, g);
      const DType type = keep_types ? w.type : DType::f32;
      auto bytes =
          std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(dtype_bytes(type, N * K)));
      from_f32(type, wf.data(), bytes->data(), N * K);
      w.data = bytes->data();
      w.type = type;
      m.owners.push_back(bytes);
      a = LoraRef{};
      ++merged;
    }
  }
  return merged;
}

}  // namespace tessera::model
