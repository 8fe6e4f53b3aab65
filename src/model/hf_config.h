// config.json of a Hugging Face folder, for the readers of model/: typed access to its fields
// (every error names the file and the field) and the rotary settings in transformers 4's and
// 5's layouts (hf_rope.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/decoder.h"

namespace tessera::model::hf_detail {

using nlohmann::json;

// Typed access to config.json fields; every error names the file and the field. A field that is
// null counts as absent (HF writes e.g. "n_inner": null for the default).
class ConfigFields {
 public:
  ConfigFields(const json& j, std::string path) : j_(j), path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& at(const char* key) const {
    TS_CHECK(has(key), "[hf] ", path_, ": missing field '", key, "'");
    return j_[key];
  }
  int64_t get_int(const char* key) const {
    const json& v = at(key);
    TS_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, "[hf] ", path_, ": field '", key,
             "' must be a positive integer, got ", v.dump());
    return v.get<int64_t>();
  }
  int64_t get_int_or(const char* key, int64_t fallback) const {
    return has(key) ? get_int(key) : fallback;
  }
  double get_float_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    TS_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0, "[hf] ", path_,
             ": field '", key, "' must be a positive number, got ", v.dump());
    return v.get<double>();
  }
  bool get_bool_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    TS_CHECK(v.is_boolean(), "[hf] ", path_, ": field '", key, "' must be true or false, got ",
             v.dump());
    return v.get<bool>();
  }

 private:
  const json& j_;
  std::string path_;
};

// rope_theta, rope_scaling (linear, llama3, longrope) and partial_rotary_factor of a config, in
// transformers 4's top-level fields or 5's rope_parameters (Gemma 3's per layer type too), into
// c (whose head_dim and max_ctx are set). What it cannot run is refused naming the field.
void read_rope(const ConfigFields& f, DecoderConfig* c);

}  // namespace tessera::model::hf_detail
