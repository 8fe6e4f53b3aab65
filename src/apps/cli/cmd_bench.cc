// `tessera bench <gemm|train|generate>`: benchmarks that print figures and ratios (never assert
// times).
#include "apps/cli/args.h"
#include "apps/cli/bench.h"

namespace tessera::cli {
namespace {

const Registrar reg({
    "bench",
    "benchmarks: gemm (vs OpenBLAS), train (GPT-2 MFU), generate (tokens/s, roofline)",
    {},
    {},
    nullptr,
    {bench_gemm_command(), bench_train_command(), bench_generate_command()},
});

}  // namespace
}  // namespace tessera::cli
