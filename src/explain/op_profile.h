// The per-op table of `tessera profile` and of bench's per-op profile: where a run's time went, op
// by op (kind, shape, element type, enclosing scope), and how close each op came to the roof that
// binds it: the time its FLOPs need at the compute peak or its bytes at the bandwidth of the
// memory level that holds them, whichever is longer, against the time it took.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ops/op_tally.h"
#include "profile/probe.h"

namespace tessera::explain {

// The machine's roofs an op is judged against. Where its bytes come from: an op whose bytes are
// mostly long-lived state (weights, the KV cache: OpCost::state_bytes) reads them from the
// smallest level that holds a whole run's state (every op's state bytes per run), since the
// rest of the step evicts them between uses; any other op from the smallest level that holds
// its bytes per call (its inputs were just written). Levels: the L2s of the threads, the L3,
// main memory; a cache level counts where the probe measured its bandwidth. compute(op) is the
// compute peak for an op and its name (f32 FMA, or the bf16 dot product for products on that
// kernel).
struct ComputePeak {
  double gflops = 0;
  std::string name;
};
struct Roofs {
  double memory_gbs = 0;  // streaming read bandwidth of main memory (or the GPU's HBM)
  std::string memory_name = "DRAM";
  double l2_gbs = 0, l3_gbs = 0;      // 0: not measured (then memory's roof applies)
  double l2_bytes = 0, l3_bytes = 0;  // capacity: L2 of every thread used, and the L3
  std::function<ComputePeak(const ops::OpTotal&)> compute;
};

// An op is "overhead-bound" when it reached less than kOverheadBelow of its roof and a call
// would take under kOverheadCallSeconds at the roof: too little work per call to pay for the
// fixed costs (a thread pool's hand-off is a few microseconds here, a GPU launch about five).
// A longer op far below its roof keeps the verdict of the roof that binds it, with its % shown.
inline constexpr double kOverheadBelow = 0.3;
inline constexpr double kOverheadCallSeconds = 10e-6;

struct OpProfileRow {
  std::string op, shape, dtype, scope;
  double calls = 0, ms = 0, share = 0;  // per run (step or token); share of the run's time
  double flops = 0, bytes = 0;          // per run
  double gflops = 0, gbs = 0;           // achieved
  double roof_ms = 0;                   // the roofline's time for the op
  std::string roof;                     // the roof that binds it: "f32", "bf16", "L2", "DRAM", ...
  std::string verdict;  // "memory-bound", "compute-bound", "overhead-bound"; "" for (other)
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }
  double roof_fraction() const { return ms > 0 ? roof_ms / ms : 0; }
};

// The CPU's roofs from a probe, for `threads` threads: memory_gbs (0: the probe's read-only
// bandwidth, else its triad) for memory; the caches' measured bandwidths; f32 FMA for every op
// but the weight products, which use the bf16 dot product for bf16 weights and the int8 dot
// product for quantized ones where the CPU has them (the kernels this build dispatches to).
Roofs cpu_roofs(const profile::MachinePeaks& p, int threads, double memory_gbs = 0);

// The time an op's totals need at the roofs: its FLOPs at its compute peak, its bytes at the
// bandwidth of the level that holds them (the rule above; state_per_run: every op's state bytes
// per run). What the profiler judges a measurement against and the planner predicts with.
struct RoofTime {
  double compute_s = 0, memory_s = 0;
  std::string compute_roof, memory_level;  // "f32", "int8", ...; "L2", "L3", "DRAM", ...
  double seconds() const { return compute_s > memory_s ? compute_s : memory_s; }
  bool compute_bound() const { return compute_s >= memory_s; }
  const std::string& roof() const { return compute_bound() ? compute_roof : memory_level; }
};
RoofTime roof_time(const Roofs& roofs, const ops::OpTotal& t, double state_per_run);

// totals were observed over `runs` runs that took `seconds` in all. The last row, "(other)", is
// the time no op accounts for (never negative: ops that overlap in time, on several threads, can
// sum past the wall time).
std::vector<OpProfileRow> op_profile(const std::vector<ops::OpTotal>& totals, int64_t runs,
                                     double seconds, const Roofs& roofs);
// The table, to `to`; at most max_rows op rows, the rest summed into one row (0: all).
void print_op_profile(const std::vector<OpProfileRow>& rows, const char* per, size_t max_rows = 0,
                      std::FILE* to = stdout);
std::string op_profile_json(const std::vector<OpProfileRow>& rows);

}  // namespace tessera::explain
