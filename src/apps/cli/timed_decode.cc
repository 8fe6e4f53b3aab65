// Greedy decode steps, timed.
#include "apps/cli/timed_decode.h"

#include <algorithm>

#include "profile/timer.h"

namespace tessera::cli {

double timed_decode(infer::Engine& e, const std::vector<int32_t>& seqs, int64_t steps) {
  const int64_t V = e.config().vocab;
  std::vector<int32_t> next(seqs.size(), 1);
  std::vector<infer::Feed> feeds(seqs.size());
  const profile::Timer t;
  for (int64_t s = 0; s < steps; ++s) {
    for (size_t i = 0; i < seqs.size(); ++i) feeds[i] = infer::Feed{seqs[i], {&next[i], 1}, false};
    const std::vector<float>& logits = e.forward(feeds);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const float* row = logits.data() + static_cast<int64_t>(i) * V;
      next[i] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
  }
  return t.seconds();
}

}  // namespace tessera::cli
