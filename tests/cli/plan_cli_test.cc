// `tessera plan`: on this CPU with --check, the predicted peak memory within 5% of the measured
// one (times are reported, never asserted); on a datasheet GPU, a plan with energy and cost; bad
// input is one line naming the flag, device, file or field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "nlohmann/json.hpp"
#include "test_util/run_tessera.h"

namespace {

using tessera::test::count_lines;
using tessera::test::run_tessera;
using tessera::test::scratch_path;
using Result = tessera::test::CliResult;

const std::string kModel =
    std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(PlanCli, CheckOnThisCpuPredictsMemoryWithinFivePercent) {
  ASSERT_TRUE(std::filesystem::exists(kModel)) << "run scripts/install-deps.sh";
  const Result r = run_tessera("plan -m " + kModel +
                               " --context 96 --batch 1,2 --check --gen 4 --threads 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_TRUE(j["measured_roofs"].get<bool>());
  const double predicted = j["check"]["predicted_peak_rss"], measured = j["check"]["peak_rss"];
  EXPECT_NEAR(predicted / measured, 1.0, 0.05) << predicted << " vs " << measured;
  ASSERT_EQ(j["decode"].size(), 2u);
  ASSERT_EQ(j["check"]["batches"].size(), 2u);
  for (const auto& d : j["decode"]) EXPECT_GT(d["tokens_per_s"].get<double>(), 0) << d;
  for (const auto& b : j["check"]["batches"]) EXPECT_GT(b["decode_tokens_per_s"].get<double>(), 0);
  // The weights by type add up to the weights.
  double sum = 0;
  for (const auto& [t, b] : j["memory"]["weights_by_dtype"].items()) sum += b.get<double>();
  EXPECT_DOUBLE_EQ(sum, j["memory"]["weights"].get<double>());
}

TEST(PlanCli, DatasheetGpuWithEnergyAndCost) {
  const Result r = run_tessera("plan -m " + kModel +
                               " --device h100 --context 4096 --batch 1,8 --price-per-hour 3.5 "
                               "--json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["measured_roofs"].get<bool>());
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["watts"].get<double>(), 700.0);  // the H100 SXM's TDP from the table
  const auto& d = j["decode"];
  ASSERT_EQ(d.size(), 2u);
  EXPECT_GT(d[1]["tokens_per_s"].get<double>(), d[0]["tokens_per_s"].get<double>());
  for (const auto& s : d) {
    // J and $ per million tokens follow from the step time: W x s and $/h / 3600 x s.
    const double s_per_mtok = 1e6 / s["tokens_per_s"].get<double>();
    EXPECT_NEAR(s["joules_per_million_tokens"].get<double>(), 700.0 * s_per_mtok,
                1e-6 * 700.0 * s_per_mtok);
    EXPECT_NEAR(s["dollars_per_million_tokens"].get<double>(), 3.5 / 3600 * s_per_mtok,
                1e-6 * s_per_mtok);
  }
}

TEST(PlanCli, TrainingStep) {
  const Result r = run_tessera(
      "plan --train --model gpt2-tiny --vocab-size 300 --batch 2,4 --seq 32 --precision bf16 "
      "--recompute block --grad-accum 2 --threads 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["plans"].size(), 2u);
  for (const auto& p : j["plans"]) {
    const auto& m = p["memory"];
    double parts = 0;
    for (const char* k : {"params", "grads", "adamw", "bf16_copy", "activations", "baseline"})
      parts += m[k].get<double>();
    EXPECT_DOUBLE_EQ(parts, m["total"].get<double>());
    EXPECT_GT(m["bf16_copy"].get<double>(), 0);  // bf16 keeps a copy of the matrices
    EXPECT_GT(p["step_seconds"].get<double>(), 0);
    EXPECT_TRUE(p["fits"].get<bool>());
    EXPECT_GE(p["max_batch"].get<int64_t>(), p["batch"].get<int64_t>());
  }
  // Twice the batch: twice the activations, the same parameters.
  EXPECT_FALSE(j["plans"][0].contains("parallel"));
  EXPECT_DOUBLE_EQ(j["plans"][1]["memory"]["params"].get<double>(),
                   j["plans"][0]["memory"]["params"].get<double>());
  EXPECT_GT(j["plans"][1]["memory"]["activations"].get<double>(),
            j["plans"][0]["memory"]["activations"].get<double>());
}

TEST(PlanCli, DataAndPipelineParallelArePredicted) {
  const Result r = run_tessera(
      "plan --train --model gpt2-tiny --vocab-size 300 --batch 2 --seq 32 --grad-accum 4 "
      "--threads 1 --data-parallel 4 --pipeline-stages 2 --link-gbs 25 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& p = j["plans"][0];
  const auto& par = p["parallel"];
  EXPECT_EQ(par["data"].get<int64_t>(), 4);
  EXPECT_EQ(par["pipeline"].get<int64_t>(), 2);
  EXPECT_GT(par["allreduce_s"].get<double>(), 0);
  EXPECT_GT(par["p2p_s"].get<double>(), 0);
  EXPECT_LT(par["memory_per_rank"].get<double>(), p["memory"]["total"].get<double>());
  // Eight ranks: more tokens/s than one, less than eight times as many.
  const double one = p["tokens_per_s"], all = par["tokens_per_s"];
  EXPECT_GT(all, one);
  EXPECT_LT(all, 8 * one);
}

TEST(PlanCli, BadInputIsOneLine) {
  const std::string spec = scratch_path("spec.json");
  {
    std::ofstream f(spec);
    f << R"({"name": "mine", "memory_bytes": 1000000000, "hbm_gbs": 100})";
  }
  for (const auto& [args, mention] : std::map<std::string, std::string>{
           {"plan --device tpu9", "tpu9"},
           {"plan --device " + spec, "spec.json"},
           {"plan --context 99999999", "--context"},
           {"plan --check --device h100", "--check"},
           {"plan --kv-type q4", "--kv-type"},
           {"plan --train --model gpt9", "gpt9"},
           {"plan --train --model gpt2-tiny --precision f8", "f8"},
           {"plan --train --model gpt2-tiny --seq 99999", "99999"},
           {"plan -m /nonexistent/m.gguf", "/nonexistent/m.gguf"},
           {"plan --seq 64", "--seq"},
           {"plan --train --model gpt2-tiny --context 64", "--context"},
           {"plan --train --model gpt2-tiny --data-parallel 2", "--link-gbs"},
           {"plan --train --model gpt2-tiny --link-gbs 9", "--link-gbs"},
           {"plan --train --model gpt2-tiny --seq 64 --pipeline-stages 99 "
            "--link-gbs 9",
            "pipeline stages"}}) {
    const Result r = run_tessera(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << " printed: " << r.err;
    EXPECT_NE(r.err.find(mention), std::string::npos) << args << " printed: " << r.err;
  }
}

}  // namespace
