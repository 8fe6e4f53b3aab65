// The training planner: memory from the model's own layout counted by hand, the step's ops from
// the model's own step in a dry run (the same ops and costs a real step reports), scaled to the
// batch.
#include "explain/train_plan.h"

#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "ops/op_tally.h"

namespace tessera::explain {
namespace {

Machine flat_machine() {
  Machine m;
  m.roofs.memory_gbs = 10;
  m.roofs.compute = [](const ops::OpTotal&) { return ComputePeak{100, "f32"}; };
  return m;
}

TEST(TrainPlan, MemoryFromTheModelsLayout) {
  TrainPlanInput in;
  in.preset = "gpt2-tiny";
  in.vocab = 300;
  in.batch = 2;
  in.seq = 16;
  in.precision = model::Precision::bf16;
  in.baseline_bytes = 1000;
  const TrainPlan p = make_train_plan(in, flat_machine());
  ops::Context ctx;
  ctx.dry_run = true;
  model::TrainModel m(model::TrainConfig::preset("gpt2-tiny", 300), ctx);
  m.plan(2, 16, model::Precision::bf16, model::Recompute::none);
  EXPECT_EQ(p.params, m.num_params());
  EXPECT_EQ(p.param_bytes, 4.0 * m.num_params());
  EXPECT_EQ(p.grad_bytes, 4.0 * m.num_params());
  EXPECT_EQ(p.adam_bytes, 8.0 * m.num_params());
  double matrices = 0;
  for (const TensorInfo& t : m.tensors().tensors())
    if (t.shape.rank() >= 2) matrices += static_cast<double>(t.shape.numel());
  EXPECT_EQ(p.bf16_copy_bytes, 2 * matrices);
  EXPECT_EQ(p.activation_bytes, static_cast<double>(m.activation_bytes()));
  EXPECT_EQ(p.total(), p.param_bytes + p.grad_bytes + p.adam_bytes + p.bf16_copy_bytes +
                           p.activation_bytes + 1000);
  EXPECT_TRUE(p.fits);  // no capacity given
}

// Twice the batch: the micro-step's FLOPs and bytes double, the optimizer's do not; gradient
// accumulation repeats the micro-step.
TEST(TrainPlan, StepScalesWithTheBatch) {
  TrainPlanInput in;
  in.preset = "gpt2-tiny";
  in.vocab = 300;
  in.seq = 16;
  in.batch = 2;
  const TrainPlan a = make_train_plan(in, flat_machine());
  in.batch = 4;
  const TrainPlan b = make_train_plan(in, flat_machine());
  in.grad_accum = 3;
  const TrainPlan c = make_train_plan(in, flat_machine());
  double fa = 0, fb = 0, oa = 0, ob = 0;
  for (const OpPrediction& o : a.micro.ops) fa += o.op.flops;
  for (const OpPrediction& o : b.micro.ops) fb += o.op.flops;
  for (const OpPrediction& o : a.optimizer.ops) oa += o.op.flops;
  for (const OpPrediction& o : b.optimizer.ops) ob += o.op.flops;
  EXPECT_DOUBLE_EQ(fb, 2 * fa);
  EXPECT_DOUBLE_EQ(ob, oa);
  EXPECT_GT(oa, 0);
  EXPECT_NEAR(c.step_seconds, 3 * b.micro.seconds + b.optimizer.seconds, 1e-12);
  std::map<std::string, int64_t> calls;
  for (const OpPrediction& o : a.micro.ops) calls[o.op.op] += o.op.calls;
  for (const char* op : {"gemm", "attention_forward", "attention_backward", "softmax_xent"})
    EXPECT_GT(calls[op], 0) << op;
  std::map<std::string, int64_t> opt_calls;
  for (const OpPrediction& o : a.optimizer.ops) opt_calls[o.op.op] += o.op.calls;
  EXPECT_GT(opt_calls["adamw"], 0);
}

// Data and pipeline parallel from a one-rank plan, against the schedule worked by hand: 4
// micro-batches through 2 stages take 5 slots of half a micro-step; the activations (B, T, C)
// cross the link forward and back in each slot; the ring all-reduce moves 2 (N-1)/N of a
// stage's gradients.
TEST(TrainPlan, DataAndPipelineParallelByHand) {
  TrainPlanInput in;
  in.preset = "gpt2-tiny";
  in.vocab = 300;
  in.seq = 16;
  in.batch = 2;
  in.grad_accum = 4;
  const TrainPlan one = make_train_plan(in, flat_machine());
  ParallelInput par;
  par.data = 4;
  par.pipeline = 2;
  par.link_gbs = 1;
  par.link_latency_s = 1e-6;
  const ParallelPlan p = plan_parallel(one, in, par, 0);
  const model::TrainConfig cfg = model::TrainConfig::preset("gpt2-tiny", 300);
  const double half = one.micro.seconds / 2;
  EXPECT_EQ(p.ranks, 8);
  EXPECT_NEAR(p.compute_s, 4 * half, 1e-15);
  EXPECT_NEAR(p.bubble_s, half, 1e-15);
  EXPECT_DOUBLE_EQ(p.bubble_fraction, 1.0 / 5);
  const double act = 2.0 * 16 * static_cast<double>(cfg.n_embd) * 4;
  EXPECT_NEAR(p.p2p_s, 5 * 2 * (act / 1e9 + 1e-6), 1e-15);
  const double grads = one.grad_bytes / 2;
  EXPECT_NEAR(p.allreduce_s, 2 * 3 * (grads / 4 / 1e9 + 1e-6), 1e-15);
  EXPECT_NEAR(p.optimizer_s, one.optimizer.seconds / 2, 1e-15);
  EXPECT_NEAR(p.step_seconds, p.compute_s + p.bubble_s + p.p2p_s + p.allreduce_s + p.optimizer_s,
              1e-15);
  EXPECT_NEAR(p.tokens_per_s, 4 * 2 * 16 * 4 / p.step_seconds, 1e-6);
  EXPECT_DOUBLE_EQ(p.param_bytes, one.param_bytes / 2);
  EXPECT_DOUBLE_EQ(p.activation_bytes, one.activation_bytes);  // two micro-batches of a half
  // One rank is the one-rank plan; a link is needed beyond it; stages cannot outnumber layers.
  const ParallelPlan solo = plan_parallel(one, in, ParallelInput{}, 0);
  EXPECT_NEAR(solo.step_seconds, one.step_seconds, 1e-15);
  par.link_gbs = 0;
  EXPECT_THROW(plan_parallel(one, in, par, 0), tessera::Error);
  par.link_gbs = 1;
  par.pipeline = cfg.n_layer + 1;
  EXPECT_THROW(plan_parallel(one, in, par, 0), tessera::Error);
}

}  // namespace
}  // namespace tessera::explain
