// End-to-end checks of the `tessera` binary's error behaviour: bad flags, missing files and
// unknown commands each give one clear line on stderr and a non-zero exit.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "test_util/run_tessera.h"

namespace {

using tessera::test::count_lines;
using tessera::test::run_tessera;
using Result = tessera::test::CliResult;

void expect_one_line_error(const std::string& args, const std::string& must_mention) {
  const Result r = run_tessera(args);
  EXPECT_NE(r.status, 0) << args;
  EXPECT_NE(r.status, -1) << "crashed: " << args;
  EXPECT_EQ(count_lines(r.err), 1) << args << " printed: " << r.err;
  EXPECT_NE(r.err.find(must_mention), std::string::npos)
      << args << " should mention '" << must_mention << "', printed: " << r.err;
}

TEST(Cli, UnknownCommand) {
  expect_one_line_error("frobnicate", "frobnicate");
}

TEST(Cli, UnknownFlag) {
  expect_one_line_error("probe --bogus 3", "--bogus");
}

TEST(Cli, BadNumber) {
  expect_one_line_error("probe --threads abc", "--threads");
}

TEST(Cli, OutOfRangeNumber) {
  expect_one_line_error("probe --threads -4", "--threads");
}

// Arguments a command does not take are refused, never silently ignored.
TEST(Cli, StrayPositional) {
  expect_one_line_error("probe stray", "'stray'");
  expect_one_line_error("generate -m x.gguf -p hi extra", "'extra'");
  expect_one_line_error("convert a.gguf b c", "'c'");
  expect_one_line_error("bench gemm 512", "'512'");
}

TEST(Cli, UnknownSingleDashFlag) {
  expect_one_line_error("generate -m x.gguf -p hi -k 40", "-k");
  expect_one_line_error("train -x 1", "-x");
}

// Every list flag goes through one parser: empty lists, empty items and bad items name the flag.
TEST(Cli, EmptyOrMalformedLists) {
  for (const char* batch : {"''", "1,,4", "1,x", "1,", "0", "4097"})
    expect_one_line_error(std::string("bench generate --batch ") + batch, "--batch");
  for (const char* sizes : {"''", "256,,512", "big"})
    expect_one_line_error(std::string("bench gemm --sizes ") + sizes, "--sizes");
  for (const char* ids : {"''", "1,,2", "1,-2"})
    expect_one_line_error(std::string("tokenizer decode --tok t.json --ids ") + ids, "--ids");
  expect_one_line_error("tokenizer train --in a --out b --specials 'x,,y'", "--specials");
}

TEST(Cli, MissingOrUnknownSubcommand) {
  expect_one_line_error("bench", "gemm");
  expect_one_line_error("tokenizer frob", "frob");
}

TEST(Cli, UnknownBenchmark) {
  expect_one_line_error("bench nonsense", "nonsense");
}

TEST(Cli, MissingTokenizerFile) {
  expect_one_line_error(
      "prepare --tokenizer /nonexistent/tok.json --in /nonexistent/c.txt --out "
      "/tmp/tessera_cli_out",
      "/nonexistent/");
}

TEST(Cli, TrainWithoutShards) {
  const std::string empty = ::testing::TempDir() + "tessera_empty_data";
  std::system(("mkdir -p " + empty).c_str());
  expect_one_line_error("train --model gpt2-tiny --data " + empty + " --steps 1 --out " +
                            ::testing::TempDir() + "tessera_cli_run",
                        empty);
}

TEST(Cli, UnknownModelPreset) {
  expect_one_line_error("train --model gpt7 --data /nonexistent --steps 1 --out /tmp/x", "gpt7");
}

TEST(Cli, TruncatedCheckpointOnResume) {
  const std::string dir = ::testing::TempDir() + "tessera_bad_ckpt";
  std::system(("mkdir -p " + dir).c_str());
  std::ofstream(dir + "/checkpoint.safetensors") << "\x10\x00\x00";
  std::ofstream(dir + "/run.json") << "{ not json";
  const Result r = run_tessera("train --resume " + dir + " --steps 2");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, -1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(dir), std::string::npos) << r.err;
}

}  // namespace
