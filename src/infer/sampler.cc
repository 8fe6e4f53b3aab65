// Sampler: penalties on a copy of the logits, then greedy or a seeded draw from the filtered,
// renormalized distribution (filters applied in the order top-k, top-p, min-p).
#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"

namespace tessera::infer {

void SamplingParams::validate() const {
  TS_CHECK(std::isfinite(temperature) && temperature >= 0,
           "[sampling] temperature must be >= 0 (got ", temperature, ")");
  TS_CHECK(top_k >= 0, "[sampling] top_k must be >= 0 (got ", top_k, ")");
  TS_CHECK(top_p > 0 && top_p <= 1, "[sampling] top_p must be in (0, 1] (got ", top_p, ")");
  TS_CHECK(min_p >= 0 && min_p < 1, "[sampling] min_p must be in [0, 1) (got ", min_p, ")");
  TS_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0,
           "[sampling] repetition_penalty must be > 0 (got ", repetition_penalty, ")");
  TS_CHECK(std::isfinite(frequency_penalty) && std::fabs(frequency_penalty) <= 2,
           "[sampling] frequency_penalty must be in [-2, 2] (got ", frequency_penalty, ")");
  TS_CHECK(std::isfinite(presence_penalty) && std::fabs(presence_penalty) <= 2,
           "[sampling] presence_penalty must be in [-2, 2] (got ", presence_penalty, ")");
  TS_CHECK(penalty_last_n >= 0, "[sampling] penalty_last_n must be >= 0 (got ", penalty_last_n,
           ")");
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
  p_.validate();
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const auto V = static_cast<int64_t>(logits.size());
  TS_CHECK(V > 0, "[sampler] empty logits");
  cand_.resize(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i)
    cand_[static_cast<size_t>(i)] =
        Candidate{static_cast<int32_t>(i), logits[static_cast<size_t>(i)]};

  // Penalties over the last penalty_last_n tokens.
  const bool penalize =
      p_.penalty_last_n > 0 &&
      (p_.repetition_penalty != 1 || p_.frequency_penalty != 0 || p_.presence_penalty != 0);
  if (penalize) {
    std::unordered_map<int32_t, int> counts;
    const size_t n = std::min(history.size(), static_cast<size_t>(p_.penalty_last_n));
    for (size_t i = history.size() - n; i < history.size(); ++i) ++counts[history[i]];
    for (const auto& [id, count] : counts) {
      if (id < 0 || id >= V) continue;
      float& l = cand_[static_cast<size_t>(id)].logit;
      // Dividing a positive logit and multiplying a negative one both make the token less
      // likely (the CTRL paper's penalty).
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
      l -= static_cast<float>(count) * p_.frequency_penalty + p_.presence_penalty;
    }
  }

  auto better = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if (p_.temperature == 0) return std::min_element(cand_.begin(), cand_.end(), better)->id;

  // Top-k (0 = all): the k best, in no particular order yet.
  if (p_.top_k > 0 && p_.top_k < V) {
    std::nth_element(cand_.begin(), cand_.begin() + (p_.top_k - 1), cand_.end(), better);
    cand_.resize(static_cast<size_t>(p_.top_k));
  }
  // Probabilities relative to the best candidate (which gets 1) and their total.
  float mx = cand_[0].logit;
  for (const Candidate& c : cand_) mx = std::max(mx, c.logit);
  const float inv_t = 1.0f / p_.temperature;
  double sum = 0;
  for (const Candidate& c : cand_) sum += std::exp((c.logit - mx) * inv_t);
  // Min-p drops every candidate below min_p * p(best) = min_p; doing it first leaves few to sort.
  auto eligible_end = cand_.end();
  if (p_.min_p > 0)
    eligible_end = std::partition(cand_.begin(), cand_.end(), [&](const Candidate& c) {
      return std::exp((c.logit - mx) * inv_t) >= p_.min_p;
    });
  const size_t eligible = static_cast<size_t>(eligible_end - cand_.begin());
  // Top-p: the smallest best-first prefix holding top_p of the mass. Sort a growing prefix
  // instead of the whole vocabulary: the mass is usually reached within a few dozen tokens.
  size_t keep = eligible, sorted = 0;
  double mass = 0;
  probs_.clear();
  while (keep == eligible && sorted < eligible) {
    const size_t next = std::min(eligible, std::max<size_t>(64, sorted * 4));
    std::partial_sort(cand_.begin() + static_cast<std::ptrdiff_t>(sorted),
                      cand_.begin() + static_cast<std::ptrdiff_t>(next), eligible_end, better);
    for (size_t i = sorted; i < next; ++i) {
      probs_.push_back(std::exp((cand_[i].logit - mx) * inv_t));
      mass += probs_[i] / sum;
      if (mass >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    sorted = next;
  }

  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += probs_[i];
  double u = static_cast<double>(rng_.uniform()) * kept;
  for (size_t i = 0; i < keep; ++i) {
    u -= probs_[i];
    if (u < 0) return cand_[i].id;
  }
  return cand_[keep - 1].id;
}

}  // namespace tessera::infer
