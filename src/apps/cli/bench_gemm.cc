// `tessera bench gemm`: GFLOP/s of our packed GEMM (f32 and bf16) beside OpenBLAS sgemm, loaded
// with dlopen as a yardstick only (never a link dependency).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/bench.h"
#include "backend/cpu/gemm.h"
#include "core/arena.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/context.h"
#include "ops/ops.h"

namespace tessera::cli {
namespace {

// The two OpenBLAS entry points we need, resolved at run time. Enum values are CBLAS's.
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;
using SgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc);
using SetThreadsFn = void (*)(int n);

struct OpenBlas {
  void* handle = nullptr;
  SgemmFn sgemm = nullptr;
  SetThreadsFn set_threads = nullptr;
  bool ok() const { return sgemm != nullptr; }
};

OpenBlas load_openblas() {
  OpenBlas ob;
  for (const char* name : {"libopenblas.so.0", "libopenblas.so"}) {
    ob.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (ob.handle) break;
  }
  if (!ob.handle) return ob;
  ob.sgemm = reinterpret_cast<SgemmFn>(dlsym(ob.handle, "cblas_sgemm"));
  ob.set_threads = reinterpret_cast<SetThreadsFn>(dlsym(ob.handle, "openblas_set_num_threads"));
  if (!ob.set_threads) ob.sgemm = nullptr;  // cannot match our thread count: not a fair yardstick
  return ob;
}

// One benchmarked shape: c (M,N) = op(a) (M,K) op(b) (K,N), as in ops::GemmArgs.
struct Shape {
  std::string name;
  ops::Trans ta, tb;
  int64_t m, n, k;
  bool accumulate;
};

// Median seconds of each function over kRounds rounds; a round runs each function in turn as a
// block: calls for at least 20 ms untimed (at least one), then `reps` timed calls back to back.
// Blocks, not call-by-call alternation: each pool's threads spin for a while after a call
// (OpenBLAS's for up to 2^28 cycles, ours 2 ms), so alternating calls set both pools' threads
// against each other on the same cores. The warm-up is timed because after an idle pause this
// VM runs slow for several milliseconds (a 256^3 product measured 450-500 us for the first six
// calls after 100 ms idle, 160-170 us hot, with no other library loaded). The rounds spread a
// burst of outside load over all contenders.
std::vector<double> median_seconds(int reps, const std::vector<std::function<void()>>& fns) {
  constexpr int kRounds = 3;
  constexpr double kWarmSeconds = 0.02;
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> t(fns.size());
  for (int round = 0; round < kRounds; ++round) {
    for (size_t f = 0; f < fns.size(); ++f) {
      const auto warm0 = Clock::now();
      do {
        fns[f]();
      } while (std::chrono::duration<double>(Clock::now() - warm0).count() < kWarmSeconds);
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        fns[f]();
        t[f].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
  }
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
  }
  return med;
}

// Median microseconds from the start of pool.run until worker 1 runs: back to back (the worker
// still spinning) and after `idle` of idleness (asleep: the ThreadPool spins 2 ms, then sleeps).
// The second is what a product pays when it follows a pause; on a VM it is the wake-up of a
// halted vCPU.
double wake_latency_us(ThreadPool& pool, std::chrono::microseconds idle, int reps) {
  if (pool.size() < 2) return 0;
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    std::this_thread::sleep_for(idle);
    std::atomic<int64_t> ns{0};
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int t) {
      if (t == 1) ns = (std::chrono::steady_clock::now() - t0).count();
    });
    us.push_back(static_cast<double>(ns.load()) * 1e-3);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

struct Row {
  std::string name;
  int64_t m, n, k;
  double ours_f32, ours_bf16, openblas;  // GFLOP/s; openblas < 0 when unavailable
};

Row run_shape(const Shape& s, const ops::Context& ctx, const OpenBlas& ob, int reps) {
  const int64_t a_rows = s.ta == ops::Trans::N ? s.m : s.k,
                a_cols = s.ta == ops::Trans::N ? s.k : s.m;
  const int64_t b_rows = s.tb == ops::Trans::N ? s.k : s.n,
                b_cols = s.tb == ops::Trans::N ? s.n : s.k;
  AlignedBuffer<float> a(a_rows * a_cols), b(b_rows * b_cols), c(s.m * s.n);
  AlignedBuffer<uint16_t> b16(b_rows * b_cols);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = u(rng);
  for (size_t i = 0; i < b.size(); ++i) b[i] = u(rng), b16[i] = f32_to_bf16(b[i]);

  ops::GemmArgs g;
  g.trans_a = s.ta, g.trans_b = s.tb, g.m = s.m, g.n = s.n, g.k = s.k;
  g.a = a.data(), g.lda = a_cols, g.b = b.data(), g.ldb = b_cols;
  g.c = c.data(), g.ldc = s.n, g.accumulate = s.accumulate;
  // bf16 as a training step multiplies: A in f32 rounded while packed (activations), B in bf16
  // (the step's bf16 copy of the weights).
  ops::GemmArgs g16 = g;
  g16.b = b16.data(), g16.b_type = DType::bf16, g16.round_bf16 = true;
  std::vector<std::function<void()>> fns = {[&] { ops::gemm(ctx, g); },
                                            [&] { ops::gemm(ctx, g16); }};
  if (ob.ok()) {
    const int ta = s.ta == ops::Trans::N ? kCblasNoTrans : kCblasTrans;
    const int tb = s.tb == ops::Trans::N ? kCblasNoTrans : kCblasTrans;
    const float beta = s.accumulate ? 1.0f : 0.0f;
    fns.push_back([&, ta, tb, beta] {
      ob.sgemm(kCblasRowMajor, ta, tb, static_cast<int>(s.m), static_cast<int>(s.n),
               static_cast<int>(s.k), 1.0f, a.data(), static_cast<int>(a_cols), b.data(),
               static_cast<int>(b_cols), beta, c.data(), static_cast<int>(s.n));
    });
  }
  const std::vector<double> sec = median_seconds(reps, fns);
  const double gflop = 2.0 * s.m * s.n * s.k * 1e-9;
  Row row{s.name, s.m, s.n, s.k, gflop / sec[0], gflop / sec[1], -1};
  if (ob.ok()) row.openblas = gflop / sec[2];
  return row;
}

// GPT-2 small linear layers at `tokens` rows: forward y = x W^T for qkv, attn proj, fc, fc proj
// and the (padded) lm head, plus the two backward forms of fc: dx = dy W and dW += dy^T x.
std::vector<Shape> gpt2_shapes(int64_t tokens) {
  using ops::Trans;
  const int64_t C = 768, F = 3072, Vp = 50304;
  return {{"qkv x.W^T", Trans::N, Trans::T, tokens, 3 * C, C, false},
          {"attn_proj x.W^T", Trans::N, Trans::T, tokens, C, C, false},
          {"fc x.W^T", Trans::N, Trans::T, tokens, F, C, false},
          {"fc_proj x.W^T", Trans::N, Trans::T, tokens, C, F, false},
          {"lm_head x.W^T", Trans::N, Trans::T, tokens, Vp, C, false},
          {"fc dx=dy.W", Trans::N, Trans::N, tokens, C, F, false},
          {"fc dW+=dy^T.x", Trans::T, Trans::N, F, C, tokens, true}};
}

int run(const Args& args) {
  const int threads = static_cast<int>(args.i64("--threads"));
  const std::vector<int64_t> sizes = args.ints("--sizes");
  const int reps = static_cast<int>(args.i64("--reps"));
  const int64_t tokens = args.i64("--tokens");  // 0 skips the GPT-2 shapes
  const bool json = args.on("--json");

  ThreadPool pool(threads);
  ops::Context ctx;
  ctx.pool = &pool;

  const char* coretype = std::getenv("OPENBLAS_CORETYPE");

  std::vector<Shape> shapes;
  for (int64_t s : sizes)
    shapes.push_back({cat("square ", s), ops::Trans::N, ops::Trans::N, s, s, s, false});
  if (tokens > 0)
    for (const Shape& s : gpt2_shapes(tokens)) shapes.push_back(s);

  const double wake_hot = wake_latency_us(pool, std::chrono::microseconds(0), 21);
  const double wake_cold = wake_latency_us(pool, std::chrono::microseconds(20000), 21);
  const OpenBlas ob = load_openblas();  // after: its threads are not there to disturb the above
  if (ob.ok()) ob.set_threads(pool.size());
  if (!json) {
    std::printf(
        "gemm: %d threads, median of 3 rounds of %d reps after 20 ms of warm-up; OpenBLAS %s%s%s\n",
        pool.size(), reps, ob.ok() ? "sgemm (dlopen)" : "unavailable (yardstick skipped)",
        coretype ? ", OPENBLAS_CORETYPE=" : "", coretype ? coretype : "");
    if (pool.size() > 1)
      std::printf("pool wake-up: %.1f us back to back, %.1f us after 20 ms idle (medians of 21)\n",
                  wake_hot, wake_cold);
    std::printf("kernels: f32 %s; bf16 (A f32 rounded while packed, B bf16) %s\n",
                cpu::gemm_kernel_name(cpu::gemm_kernel_for(false, 256)).c_str(),
                cpu::gemm_kernel_name(cpu::gemm_kernel_for(true, 256)).c_str());
    std::printf("%-18s %6s %6s %6s %10s %10s %9s %10s %7s\n", "shape", "M", "N", "K", "f32 GF/s",
                "bf16 GF/s", "bf16/f32", "OpenBLAS", "f32/OB");
  } else {
    std::printf(
        "{\"threads\": %d, \"reps\": %d, \"openblas\": %s, \"f32_kernel\": \"%s\", "
        "\"bf16_kernel\": \"%s\", \"wake_us_hot\": %.1f, \"wake_us_after_idle\": %.1f, "
        "\"rows\": [\n",
        pool.size(), reps, ob.ok() ? "true" : "false",
        cpu::gemm_kernel_name(cpu::gemm_kernel_for(false, 256)).c_str(),
        cpu::gemm_kernel_name(cpu::gemm_kernel_for(true, 256)).c_str(), wake_hot, wake_cold);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Row r = run_shape(shapes[i], ctx, ob, reps);
    if (json) {
      std::printf(
          "  {\"shape\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
          "\"f32_gflops\": %.2f, \"bf16_gflops\": %.2f, \"openblas_gflops\": %s}%s\n",
          r.name.c_str(), static_cast<long long>(r.m), static_cast<long long>(r.n),
          static_cast<long long>(r.k), r.ours_f32, r.ours_bf16,
          r.openblas > 0 ? cat(r.openblas).c_str() : "null", i + 1 < shapes.size() ? "," : "");
    } else if (r.openblas > 0) {
      std::printf("%-18s %6lld %6lld %6lld %10.1f %10.1f %9.2f %10.1f %7.2f\n", r.name.c_str(),
                  static_cast<long long>(r.m), static_cast<long long>(r.n),
                  static_cast<long long>(r.k), r.ours_f32, r.ours_bf16, r.ours_bf16 / r.ours_f32,
                  r.openblas, r.ours_f32 / r.openblas);
    } else {
      std::printf("%-18s %6lld %6lld %6lld %10.1f %10.1f %9.2f %10s %7s\n", r.name.c_str(),
                  static_cast<long long>(r.m), static_cast<long long>(r.n),
                  static_cast<long long>(r.k), r.ours_f32, r.ours_bf16, r.ours_bf16 / r.ours_f32,
                  "-", "-");
    }
    std::fflush(stdout);
  }
  if (json) std::printf("]}\n");
  return 0;
}

}  // namespace

Command bench_gemm_command() {
  return {
      "gemm",
      "GFLOP/s of our GEMM (f32, bf16) beside OpenBLAS sgemm",
      {
          Flag::threads(),
          Flag::int_list("--sizes", "256,512,1024,2048,4096", 1, 65536, "square sizes to time"),
          Flag::integer("--reps", 5, 1, 1000, "timed repetitions (median)"),
          Flag::integer("--tokens", 4096, 0, 1 << 20,
                        "rows of the GPT-2 small layer shapes; 0: skip them"),
          Flag::toggle("--json", "one JSON object on stdout"),
      },
      {},
      &run,
      {},
  };
}

}  // namespace tessera::cli
