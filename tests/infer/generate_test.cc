// Generation to completion on a tiny random model with a trained byte-level tokenizer: streaming
// equals the final text, stop strings and stop tokens, batches equal single runs, a
// conversation's next turn reuses its cached prefix without changing the result, and UTF-8
// hold-back.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "infer/generate.h"
#include "test_util/expect_error.h"
#include "tiny_chat_model.h"

namespace tessera::infer {
namespace {

using test::greedy;
const test::TinyChatModel& fx() {
  return test::tiny_chat();
}
EngineOptions options(int64_t sequences = 1) {
  return test::tiny_chat_options(sequences);
}

TEST(Generate, StreamEqualsTextAndLengthStops) {
  Engine e(fx().m, options());
  std::string streamed;
  const GenerateResult r = generate(e, fx().tok, greedy("the quick", 40), [&](std::string_view t) {
    streamed += t;
    return true;
  });
  EXPECT_EQ(r.finish_reason, FinishReason::length);
  EXPECT_EQ(r.tokens.size(), 40u);
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.text, fx().tok.decode(r.tokens));
  EXPECT_EQ(e.cache().free_blocks(), e.cache().shape().n_blocks) << "sequence not freed";
}

TEST(Generate, StopStringCutsTheText) {
  Engine e(fx().m, options());
  const GenerateResult full = generate(e, fx().tok, greedy("the quick", 40));
  ASSERT_GE(full.text.size(), 12u);
  GenerateRequest req = greedy("the quick", 40);
  const std::string stop = full.text.substr(6, 3);
  req.stop_strings = {stop};
  std::string streamed;
  const GenerateResult r = generate(e, fx().tok, req, [&](std::string_view t) {
    streamed += t;
    return true;
  });
  EXPECT_EQ(r.finish_reason, FinishReason::stop);
  EXPECT_EQ(r.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(streamed, r.text) << "text past the stop string was streamed";
  // A stop token ends generation without being emitted.
  GenerateRequest tok_req = greedy("the quick", 40);
  tok_req.stop_tokens = {full.tokens[3]};
  const GenerateResult t = generate(e, fx().tok, tok_req);
  EXPECT_EQ(t.finish_reason, FinishReason::stop);
  EXPECT_EQ(t.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + 3));
}

TEST(Generate, BatchEqualsSingleRuns) {
  Engine e(fx().m, options(3));
  std::vector<GenerateRequest> reqs = {greedy("the quick", 20), greedy("lazy", 12),
                                       greedy("héllo wörld, the", 25)};
  std::vector<GenerateResult> singles;
  for (const GenerateRequest& r : reqs) singles.push_back(generate(e, fx().tok, r));
  const std::vector<GenerateResult> batch = generate_batch(e, fx().tok, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(batch[i].tokens, singles[i].tokens) << i;
    EXPECT_EQ(batch[i].text, singles[i].text) << i;
  }
}

// A conversation on one scheduler: the next turn takes the last turn's full cache blocks from
// the prefix cache and runs only the rest, with the same result as a fresh run.
TEST(Generate, NextTurnReusesThePrefixWithTheSameResult) {
  Engine e(fx().m, options());
  SchedulerOptions so;
  so.max_running = 1;
  Scheduler sched(e, fx().tok, so);
  const GenerateResult first = generate(sched, greedy("the quick brown fox jumps over", 30));
  // Second turn: the first prompt + reply + more text.
  const std::string turn2 = "the quick brown fox jumps over" + first.text + " over the";
  const GenerateResult cached = generate(sched, greedy(turn2, 10));
  Engine fresh(fx().m, options());
  const GenerateResult want = generate(fresh, fx().tok, greedy(turn2, 10));
  EXPECT_EQ(cached.tokens, want.tokens);
  EXPECT_EQ(cached.prompt_tokens, want.prompt_tokens);
  EXPECT_GE(cached.cached_tokens, 16) << "no full block was taken from the prefix cache";
  EXPECT_EQ(cached.computed_prompt_tokens + cached.cached_tokens, cached.prompt_tokens);
  EXPECT_EQ(want.computed_prompt_tokens, want.prompt_tokens);
  // Only the prefix cache holds blocks now; dropping it empties the cache.
  sched.clear_prefix_cache();
  EXPECT_EQ(e.cache().free_blocks(), e.cache().shape().n_blocks);
}

TEST(Generate, CallbackCanCancel) {
  Engine e(fx().m, options());
  int calls = 0;
  const GenerateResult r =
      generate(e, fx().tok, greedy("the", 50), [&](std::string_view) { return ++calls < 3; });
  EXPECT_EQ(r.finish_reason, FinishReason::cancelled);
  EXPECT_LT(r.tokens.size(), 50u);
}

TEST(Generate, Utf8HoldBack) {
  EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
  EXPECT_EQ(complete_utf8_prefix("ab\xc3"), 2u);  // é cut after its lead byte
  EXPECT_EQ(complete_utf8_prefix("ab\xc3\xa9"), 4u);
  EXPECT_EQ(complete_utf8_prefix("\xf0\x9f\x98"), 0u);  // 3 of an emoji's 4 bytes
  EXPECT_EQ(complete_utf8_prefix("\xf0\x9f\x98\x80"), 4u);
}

TEST(Generate, BadRequestsAreErrors) {
  Engine e(fx().m, options());
  GenerateRequest r = greedy("the", 5);
  r.prompt.clear();
  test::expect_error([&] { generate(e, fx().tok, r); }, "prompt is empty");
  r = greedy("the", 5);
  r.stop_strings = {""};
  test::expect_error([&] { generate(e, fx().tok, r); }, "empty stop string");
}

}  // namespace
}  // namespace tessera::infer
