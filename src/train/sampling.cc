// Token selection (greedy, temperature, top-k) and the recompute-everything decode loop.
#include "train/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace tessera::train {

int32_t pick_token(const float* logits, int64_t V, double temperature, int64_t top_k, Rng& rng) {
  TS_CHECK(V > 0, "[sample] empty vocabulary");
  TS_CHECK(temperature >= 0 && std::isfinite(temperature), "--temperature must be >= 0, got ",
           temperature);
  TS_CHECK(top_k >= 0, "--top-k must be >= 0, got ", top_k);
  if (temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  int64_t k = top_k > 0 ? std::min(top_k, V) : V;
  if (k < V) {
    // Stable order (value, then id) so the candidate set never depends on the sort's internals.
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
  }
  float mx = logits[ids[0]];
  for (int64_t i = 0; i < k; ++i) mx = std::max(mx, logits[ids[static_cast<size_t>(i)]]);
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[static_cast<size_t>(i)] = std::exp((logits[ids[static_cast<size_t>(i)]] - mx) / temperature);
    sum += p[static_cast<size_t>(i)];
  }
  const double u = static_cast<double>(rng.uniform()) * sum;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[static_cast<size_t>(i)];
    if (u < acc) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(k - 1)];
}

std::vector<int32_t> sample(model::Gpt2& m, const std::vector<int32_t>& prompt,
                            const SampleOptions& opt,
                            const std::function<void(int32_t)>& on_token) {
  TS_CHECK(!prompt.empty(), "[sample] the prompt encodes to no tokens");
  TS_CHECK(opt.max_tokens >= 0, "--max-tokens must be >= 0, got ", opt.max_tokens);
  const auto& cfg = m.config();
  for (int32_t t : prompt)
    TS_CHECK(t >= 0 && t < cfg.vocab_size, "[sample] prompt token ", t,
             " is outside the model's vocabulary of ", cfg.vocab_size);
  Rng rng(opt.seed);
  std::vector<int32_t> ctx = prompt, out;
  for (int64_t i = 0; i < opt.max_tokens; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(ctx.size()), cfg.max_seq);
    const int32_t* window = ctx.data() + ctx.size() - static_cast<size_t>(T);
    m.forward(window, nullptr, 1, T);
    // logits (1,T,Vp): the last position predicts the next token.
    const float* last = m.logits() + (T - 1) * cfg.padded_vocab_size;
    const int32_t next = pick_token(last, cfg.vocab_size, opt.temperature, opt.top_k, rng);
    if (next == opt.stop_token) break;
    ctx.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  return out;
}

}  // namespace tessera::train
