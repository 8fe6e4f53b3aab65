// `tessera bench <gemm|train>`: benchmarks that print figures and ratios (never assert times).
#include <cstdio>
#include <string>

#include "apps/cli/args.h"
#include "apps/cli/bench.h"
#include "core/error.h"

namespace tessera::cli {
namespace {

int run(const std::vector<std::string>& argv) {
  TS_CHECK(!argv.empty(), "usage: tessera bench <gemm|train|generate> [flags]");
  const std::string what = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (what == "gemm") return bench_gemm(rest);
  if (what == "train") return bench_train(rest);
  if (what == "generate") return bench_generate(rest);
  fail("unknown benchmark '", what, "' (known: gemm, train, generate)");
}

const Registrar reg(
    {"bench", "benchmarks: gemm (vs OpenBLAS), train (GPT-2 MFU), generate (tokens/s, roofline)",
     &run});

}  // namespace
}  // namespace tessera::cli
