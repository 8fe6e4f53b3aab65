// Google Benchmark micro-benchmarks of the CPU ops at GPT-2 small shapes, reporting FLOP/s and
// bytes/s counters. `tessera bench` prints the user-facing tables; this is for kernel work.
#include <benchmark/benchmark.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace {

using tessera::ops::Context;

std::vector<float> random_vector(size_t n, uint64_t seed) {
  tessera::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.normal();
  return v;
}

// y (M,N) = x (M,K) W^T, W (N,K): the forward form of every linear layer.
void BM_GemmForward(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto a = random_vector(static_cast<size_t>(m * k), 1),
       b = random_vector(static_cast<size_t>(n * k), 2);
  std::vector<float> c(static_cast<size_t>(m * n));
  tessera::ops::GemmArgs g;
  g.trans_b = tessera::ops::Trans::T;
  g.m = m, g.n = n, g.k = k;
  g.a = a.data(), g.lda = k, g.b = b.data(), g.ldb = k, g.c = c.data(), g.ldc = n;
  const Context ctx;
  for (auto _ : state) tessera::ops::gemm(ctx, g);
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GemmForward)
    ->Args({512, 512, 512})
    ->Args({1024, 1024, 1024})
    ->Args({2048, 2304, 768})
    ->Args({2048, 3072, 768})
    ->Args({2048, 768, 3072})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_LayernormForward(benchmark::State& state) {
  const int64_t n = state.range(0), c = 768;
  auto x = random_vector(static_cast<size_t>(n * c), 3), w = random_vector(c, 4),
       b = random_vector(c, 5);
  std::vector<float> out(x.size()), mean(static_cast<size_t>(n)), rstd(static_cast<size_t>(n));
  const Context ctx;
  for (auto _ : state)
    tessera::ops::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                    b.data(), n, c);
  state.counters["bytes/s"] =
      benchmark::Counter(8.0 * n * c, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LayernormForward)->Arg(4096)->UseRealTime();

void BM_AttentionForward(benchmark::State& state) {
  const int64_t B = 1, T = state.range(0), C = 768, H = 12;
  auto qkv = random_vector(static_cast<size_t>(B * T * 3 * C), 6);
  std::vector<float> out(static_cast<size_t>(B * T * C)), lse(static_cast<size_t>(B * H * T));
  const Context ctx;
  for (auto _ : state)
    tessera::ops::attention_forward(ctx, out.data(), lse.data(), qkv.data(), {B, T, C, H, H});
  state.counters["FLOP/s"] =
      benchmark::Counter(tessera::ops::attention_forward_cost({B, T, C, H, H}).flops,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionForward)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// One AdamW pass over n parameters (p, g, m, v read; p, m, v written: 28 bytes each), on the
// default pool. At 2^18 the four arrays (4 MiB) stay in L2/L3 and the pass shows its arithmetic
// (its divisions and square root); at 2^26 (1 GiB) it streams from DRAM.
void BM_AdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto p = random_vector(static_cast<size_t>(n), 7), g = random_vector(static_cast<size_t>(n), 8);
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  tessera::ops::AdamWArgs a;
  a.lr = 1e-4f, a.t = 3, a.weight_decay = 0.1f;
  const Context ctx;
  for (auto _ : state) tessera::ops::adamw(ctx, p.data(), g.data(), m.data(), v.data(), n, a);
  state.counters["bytes/s"] =
      benchmark::Counter(28.0 * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AdamW)->Arg(1 << 18)->Arg(1 << 26)->Unit(benchmark::kMillisecond)->UseRealTime();

// The gradient norm's pass: sum of squares of n floats, in cache and from DRAM.
void BM_SumSquares(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto x = random_vector(static_cast<size_t>(n), 9);
  const Context ctx;
  for (auto _ : state) benchmark::DoNotOptimize(tessera::ops::sum_squares(ctx, x.data(), n));
  state.counters["bytes/s"] =
      benchmark::Counter(4.0 * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SumSquares)->Arg(1 << 18)->Arg(1 << 26)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  tessera::cpu::register_backend();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
