// The user's path through the `tessera` binary on a tiny corpus: tokenizer train, prepare, train,
// stop and resume, sample. Checks exit codes and the files each step promises to write; the
// numerics themselves are tested in the layer tests.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_util/run_tessera.h"

namespace {

namespace fs = std::filesystem;
using tessera::test::count_lines;

// Runs `tessera <args>`, stdout to `out_path`; returns the exit status (-1 if it crashed).
int tessera(const std::string& args, const std::string& out_path) {
  const std::string cmd =
      std::string(TESSERA_BINARY_DIR) + "/tessera " + args + " >" + out_path + " 2>&1";
  const int raw = std::system(cmd.c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(EndToEnd, TokenizerPrepareTrainResumeSample) {
  const fs::path dir = fs::path(::testing::TempDir()) / "tessera_e2e";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string d = dir.string(), log = d + "/log.txt";
  {
    // Fortune-style documents separated by '%' lines.
    std::ofstream corpus(d + "/corpus.txt");
    for (int i = 0; i < 60; ++i)
      corpus << "The quick brown fox " << i % 7 << " jumps over the lazy dog.\n"
             << "A stitch in time saves nine, said the tailor.\n%\n";
  }
  ASSERT_EQ(
      tessera("tokenizer train --vocab 300 --in " + d + "/corpus.txt --out " + d + "/tok.json",
              log),
      0)
      << slurp(log);
  ASSERT_EQ(tessera("prepare --tokenizer " + d + "/tok.json --in " + d + "/corpus.txt --out " + d +
                        "/data --val-fraction 0.1 --seq 16",
                    log),
            0)
      << slurp(log);
  EXPECT_TRUE(fs::exists(d + "/data/train_000.bin"));
  EXPECT_TRUE(fs::exists(d + "/data/val_000.bin"));

  const std::string run = d + "/run";
  ASSERT_EQ(tessera("train --model gpt2-tiny --n-layer 1 --n-embd 32 --n-head 2 --max-seq 32 "
                    "--data " +
                        d +
                        "/data --batch 2 --seq 16 --steps 6 --stop-at 3 "
                        "--eval-every 3 --threads 1 --quiet --out " +
                        run,
                    log),
            0)
      << slurp(log);
  EXPECT_TRUE(fs::exists(run + "/checkpoint.safetensors"));
  ASSERT_EQ(tessera("train --resume " + run + " --steps 6 --threads 1 --quiet", log), 0)
      << slurp(log);
  for (const char* f : {"/loss.svg", "/train.csv", "/run.json", "/model/config.json",
                        "/model/model.safetensors", "/model/tokenizer.json"})
    EXPECT_TRUE(fs::exists(run + f)) << f;
  // Header plus one row per step, steps 1..6, whether run straight or resumed.
  EXPECT_EQ(count_lines(slurp(run + "/train.csv")), 7) << slurp(run + "/train.csv");
  EXPECT_NE(slurp(run + "/loss.svg").find("<svg"), std::string::npos);

  ASSERT_EQ(tessera("sample --ckpt " + run +
                        " --prompt \"The quick\" --max-tokens 8 "
                        "--temperature 0 --threads 1",
                    log),
            0)
      << slurp(log);
  const std::string text = slurp(log);
  EXPECT_EQ(text.rfind("The quick", 0), 0u) << text;  // the prompt is echoed, then continued
  EXPECT_GT(text.size(), std::string("The quick").size()) << text;
}

}  // namespace
