// Checkpoint write/read through safetensors; metadata values are decimal strings.
#include "train/checkpoint.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/safetensors.h"
#include "ops/memory.h"
#include "train/options.h"

// A model's layer options (model::TrainConfig::options) as the checkpoint records them: every
// field of DecoderConfig by its name, enums by theirs; a field the record lacks keeps its default
// (a record from before the field existed).
namespace tessera::ops {
NLOHMANN_JSON_SERIALIZE_ENUM(RopeLayout,
                             {{RopeLayout::half, "half"}, {RopeLayout::interleaved, "interleaved"}})
NLOHMANN_JSON_SERIALIZE_ENUM(GluAct, {{GluAct::silu, "silu"}, {GluAct::gelu_tanh, "gelu_tanh"}})
}  // namespace tessera::ops

namespace tessera::model {
NLOHMANN_JSON_SERIALIZE_ENUM(DecoderArch,
                             {{DecoderArch::llama, "llama"}, {DecoderArch::gpt2, "gpt2"}})
NLOHMANN_JSON_SERIALIZE_ENUM(RopeScaling, {{RopeScaling::none, "none"},
                                           {RopeScaling::linear, "linear"},
                                           {RopeScaling::llama3, "llama3"},
                                           {RopeScaling::longrope, "longrope"},
                                           {RopeScaling::yarn, "yarn"}})
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(
    DecoderConfig, arch, name, n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab,
    max_ctx, norm_eps, rope_theta, rope_dim, rope_layout, rope_scaling, rope_factor,
    rope_low_freq_factor, rope_high_freq_factor, rope_original_max_ctx, rope_freq_divisors,
    rope_long_divisors, rope_attn_factor, yarn_beta_fast, yarn_beta_slow, sliding_window,
    tied_embeddings, qkv_bias, qk_norm, post_norms, mlp_act, embed_scale, attn_scale, local_layers,
    rope_theta_local, nope_layers, qk_norm_whole, n_experts, n_experts_used, expert_norm)
}  // namespace tessera::model

namespace tessera::train {

namespace {

constexpr const char* kFormat = "tessera-checkpoint-1";

// %.17g round-trips every double exactly through strtod.
std::string f64s(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

const std::string& meta(const formats::SafetensorsReader& r, const std::string& key) {
  auto it = r.metadata().find(key);
  TS_CHECK(it != r.metadata().end(), "[checkpoint] ", r.path(), ": metadata field '", key,
           "' is missing");
  return it->second;
}

template <typename T>
T parse_int(const formats::SafetensorsReader& r, const std::string& key, const std::string& s) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  TS_CHECK(ec == std::errc() && p == s.data() + s.size() && !s.empty(), "[checkpoint] ", r.path(),
           ": metadata field '", key, "' is not an integer: '", s, "'");
  return v;
}

template <typename T>
T meta_int(const formats::SafetensorsReader& r, const std::string& key) {
  return parse_int<T>(r, key, meta(r, key));
}

double meta_f64(const formats::SafetensorsReader& r, const std::string& key) {
  const std::string& s = meta(r, key);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  TS_CHECK(!s.empty() && end == s.c_str() + s.size() && errno == 0, "[checkpoint] ", r.path(),
           ": metadata field '", key, "' is not a number: '", s, "'");
  return v;
}

void meta_rng(const formats::SafetensorsReader& r, const std::string& key, uint64_t out[4]) {
  std::istringstream is(meta(r, key));
  std::string part;
  for (int i = 0; i < 4; ++i) {
    TS_CHECK(static_cast<bool>(is >> part), "[checkpoint] ", r.path(), ": metadata field '", key,
             "' needs 4 integers");
    out[i] = parse_int<uint64_t>(r, key, part);
  }
  TS_CHECK(!(is >> part), "[checkpoint] ", r.path(), ": metadata field '", key,
           "' has more than 4 integers");
}

std::string rng_str(const uint64_t s[4]) {
  return cat(s[0], " ", s[1], " ", s[2], " ", s[3]);
}

std::string config_json(const model::TrainConfig& c) {
  nlohmann::json j = {{"n_layer", c.n_layer},
                      {"n_head", c.n_head},
                      {"n_embd", c.n_embd},
                      {"vocab_size", c.vocab_size},
                      {"padded_vocab_size", c.padded_vocab_size},
                      {"max_seq", c.max_seq},
                      {"arch", c.arch == model::DecoderArch::llama ? "llama" : "gpt2"},
                      {"n_kv_head", c.n_kv_head},
                      {"d_ff", c.d_ff},
                      {"rope_theta", c.rope_theta},
                      {"norm_eps", c.norm_eps},
                      {"tied", c.tied},
                      {"qkv_bias", c.qkv_bias},
                      {"rope_interleaved", c.rope_layout == ops::RopeLayout::interleaved}};
  if (c.arch == model::DecoderArch::llama) j["decoder"] = c.decoder_config();  // its options
  return j.dump();
}

model::TrainConfig config_from(const formats::SafetensorsReader& r) {
  model::TrainConfig c;
  try {
    const auto j = nlohmann::json::parse(meta(r, "config"));
    c.n_layer = j.at("n_layer").get<int64_t>();
    c.n_head = j.at("n_head").get<int64_t>();
    c.n_embd = j.at("n_embd").get<int64_t>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.padded_vocab_size = j.at("padded_vocab_size").get<int64_t>();
    c.max_seq = j.at("max_seq").get<int64_t>();
    // Checkpoints from before the Llama family have none of these: GPT-2's values.
    const std::string arch = j.value("arch", "gpt2");
    TS_CHECK(arch == "gpt2" || arch == "llama", "[checkpoint] ", r.path(),
             ": metadata field 'config': unknown arch '", arch, "'");
    c.arch = arch == "llama" ? model::DecoderArch::llama : model::DecoderArch::gpt2;
    c.n_kv_head = j.value("n_kv_head", int64_t{0});
    c.d_ff = j.value("d_ff", int64_t{0});
    c.rope_theta = j.value("rope_theta", 10000.0);
    c.norm_eps = j.value("norm_eps", 1e-5f);
    c.tied = j.value("tied", true);
    c.qkv_bias = j.value("qkv_bias", false);
    c.rope_layout =
        j.value("rope_interleaved", false) ? ops::RopeLayout::interleaved : ops::RopeLayout::half;
    // Checkpoints from before the layer options have none: a preset's (no options).
    if (j.contains("decoder")) c.options = j.at("decoder").get<model::DecoderConfig>();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("[checkpoint] ", r.path(), ": metadata field 'config' is malformed: ", e.what());
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("[checkpoint] ", r.path(), ": metadata field 'config': ", e.what());
  }
  return c;
}

void check_format(const formats::SafetensorsReader& r) {
  TS_CHECK(meta(r, "format") == kFormat, "[checkpoint] ", r.path(), ": unknown format '",
           meta(r, "format"), "' (expected ", kFormat, ")");
}

}  // namespace

std::string checkpoint_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "checkpoint.safetensors").string();
}

void save_checkpoint(const std::string& dir, const model::TrainModel& m, const AdamW& opt,
                     const TrainState& st, const std::string& options_json) {
  make_dirs(dir);
  const Shape flat{m.num_params()};
  formats::SafetensorsWriter w;
  // Host views of the device's buffers (the buffers themselves on the CPU), alive until written.
  using Mirror = ops::HostMirror<const float>;
  Mirror params(m.context(), m.params(), m.num_params(), Mirror::read);
  Mirror adam_m(opt.context(), opt.m(), opt.size(), Mirror::read);
  Mirror adam_v(opt.context(), opt.v(), opt.size(), Mirror::read);
  w.add("params", DType::f32, flat, params.data());
  w.add("adam_m", DType::f32, flat, adam_m.data());
  w.add("adam_v", DType::f32, flat, adam_v.data());
  w.set_metadata("format", kFormat);
  w.set_metadata("step", cat(st.step));
  w.set_metadata("loader_epoch", cat(st.loader.epoch));
  w.set_metadata("loader_index", cat(st.loader.index));
  w.set_metadata("loader_rng", rng_str(st.loader.rng));
  w.set_metadata("trainer_rng", rng_str(st.rng));
  w.set_metadata("best_val_loss", f64s(st.best_val));
  w.set_metadata("evals", cat(st.evals));
  w.set_metadata("patience_counter", cat(st.bad_evals));
  w.set_metadata("early_stopped", st.early_stopped ? "1" : "0");
  w.set_metadata("config", config_json(m.config()));
  w.set_metadata("options", options_json);
  w.write(checkpoint_path(dir));
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  const std::string path = checkpoint_path(dir);
  TS_CHECK(file_exists(path), "[checkpoint] no checkpoint at '", path, "'");
  formats::SafetensorsReader r(path);
  check_format(r);
  CheckpointInfo info;
  info.options_json = meta(r, "options");
  info.config = config_from(r);
  return info;
}

TrainState load_checkpoint(const std::string& dir, model::TrainModel& m, AdamW& opt) {
  const std::string path = checkpoint_path(dir);
  TS_CHECK(file_exists(path), "[checkpoint] no checkpoint at '", path, "'");
  formats::SafetensorsReader r(path);
  check_format(r);
  const Shape flat{m.num_params()};
  TS_CHECK(opt.size() == m.num_params(), "[checkpoint] optimizer and model sizes differ");
  using Mirror = ops::HostMirror<float>;
  Mirror params(m.context(), m.params(), m.num_params(), Mirror::write);
  Mirror adam_m(opt.context(), opt.m(), opt.size(), Mirror::write);
  Mirror adam_v(opt.context(), opt.v(), opt.size(), Mirror::write);
  r.read_f32("params", flat, params.data());
  r.read_f32("adam_m", flat, adam_m.data());
  r.read_f32("adam_v", flat, adam_v.data());
  params.flush();
  adam_m.flush();
  adam_v.flush();
  m.params_updated();
  TrainState st;
  st.step = meta_int<int64_t>(r, "step");
  TS_CHECK(st.step >= 0, "[checkpoint] ", path, ": metadata field 'step' is negative");
  st.loader.epoch = meta_int<int64_t>(r, "loader_epoch");
  st.loader.index = meta_int<int64_t>(r, "loader_index");
  meta_rng(r, "loader_rng", st.loader.rng);
  meta_rng(r, "trainer_rng", st.rng);
  st.best_val = meta_f64(r, "best_val_loss");
  st.evals = meta_int<int64_t>(r, "evals");
  st.bad_evals = meta_int<int64_t>(r, "patience_counter");
  st.early_stopped = meta_int<int>(r, "early_stopped") != 0;
  return st;
}

std::unique_ptr<model::TrainModel> load_model_from_checkpoint(const std::string& dir,
                                                              const ops::Context& ctx) {
  const std::string path = checkpoint_path(dir);
  TS_CHECK(file_exists(path), "[checkpoint] no checkpoint at '", path, "'");
  formats::SafetensorsReader r(path);
  check_format(r);
  // A LoRA run's checkpoint holds its adapters: the base comes from the run's model file.
  const TrainOptions o = options_from_json(meta(r, "options"), path);
  auto m = o.lora_rank > 0 ? model::load_lora_trainable(o.init_from, lora_spec(o), ctx)
                           : std::make_unique<model::TrainModel>(config_from(r), ctx);
  ops::HostMirror<float> params(ctx, m->params(), m->num_params(), ops::HostMirror<float>::write);
  r.read_f32("params", Shape{m->num_params()}, params.data());
  params.flush();
  m->params_updated();
  return m;
}

}  // namespace tessera::train
