// `tessera prepare`: tokenizes a text corpus into train/val token shards for `tessera train`.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/chat_prepare.h"
#include "core/error.h"
#include "train/data.h"

namespace tessera::cli {
namespace {

// --chat: the conversations rendered with the chat template of the model --tokenizer names.
int run_chat(const Args& a) {
  const std::string out = a.str("--out");
  const train::PrepareStats s = prepare_chat_for_model(
      "--tokenizer", a.str("--tokenizer"), a.str("--in"), out, a.f64("--val-fraction"),
      a.i64("--seq") + 1, a.on("--pad") ? a.i64("--seq") : 0);
  std::printf(
      "%lld conversations, vocab %lld: %lld train tokens, %lld val tokens, the assistant's "
      "turns counted by the loss -> %s\n",
      static_cast<long long>(s.documents), static_cast<long long>(s.vocab),
      static_cast<long long>(s.train_tokens), static_cast<long long>(s.val_tokens), out.c_str());
  return 0;
}

int run(const Args& a) {
  if (a.on("--chat")) return run_chat(a);
  TS_CHECK(!a.on("--pad"), "--pad is for --chat (conversations padded to --seq windows)");
  train::PrepareOptions o;
  o.tokenizer_path = a.str("--tokenizer");
  o.input_path = a.str("--in");
  o.out_dir = a.str("--out");
  o.val_fraction = a.f64("--val-fraction");
  o.min_tokens = a.i64("--seq") + 1;
  const train::PrepareStats s = train::prepare_data(o);
  std::printf("%lld documents, vocab %lld: %lld train tokens (%d shard%s), %lld val tokens -> %s\n",
              static_cast<long long>(s.documents), static_cast<long long>(s.vocab),
              static_cast<long long>(s.train_tokens), s.train_shards,
              s.train_shards == 1 ? "" : "s", static_cast<long long>(s.val_tokens),
              o.out_dir.c_str());
  return 0;
}

const Registrar reg({
    "prepare",
    "tokenize a corpus into train/val token shards",
    {
        Flag::text("--tokenizer", "", "a tokenizer.json, an HF folder, or a .gguf model's own",
                   "PATH")
            .required(),
        Flag::text("--in", "", "documents split at '%' or blank lines; with --chat, JSONL", "PATH")
            .required(),
        Flag::toggle("--chat", "--in is chat JSONL: the model's template, loss on the assistant"),
        Flag::toggle("--pad", "--chat: each conversation starts a --seq window (else packed)"),
        Flag::text("--out", "", "folder for the shards", "DIR").required(),
        Flag::number("--val-fraction", 0.01, 1e-9, 1.0 - 1e-9, "share of documents for validation"),
        Flag::integer("--seq", 64, 1, int64_t{1} << 20,
                      "training window: each split must hold seq + 1 tokens"),
    },
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
