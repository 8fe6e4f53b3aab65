// Sampler: greedy ties, seeds, the filters (top-k, top-p, min-p) against exact distributions,
// penalties, and parameter errors.
#include <gtest/gtest.h>

#include <algorithm>

#include <set>

#include <numeric>

#include <cmath>
#include <map>
#include <vector>

#include "core/rng.h"
#include "infer/sampler.h"
#include "test_util/expect_error.h"

namespace tessera::infer {
namespace {

SamplingParams plain(float temperature) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  return p;
}

TEST(Sampler, GreedyTakesLowestIdOnTies) {
  Sampler s(plain(0));
  const std::vector<float> l = {1, 3, 2, 3};
  EXPECT_EQ(s.sample(l, {}), 1);
}

TEST(Sampler, DrawsFollowSoftmaxAndSeedsRepeat) {
  const std::vector<float> l = {0, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = i+1 / 10
  SamplingParams p = plain(1);
  p.seed = 7;
  Sampler a(p), b(p);
  std::map<int32_t, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    const int32_t t = a.sample(l, {});
    EXPECT_EQ(t, b.sample(l, {}));
    ++counts[t];
  }
  for (int i = 0; i < 4; ++i) {
    const double want = (i + 1) / 10.0, sd = std::sqrt(want * (1 - want) / n);
    EXPECT_NEAR(counts[i] / static_cast<double>(n), want, 5 * sd) << "token " << i;
  }
}

TEST(Sampler, FiltersKeepExactlyTheRightTokens) {
  const std::vector<float> l = {0, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  auto seen = [&](SamplingParams p) {
    Sampler s(p);
    std::map<int32_t, int> c;
    for (int i = 0; i < 5000; ++i) ++c[s.sample(l, {})];
    std::vector<int32_t> ids;
    for (const auto& [id, n] : c) ids.push_back(id);
    return ids;
  };
  SamplingParams k2 = plain(1);
  k2.top_k = 2;
  EXPECT_EQ(seen(k2), (std::vector<int32_t>{2, 3}));
  SamplingParams p = plain(1);
  p.top_p = 0.65f;  // 0.4 + 0.3 = 0.7 >= 0.65: two tokens
  EXPECT_EQ(seen(p), (std::vector<int32_t>{2, 3}));
  SamplingParams mp = plain(1);
  mp.min_p = 0.5f;  // keep p >= 0.5 * 0.4 = 0.2
  EXPECT_EQ(seen(mp), (std::vector<int32_t>{1, 2, 3}));
}

// A large vocabulary with top-p over all of it: the sampler sorts only a growing best-first
// prefix; the tokens it can draw must be exactly the top-p set a full sort gives.
TEST(Sampler, TopPOverALargeVocabularyKeepsTheFullSortSet) {
  const int64_t V = 3000;
  std::vector<float> l(static_cast<size_t>(V));
  Rng rng(3);
  for (float& x : l) x = 0.5f * rng.normal();
  for (float top_p : {0.3f, 0.97f}) {
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    double total = 0;
    for (float x : l) total += std::exp(static_cast<double>(x - l[order[0]]));
    std::set<int32_t> want;
    double mass = 0;
    for (int32_t id : order) {
      want.insert(id);
      mass += std::exp(static_cast<double>(l[id] - l[order[0]])) / total;
      if (mass >= top_p) break;
    }
    SamplingParams p = plain(1);
    p.top_p = top_p;
    p.seed = 11;
    Sampler s(p);
    std::set<int32_t> seen;
    for (int i = 0; i < 4000; ++i) {
      const int32_t t = s.sample(l, {});
      ASSERT_TRUE(want.count(t)) << "token " << t << " is outside the top-p set at " << top_p;
      seen.insert(t);
    }
    if (top_p > 0.9f) {
      EXPECT_GT(want.size(), 256u);  // the prefix had to grow several times
      EXPECT_GT(seen.size(), want.size() / 2);
    }
  }
}

TEST(Sampler, PenaltiesDiscourageRepeats) {
  const std::vector<float> l = {2.0f, 1.9f, -1.0f};
  const std::vector<int32_t> history = {0, 0, 0};
  SamplingParams rep = plain(0);
  rep.repetition_penalty = 1.2f;  // 2.0 / 1.2 = 1.67 < 1.9
  EXPECT_EQ(Sampler(rep).sample(l, history), 1);
  SamplingParams freq = plain(0);
  freq.frequency_penalty = 0.05f;  // 2.0 - 3 * 0.05 = 1.85 < 1.9
  EXPECT_EQ(Sampler(freq).sample(l, history), 1);
  SamplingParams pres = plain(0);
  pres.presence_penalty = 0.05f;  // 2.0 - 0.05 = 1.95 > 1.9
  EXPECT_EQ(Sampler(pres).sample(l, history), 0);
  pres.penalty_last_n = 0;  // no window, no penalty
  EXPECT_EQ(Sampler(pres).sample(l, history), 0);
}

// Library errors name the field (the CLI and the server map fields to their flags and params).
TEST(Sampler, BadParametersNameTheField) {
  SamplingParams p;
  p.top_p = 0;
  test::expect_error([&] { Sampler s(p); }, "top_p");
  p = SamplingParams{};
  p.temperature = -1;
  test::expect_error([&] { Sampler s(p); }, "temperature");
  p = SamplingParams{};
  p.min_p = 1;
  test::expect_error([&] { Sampler s(p); }, "min_p");
}

}  // namespace
}  // namespace tessera::infer
