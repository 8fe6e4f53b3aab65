// Flags and loading shared by the inference commands (generate, chat, perplexity, bench
// generate): the model with its tokenizer, engine options, sampling options.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "apps/cli/args.h"
#include "core/thread_pool.h"
#include "infer/chat_prompt.h"
#include "infer/engine.h"
#include "infer/loaded_model.h"
#include "infer/sampler.h"
#include "model/decoder.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {

// The default model that scripts/install-deps.sh fetches.
inline constexpr const char* kDefaultModel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

using infer::load_model_and_tokenizer;
using infer::LoadedModel;

struct EngineFlags {
  std::string model_path;
  int64_t threads = 0;  // 0: all cores
  // The engine's threads when --threads is given (else the context's default pool); shared so
  // that copies of the flags keep it alive as long as an engine built from them.
  std::shared_ptr<ThreadPool> pool;
  int64_t ctx = 0;  // 0: min(model's context, 4096)
  bool mmap = false;
  DType kv_type = DType::f16;  // --kv-type f16|f32
  bool cuda = false;           // --device cuda: the engine runs on GPU 0
  int64_t chunk_rows = 0;      // --chunk-rows: token rows per forward chunk; 0: from the weights
  std::string lora;            // --lora: a PEFT adapter folder applied at load; empty: none
};
// How the engine commands load their model: --mmap, and on the CPU the weights rearranged into
// the CPU kernels' preferred layout (model::use_cpu_layout).
model::DecoderLoadOptions engine_load_options(const EngineFlags& f);
// The table fragment of -m/--model, --lora, --threads, --ctx, --kv-type, --chunk-rows, --device,
// --mmap.
Flags engine_flags();
EngineFlags parse_engine_flags(const Args& a);
// The flags' model with its tokenizer, loaded as engine_load_options says, and --lora applied.
LoadedModel load_engine_model(const EngineFlags& f);
// Applies --lora (if given) to m, saying on stderr what it applied.
void apply_lora_flag(const EngineFlags& f, model::DecoderModel& m);
// Builds the engine options (on the flags' thread pool) for `model` (kv capacity = ctx *
// sequences).
infer::EngineOptions engine_options(const EngineFlags& f, const model::DecoderModel& model,
                                    int64_t sequences = 1);

// The table fragment of --temperature --top-k --top-p --min-p --repeat-penalty --repeat-last-n
// --frequency-penalty --presence-penalty --seed (defaults from infer::SamplingParams).
Flags sampling_flags();
infer::SamplingParams parse_sampling_flags(const Args& a);

// infer::make_prompt, with its notice (a model without a chat template) on stderr, naming the
// flags that choose otherwise.
infer::ChatPrompt make_cli_prompt(const LoadedModel& m,
                                  const std::vector<tokenizer::ChatMessage>& msgs,
                                  const std::string& system, bool raw, const std::string& format);

}  // namespace tessera::cli
