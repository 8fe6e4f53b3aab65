// The inference commands end to end on the default model: greedy generation, quantize with its
// error report, GGUF -> HF folder -> GGUF conversion, perplexity, bench generate --json,
// generation on --device cuda where a GPU is; and one-line errors for bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "backend/device.h"
#include "core/file_io.h"
#include "formats/gguf.h"
#include "nlohmann/json.hpp"
#include "test_util/run_tessera.h"

namespace {

const std::string kModel =
    std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

using tessera::test::run_tessera;
using tessera::test::scratch_path;
using tessera::test::slurp;
using Result = tessera::test::CliResult;

class InferCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kModel))
        << "missing " << kModel << ": run scripts/install-deps.sh";
  }
};

TEST_F(InferCli, GreedyRawGenerationAnswers) {
  const Result r = run_tessera("generate -m " + kModel +
                               " -p 'The capital of France is' -n 6 --temperature 0 --raw "
                               "--threads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("The capital of France is Paris"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST_F(InferCli, ChatTemplateGenerationStopsAtEndOfTurn) {
  const Result r =
      run_tessera("generate -m " + kModel +
                  " -p 'What is the capital of France, and what is it famous for?' -n 96 "
                  "--temperature 0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("<|im_end|>"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("finish: stop"), std::string::npos) << r.err;
}

// `tessera template` prints the model's own template rendered exactly as transformers renders
// it: cli_smollm2.expected is apply_chat_template(tokenize=False, add_generation_prompt=True) of
// transformers 5.25 on the folder `tessera convert` makes of the default model.
TEST_F(InferCli, TemplateRendersAsTransformers) {
  const std::string data = std::string(TESSERA_SOURCE_DIR) + "/tests/data/chat_templates/";
  Result r = run_tessera("template -m " + kModel + " --messages " + data + "cli_conversation.json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, tessera::read_text_file(data + "cli_smollm2.expected"));
  // A template file, with the variables it asks for.
  const std::string tpl = scratch_path("t.jinja");
  tessera::write_file_atomic(
      tpl,
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}[assistant]{% endif %}{{ greeting | default('-') }}");
  r = run_tessera("template --template " + tpl + " --messages " + data +
                  "cli_conversation.json --bos-token '<s>' --no-generation-prompt "
                  "--vars '{\"greeting\": \"hi\"}'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[user]H\u00e9llo, what is 2+2?[assistant]4.[user]And 3+3?hi");
  // Refusals name what was wrong.
  r = run_tessera("template -m " + kModel + " --template " + tpl + " --messages " + data +
                  "cli_conversation.json");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("exactly one of"), std::string::npos) << r.err;
  r = run_tessera("template --template " + tpl + " --messages " + tpl);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--messages"), std::string::npos) << r.err;
  tessera::write_file_atomic(tpl, "{{ raise_exception('no system role here') }}");
  r = run_tessera("template --template " + tpl + " --messages " + data + "cli_conversation.json");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("no system role here"), std::string::npos) << r.err;
  tessera::write_file_atomic(tpl, "{% if %}");
  r = run_tessera("template --template " + tpl + " --messages " + data + "cli_conversation.json");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find(":1:"), std::string::npos) << r.err;  // line 1, with its column
}

// `tokenizer encode/decode -m MODEL` with the model's own tokenizer. The ids with --special are
// HF tokenizers' (0.22, tokenizer.json of the converted folder, add_special_tokens=False);
// without it <|im_end|> is ordinary text.
TEST_F(InferCli, TokenizerOfAModel) {
  Result r = run_tessera("tokenizer encode -m " + kModel +
                         " --text 'Hello <|im_end|> w\u00f6rld' --special");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "19556,216,2,267,29989,400\n");
  r = run_tessera("tokenizer encode -m " + kModel + " --text 'Hello <|im_end|>'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find(",2,"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.rfind(",2\n"), std::string::npos) << r.out;
  r = run_tessera("tokenizer decode -m " + kModel + " --ids 19556,216,2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "Hello <|im_end|>\n");
  r = run_tessera("tokenizer encode --text x");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("-m MODEL"), std::string::npos) << r.err;
}

TEST_F(InferCli, QuantizeConvertAndPerplexity) {
  const std::string q8 = scratch_path("q8.gguf"), hf = scratch_path("hf"),
                    back = scratch_path("back.gguf");
  Result r = run_tessera("quantize " + kModel + " " + q8 + " --type q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  {  // The rewrite loses and changes no key but the two that describe its new content.
    const tessera::formats::GgufFile orig(kModel), q(q8);
    std::string lost_or_changed;
    for (const auto& [key, value] : orig.metadata()) {
      if (key == "general.file_type" || key == "general.quantization_version") continue;
      if (!q.has(key))
        lost_or_changed += " lost:" + key;
      else if (!(q.get(key) == value))
        lost_or_changed += " changed:" + key;
    }
    EXPECT_EQ(lost_or_changed, "");
    EXPECT_EQ(q.get_int("general.file_type"), 7);  // llama.cpp's MOSTLY_Q8_0
  }
  EXPECT_NE(r.out.find("blk.0.ffn_up"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rel rms"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bits per weight"), std::string::npos) << r.out;
  r = run_tessera("convert " + q8 + " " + hf + " --dtype f16");
  ASSERT_EQ(r.status, 0) << r.err;
  // The size written: the f16 folder, larger than the q8_0 weights read.
  EXPECT_NE(r.out.find("MB written"), std::string::npos) << r.out;
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors",
                        "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    EXPECT_TRUE(std::filesystem::exists(hf + "/" + f)) << f;
  // transformers' generate() stops at eos_token_id: SmolLM2's <|im_end|> (2), bos <|im_start|>.
  const auto config = nlohmann::json::parse(tessera::read_text_file(hf + "/config.json"));
  const auto gen = nlohmann::json::parse(tessera::read_text_file(hf + "/generation_config.json"));
  EXPECT_EQ(config.value("eos_token_id", -1), 2) << config.dump();
  EXPECT_EQ(config.value("bos_token_id", -1), 1) << config.dump();
  EXPECT_EQ(gen.value("eos_token_id", -1), 2) << gen.dump();
  r = run_tessera("convert " + hf + " " + back);
  ASSERT_EQ(r.status, 0) << r.err;
  // The special ids survive GGUF -> folder -> GGUF (bos, unk and padding were lost, eos was 0).
  {
    const tessera::formats::GgufFile orig(kModel), rt(back);
    for (const char* k : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"}) {
      ASSERT_TRUE(rt.has(k)) << k;
      EXPECT_EQ(rt.get_int(k), orig.get_int(k)) << k;
    }
  }
  // The round-tripped model still answers, through its own tokenizer and chat template.
  r = run_tessera("generate -m " + back +
                  " -p 'The capital of France is' -n 4 --temperature 0 --raw");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.out;
  r = run_tessera("perplexity -m " + q8 + " -f " + std::string(TESSERA_SOURCE_DIR) +
                  "/tests/data/llama/ppl_text.txt --ctx 64 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["perplexity"].get<double>(), 1.5);
  EXPECT_LT(j["perplexity"].get<double>(), 200);
  std::filesystem::remove_all(hf);
}

TEST_F(InferCli, BenchGenerateJson) {
  const Result r = run_tessera("bench generate -m " + kModel +
                               " --prompt 16 --gen 4 --reps 1 --batch 1,2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"prefill_tokens_per_s", "decode_tokens_per_s", "decode_bandwidth_fraction"})
    EXPECT_GT(j[k].get<double>(), 0) << k;
  EXPECT_EQ(j["batched"].size(), 2u);
  // Time splits are fractions of the phase's forward time: each part in [0, 1], summing to 1.
  for (const char* split : {"decode_time_split", "prefill_time_split"}) {
    double sum = 0;
    for (const char* part : {"matmul", "attention", "other"}) {
      const double f = j[split][part].get<double>();
      EXPECT_GE(f, -1e-9) << split << "." << part;
      EXPECT_LE(f, 1 + 1e-9) << split << "." << part;
      sum += f;
    }
    EXPECT_NEAR(sum, 1.0, 1e-3) << split;
    EXPECT_GT(j[split]["matmul"].get<double>(), 0) << split;
  }
  // Decode's stages: fractions of its time that add up to the matmul and attention parts of the
  // split; every stage's ops moved bytes at a positive rate (the products their weights,
  // attention the cached keys and values).
  const auto& stages = j["decode_stages"];
  double products = 0;
  for (const char* s : {"qkv", "attn_out", "mlp_in", "mlp_down", "head", "attention"})
    EXPECT_GT(stages[s]["gbs"].get<double>(), 0) << s;
  for (const char* s : {"qkv", "attn_out", "mlp_in", "mlp_down", "head"})
    products += stages[s]["time_fraction"].get<double>();
  EXPECT_NEAR(products, j["decode_time_split"]["matmul"].get<double>(), 1e-3);
  EXPECT_NEAR(stages["attention"]["time_fraction"].get<double>(),
              j["decode_time_split"]["attention"].get<double>(), 1e-3);
  // Memory on huge pages is a reading of the process: never negative, never past its peak.
  EXPECT_GE(j["huge_page_bytes"].get<double>(), 0);
  EXPECT_LE(j["huge_page_bytes"].get<double>(), j["peak_rss_bytes"].get<double>());
}

// bench generate --profile: prefill's and decode's ops apart, each phase's shares adding up to
// its time, the products and attention in both, one paged attention per layer per decode step.
TEST_F(InferCli, BenchGenerateProfileJson) {
  const Result r = run_tessera("bench generate -m " + kModel +
                               " --prompt 16 --gen 4 --reps 1 --batch 1 --profile --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const int64_t layers = 30;  // SmolLM2-135M
  for (const char* phase : {"prefill_ops", "decode_ops"}) {
    std::map<std::string, double> calls;  // per op, over its shapes
    double share = 0;
    for (const auto& op : j[phase]) {
      calls[op["op"].get<std::string>()] += op["calls"].get<double>();
      share += op["share"].get<double>();
      if (op["op"] == "(other)") continue;
      EXPECT_FALSE(op["shape"].get<std::string>().empty()) << op;
      EXPECT_GT(op["roof_ms"].get<double>(), 0) << op;
    }
    EXPECT_NEAR(share, 1.0, 1e-3) << phase;
    for (const char* name : {"matmul_wt", "matmul_wt_group", "paged_attention", "rmsnorm_forward"})
      EXPECT_TRUE(calls.contains(name)) << phase << " " << name;
    EXPECT_EQ(calls["paged_attention"], layers) << phase;
  }
}

// bench train --profile: every op of the step observed once per call, the shares (with the time
// outside ops) adding up to the whole step, the products and attention with a cost model.
TEST_F(InferCli, BenchTrainProfileJson) {
  const Result r = run_tessera(
      "bench train --model gpt2-tiny --batch 2 --seq 16 --steps 2 --threads 1 --profile --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::map<std::string, nlohmann::json> ops;  // the last row of each op (a shape of it)
  std::map<std::string, double> calls;        // per op, over its shapes
  double share = 0;
  for (const auto& op : j["ops"]) {
    ops[op["op"].get<std::string>()] = op;
    calls[op["op"].get<std::string>()] += op["calls"].get<double>();
    EXPECT_GE(op["share"].get<double>(), 0) << op;
    share += op["share"].get<double>();
  }
  EXPECT_NEAR(share, 1.0, 1e-3);
  for (const char* name : {"gemm", "attention_forward", "attention_backward", "adamw",
                           "layernorm_forward", "softmax_xent"}) {
    ASSERT_TRUE(ops.contains(name)) << name;
    EXPECT_GT(ops[name]["roof_ms"].get<double>(), 0) << name;
  }
  EXPECT_EQ(calls["softmax_xent"], 1.0);  // one loss per step
  // AdamW's few FLOPs per byte put it under the memory roof (or under no roof at all when its
  // call is too short to reach one).
  EXPECT_NE(ops["adamw"]["verdict"], "compute-bound");
  EXPECT_TRUE(ops.contains("(other)"));
  const Result cuda = run_tessera("bench train --device cuda --profile");
  EXPECT_NE(cuda.status, 0);
}

// A peak probed on a busy machine is too low, and a later run outruns it: bench train says so
// rather than print an MFU above 100% as if it were a measurement.
TEST_F(InferCli, BenchTrainSaysWhenTheCachedPeakIsTooLow) {
  const std::string cache = scratch_path("cache");
  std::filesystem::remove_all(cache);
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  setenv("XDG_CACHE_HOME", cache.c_str(), 1);
  const std::string bench =
      "bench train --model gpt2-tiny --batch 2 --seq 16 --steps 2 --threads 1";
  ASSERT_EQ(run_tessera("probe --threads 1").status, 0);
  const Result honest = run_tessera(bench);
  ASSERT_EQ(honest.status, 0) << honest.err;
  EXPECT_EQ(honest.out.find("note: above the cached peak"), std::string::npos) << honest.out;
  const std::string path = cache + "/tessera/probe.json";
  auto j = nlohmann::json::parse(slurp(path));
  j["f32_gflops_all"] = 1e-3;
  std::ofstream(path) << j.dump();
  const Result low = run_tessera(bench);
  ASSERT_EQ(low.status, 0) << low.err;
  EXPECT_NE(low.out.find("note: above the cached peak probed 20"), std::string::npos) << low.out;
  EXPECT_NE(low.out.find("tessera probe --force"), std::string::npos) << low.out;
  if (old)
    setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(cache);
}

TEST_F(InferCli, BadInputIsOneLine) {
  struct Case {
    std::string args, mention;
  };
  const Case cases[] = {
      {"generate -m /nonexistent.gguf -p hi", "/nonexistent.gguf"},
      {"generate -m " + kModel + " -p hi --top-p 0", "--top-p"},
      {"generate -m " + kModel + " -p hi --chat-template bogus", "--chat-template"},
      {"quantize " + kModel + " /tmp/x.gguf --type q5_9", "--type"},
      {"quantize " + kModel + " /tmp/x.gguf --type q4_k_m --pure", "--pure"},
      {"quantize " + kModel + " /tmp/x.gguf --type q4_0 --output-type q9", "--output-type"},
      {"perplexity -m " + kModel + " -f /nonexistent.txt", "/nonexistent.txt"},
      {"perplexity -m " + kModel + " -f x.txt --scoring chunks --stride 8", "--stride applies"},
      {"perplexity -m " + kModel + " -f x.txt --ctx 64 --stride 64", "--stride 64 must be below"},
      {"bench generate -m " + kModel + " --batch 0", "--batch"},
      {"generate -m " + kModel + " -p hi --kv-type q8_0", "--kv-type"},
      {"generate -m " + kModel + " -p hi --device tpu", "--device"},
  };
  for (const Case& c : cases) {
    const Result r = run_tessera(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.mention), std::string::npos) << c.args << ": " << r.err;
  }
}

// Without CUDA in the build or without a GPU: a one-line "[cuda]" error, never a silent fall back
// to the CPU. With a GPU: real text, generated on it.
TEST_F(InferCli, DeviceCuda) {
  const Result r = run_tessera("generate -m " + kModel +
                               " -p 'The capital of France is' -n 6 --temperature 0 --raw "
                               "--device cuda");
  if (!tessera::backend::cuda_built() || tessera::backend::cuda_device_count() == 0) {
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("[cuda] --device cuda"), std::string::npos) << r.err;
    return;
  }
  ASSERT_EQ(r.status, 0) << r.err;
  // The output starts with the raw prompt; the model must add words of its own after it.
  const std::string prompt = "The capital of France is";
  ASSERT_EQ(r.out.rfind(prompt, 0), 0u) << r.out;
  const std::string added = r.out.substr(prompt.size());
  EXPECT_TRUE(std::any_of(added.begin(), added.end(), [](char c) { return std::isalpha(c); }))
      << r.out;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

}  // namespace
