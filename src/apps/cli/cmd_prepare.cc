// `tessera prepare`: tokenizes a text corpus into train/val token shards for `tessera train`.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "train/data.h"

namespace tessera::cli {
namespace {

int run(const std::vector<std::string>& argv) {
  Args a(argv);
  train::PrepareOptions o;
  o.tokenizer_path = a.required("--tokenizer");
  o.input_path = a.required("--in");
  o.out_dir = a.required("--out");
  o.val_fraction = a.f64("--val-fraction", 0.01, 1e-9, 1.0 - 1e-9);
  o.min_tokens = a.i64("--seq", 64, 1, int64_t{1} << 20) + 1;
  a.finish();
  const train::PrepareStats s = train::prepare_data(o);
  std::printf("%lld documents, vocab %lld: %lld train tokens (%d shard%s), %lld val tokens -> %s\n",
              static_cast<long long>(s.documents), static_cast<long long>(s.vocab),
              static_cast<long long>(s.train_tokens), s.train_shards,
              s.train_shards == 1 ? "" : "s", static_cast<long long>(s.val_tokens),
              o.out_dir.c_str());
  return 0;
}

const Registrar reg({"prepare", "tokenize a corpus into train/val token shards", &run});

}  // namespace
}  // namespace tessera::cli
