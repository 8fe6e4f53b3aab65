// The per-op table that `bench ... --profile` prints: where a run's time went, op by op, and how
// close each op came to the machine's roofline: the time its FLOPs need at the compute peak or
// its bytes at the memory bandwidth, whichever is longer, against the time it took.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/op_tally.h"
#include "profile/probe.h"

namespace tessera::cli {

struct OpProfileRow {
  std::string op;
  double calls = 0, ms = 0, share = 0;  // per run (step or token); share of the run's time
  double gflops = 0, gbs = 0;           // achieved; 0 when the op has no cost model
  double roof_ms = 0;                   // the roofline's time for the op; 0 without a model
  const char* bound = "";               // "compute" or "memory": which roof limits it
};

// totals were observed over `runs` runs that took `seconds` in all; peak_gflops(op) is the
// compute peak that applies to an op (f32, or bf16 for products on the bf16 kernel),
// bandwidth_gbs the memory bandwidth. The last row, "(other)", is the time outside any op.
std::vector<OpProfileRow> op_profile(const std::vector<ops::OpTotal>& totals, int64_t runs,
                                     double seconds,
                                     const std::function<double(const std::string&)>& peak_gflops,
                                     double bandwidth_gbs);
void print_op_profile(const std::vector<OpProfileRow>& rows, const char* per);
std::string op_profile_json(const std::vector<OpProfileRow>& rows);

}  // namespace tessera::cli
