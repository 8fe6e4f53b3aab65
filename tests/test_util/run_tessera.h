// Test helper: runs the built `tessera` binary and captures its exit status, stdout and stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace tessera::test {

struct CliResult {
  int status = -1;
  std::string out, err;
};

// Lines of s ('\n' characters): an error report must be exactly one.
inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A scratch path named after the running test: ctest runs a binary's tests in parallel
// processes, so no two tests share one.
inline std::string scratch_path(const std::string& name) {
  return ::testing::TempDir() + "tessera_" +
         ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "_" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" + name;
}

// Runs `tessera <args>` (a shell command line) with no standard input.
inline CliResult run_tessera(const std::string& args) {
  const std::string out = scratch_path("out.txt"), err = scratch_path("err.txt");
  const std::string cmd = std::string(TESSERA_BINARY_DIR) + "/tessera " + args + " >" + out +
                          " 2>" + err + " </dev/null";
  CliResult r;
  const int raw = std::system(cmd.c_str());
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace tessera::test
