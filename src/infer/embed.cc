// Mean pooling of the last hidden states and L2 normalization.
#include "infer/embed.h"

#include <cmath>

namespace tessera::infer {

std::vector<float> embed_tokens(Engine& engine, std::span<const int32_t> tokens) {
  const int64_t C = engine.config().d_model, T = static_cast<int64_t>(tokens.size());
  const int32_t seq = engine.new_sequence();
  std::vector<double> sum(static_cast<size_t>(C), 0.0);
  try {
    const std::vector<float>& h = engine.forward({Feed{seq, tokens, true}}, Engine::Output::hidden);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c)
        sum[static_cast<size_t>(c)] += h[static_cast<size_t>(t * C + c)];
  } catch (...) {
    engine.free_sequence(seq);
    throw;
  }
  engine.free_sequence(seq);
  double norm = 0;
  for (double& x : sum) {
    x /= static_cast<double>(T);
    norm += x * x;
  }
  norm = std::sqrt(norm);
  std::vector<float> out(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c)
    out[static_cast<size_t>(c)] =
        static_cast<float>(norm > 0 ? sum[static_cast<size_t>(c)] / norm : 0);
  return out;
}

}  // namespace tessera::infer
