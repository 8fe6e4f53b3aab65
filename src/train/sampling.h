// Autoregressive sampling from a Gpt2 without a KV cache: each new token recomputes the forward
// pass over the last max_seq tokens. Temperature 0 is greedy; top-k 0 keeps the whole vocabulary.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "model/gpt2.h"

namespace tessera::train {

struct SampleOptions {
  int64_t max_tokens = 100;
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 1;
  int32_t stop_token = -1;  // stop (without emitting it) when sampled; -1: never
};

// Picks a token from logits (V): argmax when temperature == 0 (lowest id on ties), else a draw
// from softmax(logits / temperature) restricted to the top_k largest (top_k 0 = all).
int32_t pick_token(const float* logits, int64_t V, double temperature, int64_t top_k, Rng& rng);

// The model must have been planned for (1, T) with T >= min(prompt + max_tokens, max_seq).
// `prompt` must be non-empty. Calls on_token for each new token as it is produced; returns them.
std::vector<int32_t> sample(model::Gpt2& m, const std::vector<int32_t>& prompt,
                            const SampleOptions& opt,
                            const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace tessera::train
