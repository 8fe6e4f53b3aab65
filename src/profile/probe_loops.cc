// Peak loops: compute loops with enough independent accumulators to cover each instruction's
// latency on every port that runs it, and streaming loops (triad, read-only sums), each run on
// one thread or on all threads at once.
#include "profile/probe_loops.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/large_alloc.h"
#include "core/thread_pool.h"
#include "profile/timer.h"

namespace tessera::profile::loops {

namespace {

// 12 independent accumulators: 2 FMA ports x 4-5 cycles latency needs >= 10 in flight. The
// int8 loops use the same count: vpdpbusd has the FMA's latency (5) and ports.
constexpr int kAccumulators = 12;
// 20 M iterations x 12 FMAs at 2 per cycle: ~40 ms per run at 3 GHz.
constexpr int64_t kFmaIterations = 20'000'000;
// Half the FMA count: an AVX2 int8 step is two multiply uops (12 cycles per iteration), a
// vpdpbusd one; 10 M iterations keep each run at 20-80 ms.
constexpr int64_t kInt8Iterations = 10'000'000;

// Stores a loop's result where the compiler must assume it is read, so the loop is not removed
// (one per thread: the loops run on every thread at once).
thread_local volatile float g_sink;
thread_local volatile int32_t g_isink;

__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters) {
  __m256 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  for (int i = 0; i < kAccumulators; ++i) g_sink = _mm256_cvtss_f32(acc[i]);
  return static_cast<double>(iters) * kAccumulators * 8 * 2;
}

__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iters) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  for (int i = 0; i < kAccumulators; ++i) g_sink = _mm512_cvtss_f32(acc[i]);
  return static_cast<double>(iters) * kAccumulators * 16 * 2;
}

// vdpbf16ps: 32 bf16 products summed pairwise into 16 f32 lanes = 64 flops per instruction.
__attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"))) double bf16_loop_avx512(
    int64_t iters) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  for (int i = 0; i < kAccumulators; ++i) g_sink = _mm512_cvtss_f32(acc[i]);
  return static_cast<double>(iters) * kAccumulators * 64;
}

double fma_loop_scalar(int64_t iters) {
  float acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.001f * i;
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  for (int i = 0; i < kAccumulators; ++i) g_sink = acc[i];
  return static_cast<double>(iters) * kAccumulators * 2;
}

// The int8 loops name their 12 accumulators one by one and issue each step as one asm
// statement: from the intrinsics, GCC 12 put one or two register moves beside every vpdpbusd
// (and a stack store beside the ymm ones) and interleaved the AVX2 products until accumulators
// spilled, so the loops timed the front end, not the multipliers. u: unsigned bytes, s: signed.
#define TS_INT8_LOOP(vec, set1_epi32, set1_epi8, sink, STEP)                              \
  static_assert(kAccumulators == 12, "the loop names 12 accumulators");                   \
  vec a0 = set1_epi32(0), a1 = set1_epi32(1), a2 = set1_epi32(2), a3 = set1_epi32(3);     \
  vec a4 = set1_epi32(4), a5 = set1_epi32(5), a6 = set1_epi32(6), a7 = set1_epi32(7);     \
  vec a8 = set1_epi32(8), a9 = set1_epi32(9), a10 = set1_epi32(10), a11 = set1_epi32(11); \
  const vec u = set1_epi8(3), s = set1_epi8(-2);                                          \
  for (int64_t it = 0; it < iters; ++it) {                                                \
    STEP(a0);                                                                             \
    STEP(a1);                                                                             \
    STEP(a2);                                                                             \
    STEP(a3);                                                                             \
    STEP(a4);                                                                             \
    STEP(a5);                                                                             \
    STEP(a6);                                                                             \
    STEP(a7);                                                                             \
    STEP(a8);                                                                             \
    STEP(a9);                                                                             \
    STEP(a10);                                                                            \
    STEP(a11);                                                                            \
  }                                                                                       \
  for (const vec& a : {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11}) g_isink = sink(a)

// vpdpbusd (zmm): 64 u8 x s8 products summed in fours into 16 i32 lanes: 64 multiply-adds, 128
// ops per instruction. The accumulator is an operand, so each is a chain of 5-cycle steps.
#define TS_STEP(acc) asm("vpdpbusd %[s], %[u], %[x]" : [x] "+v"(acc) : [u] "v"(u), [s] "v"(s))
__attribute__((target("avx512vnni,avx512f,avx512bw"))) double int8_loop_avx512_vnni(int64_t iters) {
  TS_INT8_LOOP(__m512i, _mm512_set1_epi32, _mm512_set1_epi8, _mm512_cvtsi512_si32, TS_STEP);
  return static_cast<double>(iters) * kAccumulators * 64 * 2;
}
#undef TS_STEP

// AVX-VNNI vpdpbusd (ymm, VEX-encoded): 32 multiply-adds, 64 ops per instruction.
#define TS_STEP(acc) \
  asm("%{vex%} vpdpbusd %[s], %[u], %[x]" : [x] "+x"(acc) : [u] "x"(u), [s] "x"(s))
__attribute__((target("avxvnni,avx2"))) double int8_loop_avx_vnni(int64_t iters) {
  TS_INT8_LOOP(__m256i, _mm256_set1_epi32, _mm256_set1_epi8, _mm256_cvtsi256_si32, TS_STEP);
  return static_cast<double>(iters) * kAccumulators * 32 * 2;
}
#undef TS_STEP

// AVX2, as the AVX2 quantized kernels do it: vpmaddubsw (32 u8 x s8 products summed in pairs
// into 16 i16), vpmaddwd by ones (pairs into 8 i32), vpaddd into the accumulator: 32
// multiply-adds, 64 ops per three instructions. The products do not depend on the accumulator
// (as in a kernel, where they come from loads), so the two multiply ports bound the loop and the
// chains only carry 1-cycle adds. 12 accumulators + u, s, ones + ymm15 for the product: all 16
// ymm registers.
#define TS_STEP(acc)                          \
  asm("vpmaddubsw %[s], %[u], %%ymm15\n\t"    \
      "vpmaddwd %[o], %%ymm15, %%ymm15\n\t"   \
      "vpaddd %%ymm15, %[x], %[x]"            \
      : [x] "+x"(acc)                         \
      : [u] "x"(u), [s] "x"(s), [o] "x"(ones) \
      : "xmm15")
__attribute__((target("avx2"))) double int8_loop_avx2(int64_t iters) {
  const __m256i ones = _mm256_set1_epi16(1);
  TS_INT8_LOOP(__m256i, _mm256_set1_epi32, _mm256_set1_epi8, _mm256_cvtsi256_si32, TS_STEP);
  return static_cast<double>(iters) * kAccumulators * 32 * 2;
}
#undef TS_STEP
#undef TS_INT8_LOOP

// Read loops: 8 accumulators because vaddps has a 4-cycle latency and the core issues 2 loads
// per cycle, so 8 adds in flight keep both load ports busy even from L1; the levels below it
// deliver less per cycle and need fewer. n is a multiple of kReadBlockFloats.
__attribute__((target("avx512f"))) float sum_avx512(const float* p, int64_t n) {
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kReadBlockFloats)
    for (int k = 0; k < 8; ++k) acc[k] = _mm512_add_ps(acc[k], _mm512_load_ps(p + i + 16 * k));
  for (int k = 1; k < 8; ++k) acc[0] = _mm512_add_ps(acc[0], acc[k]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  float s = 0;
  for (float l : lanes) s += l;
  return s;
}

__attribute__((target("avx2"))) float sum_avx2(const float* p, int64_t n) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 64)
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_load_ps(p + i + 8 * k));
  for (int k = 1; k < 8; ++k) acc[0] = _mm256_add_ps(acc[0], acc[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float s = 0;
  for (float l : lanes) s += l;
  return s;
}

float sum_scalar(const float* p, int64_t n) {
  float acc[8] = {};
  for (int64_t i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

using SumFn = float (*)(const float*, int64_t);

SumFn best_sum() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return sum_avx512;
  if (__builtin_cpu_supports("avx2")) return sum_avx2;
  return sum_scalar;
}

bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

// cpuid leaf 7: subleaf 0 ECX bit 11 is AVX512-VNNI; subleaf 1 EAX bit 4 AVX-VNNI, bit 5
// AVX512-BF16. The AVX-512 ones also need the OS to save zmm state, which
// __builtin_cpu_supports("avx512f") checks.
bool cpuid_bit(unsigned sub, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (!__get_cpuid_count(7, sub, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1;
}

}  // namespace

ComputeLoop f32_loop() {
  if (has_avx512()) return {"avx512 vfmadd", fma_loop_avx512, kFmaIterations};
  if (has_avx2()) return {"avx2 vfmadd", fma_loop_avx2, kFmaIterations};
  return {"scalar", fma_loop_scalar, kFmaIterations / 4};  // 4x slower per iteration
}

ComputeLoop bf16_loop() {
  if (has_avx512() && cpuid_bit(1, 0, 5))
    return {"avx512-bf16 vdpbf16ps", bf16_loop_avx512, kFmaIterations};
  return {"none", nullptr, 0};
}

std::vector<ComputeLoop> int8_loops() {
  std::vector<ComputeLoop> out;
  if (has_avx512() && cpuid_bit(0, 2, 11))
    out.push_back({"avx512-vnni vpdpbusd", int8_loop_avx512_vnni, kInt8Iterations});
  if (has_avx2() && cpuid_bit(1, 0, 4))
    out.push_back({"avx-vnni vpdpbusd (256-bit)", int8_loop_avx_vnni, kInt8Iterations});
  if (has_avx2())
    out.push_back({"avx2 vpmaddubsw+vpmaddwd+vpaddd", int8_loop_avx2, kInt8Iterations / 2});
  return out;
}

ComputeLoop int8_loop() {
  const auto all = int8_loops();
  return all.empty() ? ComputeLoop{"none", nullptr, 0} : all.front();
}

double measure_ops(const ComputeLoop& c, int threads) {
  if (!c.loop) return 0;
  ThreadPool pool(threads);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> ops(static_cast<size_t>(threads));
    const Timer t;
    pool.run([&](int i) { ops[static_cast<size_t>(i)] = c.loop(c.iters); });
    const double s = t.seconds();
    double total = 0;
    for (double o : ops) total += o;
    best = std::max(best, total / s * 1e-9);
  }
  return best;
}

double measure_triad(float* scratch, int64_t n, int threads) {
  float* a = scratch;
  float* b = scratch + n;
  float* c = scratch + 2 * n;
  ThreadPool pool(threads);
  pool.run([&](int i) {
    const int64_t lo = n * i / threads, hi = n * (i + 1) / threads;
    for (int64_t j = lo; j < hi; ++j) b[j] = 1.0f, c[j] = 2.0f;
  });
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const float s = 0.5f + rep;
    const Timer t;
    // Static split per thread so each thread streams one contiguous range.
    pool.run([&](int i) {
      const int64_t lo = n * i / threads, hi = n * (i + 1) / threads;
      float* __restrict pa = a;
      const float* __restrict pb = b;
      const float* __restrict pc = c;
      for (int64_t j = lo; j < hi; ++j) pa[j] = pb[j] + s * pc[j];
    });
    const double sec = t.seconds();
    best = std::max(best, 3.0 * 4.0 * n / sec * 1e-9);  // STREAM counts read b, c and write a
  }
  return best;
}

void ReadBuffer::Free::operator()(float* p) const {
  free_large(p);
}

ReadBuffer::ReadBuffer(int64_t floats, int threads) : floats_(floats) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  data_.reset(static_cast<float*>(alloc_large(bytes, 64, "the probe's read buffer")));
  ThreadPool pool(threads);
  pool.run([&](int i) {
    const int64_t lo = floats * i / threads, hi = floats * (i + 1) / threads;
    std::memset(data_.get() + lo, 0, static_cast<size_t>(hi - lo) * sizeof(float));
  });
}

double measure_read(const float* buf, int64_t per_thread, int threads, int64_t passes, int reps,
                    bool warm) {
  static const SumFn sum = best_sum();
  ThreadPool pool(threads);
  std::vector<float> sums(static_cast<size_t>(threads));
  auto run = [&](int64_t n_passes) {
    pool.run([&](int i) {
      const float* p = buf + per_thread * i;
      float s = 0;
      for (int64_t k = 0; k < n_passes; ++k) s += sum(p, per_thread);
      sums[static_cast<size_t>(i)] = s;
    });
  };
  if (warm) run(1);
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const Timer t;
    run(passes);
    const double sec = t.seconds();
    best = std::max(best, 4.0 * per_thread * passes * threads / sec * 1e-9);
  }
  for (float s : sums) g_sink = s;
  return best;
}

}  // namespace tessera::profile::loops
