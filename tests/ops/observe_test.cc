// The observation hook: with an observer in the context every op call is reported once, with its
// name, device and cost; without one nothing is reported and results are unchanged.
#include "ops/observe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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
  };
  std::vector<Seen> seen;
  void on_op(const OpRecord& r) override {
    seen.push_back({std::string(r.op), r.device, r.cost, r.seconds});
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

}  // namespace
}  // namespace tessera::ops
