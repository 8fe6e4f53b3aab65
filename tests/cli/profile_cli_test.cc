// `tessera profile -- COMMAND`: the wrapped command runs as it would alone (its output, its exit
// code), and the report accounts for its ops: every op row has a shape, a cost model and a
// verdict, the shares (with the time between ops) add up to the ops' span, the forward's stages
// and the training step's phases appear as scopes; bad input is one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "nlohmann/json.hpp"
#include "test_util/run_tessera.h"

namespace {

namespace fs = std::filesystem;
using tessera::test::count_lines;
using tessera::test::run_tessera;
using tessera::test::scratch_path;
using tessera::test::slurp;
using Result = tessera::test::CliResult;

const std::string kModel =
    std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

// The report's op rows: shares add up to 1 with (other), and every op has a shape, a cost model
// (a positive roof time) and a verdict. Returns calls per op name.
std::map<std::string, double> check_rows(const nlohmann::json& j) {
  std::map<std::string, double> calls;
  double share = 0;
  for (const auto& r : j["ops"]) {
    share += r["share"].get<double>();
    calls[r["op"].get<std::string>()] += r["calls"].get<double>();
    if (r["op"] == "(other)") continue;
    EXPECT_FALSE(r["shape"].get<std::string>().empty()) << r;
    EXPECT_GT(r["roof_ms"].get<double>(), 0) << r;
    const std::string v = r["verdict"];
    EXPECT_TRUE(v == "memory-bound" || v == "compute-bound" || v == "overhead-bound") << r;
  }
  EXPECT_NEAR(share, 1.0, 1e-3);
  EXPECT_TRUE(calls.contains("(other)"));
  return calls;
}

std::map<std::string, nlohmann::json> scopes_of(const nlohmann::json& j) {
  std::map<std::string, nlohmann::json> s;
  for (const auto& x : j["scopes"]) s[x["scope"].get<std::string>()] = x;
  return s;
}

TEST(ProfileCli, GenerateRunsAsAloneAndEveryOpIsAccounted) {
  ASSERT_TRUE(fs::exists(kModel)) << "missing " << kModel << ": run scripts/install-deps.sh";
  const std::string report = scratch_path("report.json");
  const Result r = run_tessera("profile --json --out " + report + " -- generate -m " + kModel +
                               " -p 'The capital of France is' -n 6 --temperature 0 --raw "
                               "--threads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("The capital of France is Paris"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(slurp(report));
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["command"][0], "generate");
  const auto calls = check_rows(j);
  // One forward per generated token (the prompt's, then one per token fed back), each through
  // every layer (SmolLM2: 30).
  ASSERT_TRUE(calls.contains("paged_attention"));
  const double forwards = calls.at("paged_attention") / 30;
  EXPECT_EQ(forwards, 6.0) << j["ops"];
  EXPECT_EQ(calls.at("matmul_wt_group"), 2 * 30 * forwards);  // q|k|v and gate|up per layer
  // The stages of the forward pass are scopes; the head runs once per forward.
  const auto scopes = scopes_of(j);
  for (const char* s : {"qkv", "attn_out", "mlp_in", "mlp_down", "head", "attention"})
    ASSERT_TRUE(scopes.contains(s)) << s;
  EXPECT_EQ(scopes.at("head")["calls"].get<double>(), forwards);
  EXPECT_EQ(scopes.at("qkv")["calls"].get<double>(), 30 * forwards);
  // The scheduler's sampling after each forward is named though it runs no op.
  ASSERT_TRUE(scopes.contains("sample"));
  EXPECT_EQ(scopes.at("sample")["calls"].get<double>(), forwards);
  EXPECT_EQ(scopes.at("sample")["op_seconds"].get<double>(), 0.0);
  EXPECT_GT(j["named_outside_ops_s"].get<double>(), 0.0);
  // The span of the ops lies inside the run; the ops' own time inside their span (one thread
  // calls them).
  EXPECT_LE(j["ops_window_s"].get<double>(), j["wall_s"].get<double>());
  EXPECT_LE(j["ops_s"].get<double>(), j["ops_window_s"].get<double>() * 1.0001);
  EXPECT_GT(j["probe"]["f32_gflops_all"].get<double>(), 0);
}

TEST(ProfileCli, TrainingStepsByPhase) {
  const fs::path dir = scratch_path("train");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string d = dir.string();
  {
    std::ofstream corpus(d + "/corpus.txt");
    for (int i = 0; i < 60; ++i)
      corpus << "The quick brown fox " << i % 7 << " jumps over the lazy dog.\n%\n";
  }
  ASSERT_EQ(
      run_tessera("tokenizer train --vocab 300 --in " + d + "/corpus.txt --out " + d + "/tok.json")
          .status,
      0);
  ASSERT_EQ(run_tessera("prepare --tokenizer " + d + "/tok.json --in " + d + "/corpus.txt --out " +
                        d + "/data --val-fraction 0.1 --seq 16")
                .status,
            0);
  const std::string report = d + "/report.json";
  // --steps 2 replaces the run's --steps 50.
  const Result r = run_tessera(
      "profile --steps 2 --json --out " + report +
      " -- train --model gpt2-tiny --n-layer 1 --n-embd 32 --n-head 2 "
      "--max-seq 32 --data " +
      d + "/data --batch 2 --seq 16 --steps 50 --threads 1 --quiet --out " + d + "/run");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(slurp(report));
  const auto calls = check_rows(j);
  // One loss per step, and the validation loss at the end (forward only).
  EXPECT_GT(calls.at("softmax_xent"), 2.0);
  for (const char* op : {"gemm", "attention_forward", "attention_backward", "adamw"})
    EXPECT_GT(calls.contains(op) ? calls.at(op) : 0, 0) << op;
  const auto scopes = scopes_of(j);
  for (const char* s : {"loss", "backward", "optimizer"}) {
    ASSERT_TRUE(scopes.contains(s)) << s;
    EXPECT_EQ(scopes.at(s)["calls"].get<double>(), 2.0) << s;  // once per step
  }
  ASSERT_TRUE(scopes.contains("forward"));
  EXPECT_EQ(scopes.at("forward")["calls"].get<double>(), calls.at("softmax_xent"));
}

// --seconds stops a server with SIGTERM, which it takes as the signal to drain and exit 0.
TEST(ProfileCli, ServerForSomeSeconds) {
  const std::string report = scratch_path("serve.json");
  const Result r = run_tessera("profile --seconds 2 --json --out " + report + " -- serve -m " +
                               kModel + " --port 18977 --ctx 512 --kv-memory 64MiB --threads 1");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(slurp(report));
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_GE(j["wall_s"].get<double>(), 2.0);
}

TEST(ProfileCli, BadInputIsOneLineAndTheExitCodePassesThrough) {
  for (const auto& [args, mention] : std::map<std::string, std::string>{
           {"profile", "--"},
           {"profile -- frobnicate", "frobnicate"},
           {"profile -- profile -- generate", "itself"},
           {"profile -- bench generate", "--profile"},
           {"profile --seconds 2 -- generate -p Hi", "--seconds"},
           {"profile --steps 2 -- generate -p Hi", "--steps"},
           {"profile --bogus -- generate", "--bogus"},
           {"profile -- generate -m /nonexistent/model.gguf -p Hi", "/nonexistent/model.gguf"},
           {"profile -- generate --bogus 1", "--bogus"}}) {
    const Result r = run_tessera(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << " printed: " << r.err;
    EXPECT_NE(r.err.find(mention), std::string::npos) << args << " printed: " << r.err;
  }
  // --help of profile is profile's, even with a command after --.
  const Result h = run_tessera("profile --help -- generate");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("-- COMMAND"), std::string::npos) << h.out;
}

}  // namespace
