// Google Benchmark of ops::matmul_wt (weights in their stored type) at Llama-1B-like shapes and
// SmolLM2-135M's: decode (M=1, memory-bound: bytes/s of weights) and prefill (M=512: FLOP/s),
// per weight type and thread count. Filter with --benchmark_filter, e.g. 'decode/q4_1'.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "core/interleave.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "ops/quant.h"

namespace {

using tessera::DType;

// Indices 8-11 are the CPU's row-interleaved layouts of q4_0, q4_1, q8_0 and f16
// (core/interleave.h); 12-14 the 5-bit formats, 15 q4_K's interleaved layout (appended, so
// earlier indices keep their types; q4_kx8 needs AVX512-VNNI for its own kernel), 16 Q5_K's,
// 17 Q6_K's.
constexpr DType kTypes[] = {
    DType::f32,  DType::f16,  DType::bf16,   DType::q8_0,   DType::q4_0,   DType::q4_1,
    DType::q4_k, DType::q6_k, DType::q4_0x8, DType::q4_1x8, DType::q8_0x8, DType::f16x16,
    DType::q5_0, DType::q5_1, DType::q5_k,   DType::q4_kx8, DType::q5_kx8, DType::q6_kx8};
constexpr int64_t kNumTypes = sizeof(kTypes) / sizeof(kTypes[0]);

tessera::ThreadPool& bench_pool(int n) {
  static std::unique_ptr<tessera::ThreadPool> pools[64];
  if (!pools[n]) pools[n] = std::make_unique<tessera::ThreadPool>(n);
  return *pools[n];
}

// W (N,K): 64 quantized Gaussian rows repeated (quantizing all of a 32000-row matrix with the
// k-quant search would dominate the run; the kernels' speed does not depend on the values).
std::vector<uint8_t> make_weights(DType t, int64_t N, int64_t K) {
  const int64_t tile = std::min<int64_t>(64, N), row_bytes = tessera::dtype_bytes(t, K);
  tessera::Rng rng(1);
  std::vector<float> src(static_cast<size_t>(tile * K));
  for (auto& v : src) v = 0.02f * rng.normal();
  std::vector<uint8_t> w(static_cast<size_t>(N * row_bytes));
  const DType plain = tessera::plain_type(t);
  tessera::from_f32(plain, src.data(), w.data(), tile * K);
  for (int64_t n = tile; n < N; ++n)
    std::memcpy(w.data() + n * row_bytes, w.data() + (n % tile) * row_bytes, row_bytes);
  if (plain != t) tessera::interleave_rows(plain, w.data(), N, K);
  return w;
}

// Args: type index, M, N, K, threads.
void BM_MatmulWt(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  const int64_t M = state.range(1), N = state.range(2), K = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  if (tessera::is_interleaved(t) && !tessera::cpu::quant_avx2_supported())
    return state.SkipWithError("the interleaved layouts need AVX2");
  const auto w = make_weights(t, N, K);
  tessera::Rng rng(2);
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
  for (auto& v : x) v = rng.normal();
  tessera::ops::Context ctx;
  ctx.pool = &bench_pool(threads);
  for (auto _ : state) {
    tessera::ops::matmul_wt(ctx, y.data(), N, x.data(), M, K, w.data(), t, N);
    benchmark::DoNotOptimize(y.data());
  }
  const auto cost = tessera::ops::matmul_wt_cost(M, K, N, t);
  state.SetLabel(std::string(tessera::dtype_name(t)) + " M=" + std::to_string(M) +
                 " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                 " threads=" + std::to_string(threads));
  state.counters["bytes/s"] =
      benchmark::Counter(cost.bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] =
      benchmark::Counter(cost.flops, benchmark::Counter::kIsIterationInvariantRate);
}

// The two CPU routes of matmul_wt, called directly at one shape: the integer kernels (8-bit
// activations; AVX2 where the CPU has it) and the packed f32 GEMM widening W while packing.
// Args: type index, M, threads, route (0: integer kernels, 1: packed GEMM). N = 2048, K = 2048.
// cpu::matmul_wt switches routes where these cross.
void BM_MatmulWtRoute(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  const int64_t M = state.range(1), N = 2048, K = 2048;
  const int threads = static_cast<int>(state.range(2));
  const bool packed = state.range(3) == 1;
  if (tessera::is_interleaved(t) && !packed && !tessera::cpu::quant_avx2_supported())
    return state.SkipWithError("the interleaved layouts need AVX2");
  const auto w = make_weights(t, N, K);
  tessera::Rng rng(2);
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
  for (auto& v : x) v = rng.normal();
  tessera::ThreadPool& pool = bench_pool(threads);
  for (auto _ : state) {
    if (packed) {
      tessera::cpu::gemm_wt(pool, y.data(), N, x.data(), M, K, w.data(), t, N, nullptr);
    } else if (tessera::cpu::quant_avx2_supported()) {
      tessera::cpu::matmul_wt_avx2(pool, y.data(), N, x.data(), M, K, w.data(), t, N, nullptr);
    } else {
      tessera::cpu::matmul_wt_highway(pool, y.data(), N, x.data(), M, K, w.data(), t, N, nullptr);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(tessera::dtype_name(t)) + (packed ? " packed" : " integer") +
                 " M=" + std::to_string(M) + " threads=" + std::to_string(threads));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate);
}

void route_args(benchmark::internal::Benchmark* b) {
  for (int64_t t = 0; t < kNumTypes; ++t)
    for (int64_t m : {4, 16, 32, 64, 128, 256, 512})
      for (int64_t route : {0, 1}) b->Args({t, m, 1, route});
}

// Llama-1B-like (N, K): attention, MLP up, vocabulary head.
constexpr std::pair<int64_t, int64_t> kLlamaShapes[] = {{2048, 2048}, {5632, 2048}, {32000, 2048}};
// SmolLM2-135M (Q4_1 blocks, Q8_0 head): q/o, k/v, gate/up, down, token_embd as the head.
constexpr std::pair<int64_t, int64_t> kSmolShapes[] = {
    {576, 576}, {192, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
constexpr int64_t kQ8_0 = 3, kQ4_1 = 5, kQ4_1x8 = 9, kQ8_0x8 = 10;

void decode_args(benchmark::internal::Benchmark* b) {
  for (int64_t t = 0; t < kNumTypes; ++t)
    for (int64_t threads : {1, 2})
      for (auto nk : kLlamaShapes) b->Args({t, 1, nk.first, nk.second, threads});
  for (int64_t t : {kQ4_1, kQ8_0, kQ4_1x8, kQ8_0x8})
    for (int64_t threads : {1, 2})
      for (auto nk : kSmolShapes) b->Args({t, 1, nk.first, nk.second, threads});
}
// One matvec over a matrix larger than any last-level cache we run on (q4: 604 MB, above the
// 480 MiB L3 of the third Xeon VM), so the weights come from DRAM as in a large model's decode;
// the shapes above fit in such an L3 and measure the kernels' own speed.
constexpr int64_t kQ4_0x8 = 8, kQ4_K = 6, kQ6_K = 7, kQ4_Kx8 = 15, kQ6_Kx8 = 17;
void dram_args(benchmark::internal::Benchmark* b) {
  for (int64_t t : {kQ4_0x8, kQ4_K, kQ4_Kx8, kQ6_K, kQ6_Kx8})
    for (int64_t threads : {1, 2}) b->Args({t, 1, 524288, 2048, threads});
}
// A decode step's products one after another: copies of one (N, K) matrix, 640 MB in all
// (above the 480 MiB L3 of the third Xeon VM), each call on the next copy, so every call reads
// its weights from DRAM and starts cold, as each of a model's matrices does. Against
// decode-dram's one long matrix this shows what a product's start and end cost (the hand-off
// to the threads, the prefetch ramp, the last rows finishing on one thread).
void BM_MatmulWtCycle(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  const int64_t N = state.range(1), K = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  if (tessera::is_interleaved(t) && !tessera::cpu::quant_avx2_supported())
    return state.SkipWithError("the interleaved layouts need AVX2");
  const auto one = make_weights(t, N, K);
  const int64_t copies =
      std::max<int64_t>(2, (int64_t{640} << 20) / static_cast<int64_t>(one.size()));
  std::vector<uint8_t> w(one.size() * static_cast<size_t>(copies));
  for (int64_t c = 0; c < copies; ++c)
    std::memcpy(w.data() + c * one.size(), one.data(), one.size());
  tessera::Rng rng(2);
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N));
  for (auto& v : x) v = rng.normal();
  tessera::ops::Context ctx;
  ctx.pool = &bench_pool(threads);
  int64_t c = 0;
  for (auto _ : state) {
    tessera::ops::matmul_wt(ctx, y.data(), N, x.data(), 1, K, w.data() + c * one.size(), t, N);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  state.SetLabel(std::string(tessera::dtype_name(t)) + " N=" + std::to_string(N) +
                 " K=" + std::to_string(K) + " threads=" + std::to_string(threads));
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(one.size()),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
void cycle_args(benchmark::internal::Benchmark* b) {
  for (int64_t t : {kQ4_0x8, kQ4_Kx8})
    for (int64_t threads : {1, 2})
      for (auto nk : {std::pair<int64_t, int64_t>{2048, 2048}, {5632, 2048}, {2048, 5632}})
        b->Args({t, nk.first, nk.second, threads});
}

void prefill_args(benchmark::internal::Benchmark* b) {
  for (int64_t t = 0; t < kNumTypes; ++t)
    for (int64_t threads : {1, 2})
      for (int64_t n : {2048, 5632}) b->Args({t, 512, n, 2048, threads});
  for (int64_t threads : {1, 2}) b->Args({kQ4_1, 512, 1536, 576, threads});
}

BENCHMARK(BM_MatmulWtRoute)
    ->Name("MatmulWt/route")
    ->Apply(route_args)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulWt)
    ->Name("MatmulWt/decode")
    ->Apply(decode_args)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulWt)
    ->Name("MatmulWt/decode-dram")
    ->Apply(dram_args)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulWtCycle)
    ->Name("MatmulWt/decode-cycle")
    ->Apply(cycle_args)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulWt)
    ->Name("MatmulWt/prefill")
    ->Apply(prefill_args)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
