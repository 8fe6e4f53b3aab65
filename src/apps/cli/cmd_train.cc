// `tessera train`: trains a GPT-2 or Llama-shaped model on prepared shards, or continues a run
// with --resume DIR.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/profiling.h"
#include "apps/cli/train_flags.h"
#include "backend/device.h"
#include "core/error.h"
#include "train/trainer.h"

namespace tessera::cli {

namespace {
constexpr int64_t kBig = int64_t{1} << 40;
}  // namespace

Flags train_run_flags() {
  return join({train_model_flags(), train_step_flags()});
}

Flags train_model_flags() {
  const train::TrainOptions o;
  return {
      Flag::text("--model", o.model,
                 "a preset: gpt2-small, llama:smollm2-135m, ... (an unknown one lists all)",
                 "NAME"),
      Flag::integer("--n-layer", 0, 0, 1024, "layers; 0: the preset's"),
      Flag::integer("--n-head", 0, 0, 65536, "attention heads; 0: the preset's"),
      Flag::integer("--n-embd", 0, 0, 65536, "embedding width; 0: the preset's"),
      Flag::integer("--max-seq", 0, 0, int64_t{1} << 20, "longest sequence; 0: the preset's"),
      Flag::integer("--vocab-size", 0, 0, int64_t{1} << 24,
                    "vocabulary; 0: the data's (else at least it)"),
      Flag::text("--init-from", "", "a model to fine-tune (.gguf or HF folder, GPT-2 or Llama)",
                 "PATH"),
      Flag::text("--data", "", "prepared shards (tessera prepare); required without --resume",
                 "DIR"),
      Flag::text("--out", "", "the run's folder; required without --resume", "DIR"),
  };
}

Flags train_step_flags(const train::TrainOptions& o) {
  return {
      Flag::integer("--batch", o.batch, 1, 1 << 20, "sequences per micro-batch"),
      Flag::integer("--seq", o.seq, 1, int64_t{1} << 20, "tokens per sequence"),
      Flag::integer("--grad-accum", o.grad_accum, 1, 1 << 20, "micro-batches per step"),
      Flag::choice("--precision", o.precision, {"f32", "bf16"},
                   "the step's precision (bf16: products and kept activations)"),
      Flag::choice("--recompute", o.recompute, {"none", "gelu", "block"},
                   "activations recomputed in backward"),
      Flag::number("--lr", o.lr, 1e-12, 10.0, "peak learning rate"),
      Flag::number("--min-lr-fraction", o.min_lr_fraction, 0.0, 1.0,
                   "the schedule's floor as a fraction of --lr"),
      Flag::integer("--warmup", o.warmup, 0, kBig, "linear warm-up steps"),
      Flag::choice("--schedule", o.schedule, {"constant", "cosine", "onecycle"},
                   "learning-rate schedule"),
      Flag::number("--weight-decay", o.weight_decay, 0.0, 10.0, "AdamW weight decay"),
      Flag::number("--clip", o.clip, 0.0, 1e12, "gradient norm clip; 0: none"),
      Flag::number("--beta1", o.beta1, 0.0, 0.999999, "AdamW beta1"),
      Flag::number("--beta2", o.beta2, 0.0, 0.999999, "AdamW beta2"),
      Flag::integer("--eval-every", o.eval_every, 0, kBig, "steps between evaluations; 0: none"),
      Flag::integer("--eval-batches", o.eval_batches, 1, 1 << 20, "batches per evaluation"),
      Flag::integer("--early-stop", o.early_stop, 0, kBig,
                    "stop after N evaluations without improvement; 0: never"),
      Flag::integer("--checkpoint-every", o.checkpoint_every, 0, kBig,
                    "steps between checkpoints; 0: only at the end"),
      Flag::integer("--seed", static_cast<int64_t>(o.seed), 0, kBig, "random seed"),
  };
}

Flags train_session_flags(const train::TrainOptions& o) {
  return {
      Flag::text("--resume", "", "continue the run in DIR from its checkpoint", "DIR"),
      Flag::integer("--steps", o.steps, 0, kBig, "total optimizer steps (on --resume: new total)"),
      Flag::integer("--stop-at", 0, 0, kBig, "checkpoint and stop at this step; 0: off"),
      Flag::threads(),
      Flag::choice("--device", o.device, {"cpu", "cuda"}, "cuda: the whole step on GPU 0, bf16"),
      Flag::integer("--log-every", o.log_every, 1, kBig,
                    "steps between progress lines when stdout is not a terminal"),
      Flag::toggle("--quiet", "no progress output"),
  };
}

Flags train_flags() {
  return join({train_run_flags(), train_session_flags()});
}

std::string train_flag_of(std::string_view field) {
  // A flag is its field's name with dashes, but for these three.
  if (field == "data_dir") return "--data";
  if (field == "out_dir") return "--out";
  if (field == "lora_rank") return "--lora";  // finetune's
  std::string flag = "--" + std::string(field);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

train::TrainOptions parse_train_options(const Args& a, bool* resume) {
  train::TrainOptions o;
  const std::string resume_dir = a.str("--resume");
  *resume = !resume_dir.empty();
  if (*resume) {
    for (const Flag& f : train_run_flags())
      TS_CHECK(!a.given(f.name), "flag ", f.name, " cannot be given with --resume (the run's ",
               "options come from ", resume_dir, "/checkpoint.safetensors; only --steps, ",
               "--stop-at, --threads, --device, --log-every and --quiet may "
               "change)");
    o = train::resume_options(resume_dir);
  } else {
    o.model = a.str("--model");
    o.n_layer = a.i64("--n-layer");
    o.n_head = a.i64("--n-head");
    o.n_embd = a.i64("--n-embd");
    o.max_seq = a.i64("--max-seq");
    o.vocab_size = a.i64("--vocab-size");
    o.init_from = a.str("--init-from");
    o.data_dir = a.required("--data");
    o.out_dir = a.required("--out");
    parse_step_options(a, o);
  }
  parse_session_options(a, *resume, o);
  return o;
}

void parse_step_options(const Args& a, train::TrainOptions& o) {
  o.batch = a.i64("--batch");
  o.seq = a.i64("--seq");
  o.grad_accum = a.i64("--grad-accum");
  o.precision = a.str("--precision");
  o.recompute = a.str("--recompute");
  o.lr = a.f64("--lr");
  o.min_lr_fraction = a.f64("--min-lr-fraction");
  o.warmup = a.i64("--warmup");
  o.schedule = a.str("--schedule");
  o.weight_decay = a.f64("--weight-decay");
  o.clip = a.f64("--clip");
  o.beta1 = a.f64("--beta1");
  o.beta2 = a.f64("--beta2");
  o.eval_every = a.i64("--eval-every");
  o.eval_batches = a.i64("--eval-batches");
  o.early_stop = a.i64("--early-stop");
  o.checkpoint_every = a.i64("--checkpoint-every");
  o.seed = static_cast<uint64_t>(a.i64("--seed"));
}

void parse_session_options(const Args& a, bool resume, train::TrainOptions& o) {
  // Session flags override what the checkpoint holds only when given.
  if (!resume || a.given("--steps")) o.steps = a.i64("--steps");
  o.observer = wrapped_observer();  // `tessera profile` around this command
  o.stop_at = a.i64("--stop-at");
  if (!resume || a.given("--threads")) o.threads = a.i64("--threads");
  if (!resume || a.given("--device")) o.device = a.str("--device");
  if (!resume || a.given("--log-every")) o.log_every = a.i64("--log-every");
  if (a.on("--quiet")) o.quiet = true;
  train::validate_options(o, train_flag_of);
}

void set_device_peak(train::TrainOptions& o) {
  if (o.device == "cuda" && !o.quiet) o.peak_gflops = backend::cuda_bf16_peak_flops() * 1e-9;
}

namespace {

int run(const Args& a) {
  bool resume = false;
  train::TrainOptions o = parse_train_options(a, &resume);
  set_device_peak(o);
  train::Trainer t(o, resume, train_flag_of);
  const train::TrainResult r = t.run();
  (void)r;
  return 0;
}

const Registrar reg({
    "train",
    "train a GPT-2 or Llama-shaped model on prepared shards, or continue a run (--resume)",
    train_flags(),
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
