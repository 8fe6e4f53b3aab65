// Perplexity with sliding windows or llama.cpp's chunks: log-softmax of each scored row in double.
#include "infer/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "profile/timer.h"

namespace tessera::infer {

namespace {

// -log p(target) under one row of logits (V), in double.
double nll(const float* row, int64_t V, int32_t target) {
  const float mx = *std::max_element(row, row + V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
  return std::log(sum) + mx - row[target];
}

// The logits of one window run as a fresh sequence (valid until the next forward).
const std::vector<float>& run_window(Engine& engine, const std::vector<int32_t>& window) {
  const int32_t seq = engine.new_sequence();
  const std::vector<float>* logits = nullptr;
  try {
    logits = &engine.forward({Feed{seq, window, true}});
  } catch (...) {
    engine.free_sequence(seq);
    throw;
  }
  engine.free_sequence(seq);
  return *logits;
}

PerplexityResult chunks(Engine& engine, const std::vector<int32_t>& tokens,
                        const PerplexityOptions& opts,
                        const std::function<void(const PerplexityResult&)>& progress) {
  const int64_t ctx = opts.ctx, n = static_cast<int64_t>(tokens.size());
  TS_CHECK(ctx >= 4 && ctx <= engine.options().max_ctx, "[perplexity] ctx ", ctx,
           " must be in [4, ", engine.options().max_ctx, "] for chunks scoring");
  TS_CHECK(opts.stride == 0, "[perplexity] stride applies to sliding scoring only");
  TS_CHECK(n >= ctx, "[perplexity] the text has ", n, " tokens; chunks scoring needs at least one ",
           "window of ctx ", ctx);
  const int64_t V = engine.config().vocab, first = ctx / 2;
  const profile::Timer timer;
  PerplexityResult res;
  for (int64_t c = 0; c < n / ctx; ++c) {
    if (opts.max_windows && res.windows >= opts.max_windows) break;
    std::vector<int32_t> window(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
    if (opts.bos >= 0) window[0] = opts.bos;
    const std::vector<float>& logits = run_window(engine, window);
    // Row r predicts token c*ctx + r + 1; rows first .. ctx-2 are scored.
    for (int64_t r = first; r < ctx - 1; ++r)
      res.nll_sum += nll(logits.data() + r * V, V, tokens[static_cast<size_t>(c * ctx + r + 1)]);
    res.tokens += ctx - 1 - first;
    ++res.windows;
    res.seconds = timer.seconds();
    if (progress) progress(res);
  }
  return res;
}

}  // namespace

PerplexityResult perplexity(Engine& engine, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& opts,
                            const std::function<void(const PerplexityResult&)>& progress) {
  if (opts.scoring == Scoring::chunks) return chunks(engine, tokens, opts, progress);
  const int64_t ctx = opts.ctx, stride = opts.stride ? opts.stride : std::max<int64_t>(1, ctx / 2);
  TS_CHECK(ctx >= 2 && ctx <= engine.options().max_ctx, "[perplexity] ctx ", ctx,
           " must be in [2, ", engine.options().max_ctx, "]");
  TS_CHECK(stride >= 1 && stride <= ctx - 1, "[perplexity] stride ", stride, " must be in [1, ",
           ctx - 1, "]");
  const auto n = static_cast<int64_t>(tokens.size());
  TS_CHECK(n >= 2, "[perplexity] the text has ", n, " tokens; at least 2 are needed");
  const int64_t V = engine.config().vocab;
  const profile::Timer timer;
  PerplexityResult res;
  // Window w covers [begin, end); it scores predictions of tokens [score_from, end).
  int64_t scored_until = 1;  // token 0 is never predicted
  for (int64_t begin = 0; scored_until < n; begin += stride) {
    if (opts.max_windows && res.windows >= opts.max_windows) break;
    const int64_t end = std::min(n, begin + ctx);
    if (end <= scored_until) continue;
    const std::vector<int32_t> window(tokens.begin() + begin, tokens.begin() + end);
    const std::vector<float>& logits = run_window(engine, window);
    // Row r predicts token begin + r + 1.
    for (int64_t t = scored_until; t < end; ++t) {
      res.nll_sum += nll(logits.data() + (t - 1 - begin) * V, V, tokens[static_cast<size_t>(t)]);
      ++res.tokens;
    }
    scored_until = end;
    ++res.windows;
    res.seconds = timer.seconds();
    if (progress) progress(res);
  }
  return res;
}

}  // namespace tessera::infer
