// Token sampling: greedy, temperature, top-k, top-p, min-p, and repetition / frequency /
// presence penalties over the recent history; seeded, so a run can be repeated exactly.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace tessera::infer {

struct SamplingParams {
  float temperature = 0.8f;         // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 40;               // keep the k most likely; 0: all
  float top_p = 0.95f;              // keep the smallest set with this much mass; 1: all
  float min_p = 0.05f;              // drop tokens below min_p * p(best); 0: none
  float repetition_penalty = 1.0f;  // >1 discourages tokens seen in the last penalty_last_n
  float frequency_penalty = 0.0f;   // subtracted once per occurrence (OpenAI semantics)
  float presence_penalty = 0.0f;    // subtracted once if present
  int64_t penalty_last_n = 64;      // history window for the penalties; 0: none
  uint64_t seed = 0;

  // Throws naming the field when a value is out of range.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks the next token from logits (V) given the tokens so far (prompt and generated).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  const SamplingParams& params() const { return p_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  SamplingParams p_;
  Rng rng_;
  std::vector<Candidate> cand_;
  std::vector<float> probs_;
};

}  // namespace tessera::infer
