// The training planner: what a GPT-2 training step needs and how long it takes, before it runs.
// Memory from the model's own layout (parameters, gradients, AdamW's two moments, the bf16 copy
// of the matrices in bf16 precision, the activation arena TrainModel::plan sizes for the batch,
// sequence and recompute policy) and the process; time from the model's own step walked in a dry
// run (ops::Context::dry_run) for one sequence, each op scaled to the batch, priced like the
// inference planner's (explain/plan.h), the products at this machine's measured GEMM rate.
#pragma once

#include <cstdint>
#include <string>

#include "explain/plan.h"
#include "model/train_model.h"

namespace tessera::explain {

struct TrainPlanInput {
  std::string preset = "gpt2-small";
  int64_t vocab = 50257;
  int64_t batch = 8, seq = 1024, grad_accum = 1;
  model::Precision precision = model::Precision::f32;
  model::Recompute recompute = model::Recompute::none;
  double baseline_bytes = 0;  // the process before the model
};

// A training process's memory by part: parameters, gradients, AdamW's two moments, the bf16
// copy of the matrices, the activation arena and the process before the model.
struct TrainMemory {
  double param_bytes = 0, grad_bytes = 0, adam_bytes = 0, bf16_copy_bytes = 0, activation_bytes = 0,
         baseline_bytes = 0;
  double total() const {
    return param_bytes + grad_bytes + adam_bytes + bf16_copy_bytes + activation_bytes +
           baseline_bytes;
  }
};

struct TrainPlan : TrainMemory {
  int64_t params = 0;  // parameters
  bool fits = true;
  int64_t max_batch = 0;                      // at this sequence length and recompute policy
  StepPrediction micro;                       // one forward and backward of the batch
  StepPrediction optimizer;                   // AdamW and the bf16 refresh
  double step_seconds = 0, tokens_per_s = 0;  // grad_accum micro-steps and one optimizer step
};

// The machine's rates for the training products, measured on this CPU at rows x C x C: the
// forward's weight products (matmul_wt on f32 weights, or the bf16 copy) and the backward's
// GEMMs (f32, or rounded to bf16); what the planner prices those ops at (machine.op_gflops).
void calibrate_gemm(Machine& machine, int threads, int64_t rows, int64_t C, bool bf16);

TrainPlan make_train_plan(const TrainPlanInput& in, const Machine& machine);

// Data and pipeline parallel, as predictions from a one-rank plan (Tessera's trainer runs on one
// rank today; these say what N ranks would give over a link of the stated speed).
struct ParallelInput {
  int64_t data = 1;              // ranks each running the whole step on its own batch
  int64_t pipeline = 1;          // stages each holding n_layer / pipeline layers
  double link_gbs = 0;           // GB/s one way between two ranks (NVLink, PCIe, a NIC)
  double link_latency_s = 5e-6;  // per message
};

// The memory (TrainMemory) is per rank: its share of the parameters, gradients and AdamW state
// (a stage's layers), and the activations of the micro-batches in flight on the first stage
// (1F1B: at most `pipeline` of them, never more than grad_accum).
struct ParallelPlan : TrainMemory {
  int64_t ranks = 1;  // data x pipeline
  bool fits = true;
  // The step: the micro-steps through the pipeline (grad_accum + pipeline - 1 slots of one
  // stage's forward and backward), the activations and their gradients sent between stages,
  // the gradients' ring all-reduce over the data-parallel ranks (after the backward, not
  // overlapped with it: the upper bound), then AdamW on a stage's share.
  double compute_s = 0, bubble_s = 0, p2p_s = 0, allreduce_s = 0, optimizer_s = 0;
  double step_seconds = 0, tokens_per_s = 0;  // all ranks together
  double bubble_fraction = 0;                 // (pipeline - 1) / (grad_accum + pipeline - 1)
};

// The layers split evenly over the stages (the embedding and head counted as spread with them).
ParallelPlan plan_parallel(const TrainPlan& one, const TrainPlanInput& in, const ParallelInput& par,
                           double memory_bytes);

}  // namespace tessera::explain
