// The generate loop on a tiny random model with a trained byte-level tokenizer: streaming equals
// the final text, stop strings and stop tokens, batches equal single runs, sessions reuse their
// cached prefix without changing the result, and UTF-8 hold-back.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "infer/generate.h"
#include "test_util/expect_error.h"
#include "tiny_model.h"

namespace tessera::infer {
namespace {

struct Fixture {
  tokenizer::Tokenizer tok;
  model::DecoderModel m;
  Fixture() {
    std::string text;
    for (int i = 0; i < 40; ++i)
      text += "the quick brown fox jumps over the lazy dog. héllo wörld ";
    tok = tokenizer::Tokenizer::train_bpe(text, 300);
    test::TinyOptions o;
    o.vocab = tok.vocab_size();
    o.ctx = 256;
    m = test::make_tiny_model(o);
  }
};

const Fixture& fx() {
  static const Fixture f;
  return f;
}

EngineOptions options(int64_t sequences = 1) {
  EngineOptions o;
  o.max_ctx = 256;
  o.kv_tokens = 256 * sequences;
  o.block_tokens = 16;
  return o;
}

GenerateRequest greedy(const std::string& prompt, int64_t n) {
  GenerateRequest r;
  r.prompt = fx().tok.encode(prompt);
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  return r;
}

TEST(Generate, StreamEqualsTextAndLengthStops) {
  Engine e(fx().m, options());
  std::string streamed;
  const GenerateResult r = generate(e, fx().tok, greedy("the quick", 40), [&](std::string_view t) {
    streamed += t;
    return true;
  });
  EXPECT_EQ(r.finish_reason, "length");
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
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(streamed, r.text) << "text past the stop string was streamed";
  // A stop token ends generation without being emitted.
  GenerateRequest tok_req = greedy("the quick", 40);
  tok_req.stop_tokens = {full.tokens[3]};
  const GenerateResult t = generate(e, fx().tok, tok_req);
  EXPECT_EQ(t.finish_reason, "stop");
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

TEST(Generate, SessionReusesPrefixWithSameResult) {
  Engine e(fx().m, options());
  Session s;
  const GenerateResult first = generate(e, fx().tok, greedy("the quick brown", 10), {}, &s);
  // Second turn: the first prompt + reply + more text; only the new part runs.
  std::string turn2 = "the quick brown" + first.text + " over the";
  const GenerateResult cached = generate(e, fx().tok, greedy(turn2, 10), {}, &s);
  Engine fresh(fx().m, options());
  const GenerateResult want = generate(fresh, fx().tok, greedy(turn2, 10));
  EXPECT_EQ(cached.tokens, want.tokens);
  EXPECT_LT(cached.prompt_tokens, want.prompt_tokens);
  EXPECT_EQ(s.cached.size(), static_cast<size_t>(e.sequence_length(s.seq)));
}

TEST(Generate, CallbackCanCancel) {
  Engine e(fx().m, options());
  int calls = 0;
  const GenerateResult r =
      generate(e, fx().tok, greedy("the", 50), [&](std::string_view) { return ++calls < 3; });
  EXPECT_EQ(r.finish_reason, "cancelled");
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
  test::expect_error([&] { generate(e, fx().tok, r); }, "empty prompt");
  r = greedy("the", 5);
  r.stop_strings = {""};
  test::expect_error([&] { generate(e, fx().tok, r); }, "--stop");
}

}  // namespace
}  // namespace tessera::infer
