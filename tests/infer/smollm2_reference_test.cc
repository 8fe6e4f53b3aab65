// SmolLM2-135M-Instruct (Q4_1 GGUF, the default model) against the NumPy float64 reference of
// scripts/gen_llama_reference.py: tokenization of the prompts, last-position logits, and 32
// greedy tokens; once with weights widened to f32 (only float rounding differs from the
// reference) and once through the integer kernels (activations quantized to 8 bits, whose
// effect on the logits the reference measured and stored).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/quant_matmul_avx2.h"
#include "core/file_io.h"
#include "formats/gguf.h"
#include "infer/engine.h"
#include "model/decoder.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace tessera::infer {
namespace {

const std::string kData = std::string(TESSERA_SOURCE_DIR) + "/tests/data/llama/";
const std::string kModel =
    std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct Reference {
  nlohmann::json j;
  std::vector<float> logits;  // last position, float64 reference rounded to f32
};

Reference load_reference(const std::string& name) {
  Reference r;
  r.j = nlohmann::json::parse(read_text_file(kData + name + ".json"));
  const std::vector<uint8_t> bytes =
      read_binary_file(kData + r.j["last_logits_file"].get<std::string>());
  r.logits.resize(bytes.size() / 4);
  std::memcpy(r.logits.data(), bytes.data(), bytes.size());
  return r;
}

model::DecoderModel load_smollm2(bool cpu_layout) {
  if (!file_exists(kModel))
    throw std::runtime_error("missing " + kModel + ": run scripts/install-deps.sh");
  model::DecoderLoadOptions o;
  o.cpu_layout = cpu_layout;
  return model::load_decoder_gguf(kModel, o);
}

const model::DecoderModel& smollm2() {
  static const model::DecoderModel m = load_smollm2(false);
  return m;
}

// As the CLI loads it for the CPU engine: Q4_1 matrices in the interleaved layout where the
// AVX2 kernels run (the tied Q8_0 embedding stays as it is).
const model::DecoderModel& smollm2_cpu_layout() {
  static const model::DecoderModel m = load_smollm2(true);
  return m;
}

double rms_diff(const std::vector<float>& a, const float* b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

struct EngineRun {
  std::vector<float> last_logits;
  std::vector<int32_t> greedy;
};

EngineRun run_engine(const std::vector<int32_t>& prompt, bool float_weights, int64_t steps,
                     const model::DecoderModel& model = smollm2()) {
  EngineOptions o;
  o.max_ctx = 256;
  o.float_weights = float_weights;
  Engine e(model, o);
  const int64_t V = e.config().vocab;
  const int32_t seq = e.new_sequence();
  EngineRun r;
  const std::vector<float>* logits = &e.forward({Feed{seq, prompt, false}});
  r.last_logits = *logits;
  for (int64_t s = 0; s < steps; ++s) {
    const int32_t t = static_cast<int32_t>(std::max_element(logits->begin(), logits->begin() + V) -
                                           logits->begin());
    r.greedy.push_back(t);
    if (s + 1 < steps) logits = &e.forward({Feed{seq, {&r.greedy.back(), 1}, false}});
  }
  return r;
}

class SmolLM2 : public ::testing::TestWithParam<std::string> {};

TEST_P(SmolLM2, TokenizerMatchesReferenceIds) {
  const Reference ref = load_reference(GetParam());
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(*smollm2().gguf);
  EXPECT_EQ(tok.encode(ref.j["prompt"].get<std::string>()),
            ref.j["prompt_token_ids"].get<std::vector<int32_t>>());
}

TEST_P(SmolLM2, FloatWeightsMatchReference) {
  const Reference ref = load_reference(GetParam());
  const auto prompt = ref.j["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto want = ref.j["greedy_tokens"].get<std::vector<int32_t>>();
  const EngineRun r = run_engine(prompt, true, static_cast<int64_t>(want.size()));
  ASSERT_EQ(r.last_logits.size(), ref.logits.size());
  double max_diff = 0;
  for (size_t i = 0; i < ref.logits.size(); ++i)
    max_diff = std::max<double>(max_diff, std::fabs(r.last_logits[i] - ref.logits[i]));
  // f32 accumulation over 30 layers against float64: observed ~1e-3; the quantized path's
  // effect is ~1 (see the other test), so 0.02 separates the two cleanly.
  EXPECT_LT(max_diff, 0.02) << "rms " << rms_diff(ref.logits, r.last_logits.data());
  EXPECT_EQ(r.greedy, want);
}

// The quantized path on `model` against the float64 reference.
void expect_quantized_within_rounding(const model::DecoderModel& model, const std::string& name) {
  const Reference ref = load_reference(name);
  const auto prompt = ref.j["prompt_token_ids"].get<std::vector<int32_t>>();
  const EngineRun r = run_engine(prompt, false, 32, model);
  // The reference measured how far 8-bit activation rounding moves these logits
  // (q8_activation_logit_rms_diff); our kernels round the same way, up to float order, which
  // the reference also measured (q8act_f32_noise_logit_rms_diff).
  const double q8_rms = ref.j["q8_activation_logit_rms_diff"].get<double>();
  const double noise_rms = ref.j["q8act_f32_noise_logit_rms_diff"].get<double>();
  const double got = rms_diff(ref.logits, r.last_logits.data());
  EXPECT_LT(got, 1.5 * (q8_rms + noise_rms)) << "q8 effect " << q8_rms << " noise " << noise_rms;
  EXPECT_GT(got, 0.0) << "identical logits: the activations were not quantized";
  // Same top token whenever the reference's top-2 gap exceeds the rounding effect.
  const double gap0 = ref.j["greedy_top1_top2_gap"][0].get<double>();
  if (gap0 > 3 * (q8_rms + noise_rms)) {
    EXPECT_EQ(r.greedy[0], ref.j["greedy_tokens"][0].get<int32_t>());
  }
  std::printf("logit rms diff vs f64 reference %.4f (q8 effect %.4f); greedy: %s\n", got, q8_rms,
              tokenizer::Tokenizer::from_gguf(*smollm2().gguf).decode(r.greedy).c_str());
}

TEST_P(SmolLM2, QuantizedKernelsWithinActivationRoundingOfReference) {
  expect_quantized_within_rounding(smollm2(), GetParam());
}

TEST_P(SmolLM2, InterleavedLayoutWithinActivationRoundingOfReference) {
  const model::DecoderModel& m = smollm2_cpu_layout();
  if (!cpu::quant_avx2_supported()) GTEST_SKIP() << "no AVX2: the CPU keeps the plain layout";
  ASSERT_EQ(m.weights.layers[0].wq.type, DType::q4_1x8);
  // The tied q8_0 embedding and head: one rearranged matrix, looked up and multiplied as q8_0x8.
  ASSERT_EQ(m.weights.tok_embd.type, DType::q8_0x8);
  ASSERT_EQ(m.weights.output.type, DType::q8_0x8);
  ASSERT_EQ(m.weights.output.data, m.weights.tok_embd.data);
  expect_quantized_within_rounding(m, GetParam());
  // Widened to f32 (EngineOptions::float_weights), both layouts give the same numbers.
  const auto prompt = load_reference(GetParam()).j["prompt_token_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(run_engine(prompt, true, 2, m).last_logits, run_engine(prompt, true, 2).last_logits);
}

INSTANTIATE_TEST_SUITE_P(Prompts, SmolLM2,
                         ::testing::Values("smollm2_plain_france", "smollm2_chat_france"));

}  // namespace
}  // namespace tessera::infer
