// The training planner: the model's own step in a dry run, scaled to the batch.
#include "explain/train_plan.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/op_tally.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "profile/timer.h"
#include "train/optimizer.h"

namespace tessera::explain {

namespace {

// Ops observed on one sequence, scaled to `batch` (every op of a forward and backward is linear
// in the sequences it carries: products in rows, attention in sequences).
std::vector<ops::OpTotal> scaled(std::vector<ops::OpTotal> ops, int64_t batch) {
  for (ops::OpTotal& t : ops) {
    t.flops *= static_cast<double>(batch);
    t.bytes *= static_cast<double>(batch);
    t.state_bytes *= static_cast<double>(batch);
  }
  return ops;
}

}  // namespace

void calibrate_gemm(Machine& machine, int threads, int64_t rows, int64_t C, bool bf16) {
  ThreadPool pool(threads);
  ops::Context ctx;
  ctx.pool = &pool;
  auto median_gflops = [&](auto&& run) {
    run();  // warm: packing buffers, pages
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      const profile::Timer timer;
      run();
      t.push_back(timer.seconds());
    }
    std::sort(t.begin(), t.end());
    return 2.0 * static_cast<double>(rows * C * C) / t[t.size() / 2] * 1e-9;
  };
  std::vector<float> a(static_cast<size_t>(rows * C), 0.01f), b(static_cast<size_t>(C * C), 0.02f),
      c(static_cast<size_t>(rows * C));
  // The backward's GEMMs: f32 operands, rounded to bf16 while packed in bf16 precision.
  ops::GemmArgs g;
  g.m = rows, g.n = C, g.k = C;
  g.a = a.data(), g.lda = C;
  g.b = b.data(), g.ldb = C;
  g.c = c.data(), g.ldc = C;
  g.round_bf16 = bf16;
  const double gemm = median_gflops([&] { ops::gemm(ctx, g); });
  // The forward's products: the weights as the step keeps them (its bf16 copy in bf16 precision).
  std::vector<uint16_t> wb(static_cast<size_t>(C * C));
  if (bf16) ops::convert_f32_to_bf16(ctx, wb.data(), b.data(), C * C);
  const void* w = bf16 ? static_cast<const void*>(wb.data()) : b.data();
  const DType wt = bf16 ? DType::bf16 : DType::f32;
  const double forward =
      median_gflops([&] { ops::matmul_wt(ctx, c.data(), C, a.data(), rows, C, w, wt, C); });
  machine.op_gflops = [gemm, forward](const ops::OpTotal& t, int64_t) {
    return t.op.starts_with("matmul_wt") ? forward : gemm;
  };
}

TrainPlan make_train_plan(const TrainPlanInput& in, const Machine& machine) {
  TS_CHECK(in.batch >= 1 && in.seq >= 1 && in.grad_accum >= 1, "[plan] bad training shape: batch ",
           in.batch, ", seq ", in.seq, ", grad_accum ", in.grad_accum);
  TrainPlan p;
  const model::TrainConfig cfg = model::TrainConfig::preset(in.preset, in.vocab);
  TS_CHECK(in.seq <= cfg.max_seq, "[plan] seq ", in.seq, " exceeds ", in.preset, "'s max_seq ",
           cfg.max_seq);
  ops::OpTally micro_ops, opt_ops;
  ops::TallySwitch observer;  // plan() refreshes the bf16 copy: not part of a step
  ops::Context ctx;
  ctx.dry_run = true;
  ctx.observer = &observer;
  // The model's buffers are allocated but never touched in a dry run (pages stay unbacked).
  model::TrainModel m(cfg, ctx);
  p.params = m.num_params();
  const double n = static_cast<double>(p.params);
  p.param_bytes = 4 * n;
  p.grad_bytes = 4 * n;
  p.adam_bytes = 8 * n;
  if (in.precision == model::Precision::bf16) {
    double matrices = 0;  // the bf16 copy holds the weight matrices only
    for (const TensorInfo& t : m.tensors().tensors())
      if (t.shape.rank() >= 2) matrices += static_cast<double>(t.shape.numel());
    p.bf16_copy_bytes = 2 * matrices;
  }
  m.plan(in.batch, in.seq, in.precision, in.recompute);
  p.activation_bytes = static_cast<double>(m.activation_bytes());
  p.baseline_bytes = in.baseline_bytes;
  const double cap = machine.memory_bytes;
  p.fits = cap <= 0 || p.total() <= cap;
  auto fits_batch = [&](int64_t b) {
    m.plan(b, in.seq, in.precision, in.recompute);
    return cap <= 0 ||
           p.total() - p.activation_bytes + static_cast<double>(m.activation_bytes()) <= cap;
  };
  for (int64_t b = 1; b <= (int64_t{1} << 16) && fits_batch(b); b *= 2) p.max_batch = b;
  for (int64_t step = p.max_batch / 2; step >= 1; step /= 2)  // between it and the next power
    if (fits_batch(p.max_batch + step)) p.max_batch += step;
  // One sequence's forward and backward, then the optimizer's step and the bf16 refresh.
  m.plan(1, in.seq, in.precision, in.recompute);
  std::vector<int32_t> tokens(static_cast<size_t>(in.seq), 1), targets(tokens);
  observer.into = &micro_ops;
  m.forward_backward(tokens.data(), targets.data(), 1, in.seq, 1.0f);
  observer.into = nullptr;
  {
    train::AdamW opt(m.tensors(), train::AdamWConfig{}, ctx);
    observer.into = &opt_ops;
    const ops::Scope scope(ctx, "optimizer");
    opt.step(m.params(), m.grads(), 1e-4, 1);
    m.params_updated();
    observer.into = nullptr;
  }
  p.micro = price_ops(scaled(micro_ops.totals(), in.batch), machine, in.batch * in.seq);
  p.micro.sequences = in.batch;
  p.micro.context = in.seq;
  p.optimizer = price_ops(opt_ops.totals(), machine, 0);
  p.step_seconds = static_cast<double>(in.grad_accum) * p.micro.seconds + p.optimizer.seconds;
  p.tokens_per_s = p.step_seconds > 0
                       ? static_cast<double>(in.batch * in.seq * in.grad_accum) / p.step_seconds
                       : 0;
  return p;
}

ParallelPlan plan_parallel(const TrainPlan& one, const TrainPlanInput& in, const ParallelInput& par,
                           double memory_bytes) {
  TS_CHECK(par.data >= 1 && par.pipeline >= 1,
           "[plan] data-parallel ranks and pipeline stages "
           "must be at least 1");
  TS_CHECK(par.link_gbs > 0 || (par.data == 1 && par.pipeline == 1),
           "[plan] data or pipeline parallel needs the link's bandwidth");
  const model::TrainConfig cfg = model::TrainConfig::preset(in.preset, in.vocab);
  TS_CHECK(par.pipeline <= cfg.n_layer, "[plan] ", par.pipeline, " pipeline stages for ",
           cfg.n_layer, " layers");
  ParallelPlan p;
  const auto P = static_cast<double>(par.pipeline), N = static_cast<double>(par.data);
  const auto m = static_cast<double>(in.grad_accum);
  p.ranks = par.data * par.pipeline;
  p.param_bytes = one.param_bytes / P;
  p.grad_bytes = one.grad_bytes / P;
  p.adam_bytes = one.adam_bytes / P;
  p.bf16_copy_bytes = one.bf16_copy_bytes / P;
  p.activation_bytes = one.activation_bytes / P * std::min(m, P);
  p.baseline_bytes = one.baseline_bytes;
  p.fits = memory_bytes <= 0 || p.total() <= memory_bytes;
  const double stage_s = one.micro.seconds / P;  // one micro-step's forward and backward
  p.compute_s = m * stage_s;
  p.bubble_s = (P - 1) * stage_s;
  p.bubble_fraction = (P - 1) / (m + P - 1);
  const double bytes_per_s = par.link_gbs * 1e9;
  if (par.pipeline > 1) {
    // Each of the m + P - 1 slots on the critical path sends a micro-batch's activations
    // (B, T, C) forward and their gradients back; f32 or bf16 as the step keeps activations.
    const double elem = in.precision == model::Precision::bf16 ? 2 : 4;
    const double act = static_cast<double>(in.batch * in.seq * cfg.n_embd) * elem;
    p.p2p_s = (m + P - 1) * 2 * (act / bytes_per_s + par.link_latency_s);
  }
  if (par.data > 1)  // a ring: 2 (N-1) steps, each moving 1/N of a stage's f32 gradients
    p.allreduce_s = 2 * (N - 1) * (p.grad_bytes / N / bytes_per_s + par.link_latency_s);
  p.optimizer_s = one.optimizer.seconds / P;
  p.step_seconds = p.compute_s + p.bubble_s + p.p2p_s + p.allreduce_s + p.optimizer_s;
  p.tokens_per_s = N * static_cast<double>(in.batch * in.seq) * m / p.step_seconds;
  return p;
}

}  // namespace tessera::explain
