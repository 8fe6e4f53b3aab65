// The planner: what an inference run will need and how fast it will go, before it runs. Memory
// from the model's tensors, the KV cache and the forward's buffers; time from the forward pass
// itself, walked with a dry-run context (ops::Context::dry_run: every op reported with its shape
// and cost, none run) at the batch and context asked for, each op's time the roof that binds it
// (explain/op_profile.h: the same rule the profiler judges measurements by) plus a measured
// fixed cost per call. The weight products' compute roof is this machine's measured rate of its
// own kernels at that many rows, where the planner can measure it (the CPU it runs on); a GPU
// from the datasheet table is a prediction from its datasheet roofs alone.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "explain/op_profile.h"
#include "model/decoder.h"
#include "profile/gpu_specs.h"
#include "profile/probe.h"

namespace tessera::explain {

// The measured rate of one weight product (a type and a shape) at several row counts.
struct ProductRate {
  std::string dtype;  // the stored type, "q4_1"
  int64_t k = 0, n = 0;
  // rows -> GFLOP/s with the weights read from where a step finds them: the time a step pays.
  std::map<int64_t, double> gflops;
  // rows -> GFLOP/s with the matrix hot in the caches: the kernel's compute roof at that many
  // rows, which the time is set beside the memory roof's to say which of the two binds.
  std::map<int64_t, double> hot_gflops;
  // Interpolated in log(rows) between measured counts; past the last, the last.
  double at(int64_t rows) const { return interpolate(gflops, rows); }
  double hot_at(int64_t rows) const { return interpolate(hot_gflops, rows); }
  static double interpolate(const std::map<int64_t, double>& g, int64_t rows);
};

// The machine a plan is for.
struct Machine {
  std::string name;       // "cpu: <brand>, 2 threads", "h100 (datasheet)"
  bool measured = false;  // the roofs were measured here (probe, kernel rates), not read
  Roofs roofs;
  double call_overhead_s = 0;  // fixed cost of one op call (thread hand-off, a launch)
  double memory_bytes = 0;     // what weights, cache and buffers must fit in
  double watts = 0;            // power while running (TDP or measured)
  std::string watts_source;    // "RAPL", "TDP (datasheet)", a stated power, ...
  // The weight products' measured rates (a product not among them: roofs.compute).
  std::vector<ProductRate> product_rates;
  // GB/s of cached keys and values paged attention reads from memory, its arithmetic included
  // (measured); 0: its roofs.
  double attention_gbs = 0;
  // The same measured at the plan's context for 1, 8 and 32 rows (interpolated between; empty:
  // attention_gbs for every row count).
  std::map<int64_t, double> attention_gbs_at;
  // GFLOP/s of paged attention over a prompt's rows, the sequence's cache hot (measured); 0: its
  // roofs.
  double prefill_attention_gflops = 0;
  // Seconds per row of one layer's rotation and cache append (ops::rope_kv_append) into a cache
  // that streams (measured); 0: its roofs.
  double rope_kv_append_row_s = 0;
  // Seconds of one greedy pick over the vocabulary (measured); 0: not counted.
  double sample_s = 0;
  // Where set, the GFLOP/s of a product op by its kind at `rows` rows (0: as above); the
  // training planner's, whose forward products and backward GEMMs run different kernels.
  std::function<double(const ops::OpTotal& op, int64_t rows)> op_gflops;
};

// This CPU from its probe, with its kernels' product rates measured on `model`'s own first
// layer (in the layout the engine uses) at 1, 4, 16, 64 rows with the weights streaming from
// where a decode step finds them, and hot at prefill_rows rows; attention, the cache append and
// sampling measured as a decode step at `context` runs them; the call overhead measured on a
// small op. threads: the engine's.
Machine cpu_machine(const profile::MachinePeaks& peaks, int threads,
                    const model::DecoderModel& model, int64_t prefill_rows, DType kv_type,
                    int64_t context);
// A GPU from its datasheet (or a spec.json): memory read at its HBM bandwidth, products at its
// dense bf16 peak, 5 us per launch as the call overhead (graphs replay a decode step in one
// launch, so this bounds the step from above).
Machine gpu_machine(const profile::GpuSpec& spec);

struct PlanInput {
  int64_t context = 4096;  // tokens in each sequence (prompt and output)
  std::vector<int64_t> batches{1, 8, 32, 128};
  DType kv_type = DType::f32;  // the engine's cache elements
  int64_t block_tokens = 32;   // the engine's cache block
  int64_t prefill_rows = 512;  // the engine's chunk of prompt rows
  double baseline_bytes = 0;   // the process before it loads the model (the planner's own RSS)
};

// One op's predicted time in a step.
struct OpPrediction {
  ops::OpTotal op;  // calls, FLOPs and bytes of the step (seconds unused)
  RoofTime roof;
  double overhead_s = 0;  // calls x the machine's call overhead
  double seconds() const { return roof.seconds() + overhead_s; }
};

struct StepPrediction {
  int64_t sequences = 0, rows = 0, context = 0;
  double seconds = 0, tokens_per_s = 0;  // rows per second
  // Where the time goes: ops bound by weight bytes, by the KV cache's bytes, by compute, and
  // the fixed cost of calls.
  double weights_s = 0, kv_s = 0, compute_s = 0, overhead_s = 0, other_memory_s = 0;
  double attention_s = 0;  // paged attention and the cache append, whatever binds them
  double sample_s = 0;     // picking each sequence's next token (in overhead_s)
  std::string bound;       // "weights", "kv-cache", "compute" or "overhead": the largest part
  std::vector<OpPrediction> ops;
};

struct MemoryPrediction {
  std::vector<std::pair<std::string, double>> weights_by_dtype;  // bytes per stored type
  double weights = 0, kv_per_token = 0, kv = 0, activations = 0, logits = 0, baseline = 0;
  double total() const { return weights + kv + activations + logits + baseline; }
};

struct Plan {
  Machine machine;
  PlanInput input;
  MemoryPrediction memory;  // at the largest batch
  bool fits = true;
  int64_t max_batch = 0;            // at input.context, within machine.memory_bytes
  int64_t max_context = 0;          // for one sequence
  StepPrediction prefill;           // one chunk of prefill_rows at the end of a context-long prompt
  double prefill_tokens_per_s = 0;  // a whole context-long prompt, chunk by chunk
  std::vector<StepPrediction> decode;  // one per input batch
  std::vector<StepPrediction> sweep;   // decode at 1, 2, 4, ... up to the largest batch
  int64_t knee_batch = 0;              // past it, doubling the batch buys < 10% throughput
  std::string knee_reason;
};

// The ops of one forward over `sequences` sequences of `rows_each` rows each, ending at
// position context - 1 (decode: rows_each = 1), from the model's own forward pass in a dry run.
std::vector<ops::OpTotal> forward_ops(const model::DecoderModel& m, int64_t sequences,
                                      int64_t rows_each, int64_t context, DType kv_type,
                                      int64_t block_tokens);
// The time of a step of these ops over `rows` token rows, `rows_each` of each sequence, on
// `machine`: each op's roof time plus its calls' fixed cost, split by what binds it. Decode (one
// row a sequence) reads each sequence's cache once and appends to it in one place: attention
// and the append at their measured streaming rates. With more rows a sequence, its rows reuse
// its cache: attention at its measured rate over a prompt, the append at its roofs.
StepPrediction price_ops(const std::vector<ops::OpTotal>& ops, const Machine& machine, int64_t rows,
                         int64_t rows_each = 0);
StepPrediction predict_step(const model::DecoderModel& m, const Machine& machine, int64_t sequences,
                            int64_t rows_each, int64_t context, const PlanInput& in);
MemoryPrediction predict_memory(const model::DecoderModel& m, const PlanInput& in,
                                int64_t sequences, int64_t context);
Plan make_plan(const model::DecoderModel& m, const Machine& machine, const PlanInput& in);

}  // namespace tessera::explain
