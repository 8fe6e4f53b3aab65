// `tessera train`: trains a GPT-2 on prepared shards, or continues a run with --resume DIR.
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/train_flags.h"
#include "core/error.h"
#include "train/trainer.h"

namespace tessera::cli {

// Flags that define a run; with --resume they come from the checkpoint and may not be given.
static const char* const kRunFlags[] = {"--model",        "--n-layer",
                                        "--n-head",       "--n-embd",
                                        "--max-seq",      "--vocab-size",
                                        "--init-from",    "--data",
                                        "--out",          "--batch",
                                        "--seq",          "--grad-accum",
                                        "--precision",    "--recompute",
                                        "--lr",           "--min-lr-fraction",
                                        "--warmup",       "--schedule",
                                        "--weight-decay", "--clip",
                                        "--beta1",        "--beta2",
                                        "--eval-every",   "--eval-batches",
                                        "--early-stop",   "--checkpoint-every",
                                        "--seed"};

train::TrainOptions parse_train_options(Args& a, bool* resume) {
  train::TrainOptions o;
  constexpr int64_t kBig = int64_t{1} << 40;
  const std::string resume_dir = a.str("--resume", "");
  *resume = !resume_dir.empty();
  if (*resume) {
    for (const char* f : kRunFlags)
      TS_CHECK(!a.has(f), "flag ", f, " cannot be given with --resume (the run's options come ",
               "from ", resume_dir, "/checkpoint.safetensors; only --steps, --stop-at, ",
               "--threads, --device, --log-every and --quiet may change)");
    o = train::resume_options(resume_dir);
  } else {
    o.model = a.str("--model", o.model);
    o.n_layer = a.i64("--n-layer", 0, 0, 1024);
    o.n_head = a.i64("--n-head", 0, 0, 65536);
    o.n_embd = a.i64("--n-embd", 0, 0, 65536);
    o.max_seq = a.i64("--max-seq", 0, 0, int64_t{1} << 20);
    o.vocab_size = a.i64("--vocab-size", 0, 0, int64_t{1} << 24);
    o.init_from = a.str("--init-from", "");
    o.data_dir = a.required("--data");
    o.out_dir = a.required("--out");
    o.batch = a.i64("--batch", o.batch, 1, 1 << 20);
    o.seq = a.i64("--seq", o.seq, 1, int64_t{1} << 20);
    o.grad_accum = a.i64("--grad-accum", o.grad_accum, 1, 1 << 20);
    o.precision = a.str("--precision", o.precision);
    o.recompute = a.str("--recompute", o.recompute);
    o.lr = a.f64("--lr", o.lr, 1e-12, 10.0);
    o.min_lr_fraction = a.f64("--min-lr-fraction", o.min_lr_fraction, 0.0, 1.0);
    o.warmup = a.i64("--warmup", o.warmup, 0, kBig);
    o.schedule = a.str("--schedule", o.schedule);
    o.weight_decay = a.f64("--weight-decay", o.weight_decay, 0.0, 10.0);
    o.clip = a.f64("--clip", o.clip, 0.0, 1e12);
    o.beta1 = a.f64("--beta1", o.beta1, 0.0, 0.999999);
    o.beta2 = a.f64("--beta2", o.beta2, 0.0, 0.999999);
    o.eval_every = a.i64("--eval-every", o.eval_every, 0, kBig);
    o.eval_batches = a.i64("--eval-batches", o.eval_batches, 1, 1 << 20);
    o.early_stop = a.i64("--early-stop", o.early_stop, 0, kBig);
    o.checkpoint_every = a.i64("--checkpoint-every", o.checkpoint_every, 0, kBig);
    o.seed = static_cast<uint64_t>(a.i64("--seed", static_cast<int64_t>(o.seed), 0, kBig));
  }
  o.steps = a.i64("--steps", o.steps, 0, kBig);
  o.stop_at = a.i64("--stop-at", 0, 0, kBig);
  o.threads = a.i64("--threads", o.threads, 0, 4096);
  o.device = a.str("--device", o.device);
  o.log_every = a.i64("--log-every", o.log_every, 1, kBig);
  if (a.has("--quiet")) o.quiet = true;
  a.finish();
  train::validate_options(o);
  return o;
}

namespace {

int run(const std::vector<std::string>& argv) {
  Args a(argv, {"--quiet"});
  bool resume = false;
  const train::TrainOptions o = parse_train_options(a, &resume);
  train::Trainer t(o, resume);
  const train::TrainResult r = t.run();
  (void)r;
  return 0;
}

const Registrar reg({"train", "train a GPT-2 on prepared shards, or continue a run (--resume)",
                     &run});

}  // namespace
}  // namespace tessera::cli
