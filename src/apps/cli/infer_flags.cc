// Model + tokenizer loading and the flag parsers shared by the inference commands.
#include "apps/cli/infer_flags.h"

#include "backend/device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "apps/cli/profiling.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/lora.h"
#include "tokenizer/chat_template.h"

namespace tessera::cli {

model::DecoderLoadOptions engine_load_options(const EngineFlags& f) {
  model::DecoderLoadOptions o;
  o.mmap = f.mmap;
  // TESSERA_CPU_LAYOUT=0 keeps the file's layout (to measure what the rearrangement buys).
  const char* env = std::getenv("TESSERA_CPU_LAYOUT");
  o.cpu_layout = !f.cuda && !(env && std::string(env) == "0");
  return o;
}

Flags engine_flags() {
  return {
      Flag::text("--model", kDefaultModel, "a .gguf file or a Hugging Face folder", "PATH"),
      Flag::text("--lora", "", "a LoRA adapter folder (PEFT's files) applied at load", "DIR"),
      Flag::threads(),
      Flag::integer("--ctx", 0, 0, int64_t{1} << 24,
                    "context length in tokens; 0: the model's, at most 4096"),
      Flag::choice("--kv-type", "f16", {"f16", "f32"}, "KV cache element type"),
      Flag::integer("--chunk-rows", 0, 0, 65536,
                    "token rows per forward chunk of a long prompt; 0: chosen from the weights"),
      Flag::choice("--device", "cpu", {"cpu", "cuda"}, "cuda: GPU 0"),
      Flag::toggle("--mmap", "map the model file instead of reading it into memory"),
  };
}

EngineFlags parse_engine_flags(const Args& a) {
  EngineFlags f;
  f.model_path = a.str("--model");
  f.threads = a.i64("--threads");
  if (f.threads > 0) f.pool = std::make_shared<ThreadPool>(static_cast<int>(f.threads));
  f.ctx = a.i64("--ctx");
  f.mmap = a.on("--mmap");
  const std::string device = a.str("--device");
  // Checked here, before the model loads: a build without CUDA or a machine without a GPU says
  // so at once instead of after reading gigabytes of weights.
  f.cuda = device == "cuda";
  if (f.cuda)
    TS_CHECK(backend::cuda_device_count() > 0,
             "[cuda] --device cuda: ", backend::cuda_device_summary());
  const std::string kv = a.str("--kv-type");
  f.kv_type = kv == "f16" ? DType::f16 : DType::f32;
  // The engine's activation buffers hold this many rows (about 90 KB per row for a 1B model);
  // a longer prompt runs in chunks of it. 0 lets the engine choose (infer::EngineOptions).
  f.chunk_rows = a.i64("--chunk-rows");
  f.lora = a.str("--lora");
  TS_CHECK(!a.given("--lora") || !f.lora.empty(), "--lora needs an adapter folder");
  return f;
}

void apply_lora_flag(const EngineFlags& f, model::DecoderModel& m) {
  if (f.lora.empty()) return;
  const model::LoraSpec s = model::apply_peft_adapter(m, f.lora);
  std::string targets;
  for (model::LayerMatrix t : s.targets)
    targets += std::string(targets.empty() ? "" : ",") + model::lora_target_name(t);
  std::fprintf(stderr, "[lora] %s: rank %lld, alpha %g, on %s\n", f.lora.c_str(),
               static_cast<long long>(s.rank), s.alpha, targets.c_str());
}

LoadedModel load_engine_model(const EngineFlags& f) {
  LoadedModel m = load_model_and_tokenizer(f.model_path, engine_load_options(f));
  apply_lora_flag(f, m.model);
  return m;
}

infer::EngineOptions engine_options(const EngineFlags& f, const model::DecoderModel& model,
                                    int64_t sequences) {
  infer::EngineOptions o;
  o.ctx.pool = f.pool.get();
  o.ctx.observer = wrapped_observer();  // `tessera profile` around this command
  o.max_ctx = f.ctx > 0 ? f.ctx : std::min<int64_t>(model.config.max_ctx, 4096);
  TS_CHECK(o.max_ctx <= model.config.max_ctx, "--ctx ", o.max_ctx,
           " is longer than the model's context length ", model.config.max_ctx);
  o.kv_tokens = o.max_ctx * sequences;
  o.max_sequences = sequences;  // sliding-window layers then keep only their windows' blocks
  o.kv_type = f.kv_type;
  o.max_rows = f.chunk_rows;
  if (f.cuda) o.ctx.device = ops::Device::cuda;
  return o;
}

Flags sampling_flags() {
  const infer::SamplingParams p;
  return {
      Flag::number("--temperature", p.temperature, 0, 100, "sampling temperature; 0: greedy"),
      Flag::integer("--top-k", p.top_k, 0, int64_t{1} << 24, "keep the k most likely; 0: all"),
      Flag::number("--top-p", p.top_p, 1e-6, 1, "keep the smallest set with this much mass"),
      Flag::number("--min-p", p.min_p, 0, 0.999999, "drop tokens below min-p x p(best)"),
      Flag::number("--repeat-penalty", p.repetition_penalty, 1e-3, 100,
                   ">1 discourages tokens seen in the last --repeat-last-n"),
      Flag::integer("--repeat-last-n", p.penalty_last_n, 0, int64_t{1} << 24,
                    "history window of the penalties; 0: none"),
      Flag::number("--frequency-penalty", p.frequency_penalty, -2, 2,
                   "subtracted once per occurrence of a token"),
      Flag::number("--presence-penalty", p.presence_penalty, -2, 2,
                   "subtracted once if a token occurred"),
      Flag::integer("--seed", static_cast<int64_t>(p.seed), 0, int64_t{1} << 62,
                    "random seed of the sampler"),
  };
}

infer::SamplingParams parse_sampling_flags(const Args& a) {
  infer::SamplingParams p;
  p.temperature = static_cast<float>(a.f64("--temperature"));
  p.top_k = a.i64("--top-k");
  p.top_p = static_cast<float>(a.f64("--top-p"));
  p.min_p = static_cast<float>(a.f64("--min-p"));
  p.repetition_penalty = static_cast<float>(a.f64("--repeat-penalty"));
  p.penalty_last_n = a.i64("--repeat-last-n");
  p.frequency_penalty = static_cast<float>(a.f64("--frequency-penalty"));
  p.presence_penalty = static_cast<float>(a.f64("--presence-penalty"));
  p.seed = static_cast<uint64_t>(a.i64("--seed"));
  p.validate();
  return p;
}

infer::ChatPrompt make_cli_prompt(const LoadedModel& m,
                                  const std::vector<tokenizer::ChatMessage>& msgs,
                                  const std::string& system, bool raw, const std::string& format) {
  if (!format.empty()) tokenizer::parse_chat_format(format, "--chat-template");  // named as a flag
  infer::ChatPrompt p = infer::make_prompt(m, msgs, system, raw, format);
  if (!p.notice.empty())
    std::fprintf(stderr, "[chat] %s (choose another with --chat-template, or --raw)\n",
                 p.notice.c_str());
  return p;
}

}  // namespace tessera::cli
