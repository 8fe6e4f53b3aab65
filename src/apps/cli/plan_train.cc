// `tessera plan --train`: a GPT-2 training step's memory and time, predicted; --check runs
// `tessera bench train` with the same shape in a child process and prints it beside.
#include "apps/cli/plan_train.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "explain/train_plan.h"
#include "profile/probe.h"

namespace tessera::cli {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  TS_CHECK(in, "--device ", path, ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GB", bytes / 1e9);
  return buf;
}

// `tessera bench train ... --json` of this binary, its one JSON line parsed.
nlohmann::json bench_train(const std::string& args) {
  std::array<char, 4096> exe{};
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  TS_CHECK(n > 0, "--check: cannot find this program's path");
  const std::string cmd =
      std::string(exe.data(), static_cast<size_t>(n)) + " bench train " + args + " --json 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  TS_CHECK(p, "--check: cannot run bench train");
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  TS_CHECK(rc == 0, "--check: bench train failed: ", out.substr(0, 300));
  try {
    return nlohmann::json::parse(out.substr(out.rfind('{', out.find_last_of('}'))));
  } catch (const std::exception&) {
    fail("--check: bench train printed no JSON: ", out.substr(0, 300));
  }
}

}  // namespace

std::optional<profile::GpuSpec> plan_device(const std::string& device) {
  if (device == "cpu") return std::nullopt;
  if (const profile::GpuSpec* spec = profile::find_gpu_spec(device)) return *spec;
  std::string known;
  for (const std::string& n : profile::gpu_spec_names()) known += (known.empty() ? "" : ", ") + n;
  TS_CHECK(device.ends_with(".json"), "--device '", device, "' is not cpu, a known GPU (", known,
           ") or a spec .json file");
  return profile::gpu_spec_from_json(read_text(device), device);
}

int run_train_plan(const Args& a, const std::optional<profile::GpuSpec>& gpu, int threads,
                   double baseline_bytes) {
  explain::TrainPlanInput in;
  in.preset = a.given("--model") ? a.str("--model") : "gpt2-small";
  in.vocab = a.i64("--vocab-size");
  in.seq = a.i64("--seq");
  in.grad_accum = a.i64("--grad-accum");
  in.precision = model::parse_precision(a.str("--precision"), "--precision");
  in.recompute = model::parse_recompute(a.str("--recompute"), "--recompute");
  in.baseline_bytes = gpu ? 0 : baseline_bytes;
  const std::vector<int64_t> batches = a.ints("--batch");
  const bool json = a.on("--json"), check = a.on("--check");
  TS_CHECK(!check || !gpu, "--check measures on this machine: use --device cpu");
  const double price = a.f64("--price-per-hour");
  explain::ParallelInput par;
  par.data = a.i64("--data-parallel");
  par.pipeline = a.i64("--pipeline-stages");
  par.link_gbs = a.f64("--link-gbs");
  par.link_latency_s = a.f64("--link-latency-us") * 1e-6;
  const bool parallel = par.data > 1 || par.pipeline > 1;
  TS_CHECK(!parallel || par.link_gbs > 0,
           "--data-parallel and --pipeline-stages need --link-gbs (the link between ranks)");
  TS_CHECK(parallel || !a.given("--link-gbs"),
           "--link-gbs is for --data-parallel or --pipeline-stages above 1");
  TS_CHECK(!parallel || !check,
           "--check measures one process: drop --data-parallel and "
           "--pipeline-stages");
  explain::Machine machine;
  if (gpu) {
    machine = explain::gpu_machine(*gpu);
  } else {
    const profile::MachinePeaks peaks = profile::cached_peaks(threads);
    machine.name = "cpu: " + peaks.cpu + ", " + std::to_string(threads) + " threads";
    machine.measured = true;
    machine.roofs = explain::cpu_roofs(peaks, threads);
    machine.memory_bytes =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    const model::TrainConfig cfg = model::TrainConfig::preset(in.preset, in.vocab);
    explain::calibrate_gemm(machine, threads, std::min<int64_t>(in.seq * batches.front(), 512),
                            cfg.n_embd, in.precision == model::Precision::bf16);
  }
  if (a.f64("--watts") > 0) machine.watts = a.f64("--watts");

  nlohmann::json out = nlohmann::json::array();
  if (!json)
    std::printf("plan --train: %s, seq %lld, %s, recompute %s, grad-accum %lld, on %s\n",
                in.preset.c_str(), static_cast<long long>(in.seq), a.str("--precision").c_str(),
                a.str("--recompute").c_str(), static_cast<long long>(in.grad_accum),
                machine.name.c_str());
  for (int64_t b : batches) {
    in.batch = b;
    const explain::TrainPlan p = explain::make_train_plan(in, machine);
    const double joules = machine.watts > 0 ? machine.watts * p.step_seconds : 0;
    const double tokens = static_cast<double>(b * in.seq * in.grad_accum);
    nlohmann::json j = {{"batch", b},
                        {"params", p.params},
                        {"memory",
                         {{"params", p.param_bytes},
                          {"grads", p.grad_bytes},
                          {"adamw", p.adam_bytes},
                          {"bf16_copy", p.bf16_copy_bytes},
                          {"activations", p.activation_bytes},
                          {"baseline", p.baseline_bytes},
                          {"total", p.total()},
                          {"capacity", machine.memory_bytes}}},
                        {"fits", p.fits},
                        {"max_batch", p.max_batch},
                        {"step_seconds", p.step_seconds},
                        {"tokens_per_s", p.tokens_per_s},
                        {"micro_bound", p.micro.bound},
                        {"joules_per_million_tokens", joules > 0 ? joules / tokens * 1e6 : 0},
                        {"dollars_per_million_tokens",
                         price > 0 ? price / 3600 * p.step_seconds / tokens * 1e6 : 0}};
    std::string measured;
    if (check) {
      char args[256];
      std::snprintf(args, sizeof args,
                    "--model %s --batch %lld --seq %lld --precision %s --recompute %s "
                    "--threads %d --vocab-size %lld --steps 3",
                    in.preset.c_str(), static_cast<long long>(b), static_cast<long long>(in.seq),
                    a.str("--precision").c_str(), a.str("--recompute").c_str(), threads,
                    static_cast<long long>(in.vocab));
      const nlohmann::json m = bench_train(args);
      // bench train times one micro-step with its optimizer step: the plan's at grad-accum 1.
      const double predicted_ms = (p.micro.seconds + p.optimizer.seconds) * 1e3;
      const double ms = m.at("median_ms").get<double>(), rss = m.at("peak_rss_mib").get<double>();
      j["check"] = {{"predicted_step_ms", predicted_ms},
                    {"step_ms", ms},
                    {"peak_rss_bytes", rss * (1 << 20)},
                    {"predicted_total_bytes", p.total()}};
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "\n    check (bench train, one micro-step and the optimizer): step %.1f ms "
                    "predicted, %.1f measured (%+.1f%%); peak memory %s predicted, %s measured "
                    "(%+.1f%%)",
                    predicted_ms, ms, 100 * (predicted_ms - ms) / ms, gb(p.total()).c_str(),
                    gb(rss * (1 << 20)).c_str(),
                    100 * (p.total() - rss * (1 << 20)) / (rss * (1 << 20)));
      measured = buf;
    }
    std::string par_text;
    if (parallel) {
      const explain::ParallelPlan pp = explain::plan_parallel(p, in, par, machine.memory_bytes);
      j["parallel"] = {{"data", par.data},
                       {"pipeline", par.pipeline},
                       {"link_gbs", par.link_gbs},
                       {"memory_per_rank", pp.total()},
                       {"fits", pp.fits},
                       {"compute_s", pp.compute_s},
                       {"bubble_s", pp.bubble_s},
                       {"p2p_s", pp.p2p_s},
                       {"allreduce_s", pp.allreduce_s},
                       {"optimizer_s", pp.optimizer_s},
                       {"step_seconds", pp.step_seconds},
                       {"tokens_per_s", pp.tokens_per_s}};
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "\n    %lld ranks (data %lld x pipeline %lld, link %.0f GB/s), predicted: "
                    "memory per rank %s (%s); step %.1f ms = micro-steps %.1f + pipeline bubble "
                    "%.1f (%.0f%%) + activations between stages %.1f + gradient all-reduce %.1f "
                    "+ optimizer %.1f; %.1f tokens/s (%.2fx one rank)",
                    static_cast<long long>(pp.ranks), static_cast<long long>(par.data),
                    static_cast<long long>(par.pipeline), par.link_gbs, gb(pp.total()).c_str(),
                    pp.fits ? "fits" : "does not fit", pp.step_seconds * 1e3, pp.compute_s * 1e3,
                    pp.bubble_s * 1e3, 100 * pp.bubble_fraction, pp.p2p_s * 1e3,
                    pp.allreduce_s * 1e3, pp.optimizer_s * 1e3, pp.tokens_per_s,
                    pp.tokens_per_s / p.tokens_per_s);
      par_text = buf;
    }
    out.push_back(j);
    if (!json)
      std::printf(
          "  batch %lld: memory %s = params %s + grads %s + AdamW %s + bf16 copy %s + "
          "activations %s + process %s: %s (largest batch %lld); step %.1f ms (%.1f tokens/s; a "
          "micro-step %.1f ms, %s-bound; optimizer %.1f ms)%s\n",
          static_cast<long long>(b), gb(p.total()).c_str(), gb(p.param_bytes).c_str(),
          gb(p.grad_bytes).c_str(), gb(p.adam_bytes).c_str(), gb(p.bf16_copy_bytes).c_str(),
          gb(p.activation_bytes).c_str(), gb(p.baseline_bytes).c_str(),
          p.fits ? "fits" : "does not fit", static_cast<long long>(p.max_batch),
          p.step_seconds * 1e3, p.tokens_per_s, p.micro.seconds * 1e3, p.micro.bound.c_str(),
          p.optimizer.seconds * 1e3, measured.c_str());
    if (!json && parallel) std::printf("%s\n", par_text.c_str() + 1);
  }
  if (json)
    std::printf("%s\n", nlohmann::json{{"device", machine.name}, {"plans", out}}.dump(1).c_str());
  return 0;
}

}  // namespace tessera::cli
