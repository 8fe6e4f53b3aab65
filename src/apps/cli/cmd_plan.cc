// `tessera plan`: before a run, whether the model, its KV cache and buffers fit, the largest
// batch and context that do, prefill and decode tokens/s per batch with where the time goes, the
// batch past which decode stops scaling and why, and joules and dollars per million tokens.
// --check runs the engine on this CPU and prints the prediction beside the measurement.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "apps/cli/plan_train.h"
#include "apps/cli/timed_decode.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "explain/plan.h"
#include "explain/report_html.h"
#include "infer/engine.h"
#include "model/synthetic.h"
#include "ops/quant.h"
#include "profile/timer.h"

namespace tessera::cli {
namespace {

using explain::Machine;
using explain::Plan;
using explain::PlanInput;
using explain::StepPrediction;

// "1.23 GB"
std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GB", bytes / 1e9);
  return buf;
}

// The engine's prompt chunk on the CPU: enough rows to saturate the products of every type the
// layers store (as the engine picks it).
int64_t cpu_prefill_rows(const model::DecoderModel& m) {
  ops::Context ctx;
  int64_t rows = 0;
  for (const model::WeightRef* w : m.weights.layers.at(0).matrices())
    if (w->present()) rows = std::max(rows, ops::matmul_wt_saturating_rows(ctx, w->type));
  return rows > 0 ? rows : 512;
}

struct Measured {
  int64_t batch = 0;
  double decode_tps = 0, prefill_tps = 0;
};

// Runs the engine: one sequence with a prompt of context - gen random tokens (its prefill
// timed), then for each batch that many copies of it (their keys and values in blocks of their
// own, so decode reads as many caches as sequences) and gen decode steps of all of them
// together (timed).
std::vector<Measured> measure(const model::DecoderModel& m, const PlanInput& in, int threads,
                              int64_t gen, double* peak_rss) {
  ThreadPool pool(threads);
  infer::EngineOptions eo;
  eo.ctx.pool = &pool;
  eo.max_ctx = in.context;
  eo.kv_type = in.kv_type;
  eo.block_tokens = in.block_tokens;
  eo.max_rows = in.prefill_rows;
  const int64_t biggest = *std::max_element(in.batches.begin(), in.batches.end());
  const int64_t blocks = (in.context + in.block_tokens - 1) / in.block_tokens;
  eo.kv_tokens = (biggest + 1) * blocks * in.block_tokens;  // the copies and their source
  infer::Engine engine(m, eo);
  Rng rng(7);
  const int64_t V = m.config.vocab, P = in.context - gen;
  std::vector<int32_t> prompt(static_cast<size_t>(P));
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  const int32_t source = engine.new_sequence();
  const profile::Timer prefill;
  engine.forward({infer::Feed{source, prompt, false}});
  const double prefill_tps = static_cast<double>(P) / prefill.seconds();
  std::vector<Measured> out;
  for (int64_t b : in.batches) {
    Measured r;
    r.batch = b;
    r.prefill_tps = prefill_tps;
    std::vector<int32_t> seqs;
    for (int64_t i = 0; i < b; ++i) seqs.push_back(engine.copy_sequence(source));
    const double seconds = timed_decode(engine, seqs, gen);
    r.decode_tps = static_cast<double>(b * gen) / seconds;
    for (int32_t s : seqs) engine.free_sequence(s);
    out.push_back(r);
  }
  *peak_rss = static_cast<double>(profile::peak_rss_bytes());
  return out;
}

nlohmann::json step_json(const StepPrediction& s) {
  nlohmann::json ops = nlohmann::json::array();
  for (const explain::OpPrediction& o : s.ops)
    ops.push_back({{"op", o.op.op},
                   {"shape", o.op.shape},
                   {"dtype", o.op.dtype},
                   {"scope", o.op.scope},
                   {"calls", o.op.calls},
                   {"flops", o.op.flops},
                   {"bytes", o.op.bytes},
                   {"seconds", o.seconds()},
                   {"roof", o.roof.roof()},
                   {"compute_bound", o.roof.compute_bound()}});
  return {{"sequences", s.sequences},
          {"rows", s.rows},
          {"context", s.context},
          {"seconds", s.seconds},
          {"tokens_per_s", s.tokens_per_s},
          {"weights_s", s.weights_s},
          {"kv_s", s.kv_s},
          {"compute_s", s.compute_s},
          {"overhead_s", s.overhead_s},
          {"attention_s", s.attention_s},
          {"bound", s.bound},
          {"ops", ops}};
}

int run(const Args& a) {
  const double baseline = static_cast<double>(profile::current_rss_bytes());
  const std::string path = a.str("--model"), device = a.str("--device");
  const int threads =
      static_cast<int>(a.i64("--threads") > 0 ? a.i64("--threads") : default_pool().size());
  const std::string kv = a.str("--kv-type");
  const double price = a.f64("--price-per-hour"), watts_flag = a.f64("--watts");
  const bool json = a.on("--json"), check = a.on("--check");
  TS_CHECK(!check || device == "cpu", "--check measures on this machine: use --device cpu");

  // The device first: a bad name or spec file is refused before any loading.
  const std::optional<profile::GpuSpec> gpu = plan_device(device);
  // Flags of the other kind of plan are refused, never ignored.
  const bool train = a.on("--train");
  for (const char* f : {"--seq", "--precision", "--recompute", "--grad-accum", "--vocab-size",
                        "--data-parallel", "--pipeline-stages", "--link-gbs", "--link-latency-us"})
    TS_CHECK(train || !a.given(f), f, " plans training: add --train");
  for (const char* f : {"--context", "--kv-type", "--gen", "--html"})
    TS_CHECK(!train || !a.given(f), f, " is for an inference plan, not --train");
  if (train) return run_train_plan(a, gpu, threads, baseline);

  // The model as a map of its file: its tensors' types and shapes, no bytes read.
  model::DecoderLoadOptions lo;
  lo.mmap = true;
  const model::DecoderModel m = model::is_synthetic_spec(path) ? model::make_synthetic_decoder(path)
                                                               : model::load_decoder(path, lo);
  PlanInput in;
  in.context = a.i64("--context");
  TS_CHECK(in.context <= m.config.max_ctx, "--context ", in.context,
           " is longer than the model's context length ", m.config.max_ctx);
  in.batches = a.ints("--batch");
  in.kv_type = kv == "f16" ? DType::f16 : DType::f32;
  in.baseline_bytes = device == "cpu" ? baseline : 0;
  Machine machine;
  if (!gpu) {
    in.prefill_rows = cpu_prefill_rows(m);
    machine = explain::cpu_machine(profile::cached_peaks(threads), threads, m, in.prefill_rows,
                                   in.kv_type, in.context);
  } else {
    in.prefill_rows = 512;
    machine = explain::gpu_machine(*gpu);
  }
  if (watts_flag > 0) {
    machine.watts = watts_flag;
    machine.watts_source = "--watts";
  }
  const Plan plan = explain::make_plan(m, machine, in);

  // Energy and money per million generated tokens at each batch.
  auto per_million = [&](double tokens_per_s, double* joules, double* dollars) {
    const double s = tokens_per_s > 0 ? 1e6 / tokens_per_s : 0;
    *joules = machine.watts > 0 ? machine.watts * s : 0;
    *dollars = price > 0 ? price / 3600.0 * s : 0;
  };

  std::vector<Measured> measured;
  double peak_rss = 0, check_rss0 = 0;
  explain::MemoryPrediction check_memory;
  model::DecoderModel loaded;
  if (check) {
    // The check's own prediction: the process as it stands now, plus what the engine loads.
    check_rss0 = static_cast<double>(profile::current_rss_bytes());
    profile::reset_peak_rss();
    PlanInput now = in;
    now.baseline_bytes = check_rss0;
    check_memory = explain::predict_memory(  // the copies and the sequence they copy
        m, now, *std::max_element(in.batches.begin(), in.batches.end()) + 1, in.context);
    // The engine's own load: read into memory, in the CPU's layout.
    model::DecoderLoadOptions el;
    el.cpu_layout = true;
    if (model::is_synthetic_spec(path)) {
      loaded = model::make_synthetic_decoder(path);
      model::use_cpu_layout(loaded);
    } else {
      loaded = model::load_decoder(path, el);
    }
    measured = measure(loaded, in, threads, a.i64("--gen"), &peak_rss);
  }

  if (const std::string html = a.str("--html"); !html.empty()) {
    std::vector<std::string> notes{
        path + " on " + machine.name + ", context " + std::to_string(in.context),
        "memory at the largest batch: " + gb(plan.memory.total()) + " of " +
            gb(machine.memory_bytes) + (plan.fits ? ": fits" : ": does not fit"),
        "prefill " + std::to_string(static_cast<int64_t>(plan.prefill_tokens_per_s)) + " tokens/s"};
    if (plan.knee_batch > 0)
      notes.push_back("decode stops scaling past batch " + std::to_string(plan.knee_batch) + ": " +
                      plan.knee_reason);
    explain::RoofLines lines;
    if (gpu) {
      lines.memory.emplace_back("HBM", gpu->hbm_gbs);
      lines.compute.emplace_back("bf16 tensor", gpu->bf16_dense_tflops * 1e3);
    } else {
      lines = explain::roof_lines(profile::cached_peaks(threads));
    }
    std::ofstream f(html);
    f << explain::plan_html("plan: " + m.config.name, notes, plan, lines);
    TS_CHECK(f.good(), "--html ", html, ": cannot write");
  }
  if (json) {
    nlohmann::json j = {{"model", path},
                        {"device", machine.name},
                        {"measured_roofs", machine.measured},
                        {"attention_gbs", machine.attention_gbs},
                        {"context", in.context},
                        {"kv_type", kv},
                        {"prefill_rows", in.prefill_rows},
                        {"memory",
                         {{"weights", plan.memory.weights},
                          {"kv_per_token", plan.memory.kv_per_token},
                          {"kv", plan.memory.kv},
                          {"activations", plan.memory.activations},
                          {"logits", plan.memory.logits},
                          {"baseline", plan.memory.baseline},
                          {"total", plan.memory.total()},
                          {"capacity", machine.memory_bytes}}},
                        {"fits", plan.fits},
                        {"max_batch", plan.max_batch},
                        {"max_context", plan.max_context},
                        {"prefill_tokens_per_s", plan.prefill_tokens_per_s},
                        {"knee_batch", plan.knee_batch},
                        {"knee_reason", plan.knee_reason},
                        {"watts", machine.watts},
                        {"decode", nlohmann::json::array()},
                        {"sweep", nlohmann::json::array()}};
    for (const auto& [t, b] : plan.memory.weights_by_dtype) j["memory"]["weights_by_dtype"][t] = b;
    for (const StepPrediction& s : plan.decode) {
      nlohmann::json d = step_json(s);
      double joules = 0, dollars = 0;
      per_million(s.tokens_per_s, &joules, &dollars);
      d["joules_per_million_tokens"] = joules;
      d["dollars_per_million_tokens"] = dollars;
      j["decode"].push_back(d);
    }
    for (const StepPrediction& s : plan.sweep) j["sweep"].push_back(step_json(s));
    j["prefill_chunk"] = step_json(plan.prefill);
    for (const explain::ProductRate& r : machine.product_rates) {
      nlohmann::json g;
      for (const auto& [rows, gflops] : r.gflops) g[std::to_string(rows)] = gflops;
      j["product_rates"].push_back({{"dtype", r.dtype}, {"k", r.k}, {"n", r.n}, {"gflops", g}});
    }
    if (check) {
      j["check"]["peak_rss"] = peak_rss;
      j["check"]["predicted_peak_rss"] = check_memory.total();
      for (const Measured& r : measured)
        j["check"]["batches"].push_back({{"batch", r.batch},
                                         {"decode_tokens_per_s", r.decode_tps},
                                         {"prefill_tokens_per_s", r.prefill_tps}});
    }
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }

  const model::DecoderConfig& c = m.config;
  std::printf("plan: %s (%s) on %s; context %lld, KV cache %s, prompt chunks of %lld rows\n",
              c.name.c_str(), path.c_str(), machine.name.c_str(),
              static_cast<long long>(in.context), kv.c_str(),
              static_cast<long long>(in.prefill_rows));
  if (machine.measured) {
    std::printf(
        "roofs (measured here): memory %.1f GB/s (%s), L2 %.0f GB/s, L3 %.1f GB/s; a call "
        "costs %.1f us; attention reads the cache at %.1f GB/s\n",
        machine.roofs.memory_gbs, machine.roofs.memory_name.c_str(), machine.roofs.l2_gbs,
        machine.roofs.l3_gbs, machine.call_overhead_s * 1e6, machine.attention_gbs);
    std::printf("products (GFLOP/s at 1/4/16/64/%lld rows, weights as a step reads them):",
                static_cast<long long>(in.prefill_rows));
    for (const explain::ProductRate& r : machine.product_rates) {
      std::printf("\n  %s k=%lld n=%lld:", r.dtype.c_str(), static_cast<long long>(r.k),
                  static_cast<long long>(r.n));
      for (int64_t rows : {int64_t{1}, int64_t{4}, int64_t{16}, int64_t{64}, in.prefill_rows})
        std::printf(" %.0f", r.at(rows));
    }
    std::printf("\n");
  } else {
    std::printf("roofs (datasheet): memory %.0f GB/s; %.0f W\n", machine.roofs.memory_gbs,
                machine.watts);
  }
  std::printf("memory at batch %lld: weights %s (",
              static_cast<long long>(plan.decode.back().sequences),
              gb(plan.memory.weights).c_str());
  for (size_t i = 0; i < plan.memory.weights_by_dtype.size(); ++i)
    std::printf("%s%s %s", i ? ", " : "", plan.memory.weights_by_dtype[i].first.c_str(),
                gb(plan.memory.weights_by_dtype[i].second).c_str());
  std::printf(
      "), KV cache %s (%.1f KB per token), buffers %s, logits %s, process %s = %s of %s: %s\n",
      gb(plan.memory.kv).c_str(), plan.memory.kv_per_token / 1e3,
      gb(plan.memory.activations).c_str(), gb(plan.memory.logits).c_str(),
      gb(plan.memory.baseline).c_str(), gb(plan.memory.total()).c_str(),
      gb(machine.memory_bytes).c_str(),
      plan.fits ? "fits"
                : ("does not fit, by " + gb(plan.memory.total() - machine.memory_bytes)).c_str());
  std::printf("largest batch at context %lld: %lld; longest context at batch 1: %lld\n",
              static_cast<long long>(in.context), static_cast<long long>(plan.max_batch),
              static_cast<long long>(plan.max_context));
  std::printf("prefill: %.1f tokens/s over a %lld-token prompt (last chunk %.1f ms, %s-bound)\n",
              plan.prefill_tokens_per_s, static_cast<long long>(in.context),
              plan.prefill.seconds * 1e3, plan.prefill.bound.c_str());
  std::printf("decode (per step: time bound by weights / KV cache / compute / call overhead):\n");
  std::printf("  %6s %12s %10s %9s %9s %9s %9s %8s %10s %12s %10s\n", "batch", "tokens/s",
              "step ms", "weights", "kv", "compute", "overhead", "attn", "bound", "J/Mtok",
              "$/Mtok");
  for (const StepPrediction& s : plan.decode) {
    double joules = 0, dollars = 0;
    per_million(s.tokens_per_s, &joules, &dollars);
    std::printf("  %6lld %12.1f %10.3f %8.0f%% %8.0f%% %8.0f%% %8.0f%% %7.0f%% %10s",
                static_cast<long long>(s.sequences), s.tokens_per_s, s.seconds * 1e3,
                100 * s.weights_s / s.seconds, 100 * s.kv_s / s.seconds,
                100 * s.compute_s / s.seconds, 100 * s.overhead_s / s.seconds,
                100 * s.attention_s / s.seconds, s.bound.c_str());
    if (joules > 0)
      std::printf(" %12.3g", joules);
    else
      std::printf(" %12s", "-");
    if (dollars > 0)
      std::printf(" %10.3g\n", dollars);
    else
      std::printf(" %10s\n", "-");
  }
  if (plan.knee_batch > 0)
    std::printf("decode stops scaling past batch %lld: %s\n",
                static_cast<long long>(plan.knee_batch), plan.knee_reason.c_str());
  else
    std::printf("decode still scales at batch %lld\n",
                static_cast<long long>(plan.sweep.back().sequences));
  if (machine.watts <= 0)
    std::printf("energy: no power figure for this CPU (give --watts W for joules per token)\n");
  else
    std::printf("energy: %.0f W (%s)\n", machine.watts, machine.watts_source.c_str());
  if (check) {
    std::printf("check (measured here, this engine; decode at positions %lld..%lld):\n",
                static_cast<long long>(in.context - a.i64("--gen")),
                static_cast<long long>(in.context));
    std::printf("  peak memory (from %s before loading): predicted %s, measured %s (%+.1f%%)\n",
                gb(check_rss0).c_str(), gb(check_memory.total()).c_str(), gb(peak_rss).c_str(),
                100 * (check_memory.total() - peak_rss) / peak_rss);
    const double pp = plan.prefill_tokens_per_s, mp = measured.front().prefill_tps;
    std::printf(
        "  prefill of a %lld-token prompt: predicted %.1f tokens/s, measured %.1f (%+.1f%%)\n",
        static_cast<long long>(in.context - a.i64("--gen")), pp, mp, 100 * (pp - mp) / mp);
    std::printf("  %6s %14s %14s %8s\n", "batch", "decode pred", "measured", "err");
    for (size_t i = 0; i < measured.size(); ++i) {
      const double pd = plan.decode[i].tokens_per_s, md = measured[i].decode_tps;
      std::printf("  %6lld %14.1f %14.1f %+7.1f%%\n", static_cast<long long>(measured[i].batch), pd,
                  md, 100 * (pd - md) / md);
    }
  }
  return 0;
}

const Registrar reg{Command{
    "plan",
    "predict a run before it starts: memory, fit, tokens/s per batch, the knee, energy and cost",
    {Flag::text("--model", kDefaultModel,
                "a .gguf file, a Hugging Face folder or synthetic:SIZE:TYPE", "PATH")
         .short_name("-m"),
     Flag::text("--device", "cpu",
                "cpu (measured here), h100, h200, a100, l4, rtx4090, or a spec .json", "DEV"),
     Flag::integer("--context", 4096, 1, int64_t{1} << 24, "tokens per sequence"),
     Flag::int_list("--batch", "1,8,32,128", 1, 1 << 20, "sequences decoding together"),
     Flag::threads("cpu: worker threads; 0: all cores"),
     Flag::choice("--kv-type", "f16", {"f16", "f32"}, "KV cache element type"),
     Flag::number("--price-per-hour", 0.0, 0.0, 1e6, "the machine's price, $/hour (0: none)"),
     Flag::number("--watts", 0.0, 0.0, 1e6,
                  "power while running, W (0: the GPU's TDP; none for a CPU)"),
     Flag::toggle("--check", "cpu: run the engine here and print predicted beside measured"),
     Flag::integer("--gen", 16, 1, 100000, "--check: decode steps measured per batch"),
     Flag::toggle("--json", "the plan as JSON"),
     Flag::toggle("--train", "plan a training step of a train preset (--model gpt2-small, ...)"),
     Flag::integer("--seq", 1024, 1, int64_t{1} << 20, "--train: tokens per sequence"),
     Flag::choice("--precision", "f32", {"f32", "bf16"}, "--train: the step's precision"),
     Flag::choice("--recompute", "none", {"none", "gelu", "block"},
                  "--train: activations recomputed"),
     Flag::integer("--grad-accum", 1, 1, 1 << 20, "--train: micro-batches per optimizer step"),
     Flag::integer("--vocab-size", 50257, 1, int64_t{1} << 24, "--train: vocabulary size"),
     Flag::integer("--data-parallel", 1, 1, 1 << 20,
                   "--train: ranks with a batch each (predicted)"),
     Flag::integer("--pipeline-stages", 1, 1, 1024,
                   "--train: stages the layers split over (predicted)"),
     Flag::number("--link-gbs", 0.0, 0.0, 1e6, "--train: GB/s one way between two ranks"),
     Flag::number("--link-latency-us", 5.0, 0.0, 1e6, "--train: microseconds per message"),
     Flag::text("--html", "", "also write the plan as a page: throughput against batch, roofline",
                "PATH")},
    {},
    run,
    {},
    false}};

}  // namespace
}  // namespace tessera::cli
