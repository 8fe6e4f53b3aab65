// `tessera perplexity`: perplexity of a model on a text file, with sliding windows (every token
// scored once) or as llama.cpp's llama-perplexity scores (--scoring chunks).
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "core/error.h"
#include "core/file_io.h"
#include "infer/perplexity.h"

namespace tessera::cli {
namespace {

int run(const Args& a) {
  const EngineFlags ef = parse_engine_flags(a);
  const std::string path = a.str("--file");
  infer::PerplexityOptions po;
  po.ctx = a.i64("--ctx");
  po.stride = a.i64("--stride");
  po.max_windows = a.i64("--max-windows");
  const std::string scoring = a.str("--scoring");
  po.scoring = scoring == "chunks" ? infer::Scoring::chunks : infer::Scoring::sliding;
  const bool json = a.on("--json");
  // The window flags together, named as flags before the model loads (infer::perplexity names
  // its options' fields).
  const bool chunks = po.scoring == infer::Scoring::chunks;
  TS_CHECK(!chunks || po.ctx >= 4, "--scoring chunks needs --ctx >= 4, got ", po.ctx);
  TS_CHECK(!chunks || po.stride == 0, "--stride applies to --scoring sliding only");
  TS_CHECK(po.stride < po.ctx, "--stride ", po.stride, " must be below --ctx ", po.ctx);

  const LoadedModel m = load_engine_model(ef);
  EngineFlags sized = ef;
  sized.ctx = po.ctx;
  infer::EngineOptions eo = engine_options(sized, m.model);
  if (eo.max_rows > po.ctx) eo.max_rows = po.ctx;  // 0 (chosen by the engine) stays
  infer::Engine engine(m.model, eo);
  std::vector<int32_t> tokens;
  if (m.tok.special_tokens().add_bos && m.tok.special_tokens().bos >= 0)
    tokens.push_back(m.tok.special_tokens().bos);
  const std::vector<int32_t> text = m.tok.encode_ordinary(read_text_file(path));
  tokens.insert(tokens.end(), text.begin(), text.end());
  if (m.tok.special_tokens().add_bos) po.bos = m.tok.special_tokens().bos;  // as llama.cpp does
  const infer::PerplexityResult r =
      infer::perplexity(engine, tokens, po, [&](const infer::PerplexityResult& p) {
        if (!json)
          std::fprintf(stderr, "\r[window %lld] %lld tokens, perplexity %.4f", (long long)p.windows,
                       (long long)p.tokens, p.ppl());
      });
  if (json) {
    std::printf(
        "{\"model\": \"%s\", \"file\": \"%s\", \"scoring\": \"%s\", \"ctx\": %lld, "
        "\"tokens\": %lld, \"windows\": %lld, \"perplexity\": %.6f, \"seconds\": %.3f}\n",
        ef.model_path.c_str(), path.c_str(), scoring.c_str(), (long long)po.ctx,
        (long long)r.tokens, (long long)r.windows, r.ppl(), r.seconds);
  } else {
    std::fprintf(stderr, "\n");
    std::printf("perplexity %.4f over %lld tokens (%lld windows of %lld, %.1f tokens/s)\n", r.ppl(),
                (long long)r.tokens, (long long)r.windows, (long long)po.ctx,
                r.seconds > 0 ? r.tokens / r.seconds : 0.0);
  }
  return 0;
}

const Registrar reg({
    "perplexity",
    "perplexity of a model on a text file (sliding windows, or llama.cpp's chunks)",
    join({engine_flags(),
          {
              // Replaces the engine's --ctx: here it is the window length.
              Flag::integer("--ctx", 512, 2, int64_t{1} << 24, "window length in tokens"),
              Flag::text("--file", "", "the text to score", "PATH").required(),
              Flag::choice("--scoring", "sliding", {"sliding", "chunks"},
                           "sliding: every token once; chunks: llama-perplexity's numbers"),
              Flag::integer("--stride", 0, 0, int64_t{1} << 24,
                            "sliding: new tokens per window after the first; 0: half a window"),
              Flag::integer("--max-windows", 0, 0, int64_t{1} << 40,
                            "stop after N windows; 0: all"),
              Flag::toggle("--json", "one JSON line on stdout"),
          }}),
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
