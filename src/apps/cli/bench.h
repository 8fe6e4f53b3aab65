// `tessera bench <what>` subcommands, each in its own file (bench_<what>.cc).
#pragma once

#include "apps/cli/args.h"

namespace tessera::cli {

Command bench_gemm_command();      // bench_gemm.cc
Command bench_train_command();     // bench_train.cc
Command bench_generate_command();  // bench_generate.cc

}  // namespace tessera::cli
