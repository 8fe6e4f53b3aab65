// `tessera prepare`: tokenizes a text corpus into train/val token shards for `tessera train`.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "core/error.h"
#include "train/data.h"

namespace tessera::cli {
namespace {

int run(const Args& a) {
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
        Flag::text("--tokenizer", "",
                   "a tokenizer.json, a Hugging Face folder with one, or a .gguf model's own",
                   "PATH")
            .required(),
        Flag::text("--in", "", "the corpus: documents split at '%' lines or blank lines", "PATH")
            .required(),
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
