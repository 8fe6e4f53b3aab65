// The GPU datasheet table and the reader for a user's spec.json.
#include "profile/gpu_specs.h"

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera::profile {

namespace {

// NVIDIA's "GB" of device memory on these datasheets is binary: an "80GB" A100 reports 81920 MiB.
// The usable amount is a little less (the driver's reservation, ECC on GDDR cards).
constexpr int64_t kGiB = int64_t{1} << 30;

// Every tensor-core figure below is the datasheet's dense one; where the datasheet prints only
// the "with sparsity" figure (marked *), it is halved, as its footnote says.
const GpuSpec kSpecs[] = {
    // H100 SXM5 80 GB (NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM" column): 3.35 TB/s
    // HBM3; bf16 and fp16 1,979*, fp8 3,958*, int8 3,958* TOPS; up to 700 W.
    {"h100", 80 * kGiB, 3350, 989.5, 989.5, 1979, 1979, 700, true},
    // H200 SXM 141 GB (NVIDIA H200 Tensor Core GPU datasheet, "H200 SXM" column): 4.8 TB/s
    // HBM3e; the same tensor cores as H100 SXM (1,979*, 3,958*, 3,958*); up to 700 W.
    {"h200", 141 * kGiB, 4800, 989.5, 989.5, 1979, 1979, 700, true},
    // A100 80 GB SXM (NVIDIA A100 Tensor Core GPU datasheet, "A100 80GB SXM" column): 2,039 GB/s
    // HBM2e; bf16 and fp16 312 (624*), int8 624 TOPS (1,248*); no fp8; 400 W.
    {"a100", 80 * kGiB, 2039, 312, 312, 0, 624, 400, true},
    // L4 24 GB (NVIDIA L4 Tensor Core GPU datasheet): 300 GB/s GDDR6; bf16 and fp16 242*,
    // fp8 485*, int8 485* TOPS; 72 W.
    {"l4", 24 * kGiB, 300, 121, 121, 242.5, 242.5, 72, true},
    // GeForce RTX 4090 24 GB (NVIDIA Ada Lovelace architecture whitepaper, appendix table for
    // the RTX 4090: GeForce cards have no datasheet with tensor figures): 1,008 GB/s GDDR6X;
    // bf16 and fp16 165.2 and fp8 330.3 with FP32 accumulation (what GEMMs in training and
    // inference use; GeForce cards run FP16 accumulation at twice that), int8 660.6 TOPS;
    // 450 W total graphics power.
    {"rtx4090", 24 * kGiB, 1008, 165.2, 165.2, 330.3, 660.6, 450, true},
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

const GpuSpec* find_gpu_spec(std::string_view name) {
  const std::string key = lower(name);
  for (const GpuSpec& s : kSpecs)
    if (s.name == key) return &s;
  return nullptr;
}

std::vector<std::string> gpu_spec_names() {
  std::vector<std::string> names;
  for (const GpuSpec& s : kSpecs) names.push_back(s.name);
  return names;
}

GpuSpec gpu_spec_from_json(const std::string& text, const std::string& file) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("[gpu spec] ", file, ": not valid JSON (", e.what(), ")");
  }
  TS_CHECK(j.is_object(), "[gpu spec] ", file, ": expected one JSON object with the GPU's fields");
  auto field = [&](const char* key) -> const nlohmann::json& {
    TS_CHECK(j.contains(key), "[gpu spec] ", file, ": missing field '", key, "'");
    return j.at(key);
  };
  auto number = [&](const char* key, bool positive) {
    const nlohmann::json& v = field(key);
    TS_CHECK(v.is_number(), "[gpu spec] ", file, ": field '", key, "' must be a number, not ",
             v.type_name());
    const double x = v.get<double>();
    TS_CHECK(std::isfinite(x) && (positive ? x > 0 : x >= 0), "[gpu spec] ", file, ": field '", key,
             "' must be ", positive ? "> 0" : ">= 0", ", not ", v.dump());
    return x;
  };
  GpuSpec s;
  const nlohmann::json& name = field("name");
  TS_CHECK(name.is_string(), "[gpu spec] ", file, ": field 'name' must be a string, not ",
           name.type_name());
  s.name = name.get<std::string>();
  const double bytes = number("memory_bytes", true);
  TS_CHECK(bytes == std::floor(bytes) && bytes < 9.2e18, "[gpu spec] ", file,
           ": field 'memory_bytes' must be a whole number of bytes, not ",
           field("memory_bytes").dump());
  s.memory_bytes = static_cast<int64_t>(bytes);
  s.hbm_gbs = number("hbm_gbs", true);
  s.bf16_dense_tflops = number("bf16_dense_tflops", false);
  s.fp16_dense_tflops = number("fp16_dense_tflops", false);
  s.fp8_dense_tflops = number("fp8_dense_tflops", false);
  s.int8_dense_tops = number("int8_dense_tops", false);
  s.tdp_watts = number("tdp_watts", false);
  const nlohmann::json& datasheet = field("datasheet");
  TS_CHECK(datasheet.is_boolean(), "[gpu spec] ", file,
           ": field 'datasheet' must be true or false, not ", datasheet.dump());
  s.datasheet = datasheet.get<bool>();
  return s;
}

}  // namespace tessera::profile
