// The observation hook: with an observer in the context every op call is reported once, with its
// name, device and cost; without one nothing is reported and results are unchanged.
#include "ops/observe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/memory.h"
#include "ops/op_tally.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace tessera::ops {
namespace {

struct Recorder final : OpObserver {
  struct Seen {
    std::string op;
    Device device;
    OpCost cost;
    double seconds;
    std::string shape, dtype;
  };
  std::vector<Seen> seen;
  int begins = 0;
  void on_begin(std::string_view, const Context&) override { ++begins; }
  void on_op(const OpRecord& r) override {
    seen.push_back({std::string(r.op), r.device, r.cost, r.seconds, shape_string(r.shape),
                    std::string(r.shape.dtype)});
  }
};

TEST(OpObserver, EveryCallIsReportedWithItsCost) {
  Recorder rec;
  Context ctx;
  ctx.observer = &rec;
  constexpr int64_t M = 3, N = 5, K = 7;
  std::vector<float> a(M * K, 1.0f), b(K * N, 2.0f), c(M * N);
  GemmArgs g;
  g.m = M, g.n = N, g.k = K;
  g.a = a.data(), g.lda = K;
  g.b = b.data(), g.ldb = N;
  g.c = c.data(), g.ldc = N;
  gemm(ctx, g);
  add(ctx, c.data(), c.data(), c.data(), M * N);
  std::vector<float> w(N * K, 0.5f), y(M * N);
  matmul_wt(ctx, y.data(), N, a.data(), M, K, w.data(), DType::f32, N);

  ASSERT_EQ(rec.seen.size(), 3u);
  EXPECT_EQ(rec.seen[0].op, "gemm");
  EXPECT_EQ(rec.seen[0].cost.flops, 2.0 * M * N * K);
  EXPECT_EQ(rec.seen[1].op, "add");
  EXPECT_EQ(rec.seen[1].cost.flops, M * N);              // one add per element
  EXPECT_EQ(rec.seen[1].cost.bytes, 3.0 * 4.0 * M * N);  // two reads and a write
  EXPECT_EQ(rec.seen[2].op, "matmul_wt");
  EXPECT_EQ(rec.seen[2].cost.flops, matmul_wt_cost(M, K, N, DType::f32).flops);
  for (const auto& s : rec.seen) {
    EXPECT_EQ(s.device, Device::cpu);
    EXPECT_GE(s.seconds, 0.0);
  }
  EXPECT_EQ(c[0], 2.0f * 2.0f * K);  // the ops still computed: (1 * 2 * K) doubled
  EXPECT_EQ(y[0], 0.5f * K);
}

TEST(OpObserver, GroupedProductReadsItsInputOnce) {
  Recorder rec;
  Context ctx;
  ctx.observer = &rec;
  constexpr int64_t M = 2, K = 8;
  std::vector<float> x(M * K, 1.0f), w1(4 * K, 1.0f), w2(6 * K, 1.0f), y1(M * 4), y2(M * 6);
  const WtProduct products[] = {{y1.data(), 4, w1.data(), DType::f32, 4, nullptr},
                                {y2.data(), 6, w2.data(), DType::f32, 6, nullptr}};
  matmul_wt_group(ctx, x.data(), M, K, products);
  ASSERT_EQ(rec.seen.size(), 1u);
  EXPECT_EQ(rec.seen[0].op, "matmul_wt_group");
  const OpCost one = matmul_wt_cost(M, K, 4, DType::f32), two = matmul_wt_cost(M, K, 6, DType::f32);
  EXPECT_EQ(rec.seen[0].cost.flops, one.flops + two.flops);
  EXPECT_EQ(rec.seen[0].cost.bytes, one.bytes + two.bytes - 4.0 * M * K);
}

TEST(OpObserver, NoObserverNoReports) {
  Recorder rec;
  Context ctx;  // observer null
  std::vector<float> x(4, 1.0f);
  scale(ctx, x.data(), 4, 3.0f);
  EXPECT_TRUE(rec.seen.empty());
  EXPECT_EQ(x[3], 3.0f);
}

// OpTally sums per op what it observes (calls, time, cost), largest time first; reset empties it.
TEST(OpTally, SumsPerOp) {
  OpTally tally;
  Context ctx;
  ctx.observer = &tally;
  std::vector<float> x(64, 1.0f);
  for (int i = 0; i < 3; ++i) add(ctx, x.data(), x.data(), x.data(), 64);
  scale(ctx, x.data(), 64, 0.5f);
  const std::vector<OpTotal> t = tally.totals();
  ASSERT_EQ(t.size(), 2u);
  const OpTotal& a = t[0].op == "add" ? t[0] : t[1];
  const OpTotal& s = t[0].op == "add" ? t[1] : t[0];
  EXPECT_EQ(a.op, "add");
  EXPECT_EQ(a.calls, 3);
  EXPECT_EQ(a.flops, 3.0 * 64);
  EXPECT_EQ(a.bytes, 3.0 * 3 * 4 * 64);
  EXPECT_EQ(s.op, "scale");
  EXPECT_EQ(s.calls, 1);
  EXPECT_GE(t[0].seconds, t[1].seconds);
  EXPECT_EQ(x[0], 4.0f);  // 1 doubled three times, halved
  tally.reset();
  EXPECT_TRUE(tally.totals().empty());
}

// Each op kind's shape and cost against a count by hand: FLOPs per element, and every array read
// or written once (f32: 4 bytes), the long-lived part as state_bytes.
TEST(OpObserver, ShapesAndCostsCountedByHand) {
  Recorder rec;
  Context ctx;
  ctx.observer = &rec;
  constexpr int64_t N = 2, C = 8, F = 4, V = 5, Vp = 8, K = 8, M = 3;
  std::vector<float> x(N * C, 1.0f), y(N * C), w(C, 1.0f), rstd(N), gate(N * F, 0.5f),
      up(N * F, 2.0f), act(N * F), logits(N * Vp, 0.1f), losses(N), p(16, 1.0f), g(16, 0.1f), m(16),
      v(16), wt(F * K, 0.25f), out(M * F);
  std::vector<int32_t> targets{1, 3}, index{1, 0};
  rmsnorm_forward(ctx, y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  glu_forward(ctx, act.data(), gate.data(), up.data(), N, F, GluAct::silu);
  softmax_xent(ctx, losses.data(), logits.data(), targets.data(), N, V, Vp, 0.0f);
  adamw(ctx, p.data(), g.data(), m.data(), v.data(), 16, AdamWArgs{});
  gather_rows(ctx, y.data(), x.data(), index.data(), N, C, N);
  matmul_wt(ctx, out.data(), F, x.data(), M - 1, K, wt.data(), DType::f32, F);
  copy(ctx, y.data(), x.data(), 64, CopyKind::host_to_device);
  zero(ctx, y.data(), 32);
  ASSERT_EQ(rec.seen.size(), 8u);
  EXPECT_EQ(rec.begins, 8);
  struct Want {
    const char* op;
    const char* shape;
    const char* dtype;
    double flops, bytes, state_bytes;
  };
  const Want want[] = {
      // square-accumulate and two multiplies; read x and w, write y and rstd
      {"rmsnorm_forward", "n=2 c=8", "f32", 4.0 * N * C, 4.0 * (2 * N * C + C + N), 0},
      // exp, add, divide, two multiplies; read gate and up, write out
      {"glu_forward", "n=2 f=4", "f32", 5.0 * N * F, 4.0 * 3 * N * F, 0},
      // max, exp, sum, divide over the padded row; read once (no gradient written)
      {"softmax_xent", "n=2 v=8", "f32", 4.0 * N * Vp, 4.0 * N * Vp, 0},
      // 12 FLOPs per parameter; read p, g, m, v and write p, m, v: all of it state
      {"adamw", "n=16", "f32", 12.0 * 16, 4.0 * 7 * 16, 4.0 * 7 * 16},
      {"gather_rows", "n=2 c=8", "f32", 0, 4.0 * 2 * N * C, 0},
      // 2 FLOPs per multiply-add; the weights are state, x and y are not
      {"matmul_wt", "m=2 k=8 n=4", "f32", 2.0 * 2 * F * K, 4.0 * (F * K + 2 * (K + F)),
       4.0 * F * K},
      {"copy", "bytes=64 kind=0", "bytes", 0, 2.0 * 64, 0},
      {"zero", "bytes=32", "bytes", 0, 32, 0}};
  for (size_t i = 0; i < std::size(want); ++i) {
    SCOPED_TRACE(want[i].op);
    EXPECT_EQ(rec.seen[i].op, want[i].op);
    EXPECT_EQ(rec.seen[i].shape, want[i].shape);
    EXPECT_EQ(rec.seen[i].dtype, want[i].dtype);
    EXPECT_EQ(rec.seen[i].cost.flops, want[i].flops);
    EXPECT_EQ(rec.seen[i].cost.bytes, want[i].bytes);
    EXPECT_EQ(rec.seen[i].cost.state_bytes, want[i].state_bytes);
  }
}

// Scopes nest; an op belongs to the innermost one, and every enclosing scope sums its cost.
// One total per (op, shape, dtype, scope) by default, one per op without by_shape.
TEST(OpTally, ScopesAndShapes) {
  OpTally tally, per_op(false);
  for (OpTally* t : {&tally, &per_op}) {
    Context ctx;
    ctx.observer = t;
    std::vector<float> x(64, 1.0f);
    {
      const Scope outer(ctx, "outer");
      add(ctx, x.data(), x.data(), x.data(), 64);
      {
        const Scope inner(ctx, "inner");
        scale(ctx, x.data(), 32, 0.5f);
        scale(ctx, x.data(), 64, 0.5f);
      }
    }
    scale(ctx, x.data(), 64, 0.5f);
  }
  std::vector<OpTotal> rows = tally.totals();
  ASSERT_EQ(rows.size(), 4u);  // add in outer; scale n=32 and n=64 in inner; scale n=64 outside
  int found = 0;
  for (const OpTotal& r : rows) {
    if (r.op == "add") found += r.scope == "outer" && r.shape == "n=64" && r.calls == 1;
    if (r.op == "scale" && r.scope == "inner") found += r.calls == 1;
    if (r.op == "scale" && r.scope.empty()) found += r.shape == "n=64" && r.calls == 1;
  }
  EXPECT_EQ(found, 4);
  const std::vector<ScopeTotal> scopes = tally.scopes();
  ASSERT_EQ(scopes.size(), 2u);
  EXPECT_EQ(scopes[0].name, "outer");
  EXPECT_EQ(scopes[1].name, "inner");
  EXPECT_EQ(scopes[0].calls, 1);
  EXPECT_EQ(scopes[0].flops, 64.0 + 32.0 + 64.0);  // its add and the inner scales
  EXPECT_EQ(scopes[1].flops, 32.0 + 64.0);
  EXPECT_GE(scopes[0].seconds, scopes[1].seconds);
  EXPECT_GE(scopes[0].seconds, scopes[0].op_seconds * 0.999);
  EXPECT_EQ(tally.sum().calls, 4);
  EXPECT_EQ(tally.sum().flops, 64.0 + 32.0 + 64.0 + 64.0);
  // Without by_shape: add in outer, scale in inner (both shapes), scale outside.
  EXPECT_EQ(per_op.totals().size(), 3u);
  // A scope without an observer does nothing.
  Context bare;
  const Scope nothing(bare, "x");
}

}  // namespace
}  // namespace tessera::ops
