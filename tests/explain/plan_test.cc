// The planner walks the model's own forward pass: its dry run reports the ops a real forward of
// the same shape runs (same ops, shapes, FLOPs and bytes) without running them; its memory is
// the model's tensors, the cache and the buffers counted by hand; its decode curve has a knee
// where a machine's roofs say it must.
#include "explain/plan.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "infer/engine.h"
#include "infer/tiny_model.h"
#include "ops/op_tally.h"

namespace tessera::explain {
namespace {

model::DecoderModel tiny(model::DecoderArch arch) {
  test::TinyOptions o;
  o.arch = arch;
  o.layers = 3;
  return test::make_tiny_model(o);
}

using Key = std::tuple<std::string, std::string, std::string>;
std::map<Key, ops::OpTotal> by_key(const std::vector<ops::OpTotal>& totals) {
  std::map<Key, ops::OpTotal> m;
  for (const ops::OpTotal& t : totals) {
    ops::OpTotal& s = m[{t.op, t.shape, t.dtype}];
    s.op = t.op;
    s.calls += t.calls;
    s.flops += t.flops;
    s.bytes += t.bytes;
    s.state_bytes += t.state_bytes;
  }
  return m;
}

// Three sequences at position 9 decode one token each, for real under an observer; the dry run
// of the same step reports the same ops.
TEST(Plan, DryRunReportsTheOpsOfARealForward) {
  for (auto arch : {model::DecoderArch::llama, model::DecoderArch::gpt2}) {
    const model::DecoderModel m = tiny(arch);
    ops::OpTally real;
    infer::EngineOptions eo;
    eo.max_ctx = 16;
    eo.kv_tokens = 64;
    eo.block_tokens = 4;
    eo.kv_type = DType::f32;
    eo.ctx.observer = &real;
    infer::Engine e(m, eo);
    std::vector<int32_t> seqs;
    const std::vector<int32_t> prompt = test::random_tokens(9, m.config.vocab, 3);
    for (int i = 0; i < 3; ++i) {
      seqs.push_back(e.new_sequence());
      e.forward({infer::Feed{seqs.back(), prompt, false}});
    }
    real.reset();
    const int32_t t = 5;
    e.forward({infer::Feed{seqs[0], {&t, 1}, false}, infer::Feed{seqs[1], {&t, 1}, false},
               infer::Feed{seqs[2], {&t, 1}, false}});
    const auto want = by_key(real.totals());
    const auto got = by_key(forward_ops(m, 3, 1, 10, DType::f32, 4));
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [k, w] : want) {
      SCOPED_TRACE(std::get<0>(k) + " " + std::get<1>(k));
      ASSERT_TRUE(got.contains(k));
      const ops::OpTotal& g = got.at(k);
      EXPECT_EQ(g.calls, w.calls);
      EXPECT_DOUBLE_EQ(g.flops, w.flops);
      EXPECT_DOUBLE_EQ(g.bytes, w.bytes);
      EXPECT_DOUBLE_EQ(g.state_bytes, w.state_bytes);
    }
  }
}

// A dry run reports and does not run: the output keeps its values.
TEST(Plan, DryRunRunsNothing) {
  ops::OpTally tally;
  ops::Context ctx;
  ctx.dry_run = true;
  ctx.observer = &tally;
  std::vector<float> x(8, 1.0f), y(8, 7.0f);
  ops::add(ctx, y.data(), x.data(), x.data(), 8);
  EXPECT_EQ(ops::sum_squares(ctx, x.data(), 8), 0.0);
  EXPECT_EQ(y[0], 7.0f);
  ASSERT_EQ(tally.totals().size(), 2u);
  EXPECT_EQ(tally.sum().flops, 8.0 + 16.0);
}

TEST(Plan, MemoryCountedByHand) {
  const model::DecoderModel m = tiny(model::DecoderArch::llama);
  const model::DecoderConfig& c = m.config;
  PlanInput in;
  in.kv_type = DType::f16;
  in.block_tokens = 4;
  in.prefill_rows = 8;
  in.baseline_bytes = 1000;
  const MemoryPrediction p = predict_memory(m, in, 3, 10);
  EXPECT_EQ(p.weights, static_cast<double>(m.total_weight_bytes()));
  EXPECT_EQ(p.kv_per_token, 2.0 * c.n_layers * c.n_kv_heads * c.head_dim * 2);
  EXPECT_EQ(p.kv, p.kv_per_token * 3 * 12);  // 10 tokens fill 3 blocks of 4
  EXPECT_EQ(p.logits, 4.0 * c.vocab * 3);
  EXPECT_EQ(p.total(), p.weights + p.kv + p.activations + p.logits + 1000);
  double by_type = 0;
  for (const auto& [t, b] : p.weights_by_dtype) by_type += b;
  EXPECT_EQ(by_type, p.weights);
}

// A model with sliding-window layers (every layer of this one, over 5 positions): the planner
// counts the cache the engine would make, the other layers' whole context (none here) and the
// windows' blocks of each sequence, far below a full cache at a long context; the engine of
// the same options holds exactly that.
TEST(Plan, WindowedLayersCountTheirWindowsOnly) {
  model::DecoderModel m = tiny(model::DecoderArch::llama);
  m.config.sliding_window = 5;
  PlanInput in;
  in.kv_type = DType::f16;
  in.block_tokens = 4;
  in.prefill_rows = 8;
  const int64_t context = m.config.max_ctx, sequences = 3;
  const MemoryPrediction p = predict_memory(m, in, sequences, context);
  const double full = p.kv_per_token * static_cast<double>(sequences * context);
  // (8 rows + W 5 - 2) / 4, rounded up, + 2 blocks a sequence, of 4 tokens each.
  EXPECT_EQ(p.kv, p.kv_per_token * static_cast<double>(sequences * ((8 + 5 - 2 + 3) / 4 + 2) * 4));
  EXPECT_LT(p.kv, full / 4);
  infer::EngineOptions eo;
  eo.max_ctx = context;
  eo.kv_tokens = sequences * context;
  eo.block_tokens = in.block_tokens;
  eo.kv_type = in.kv_type;
  eo.max_rows = in.prefill_rows;
  eo.max_sequences = sequences;
  EXPECT_EQ(static_cast<double>(infer::Engine(m, eo).kv_bytes()), p.kv);
}

// A machine with slow compute and fast memory: decode scales until the products turn
// compute-bound, and the planner names that as the knee; one with slow memory and a long
// context: the KV cache binds.
TEST(Plan, KneeAndItsReason) {
  const model::DecoderModel m = tiny(model::DecoderArch::llama);
  PlanInput in;
  in.context = 64;
  in.batches = {1, 64};
  in.prefill_rows = 16;
  Machine compute_poor;
  compute_poor.roofs.memory_gbs = 1000;
  compute_poor.roofs.compute = [](const ops::OpTotal&) { return ComputePeak{0.01, "f32"}; };
  Plan p = make_plan(m, compute_poor, in);
  ASSERT_EQ(p.decode.size(), 2u);
  EXPECT_EQ(p.decode[1].bound, "compute");
  EXPECT_EQ(p.knee_batch, 1);  // compute-bound from the start: no batch buys throughput
  EXPECT_NE(p.knee_reason.find("compute"), std::string::npos) << p.knee_reason;

  Machine memory_poor;
  memory_poor.roofs.memory_gbs = 0.001;
  memory_poor.roofs.compute = [](const ops::OpTotal&) { return ComputePeak{1e6, "f32"}; };
  p = make_plan(m, memory_poor, in);
  EXPECT_EQ(p.decode[0].bound, "weights");  // one sequence: the weights' bytes dominate
  EXPECT_EQ(p.decode[1].bound, "kv-cache");
  EXPECT_GT(p.decode[1].tokens_per_s, p.decode[0].tokens_per_s);
  EXPECT_GT(p.knee_batch, 1);
  EXPECT_NE(p.knee_reason.find("KV cache"), std::string::npos) << p.knee_reason;
  // Fit: a machine of 1 byte holds nothing.
  memory_poor.memory_bytes = 1;
  p = make_plan(m, memory_poor, in);
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.max_batch, 0);
}

// What the planner measured prices an op: a product at its rate with the weights streaming
// (on the side of whichever binds: the memory roof when the bytes take longer than the hot
// kernel's arithmetic), decode's attention at its rate for that many rows, the cache append per
// row; a prompt's attention at its hot rate. By hand on a machine of round numbers.
TEST(Plan, MeasuredRatesPriceTheirOps) {
  Machine m;
  m.roofs.memory_gbs = 10;
  m.roofs.compute = [](const ops::OpTotal&) { return ComputePeak{100, "f32"}; };
  ProductRate r;
  r.dtype = "q8_0";
  r.k = 64, r.n = 128;
  r.gflops = {{1, 1.0}, {16, 10.0}};
  r.hot_gflops = {{1, 50.0}, {16, 100.0}};
  m.product_rates.push_back(r);
  m.attention_gbs = 4;
  m.attention_gbs_at = {{1, 2.0}, {8, 4.0}};
  m.rope_kv_append_row_s = 1e-6;
  m.prefill_attention_gflops = 20;
  auto op = [](std::string name, std::string shape, std::string dtype, double flops, double bytes,
               double state) {
    ops::OpTotal t;
    t.op = std::move(name);
    t.shape = std::move(shape);
    t.dtype = std::move(dtype);
    t.calls = 1;
    t.flops = flops, t.bytes = bytes, t.state_bytes = state;
    return t;
  };
  // One row: 16,384 FLOPs at the streaming rate of 1 GFLOP/s is 16.4 us, its 8,704 bytes at 10
  // GB/s 0.87 us, hot arithmetic 0.33 us: memory binds, at the measured time.
  const std::vector<ops::OpTotal> decode = {
      op("matmul_wt", "m=1 k=64 n=128", "q8_0x8", 16384, 8704, 8704),
      op("paged_attention", "rows=1 h=4 hkv=2 d=16", "f16", 4096, 2e6, 2e6),
      op("rope_kv_append", "rows=1 h=4 hkv=2 d=16", "f16", 0, 192, 0)};
  const StepPrediction d = price_ops(decode, m, 1, 1);
  ASSERT_EQ(d.ops.size(), 3u);
  EXPECT_NEAR(d.ops[0].roof.seconds(), 16384 / 1e9, 1e-12);
  EXPECT_FALSE(d.ops[0].roof.compute_bound());
  EXPECT_NEAR(d.ops[1].roof.seconds(), 2e6 / 2e9, 1e-12);  // 1 row: 2 GB/s
  EXPECT_NEAR(d.ops[2].roof.seconds(), 1e-6, 1e-15);
  EXPECT_NEAR(d.weights_s, 16384 / 1e9, 1e-12);
  // Sixteen rows: 262,144 FLOPs at 10 GFLOP/s is 26.2 us; hot, at 100 GFLOP/s, 2.6 us against
  // 1.7 us of bytes: the kernel binds; a prompt's attention (16 rows of one sequence) at its hot
  // 20 GFLOP/s.
  const std::vector<ops::OpTotal> prompt = {
      op("matmul_wt", "m=16 k=64 n=128", "q8_0x8", 262144, 8704 + 16 * 64 * 4 * 2, 8704),
      op("paged_attention", "rows=16 h=4 hkv=2 d=16", "f16", 65536, 3e6, 3e6)};
  const StepPrediction pr = price_ops(prompt, m, 16, 16);
  EXPECT_NEAR(pr.ops[0].roof.seconds(), 262144 / 10e9, 1e-12);
  EXPECT_TRUE(pr.ops[0].roof.compute_bound());
  EXPECT_NEAR(pr.ops[1].roof.seconds(), 65536 / 20e9, 1e-12);
  // A product the machine did not measure falls back to the roofs.
  const StepPrediction other =
      price_ops({op("matmul_wt", "m=1 k=32 n=32", "f32", 2048, 4096, 4096)}, m, 1, 1);
  EXPECT_NEAR(other.ops[0].roof.seconds(), 4096 / 10e9, 1e-12);
}

}  // namespace
}  // namespace tessera::explain
