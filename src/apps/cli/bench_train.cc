// `tessera bench train`: GPT-2 training-step time on random tokens (forward, backward, AdamW),
// tokens/s, MFU against the probed peak (on --device cuda: against the GPU's dense bf16 peak),
// peak RSS and the activation arena size (on CUDA: the device memory the trainer holds).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/bench.h"
#include "backend/cpu/gemm.h"
#include "backend/device.h"
#include "core/error.h"
#include "core/rng.h"
#include "explain/op_profile.h"
#include "model/train_model.h"
#include "ops/memory.h"
#include "ops/op_tally.h"
#include "profile/power.h"
#include "profile/probe.h"
#include "profile/timer.h"
#include "train/optimizer.h"
#include "train/step.h"

namespace tessera::cli {

namespace {

int run(const Args& a) {
  const std::string preset = a.str("--model");
  const int64_t B = a.i64("--batch");
  const int64_t T = a.i64("--seq");
  const int64_t steps = a.i64("--steps");
  const std::string precision = a.str("--precision");
  const std::string recompute = a.str("--recompute");
  const int64_t threads = a.i64("--threads");
  const int64_t vocab = a.i64("--vocab-size");
  const std::string device = a.str("--device");
  const bool json = a.on("--json");
  const bool per_op = a.on("--profile");
  const model::Precision prec = model::parse_precision(precision, "--precision");
  const model::Recompute rec = model::parse_recompute(recompute, "--recompute");
  const bool cuda = device == "cuda";
  if (cuda) {
    TS_CHECK(backend::cuda_device_count() > 0,
             "[cuda] --device cuda: ", backend::cuda_device_summary());
    TS_CHECK(prec == model::Precision::bf16, "--device cuda trains in --precision bf16, not ",
             precision);
    TS_CHECK(!per_op,
             "--profile times each op on the host, where CUDA's run asynchronously: "
             "use --device cpu");
  }

  std::unique_ptr<ThreadPool> pool;
  if (threads > 0) pool = std::make_unique<ThreadPool>(static_cast<int>(threads));
  ops::Context ctx;
  ctx.pool = pool.get();
  // cuda: the model's own step on the CUDA ops backend's memory.
  if (cuda) ctx.device = ops::Device::cuda;
  ops::OpTally tally;  // observes every op of the timed steps with --profile
  if (per_op) ctx.observer = &tally;
  model::TrainModel m(model::TrainConfig::preset(preset, vocab), ctx);
  TS_CHECK(T <= m.config().max_seq, "--seq ", T, " exceeds ", preset, "'s max_seq ",
           m.config().max_seq);
  m.init_weights(1);
  m.plan(B, T, prec, rec);
  m.params_updated();
  train::AdamW opt(m.tensors(), train::AdamWConfig{}, ctx);
  Rng rng(7);
  std::vector<int32_t> tokens(static_cast<size_t>(B * (T + 1)));
  std::vector<int32_t> inp(static_cast<size_t>(B * T)), tgt(inp.size());

  // A random (B, T+1) window: inputs and the targets one token on.
  auto next_batch = [&](int32_t* in, int32_t* tg) {
    for (auto& x : tokens) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) {
        in[b * T + i] = tokens[static_cast<size_t>(b * (T + 1) + i)];
        tg[b * T + i] = tokens[static_cast<size_t>(b * (T + 1) + i + 1)];
      }
  };
  auto one_step = [&](int64_t t) {
    // The trainer's own step (train/step.h), the batch's generation inside the timed step as
    // the trainer's loading is; on a device, until its last kernel is done.
    const profile::Timer timer;
    train::train_step(m, opt, B, T, 1, 1e-4, t, next_batch, inp.data(), tgt.data());
    ops::synchronize(ctx);
    return timer.seconds();
  };
  one_step(1);  // warm-up: first touch of the arena and packed buffers
  tally.reset();
  const profile::EnergyMeter meter;
  const profile::EnergySample e0 = meter.sample();
  std::vector<double> times;
  for (int64_t s = 0; s < steps; ++s) times.push_back(one_step(s + 2));
  const double joules = meter.joules_between(e0, meter.sample());
  const double trained = static_cast<double>(B * T * steps);
  double total = 0;
  for (double t : times) total += t;
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  const double tps = static_cast<double>(B * T) / med;
  const double gflops = m.flops_per_token_train(T) * tps * 1e-9;
  bool use_bf16 = false;
  double peak = 0;
  int64_t probed_at = 0;
  if (cuda) {
    use_bf16 = true;
    peak = backend::cuda_bf16_peak_flops() * 1e-9;  // dense tensor-core figure
  } else {
    const auto peaks = profile::cached_peaks(static_cast<int>(ctx.threads().size()));
    probed_at = peaks.probed_at;
    use_bf16 = prec == model::Precision::bf16 && peaks.bf16_gflops_all > 0;
    peak = use_bf16 ? peaks.bf16_gflops_all : peaks.f32_gflops_all;
  }
  const double mfu = peak > 0 ? gflops / peak : 0;
  std::vector<explain::OpProfileRow> rows;
  if (per_op) {
    const auto peaks = profile::cached_peaks(static_cast<int>(ctx.threads().size()));
    // The step's products (attention's too) run on bf16 dot products in bf16 precision; every
    // other op in f32.
    explain::Roofs roofs = explain::cpu_roofs(peaks, static_cast<int>(ctx.threads().size()));
    const double f32 = peaks.f32_gflops_all;
    const std::string product_peak = use_bf16 ? "bf16" : "f32";
    roofs.compute = [&, f32](const ops::OpTotal& t) {
      const bool product =
          t.op == "gemm" || t.op.starts_with("matmul_wt") || t.op.starts_with("attention_");
      return product ? explain::ComputePeak{peak, product_peak} : explain::ComputePeak{f32, "f32"};
    };
    rows = explain::op_profile(tally.totals(), steps, total, roofs);
  }
  // The products of a step: bf16 compute rounds both operands (the f32 activations while
  // packed), so on the CPU its kernel is the one cpu::gemm takes for bf16 compute at B*T rows.
  const std::string kernel =
      cuda ? std::string("cuBLASLt bf16 tensor cores")
           : cpu::gemm_kernel_name(cpu::gemm_kernel_for(prec == model::Precision::bf16, B * T));
  const double rss_mib = static_cast<double>(profile::peak_rss_bytes()) / (1 << 20);
  const double act_mib = static_cast<double>(m.activation_bytes()) / (1 << 20);
  if (json) {
    std::printf(
        "{\"model\": \"%s\", \"device\": \"%s\", \"params\": %lld, \"batch\": %lld, \"seq\": %lld, "
        "\"precision\": \"%s\", \"recompute\": \"%s\", \"threads\": %d, "
        "\"median_ms\": %.3f, \"tokens_per_s\": %.1f, \"gflops\": %.2f, "
        "\"peak_gflops\": %.2f, \"mfu\": %.4f, \"peak_rss_mib\": %.1f, "
        "\"activation_mib\": %.1f, \"gemm_kernel\": \"%s\", \"joules_per_token\": %s%s%s}\n",
        preset.c_str(), device.c_str(), static_cast<long long>(m.num_params()),
        static_cast<long long>(B), static_cast<long long>(T), precision.c_str(), recompute.c_str(),
        ctx.threads().size(), med * 1e3, tps, gflops, peak, mfu, rss_mib, act_mib, kernel.c_str(),
        joules >= 0 ? std::to_string(joules / trained).c_str() : "null",
        per_op ? ", \"ops\": " : "", per_op ? explain::op_profile_json(rows).c_str() : "");
    return 0;
  }
  std::printf("bench train: %s (%.1fM params), B=%lld T=%lld, %s, recompute %s, %d threads\n",
              preset.c_str(), static_cast<double>(m.num_params()) * 1e-6, static_cast<long long>(B),
              static_cast<long long>(T), precision.c_str(), recompute.c_str(),
              ctx.threads().size());
  std::printf("  gemm kernel          %s\n", kernel.c_str());
  std::printf("  step (median of %lld)  %10.1f ms\n", static_cast<long long>(steps), med * 1e3);
  std::printf("  throughput           %10.1f tokens/s\n", tps);
  std::printf("  achieved             %10.2f GFLOP/s  (%.1f%% of %s peak %.1f GFLOP/s)\n", gflops,
              100.0 * mfu, use_bf16 ? "bf16" : "f32", peak);
  if (!cuda && mfu > 1.0) {
    // No step outruns the machine: the cached peak is too low (measured while busy).
    const std::time_t at = static_cast<std::time_t>(probed_at);
    char when[32] = "an unknown time";
    if (probed_at > 0) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&at));
    std::printf(
        "  note: above the cached peak probed %s, which must have run on a busy machine; "
        "`tessera probe --force` re-measures it\n",
        when);
  }
  std::printf("  peak RSS             %10.1f MiB\n", rss_mib);
  std::printf("  activation arena     %10.1f MiB\n", act_mib);
  std::printf("  energy               %s\n",
              profile::energy_text(joules, trained, meter.source_name()).c_str());
  if (per_op) {
    std::printf(
        "  ops of the timed steps (roof: the %s peak for products and attention, the f32 peak "
        "for the rest, triad bandwidth):\n",
        use_bf16 ? "bf16" : "f32");
    explain::print_op_profile(rows, "/step");
  }
  return 0;
}

}  // namespace

Command bench_train_command() {
  return {
      "train",
      "GPT-2 training-step time on random tokens: tokens/s, MFU, memory",
      {
          Flag::text("--model", "gpt2-small",
                     "a train preset (gpt2-small, llama:smollm2-135m, ...)", "NAME"),
          Flag::integer("--batch", 4, 1, 4096, "sequences per step"),
          Flag::integer("--seq", 64, 1, int64_t{1} << 20, "tokens per sequence"),
          Flag::integer("--steps", 5, 1, 100000, "timed steps (median)"),
          Flag::choice("--precision", "f32", {"f32", "bf16"},
                       "the step's precision (bf16: products and kept activations)"),
          Flag::choice("--recompute", "none", {"none", "gelu", "block"},
                       "activations recomputed in backward"),
          Flag::threads(),
          Flag::integer("--vocab-size", 50257, 1, int64_t{1} << 24, "vocabulary size"),
          Flag::choice("--device", "cpu", {"cpu", "cuda"}, "cuda: GPU 0, bf16"),
          Flag::toggle("--profile", "time every op of the timed steps: a table per op"),
          Flag::toggle("--json", "one JSON line on stdout"),
      },
      {},
      &run,
      {},
  };
}

}  // namespace tessera::cli
