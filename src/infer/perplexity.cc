// Sliding-window perplexity: log-softmax of each scored row in double precision.
#include "infer/perplexity.h"

#include <algorithm>

#include "core/error.h"
#include "profile/timer.h"

namespace tessera::infer {

PerplexityResult perplexity(Engine& engine, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& opts,
                            const std::function<void(const PerplexityResult&)>& progress) {
  const int64_t ctx = opts.ctx, stride = opts.stride ? opts.stride : std::max<int64_t>(1, ctx / 2);
  TS_CHECK(ctx >= 2 && ctx <= engine.options().max_ctx, "[perplexity] --ctx ", ctx,
           " must be in [2, ", engine.options().max_ctx, "]");
  TS_CHECK(stride >= 1 && stride <= ctx - 1, "[perplexity] --stride ", stride, " must be in [1, ",
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
    const int32_t seq = engine.new_sequence();
    const std::vector<int32_t> window(tokens.begin() + begin, tokens.begin() + end);
    const std::vector<float>* logits = nullptr;
    try {
      logits = &engine.forward({Feed{seq, window, true}});
    } catch (...) {
      engine.free_sequence(seq);
      throw;
    }
    engine.free_sequence(seq);  // the logits stay valid until the next forward
    // Row r predicts token begin + r + 1.
    for (int64_t t = scored_until; t < end; ++t) {
      const float* row = logits->data() + (t - 1 - begin) * V;
      const float mx = *std::max_element(row, row + V);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      res.nll_sum += std::log(sum) + mx - row[tokens[static_cast<size_t>(t)]];
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
