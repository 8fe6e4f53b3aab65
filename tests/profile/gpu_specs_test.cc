// The GPU datasheet table (lookup by name, any case; every entry's figures sane) and a user's
// spec.json: read when complete, one clear error naming the file and the field otherwise.
#include "profile/gpu_specs.h"

#include <gtest/gtest.h>

#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace tessera::profile {
namespace {

TEST(GpuSpecs, LooksUpEveryDeviceInAnyCase) {
  const std::vector<std::string> names = gpu_spec_names();
  EXPECT_EQ(names, (std::vector<std::string>{"h100", "h200", "a100", "l4", "rtx4090"}));
  for (const std::string& n : names) {
    const GpuSpec* s = find_gpu_spec(n);
    ASSERT_NE(s, nullptr) << n;
    EXPECT_EQ(s->name, n);
    EXPECT_TRUE(s->datasheet) << n;
    EXPECT_GT(s->memory_bytes, int64_t{16} << 30) << n;
    EXPECT_GT(s->hbm_gbs, 0) << n;
    EXPECT_GT(s->bf16_dense_tflops, 0) << n;
    EXPECT_EQ(s->bf16_dense_tflops, s->fp16_dense_tflops) << n;
    EXPECT_GE(s->int8_dense_tops, 2 * s->bf16_dense_tflops) << n;
    EXPECT_GT(s->tdp_watts, 0) << n;
  }
  EXPECT_EQ(find_gpu_spec("H100"), find_gpu_spec("h100"));
  EXPECT_EQ(find_gpu_spec("RTX4090"), find_gpu_spec("rtx4090"));
  EXPECT_EQ(find_gpu_spec("b200"), nullptr);
  EXPECT_EQ(find_gpu_spec(""), nullptr);
  // Dense, not sparse: H100 SXM's bf16 is 989.5 TFLOP/s (1,979 with sparsity).
  EXPECT_DOUBLE_EQ(find_gpu_spec("h100")->bf16_dense_tflops, 989.5);
  EXPECT_EQ(find_gpu_spec("a100")->fp8_dense_tflops, 0) << "A100 has no fp8 tensor cores";
  EXPECT_LT(find_gpu_spec("h100")->memory_bytes, find_gpu_spec("h200")->memory_bytes);
}

nlohmann::json full_spec() {
  return {{"name", "my-gpu"},         {"memory_bytes", 48LL << 30}, {"hbm_gbs", 864},
          {"bf16_dense_tflops", 362}, {"fp16_dense_tflops", 362},   {"fp8_dense_tflops", 733},
          {"int8_dense_tops", 733},   {"tdp_watts", 350},           {"datasheet", true}};
}

const char* const kFields[] = {"name",
                               "memory_bytes",
                               "hbm_gbs",
                               "bf16_dense_tflops",
                               "fp16_dense_tflops",
                               "fp8_dense_tflops",
                               "int8_dense_tops",
                               "tdp_watts",
                               "datasheet"};

TEST(GpuSpecs, ReadsACompleteSpecFile) {
  EXPECT_EQ(full_spec().size(), std::size(kFields));
  const GpuSpec s = gpu_spec_from_json(full_spec().dump(), "spec.json");
  EXPECT_EQ(s.name, "my-gpu");
  EXPECT_EQ(s.memory_bytes, 48LL << 30);
  EXPECT_EQ(s.hbm_gbs, 864);
  EXPECT_EQ(s.bf16_dense_tflops, 362);
  EXPECT_EQ(s.fp16_dense_tflops, 362);
  EXPECT_EQ(s.fp8_dense_tflops, 733);
  EXPECT_EQ(s.int8_dense_tops, 733);
  EXPECT_EQ(s.tdp_watts, 350);
  EXPECT_TRUE(s.datasheet);
}

// The message a bad spec file raises (empty when it raises none, or not an Error).
std::string error_of(const std::string& text, const std::string& file = "my/spec.json") {
  try {
    gpu_spec_from_json(text, file);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GpuSpecs, EachMissingFieldIsNamedWithTheFile) {
  for (const std::string key : kFields) {
    nlohmann::json j = full_spec();
    j.erase(key);
    const std::string msg = error_of(j.dump());
    EXPECT_NE(msg.find("my/spec.json"), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("missing field '" + key + "'"), std::string::npos) << key << ": " << msg;
  }
}

TEST(GpuSpecs, EachIllTypedFieldIsNamedWithTheFile) {
  for (const std::string key : kFields) {
    nlohmann::json j = full_spec();
    j[key] = key == "name" ? nlohmann::json(3) : nlohmann::json("fast");
    const std::string msg = error_of(j.dump());
    EXPECT_NE(msg.find("my/spec.json"), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("field '" + key + "' must be"), std::string::npos) << key << ": " << msg;
  }
}

TEST(GpuSpecs, RejectsBadValuesAndBadJson) {
  nlohmann::json j = full_spec();
  j["hbm_gbs"] = 0;
  EXPECT_NE(error_of(j.dump()).find("'hbm_gbs' must be > 0"), std::string::npos);
  j = full_spec();
  j["tdp_watts"] = -5;
  EXPECT_NE(error_of(j.dump()).find("'tdp_watts' must be >= 0"), std::string::npos);
  j = full_spec();
  j["memory_bytes"] = 1.5;
  EXPECT_NE(error_of(j.dump()).find("'memory_bytes' must be a whole number"), std::string::npos);
  j = full_spec();
  j["fp8_dense_tflops"] = 0;  // a card without fp8 units
  EXPECT_EQ(error_of(j.dump()), "");
  EXPECT_NE(error_of("{\"name\": ").find("my/spec.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("my/spec.json: expected one JSON object"), std::string::npos);
}

}  // namespace
}  // namespace tessera::profile
