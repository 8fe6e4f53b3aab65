// The rotary settings of a Hugging Face config.json (model/hf_config.h).
#include <cmath>
#include <string>
#include <vector>

#include "model/hf_config.h"

namespace tessera::model::hf_detail {
namespace {

// partial_rotary_factor: the share of each head that rotates (Phi-4-mini: 0.75), as rope_dim.
void read_partial_rotary(const ConfigFields& f, const std::string& prefix, DecoderConfig* c) {
  const double share = f.get_float_or("partial_rotary_factor", 1.0);
  const double dims = share * static_cast<double>(c->head_dim);
  const auto rope_dim = static_cast<int64_t>(std::llround(dims));
  TS_CHECK(share > 0 && share <= 1 && std::fabs(dims - static_cast<double>(rope_dim)) < 1e-6 &&
               rope_dim % 2 == 0,
           "[hf] ", f.path(), ": field '", prefix, "partial_rotary_factor' is ", share,
           "; it must rotate an even number of each head's ", c->head_dim, " dimensions");
  c->rope_dim = rope_dim;
}

// LongRoPE's pretrained length (rope_scaling's original_max_position_embeddings, or the
// top-level one Phi-3 configs carry) and attention factor (given, or transformers' default:
// sqrt(1 + ln(s) / ln(original)) for s = max_position_embeddings / original, 1 when s <= 1).
void complete_longrope(const ConfigFields& f, DecoderConfig* c) {
  if (c->rope_original_max_ctx == 0)
    c->rope_original_max_ctx = f.get_int_or("original_max_position_embeddings", c->max_ctx);
  TS_CHECK(c->rope_original_max_ctx > 1, "[hf] ", f.path(),
           ": field 'original_max_position_embeddings' must be > 1");
  if (c->rope_attn_factor == 0.0) {
    const double s =
        static_cast<double>(c->max_ctx) / static_cast<double>(c->rope_original_max_ctx);
    c->rope_attn_factor =
        s <= 1.0 ? 1.0
                 : std::sqrt(1.0 +
                             std::log(s) / std::log(static_cast<double>(c->rope_original_max_ctx)));
  }
}

// YaRN's pretrained length (a top-level original_max_position_embeddings first, as transformers 5
// reads it, then the block's, then max_position_embeddings), factor (given, or the ratio of the
// two lengths) and attention factor (given, or 0.1 ln(factor) + 1 for a factor above 1).
void complete_yarn(const ConfigFields& f, DecoderConfig* c) {
  if (f.has("original_max_position_embeddings"))
    c->rope_original_max_ctx = f.get_int("original_max_position_embeddings");
  if (c->rope_original_max_ctx == 0) c->rope_original_max_ctx = c->max_ctx;
  TS_CHECK(c->rope_original_max_ctx > 1, "[hf] ", f.path(),
           ": YaRN's original_max_position_embeddings must be > 1");
  if (c->rope_factor == 0.0)
    c->rope_factor =
        static_cast<double>(c->max_ctx) / static_cast<double>(c->rope_original_max_ctx);
  if (c->rope_attn_factor == 0.0)
    c->rope_attn_factor = c->rope_factor > 1 ? 0.1 * std::log(c->rope_factor) + 1 : 1.0;
}

// One rope-scaling object (transformers 4's top-level 'rope_scaling', or transformers 5's
// 'rope_parameters', which also holds rope_theta) into c. `where` names the field in errors.
void read_rope_block(const json& rs, const std::string& path, const std::string& where,
                     DecoderConfig* c) {
  TS_CHECK(rs.is_object(), "[hf] ", path, ": field '", where, "' must be an object");
  const ConfigFields s(rs, path + " " + where);
  const char* type_key = s.has("rope_type") ? "rope_type" : "type";
  const json& type = s.at(type_key);
  TS_CHECK(type.is_string(), "[hf] ", path, ": field '", where, ".", type_key,
           "' must be a string");
  const std::string t = type.get<std::string>();
  if (s.has("partial_rotary_factor")) read_partial_rotary(s, where + ".", c);
  if (t == "default") return;
  if (t == "linear") {
    c->rope_scaling = RopeScaling::linear;
  } else if (t == "llama3") {
    c->rope_scaling = RopeScaling::llama3;
    c->rope_low_freq_factor = s.get_float_or("low_freq_factor", c->rope_low_freq_factor);
    c->rope_high_freq_factor = s.get_float_or("high_freq_factor", c->rope_high_freq_factor);
    c->rope_original_max_ctx = s.get_int("original_max_position_embeddings");
    TS_CHECK(c->rope_high_freq_factor > c->rope_low_freq_factor, "[hf] ", path, ": field '", where,
             ".high_freq_factor' must exceed low_freq_factor");
  } else if (t == "longrope" || t == "su") {
    // Phi-3.5 / Phi-4-mini; the pretrained length and the attention factor may be left to the
    // top level and to transformers' default (read_rope completes them).
    c->rope_scaling = RopeScaling::longrope;
    auto factors = [&](const char* key) {
      const json& a = s.at(key);
      TS_CHECK(a.is_array(), "[hf] ", path, ": field '", where, ".", key, "' must be a list");
      std::vector<float> v;
      for (const json& x : a) {
        TS_CHECK(x.is_number(), "[hf] ", path, ": field '", where, ".", key,
                 "' holds a non-number");
        v.push_back(x.get<float>());
      }
      return v;
    };
    c->rope_freq_divisors = factors("short_factor");
    c->rope_long_divisors = factors("long_factor");
    c->rope_original_max_ctx = s.get_int_or("original_max_position_embeddings", 0);
    c->rope_attn_factor = s.get_float_or("attention_factor", 0.0);
    return;
  } else if (t == "yarn") {
    // Qwen2.5 / Qwen3 long context; read_rope completes the length, factor and attention factor.
    c->rope_scaling = RopeScaling::yarn;
    c->rope_factor = s.get_float_or("factor", 0.0);
    c->rope_original_max_ctx = s.get_int_or("original_max_position_embeddings", 0);
    c->rope_attn_factor = s.get_float_or("attention_factor", 0.0);
    c->yarn_beta_fast = s.get_float_or("beta_fast", 32.0);
    c->yarn_beta_slow = s.get_float_or("beta_slow", 1.0);
    TS_CHECK(c->rope_attn_factor != 0.0 || (!s.has("mscale") && !s.has("mscale_all_dim")), "[hf] ",
             path, ": fields '", where, ".mscale' and 'mscale_all_dim' (DeepSeek's ",
             "attention factor) are not implemented; give 'attention_factor'");
    TS_CHECK(!s.has("truncate") || (s.at("truncate").is_boolean() && s.at("truncate").get<bool>()),
             "[hf] ", path, ": field '", where,
             ".truncate' false (an unrounded ramp) is not "
             "implemented");
    return;
  } else {
    // yarn, dynamic, ...: refused by name rather than run with the wrong frequencies.
    fail("[hf] ", path, ": field '", where, ".", type_key, "' is \"", t,
         "\"; supported: default, linear, llama3, longrope, yarn");
  }
  c->rope_factor = s.get_float_or("factor", 0);
  TS_CHECK(c->rope_factor > 0, "[hf] ", path, ": missing field '", where, ".factor'");
}

// transformers 5's Gemma 3 layout: 'rope_parameters' holds one block per layer type,
// 'full_attention' (the global layers: rope_theta and any scaling) and 'sliding_attention' (the
// local layers: rope_theta only).
void read_layer_type_rope(const ConfigFields& f, DecoderConfig* c) {
  const json& rp = f.at("rope_parameters");
  const std::string where = "rope_parameters";
  for (const auto& [kind, block] : rp.items())
    TS_CHECK(kind == "full_attention" || kind == "sliding_attention", "[hf] ", f.path(),
             ": field '", where, ".", kind, "' names no layer type this model has");
  const ConfigFields full(rp["full_attention"], f.path() + " " + where + ".full_attention");
  c->rope_theta = full.get_float_or("rope_theta", 10000.0);
  read_rope_block(rp["full_attention"], f.path(), where + ".full_attention", c);
  if (!rp.contains("sliding_attention")) return;
  const ConfigFields local(rp["sliding_attention"], f.path() + " " + where + ".sliding_attention");
  c->rope_theta_local = local.get_float_or("rope_theta", 10000.0);
  DecoderConfig plain;
  read_rope_block(rp["sliding_attention"], f.path(), where + ".sliding_attention", &plain);
  TS_CHECK(plain.rope_scaling == RopeScaling::none, "[hf] ", f.path(), ": field '", where,
           ".sliding_attention' scales the local layers' rotation; only the global layers' "
           "scaling is supported");
}

// What a scaling type leaves to the top level and to transformers' defaults.
void complete_scaling(const ConfigFields& f, DecoderConfig* c) {
  if (c->rope_scaling == RopeScaling::longrope) complete_longrope(f, c);
  if (c->rope_scaling == RopeScaling::yarn) complete_yarn(f, c);
}

// The rotary settings in either layout: transformers 4 writes top-level 'rope_theta' and
// 'rope_scaling'; transformers 5 writes 'rope_parameters' {rope_type, rope_theta, and the
// type's own fields}. Both present and disagreeing is an error naming both, never a guess.
}  // namespace

void read_rope(const ConfigFields& f, DecoderConfig* c) {
  constexpr double kDefaultTheta = 10000.0;  // transformers' default for the Llama family
  if (f.has("rope_parameters") && f.at("rope_parameters").contains("full_attention")) {
    read_layer_type_rope(f, c);
    return;
  }
  const bool top_theta = f.has("rope_theta");
  c->rope_theta = f.get_float_or("rope_theta", kDefaultTheta);
  if (f.has("rope_scaling")) read_rope_block(f.at("rope_scaling"), f.path(), "rope_scaling", c);
  if (f.has("partial_rotary_factor")) read_partial_rotary(f, "", c);
  if (!f.has("rope_parameters")) {
    complete_scaling(f, c);
    return;
  }
  const json& rp = f.at("rope_parameters");
  TS_CHECK(rp.is_object(), "[hf] ", f.path(), ": field 'rope_parameters' must be an object");
  DecoderConfig v5 = *c;
  v5.rope_scaling = RopeScaling::none;
  const ConfigFields p(rp, f.path() + " rope_parameters");
  v5.rope_theta = p.get_float_or("rope_theta", kDefaultTheta);
  read_rope_block(rp, f.path(), "rope_parameters", &v5);
  if (top_theta)
    TS_CHECK(!p.has("rope_theta") || v5.rope_theta == c->rope_theta, "[hf] ", f.path(),
             ": field 'rope_theta' (", c->rope_theta, ") and 'rope_parameters.rope_theta' (",
             v5.rope_theta, ") disagree");
  if (f.has("rope_scaling"))
    TS_CHECK(v5.rope_scaling == c->rope_scaling && v5.rope_factor == c->rope_factor &&
                 v5.rope_low_freq_factor == c->rope_low_freq_factor &&
                 v5.rope_high_freq_factor == c->rope_high_freq_factor &&
                 v5.rope_original_max_ctx == c->rope_original_max_ctx,
             "[hf] ", f.path(), ": fields 'rope_scaling' (", f.at("rope_scaling").dump(),
             ") and 'rope_parameters' (", rp.dump(), ") disagree");
  if (!top_theta) c->rope_theta = v5.rope_theta;
  if (!f.has("rope_scaling")) {  // every rotary field as rope_parameters gives it
    v5.rope_theta = c->rope_theta;
    *c = std::move(v5);
  }
  complete_scaling(f, c);
}

}  // namespace tessera::model::hf_detail
