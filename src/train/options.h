// Every setting of a training run, with JSON round-trip (stored in run.json and in checkpoints so
// that resuming rebuilds exactly the same run).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "model/lora.h"
#include "ops/observe.h"

namespace tessera::train {

struct TrainOptions {
  // Model: a preset name; n_layer/n_head/n_embd/max_seq override the preset when > 0.
  std::string model = "gpt2-small";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, max_seq = 0;
  int64_t vocab_size = 0;  // 0: the data's vocabulary; otherwise must be >= it
  std::string init_from;   // a model file (GGUF or HF folder) to start from (overrides the preset)
  // LoRA (lora_rank > 0): adapters of that rank on lora_targets ("q,k,v,o", ...; lora.h) of the
  // init_from model, frozen in its stored type; scale lora_alpha / rank (0: alpha = 2 rank).
  int64_t lora_rank = 0;
  double lora_alpha = 0;
  std::string lora_targets = "q,k,v,o";

  std::string data_dir, out_dir;
  int64_t batch = 8, seq = 512, grad_accum = 1;
  std::string precision = "f32", recompute = "none";
  // cpu, or cuda: the whole step on GPU 0 through the CUDA ops backend (bf16, any recompute).
  // May change on resume (checkpoints are the same either way).
  std::string device = "cpu";
  // Sees every op of the steps, and their scopes (forward, loss, backward, optimizer, the
  // forward's stages); null: none.
  ops::OpObserver* observer = nullptr;
  // The products' peak in GFLOP/s for the MFU of the progress lines: 0 takes the CPU's probed
  // peak on cpu and shows none on another device (the caller knows the device's).
  double peak_gflops = 0;

  double lr = 6e-4, min_lr_fraction = 0.1;
  int64_t warmup = 0;
  std::string schedule = "cosine";
  int64_t steps = 1000;  // total optimizer steps of the run (on resume: the new total)
  // Stop once this step is reached, checkpointing as at the end but without the final model,
  // as if interrupted (time-boxed jobs, resume tests); 0: off. Not inherited on resume.
  int64_t stop_at = 0;

  double weight_decay = 0.1, clip = 1.0, beta1 = 0.9, beta2 = 0.95;

  int64_t eval_every = 100, eval_batches = 8;
  int64_t early_stop = 0;        // patience in evaluations; 0 disables early stopping
  int64_t checkpoint_every = 0;  // 0: only at the end
  int64_t threads = 0;           // 0: all hardware threads (the default pool)
  uint64_t seed = 1337;
  int64_t log_every = 10;  // plain progress lines every N steps when stdout is not a TTY
  bool quiet = false;      // no progress output and no peak probe (tests)
  bool save_model = true;  // write <out>/model/ (HF layout) at the end
};

std::string options_to_json(const TrainOptions& o);
// Throws Error naming `source` and the field on malformed input; missing fields keep defaults.
TrainOptions options_from_json(const std::string& json, const std::string& source);
// What validate_options calls an option in its messages, given the field's name in run.json
// ("grad_accum"): a command line passes one that gives its own name for it.
using OptionNamer = std::string (*)(std::string_view field);
// What `namer` calls the option of `field` (null: the field's name).
std::string option_name(OptionNamer namer, std::string_view field);
// Checks ranges, names (precision, recompute, schedule) and combinations; throws naming each
// option as `namer` calls it (null: the field's name).
void validate_options(const TrainOptions& o, OptionNamer namer = nullptr);
// The adapters o asks for (lora_rank > 0), alpha's default applied.
model::LoraSpec lora_spec(const TrainOptions& o);

}  // namespace tessera::train
