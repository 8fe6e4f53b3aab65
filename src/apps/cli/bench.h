// `tessera bench <what>` subcommands, each in its own file (bench_<what>.cc).
#pragma once

#include <string>
#include <vector>

namespace tessera::cli {

int bench_gemm(const std::vector<std::string>& argv);      // bench_gemm.cc
int bench_train(const std::vector<std::string>& argv);     // bench_train.cc
int bench_generate(const std::vector<std::string>& argv);  // bench_generate.cc

}  // namespace tessera::cli
