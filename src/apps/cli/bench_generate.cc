// `tessera bench generate`: prefill and decode speed of a model on this machine, and where they
// sit on the roofline: decode as weight bytes per token x tokens/s over the probed memory
// bandwidth, prefill as GFLOP/s over the probed FMA peak; then batched decode for several
// batch sizes (memory-bound at 1, compute-bound as the batch grows).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/bench.h"
#include "apps/cli/infer_flags.h"
#include "apps/cli/timed_decode.h"
#include "backend/cpu/gemm.h"
#include "backend/device.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "explain/op_profile.h"
#include "infer/engine.h"
#include "model/synthetic.h"
#include "ops/op_tally.h"
#include "profile/power.h"
#include "profile/probe.h"
#include "profile/timer.h"

namespace tessera::cli {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A phase's time by stage of the forward pass (model::Stage), and the bytes each stage's ops
// moved, from the scopes an observer summed.
struct StageSplit {
  double seconds[infer::kNumStages] = {}, bytes[infer::kNumStages] = {};
  double matmul_seconds() const {
    double t = 0;
    for (int i = 0; i < infer::kNumStages; ++i)
      if (static_cast<infer::Stage>(i) != infer::Stage::attention) t += seconds[i];
    return t;
  }
  double attention_seconds() const { return seconds[static_cast<int>(infer::Stage::attention)]; }
};

StageSplit stage_split(const ops::OpTally& t) {
  StageSplit s;
  for (const ops::ScopeTotal& sc : t.scopes())
    for (int i = 0; i < infer::kNumStages; ++i)
      if (sc.name == infer::stage_name(static_cast<infer::Stage>(i))) {
        s.seconds[i] += sc.seconds;
        s.bytes[i] += sc.bytes;
      }
  return s;
}

int run(const Args& a) {
  const EngineFlags ef = parse_engine_flags(a);
  const int64_t prompt_len = a.i64("--prompt");
  const int64_t gen = a.i64("--gen");
  const int64_t reps = a.i64("--reps");
  const std::vector<int64_t> batches = a.ints("--batch");  // never empty: the table refuses ""
  const int64_t batch_prompt = a.i64("--batch-prompt");
  const bool json = a.on("--json");
  const bool per_op = a.on("--profile");
  TS_CHECK(!per_op || !ef.cuda,
           "--profile places each op against the CPU's roofs; on --device cuda the decode "
           "stages are reported without it");
  // The stages are scopes an observer sums. On the CPU it watches every rep (a clock read per
  // op); on CUDA it watches a decode pass of its own (below), so that the reps replay graphs.
  const bool observe = !ef.cuda;

  // No tokenizer needed: the prompt is random token ids (synthetic models carry none).
  LoadedModel m;
  if (model::is_synthetic_spec(ef.model_path)) {
    m.model = model::make_synthetic_decoder(ef.model_path);
    if (engine_load_options(ef).cpu_layout) model::use_cpu_layout(m.model);
  } else {
    m.model = model::load_decoder(ef.model_path, engine_load_options(ef));
  }
  apply_lora_flag(ef, m.model);
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  EngineFlags sized = ef;
  if (sized.ctx == 0)
    sized.ctx = std::min(m.model.config.max_ctx, std::max(prompt_len + gen, batch_prompt + gen));
  infer::EngineOptions eo = engine_options(sized, m.model);
  // Cache for the longest of the two phases (blocks rounded up per sequence).
  const int64_t bt = eo.block_tokens;
  eo.kv_tokens =
      std::max((prompt_len + gen + bt - 1) / bt, max_batch * ((batch_prompt + gen + bt - 1) / bt)) *
      bt;
  eo.max_sequences = max_batch + 1;  // the batch's copies and their source
  ops::TallySwitch observer;         // prefill's and decode's ops and stages, tallied apart
  ops::OpTally prefill_ops, decode_ops, batched_ops, stage_ops;  // batched: the largest batch's
  observer.synchronize = ef.cuda;  // a device's ops timed on the device (each waited for)
  eo.ctx.observer = &observer;
  infer::Engine engine(m.model, eo);
  const int threads = eo.ctx.threads().size();
  // The roofline's yardsticks: the CPU's probed triad bandwidth and FMA peak, or on CUDA the
  // GPU's measured read bandwidth and its dense bf16 tensor-core peak.
  struct Peaks {
    double gbs = 0, gflops = 0, f32_gflops = 0;  // gflops: the products' peak
    std::string flops_kind = "f32";
  } peaks;
  if (ef.cuda) {
    peaks.gbs = backend::cuda_read_bandwidth() / 1e9;
    peaks.gflops = backend::cuda_bf16_peak_flops() / 1e9;
  } else {
    // The bandwidth is measured now, beside the run: a cached reading from another hour of a
    // shared machine can be far off (one read 14.8 GB/s on two threads against 21.6-27.5
    // fresh). The FMA peak moves little and comes from the cache.
    const profile::MachinePeaks p = profile::cached_peaks(threads);
    peaks.gbs = profile::measure_triad_gbs(threads);
    peaks.gflops = peaks.f32_gflops = p.f32_gflops_all;
    // bf16 weights run prefill on the bf16 dot-product kernel where the CPU has one: its peak.
    const bool bf16_weights =
        !m.model.weights.layers.empty() && m.model.weights.layers[0].w_up.type == DType::bf16;
    if (bf16_weights && p.bf16_gflops_all > 0 &&
        cpu::gemm_kernel_for(true, prompt_len) == cpu::GemmKernel::bf16_dot) {
      peaks.gflops = p.bf16_gflops_all;
      peaks.flops_kind = "bf16 dot";
    }
  }
  profile::reset_peak_rss();  // the probe's arrays are freed; they are not the model's memory
  const model::DecoderConfig& c = m.model.config;

  Rng rng(1234);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab)));

  // Prefill of the prompt, then decode of `gen` tokens after it, `reps` times; medians.
  // Where decode time goes (all reps): matmuls, attention, the rest (norms, RoPE, adds, the
  // cache append, thread hand-offs).
  std::vector<double> prefill_s, decode_s;
  // Energy of the batch-1 decodes, where the machine's counters can be read (-1: not here).
  const profile::EnergyMeter meter;
  double decode_joules = meter.source() == profile::EnergyMeter::Source::none ? -1 : 0;
  for (int64_t r = 0; r < reps; ++r) {
    const int32_t seq = engine.new_sequence();
    if (observe) observer.into = &prefill_ops;
    const profile::Timer t;
    engine.forward({infer::Feed{seq, prompt, false}});
    prefill_s.push_back(t.seconds());
    if (observe) observer.into = &decode_ops;
    const profile::EnergySample e0 = meter.sample();
    decode_s.push_back(timed_decode(engine, {seq}, gen));
    if (decode_joules >= 0) {
      const double j = meter.joules_between(e0, meter.sample());
      decode_joules = j < 0 ? -1 : decode_joules + j;
    }
    observer.into = nullptr;
    engine.free_sequence(seq);
  }
  double pre_total = 0, dec_total = 0;
  for (double x : prefill_s) pre_total += x;
  for (double x : decode_s) dec_total += x;
  const StageSplit pre = stage_split(prefill_ops), dec = stage_split(decode_ops);
  const double pre_frac_matmul = pre.matmul_seconds() / pre_total;
  const double pre_frac_attention = pre.attention_seconds() / pre_total;
  const double frac_matmul = dec.matmul_seconds() / dec_total;
  const double frac_attention = dec.attention_seconds() / dec_total;
  const double prefill_tps = prompt_len / median(prefill_s);
  const double decode_tps = gen / median(decode_s);
  const double bytes_per_token = static_cast<double>(m.model.weight_bytes_per_token());
  const double decode_bw = bytes_per_token * decode_tps / 1e9;
  // Attention also reads the cached keys and values of every earlier token (of the window's,
  // in a sliding-window layer): at prompt + gen/2 keys on average per decode step. Not part of
  // the weight roofline figure, but part of what the memory system carries (at long contexts, a
  // large part).
  const double kv_bytes_per_token = static_cast<double>(engine.kv_bytes_read(prompt_len + gen / 2));
  const double decode_total_bw = (bytes_per_token + kv_bytes_per_token) * decode_tps / 1e9;
  // Matmul FLOPs per prompt token (2 per weight of every layer matrix; the embedding lookup is
  // free), attention's (QK and PV over (p + 1) / 2 keys on average), and the output head's,
  // which prefill runs once: only the last prompt row's logits are asked for.
  const double layer_flops =
      2.0 *
      static_cast<double>((c.q_dim() * c.d_model * 2 + c.kv_dim() * c.d_model * 2 +
                           c.d_ff * c.d_model * (c.arch == model::DecoderArch::llama ? 3 : 2)) *
                          c.n_layers);
  const double head_flops = 2.0 * static_cast<double>(c.vocab * c.d_model);
  const double attn_flops = 4.0 * c.n_layers * c.q_dim() * (prompt_len + 1) / 2.0;
  const double prefill_flops = prompt_len * (layer_flops + attn_flops) + head_flops;
  const double prefill_gflops = prefill_flops / median(prefill_s) / 1e9;
  // Per op: prefill per prompt, decode per token; the products against the products' peak.
  std::vector<explain::OpProfileRow> prefill_rows, decode_rows;
  if (per_op) {
    // The probe's roofs, with memory's bandwidth the triad measured beside this run.
    const explain::Roofs roofs =
        explain::cpu_roofs(profile::cached_peaks(threads), threads, peaks.gbs);
    prefill_rows = explain::op_profile(prefill_ops.totals(), reps, pre_total, roofs);
    decode_rows = explain::op_profile(decode_ops.totals(), reps * gen, dec_total, roofs);
  }

  // On a device the stages are timed in a decode pass of their own: an observed op runs eagerly
  // and is waited for, where the reps above replay CUDA graphs. Its tokens/s is reported with it
  // (below the graphs' figure by what the graphs and the overlap of launches save).
  StageSplit stages = dec;
  double stage_seconds = dec_total, stage_tokens = static_cast<double>(gen * reps),
         stage_tps = decode_tps;
  if (ef.cuda) {
    const int32_t seq = engine.new_sequence();
    engine.forward({infer::Feed{seq, prompt, false}});
    observer.into = &stage_ops;
    stage_seconds = timed_decode(engine, {seq}, gen);
    observer.into = nullptr;
    stage_tps = gen / stage_seconds;
    stages = stage_split(stage_ops);
    engine.free_sequence(seq);
    stage_tokens = static_cast<double>(gen);
  }

  struct BatchRow {
    int64_t batch;
    double tps;
  };
  std::vector<BatchRow> batch_rows;
  std::vector<explain::OpProfileRow> batched_rows;  // per step of the largest batch (--profile)
  for (int64_t b : batches) {
    std::vector<int32_t> seqs;
    std::vector<infer::Feed> feeds;
    const std::vector<int32_t> p(prompt.begin(),
                                 prompt.begin() + std::min(batch_prompt, prompt_len));
    for (int64_t i = 0; i < b; ++i) seqs.push_back(engine.new_sequence());
    for (int32_t s : seqs) feeds.push_back(infer::Feed{s, p, false});
    engine.forward(feeds);
    if (per_op && b == max_batch) observer.into = &batched_ops;
    const double secs = timed_decode(engine, seqs, gen);
    observer.into = nullptr;
    batch_rows.push_back({b, static_cast<double>(b * gen) / secs});
    if (per_op && b == max_batch)
      batched_rows = explain::op_profile(
          batched_ops.totals(), gen, secs,
          explain::cpu_roofs(profile::cached_peaks(threads), threads, peaks.gbs));
    for (int32_t s : seqs) engine.free_sequence(s);
  }

  if (json) {
    std::printf(
        "{\"model\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"prompt_tokens\": %lld, "
        "\"gen_tokens\": %lld, "
        "\"prefill_tokens_per_s\": %.3f, \"prefill_gflops\": %.2f, "
        "\"prefill_peak_fraction\": %.4f, \"decode_tokens_per_s\": %.3f, "
        "\"decode_gbs\": %.3f, \"decode_bandwidth_fraction\": %.4f, "
        "\"weight_bytes_per_token\": %.0f, \"kv_bytes_per_token\": %.0f, "
        "\"decode_total_bandwidth_fraction\": %.4f, \"peak_gbs\": %.2f, \"peak_gflops\": %.1f, "
        "\"batched\": [",
        ef.model_path.c_str(), engine.device_description().c_str(), threads, (long long)prompt_len,
        (long long)gen, prefill_tps, prefill_gflops, prefill_gflops / peaks.gflops, decode_tps,
        decode_bw, decode_bw / peaks.gbs, bytes_per_token, kv_bytes_per_token,
        decode_total_bw / peaks.gbs, peaks.gbs, peaks.gflops);
    for (size_t i = 0; i < batch_rows.size(); ++i)
      std::printf("%s{\"batch\": %lld, \"decode_tokens_per_s\": %.3f}", i ? ", " : "",
                  (long long)batch_rows[i].batch, batch_rows[i].tps);
    // The split is timed on the host around each op: on CUDA the launches return at once, so
    // there is no split to report.
    auto split = [&](double mm, double at) {
      char buf[128];
      if (ef.cuda) return std::string("null");
      std::snprintf(buf, sizeof buf, "{\"matmul\": %.4f, \"attention\": %.4f, \"other\": %.4f}", mm,
                    at, 1 - mm - at);
      return std::string(buf);
    };
    // Per stage of decode: its share of the decode time and the bytes its ops moved per second
    // of its own time (the products' weights; attention's cached keys and values).
    // (On CUDA from the eager pass with events between stages; its tokens/s beside it.)
    std::printf("], \"decode_stages\": ");
    for (int i = 0; i < infer::kNumStages; ++i) {
      const double sec = stages.seconds[i];
      std::printf("%s\"%s\": {\"time_fraction\": %.4f, \"gbs\": %.3f}", i ? ", " : "{",
                  infer::stage_name(static_cast<infer::Stage>(i)), sec / stage_seconds,
                  sec > 0 ? stages.bytes[i] / sec / 1e9 : 0.0);
    }
    std::printf("}, \"decode_stages_tokens_per_s\": %.3f", stage_tps);
    if (decode_joules >= 0)
      std::printf(", \"decode_joules_per_token\": %.6g, \"energy_source\": \"%s\"",
                  decode_joules / static_cast<double>(gen * reps), meter.source_name());
    else
      std::printf(", \"decode_joules_per_token\": null");
    std::printf(
        ", \"decode_time_split\": %s, \"prefill_time_split\": %s, "
        "\"kv_cache_bytes\": %lld, \"file_weight_bytes\": %lld, \"peak_rss_bytes\": %lld, "
        "\"huge_page_bytes\": %lld",
        split(frac_matmul, frac_attention).c_str(),
        split(pre_frac_matmul, pre_frac_attention).c_str(),
        static_cast<long long>(engine.kv_bytes()),
        static_cast<long long>(m.model.total_weight_bytes()),
        static_cast<long long>(profile::peak_rss_bytes()),
        static_cast<long long>(profile::huge_page_bytes()));
    if (per_op)
      std::printf(", \"prefill_ops\": %s, \"decode_ops\": %s, \"batched_decode_ops\": %s",
                  explain::op_profile_json(prefill_rows).c_str(),
                  explain::op_profile_json(decode_rows).c_str(),
                  explain::op_profile_json(batched_rows).c_str());
    std::printf("}\n");
    return 0;
  }
  std::printf("model %s (%s) on %s, %d threads; peaks: %.1f GB/s %s, %.1f GFLOP/s %s\n",
              c.name.c_str(), ef.model_path.c_str(), engine.device_description().c_str(), threads,
              peaks.gbs, ef.cuda ? "read" : "triad (measured now)", peaks.gflops,
              ef.cuda ? "bf16 tensor" : peaks.flops_kind.c_str());
  std::printf("prefill %lld tokens: %.1f tokens/s, %.1f GFLOP/s (%.0f%% of peak)\n",
              (long long)prompt_len, prefill_tps, prefill_gflops,
              100 * prefill_gflops / peaks.gflops);
  std::printf(
      "decode %lld tokens: %.1f tokens/s, %.2f GB/s of weights (%.1f MB/token) = %.0f%% of "
      "bandwidth; with the KV cache reads (%.1f MB/token) %.0f%%\n",
      (long long)gen, decode_tps, decode_bw, bytes_per_token / 1e6, 100 * decode_bw / peaks.gbs,
      kv_bytes_per_token / 1e6, 100 * decode_total_bw / peaks.gbs);
  if (!ef.cuda) {
    std::printf("prefill time: %.0f%% matmuls, %.0f%% attention, %.0f%% other\n",
                100 * pre_frac_matmul, 100 * pre_frac_attention,
                100 * (1 - pre_frac_matmul - pre_frac_attention));
    std::printf("decode time: %.0f%% matmuls, %.0f%% attention, %.0f%% other\n", 100 * frac_matmul,
                100 * frac_attention, 100 * (1 - frac_matmul - frac_attention));
  }
  // Each stage's rate over its own time shows which products fall short of the roofline.
  if (ef.cuda)
    std::printf("decode stages (each op waited for, eager launches: %.1f tokens/s):", stage_tps);
  else
    std::printf("decode stages:");
  for (int i = 0; i < infer::kNumStages; ++i) {
    const double sec = stages.seconds[i];
    std::printf(" %s %.0f%% %.0f us", infer::stage_name(static_cast<infer::Stage>(i)),
                100 * sec / stage_seconds, 1e6 * sec / stage_tokens);
    if (stages.bytes[i] > 0 && sec > 0) std::printf(" %.1f GB/s", stages.bytes[i] / sec / 1e9);
    std::printf(i + 1 < infer::kNumStages ? ";" : "\n");
  }
  if (decode_joules >= 0)
    std::printf(
        "decode energy: %s\n",
        profile::energy_text(decode_joules, static_cast<double>(gen * reps), meter.source_name())
            .c_str());
  for (const BatchRow& r : batch_rows)
    std::printf("batched decode, %4lld sequences: %8.1f tokens/s (%.2fx batch 1)\n",
                (long long)r.batch, r.tps, r.tps / decode_tps);
  if (per_op) {
    std::printf(
        "prefill ops, per %lld-token prompt (roofs: the probe's, memory's the triad measured "
        "now):\n",
        (long long)prompt_len);
    explain::print_op_profile(prefill_rows, "/prompt");
    std::printf("decode ops, per token:\n");
    explain::print_op_profile(decode_rows, "/token");
    std::printf("decode ops at batch %lld, per step:\n", static_cast<long long>(max_batch));
    explain::print_op_profile(batched_rows, "/step");
  }
  if (ef.cuda) {  // the cache lives on the device; host memory holds the weights' file copy
    std::printf("memory: %s; host peak RSS %.1f MB\n", engine.device_description().c_str(),
                profile::peak_rss_bytes() / 1e6);
    return 0;
  }
  std::printf(
      "memory: peak RSS %.1f MB = weights %.1f MB + KV cache %.1f MB + %.1f MB other; %.1f MB "
      "on huge pages\n",
      profile::peak_rss_bytes() / 1e6, m.model.total_weight_bytes() / 1e6, engine.kv_bytes() / 1e6,
      (profile::peak_rss_bytes() - m.model.total_weight_bytes() - engine.kv_bytes()) / 1e6,
      profile::huge_page_bytes() / 1e6);
  return 0;
}

}  // namespace

Command bench_generate_command() {
  return {
      "generate",
      "prefill and decode tokens/s of a model, on the roofline; batched decode",
      join({engine_flags(),
            {
                Flag::text("--model", kDefaultModel,
                           "a .gguf file, a Hugging Face folder or synthetic:SIZE:TYPE", "PATH"),
                Flag::integer("--prompt", 512, 1, int64_t{1} << 20, "prompt length in tokens"),
                Flag::integer("--gen", 128, 1, int64_t{1} << 20, "tokens decoded per repetition"),
                Flag::integer("--reps", 3, 1, 1000, "repetitions (medians)"),
                Flag::int_list("--batch", "1", 1, 4096, "batch sizes of the batched decode"),
                Flag::integer("--batch-prompt", 32, 1, int64_t{1} << 20,
                              "prompt tokens per sequence of the batched decode"),
                Flag::toggle("--profile", "time every op of prefill and decode: a table per op"),
                Flag::toggle("--json", "one JSON object on stdout"),
            }}),
      {},
      &run,
      {},
  };
}

}  // namespace tessera::cli
