// `tessera finetune`: a full or LoRA fine-tune of a model file on the user's data in one command.
// The data is prepared with the model's own tokenizer (chat JSONL rendered with its chat template
// and masked to the assistant turns, or plain text), into <out>/data, then `tessera train` runs
// from the model (--init-from), with --lora R on adapters over the model as stored. --resume
// continues the run as train does.
#include <cstdio>
#include <filesystem>
#include <string>

#include "apps/cli/args.h"
#include "apps/cli/chat_prepare.h"
#include "apps/cli/model_files.h"
#include "apps/cli/train_flags.h"
#include "core/error.h"
#include "train/data.h"
#include "train/trainer.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

// The data as shards in `dir`: a prepared folder as it is, else chat JSONL (.jsonl) or text.
std::string prepare(const std::string& model, const std::string& data, const std::string& out,
                    double val_fraction, int64_t seq, bool pad) {
  TS_CHECK(!pad || data.ends_with(".jsonl"), "--pad is for chat data (a .jsonl --data)");
  if (fs::is_directory(data)) return data;
  TS_CHECK(fs::is_regular_file(data), "--data ", data, ": no such file or folder");
  const std::string dir = (fs::path(out) / "data").string();
  train::PrepareStats s;
  if (data.ends_with(".jsonl")) {
    s = prepare_chat_for_model("-m", model, data, dir, val_fraction, seq + 1, pad ? seq : 0);
  } else {
    train::PrepareOptions o;
    o.tokenizer_path = model;
    o.input_path = data;
    o.out_dir = dir;
    o.val_fraction = val_fraction;
    o.min_tokens = seq + 1;
    s = train::prepare_data(o);
  }
  std::printf(
      "data: %lld %s, %lld train tokens, %lld validation tokens -> %s\n",
      static_cast<long long>(s.documents),
      data.ends_with(".jsonl") ? "conversations (loss on the assistant turns)" : "documents",
      static_cast<long long>(s.train_tokens), static_cast<long long>(s.val_tokens), dir.c_str());
  return dir;
}

int run(const Args& a) {
  const bool resume = a.given("--resume");
  train::TrainOptions o;
  if (resume) {
    for (const char* f : {"--model", "--data", "--out", "--val-fraction", "--pad", "--lora",
                          "--lora-alpha", "--lora-targets"})
      TS_CHECK(!a.given(f), "flag ", f,
               " cannot be given with --resume (the run's options come "
               "from its checkpoint)");
    for (const Flag& f : train_step_flags())
      TS_CHECK(!a.given(f.name), "flag ", f.name,
               " cannot be given with --resume (the run's "
               "options come from its checkpoint)");
    o = train::resume_options(a.str("--resume"));
  } else {
    const std::string model = a.required("--model"), out = a.required("--out");
    o.init_from = model;
    parse_step_options(a, o);
    o.lora_rank = a.i64("--lora");
    o.lora_alpha = a.f64("--lora-alpha");
    o.lora_targets = a.str("--lora-targets");
    for (const char* f : {"--lora-alpha", "--lora-targets"})
      TS_CHECK(o.lora_rank > 0 || !a.given(f), "flag ", f, " needs --lora RANK");
    o.out_dir = out;
    // Every flag checked before the data is prepared (the prepared folder replaces --data).
    train::TrainOptions early = o;
    early.data_dir = a.required("--data");
    parse_session_options(a, false, early);
    o.data_dir =
        prepare(model, a.required("--data"), out, a.f64("--val-fraction"), o.seq, a.on("--pad"));
  }
  parse_session_options(a, resume, o);
  const bool gguf = a.on("--gguf");
  TS_CHECK(!gguf || o.lora_rank == 0,
           "--gguf writes a full fine-tune's model; a LoRA run writes its adapter (merge it with "
           "convert --lora)");
  set_device_peak(o);
  train::Trainer t(o, resume, train_flag_of);
  const train::TrainResult r = t.run();
  const std::string folder = (fs::path(o.out_dir) / "model").string();
  if (gguf && (r.steps_done >= o.steps || r.early_stopped) && fs::is_directory(folder)) {
    // The saved folder as convert writes a GGUF: f32 weights, tokenizer and chat template.
    const LoadedModel m = load_model_and_tokenizer(folder, {}, true);
    const std::string path = (fs::path(o.out_dir) / "model.gguf").string();
    save_model(m, m.model, path, DType::f32);
    if (!o.quiet) std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}

// A fine-tune's defaults where they differ from training from scratch: a tenth of the learning
// rate (the weights already know the language), no weight decay pulling them to zero, a short
// warm-up, and evaluations often enough for short runs.
train::TrainOptions finetune_defaults() {
  train::TrainOptions o;
  o.lr = 1e-4;
  o.weight_decay = 0;
  o.warmup = 10;
  o.eval_every = 50;
  o.steps = 200;
  return o;
}

Flags finetune_flags() {
  return join(
      {{
           Flag::text("--model", "", "the model: a .gguf or HF folder (its tokenizer, template)",
                      "PATH"),
           Flag::text("--data", "", "chat .jsonl (loss on assistant turns), text, or shards",
                      "PATH"),
           Flag::text("--out", "", "the run's folder (the data, checkpoints, the model)", "DIR"),
           Flag::number("--val-fraction", 0.05, 1e-9, 1.0 - 1e-9,
                        "share of conversations (documents) held out"),
           Flag::toggle("--pad", "chat: each conversation starts a --seq window (else packed)"),
           Flag::toggle("--gguf", "also write the tuned model as <out>/model.gguf (f32)"),
           Flag::integer("--lora", 0, 0, 4096,
                         "LoRA rank R: adapters on the model frozen as stored (0: full fine-tune)"),
           Flag::number("--lora-alpha", 0.0, 0, 1e6, "LoRA scale alpha / R (0: 2 R)"),
           Flag::text("--lora-targets", "q,k,v,o", "matrices to adapt: q,k,v,o,gate,up,down, all",
                      "LIST"),
       },
       train_step_flags(finetune_defaults()),
       train_session_flags(finetune_defaults())});
}

const Registrar reg({
    "finetune",
    "fine-tune a model file (all weights, or LoRA adapters) on chat JSONL or text",
    finetune_flags(),
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
