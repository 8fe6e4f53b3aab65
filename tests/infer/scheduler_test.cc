// The scheduler on a tiny random model: requests joining and leaving between steps, prompts
// prefilled in chunks beside running decodes, preemption when the cache runs out, the prefix
// cache and samples sharing a prompt all give the tokens each request gives alone; cancel,
// deadlines and wait limits end requests and free their blocks; log-probabilities are the
// model's.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
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

// Collects each request's results (by id and sample) and how often it was called.
struct Collector {
  std::map<std::pair<Scheduler::RequestId, size_t>, GenerateResult> results;
  std::map<std::pair<Scheduler::RequestId, size_t>, std::string> streamed;
  Scheduler::RequestId add(Scheduler& s, const GenerateRequest& r) {
    RequestSink sink;
    auto id = std::make_shared<Scheduler::RequestId>(0);
    sink.on_tokens = [this, id](size_t k, std::span<const GeneratedToken>, std::string_view t) {
      streamed[{*id, k}] += t;
      return true;
    };
    sink.on_finish = [this, id](size_t k, GenerateResult&& res) {
      results[{*id, k}] = std::move(res);
    };
    *id = s.add(r, std::move(sink));
    return *id;
  }
};

std::vector<GenerateRequest> mixed_requests() {
  const char* prompts[] = {
      "the quick", "lazy dog. héllo wörld the quick brown fox jumps",
      "over",      "héllo wörld héllo wörld héllo wörld the lazy dog jumps over",
      "the lazy",  "brown fox"};
  const int64_t lengths[] = {30, 12, 40, 25, 7, 33};
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(prompts[i], lengths[i]));
  return reqs;
}

std::vector<GenerateResult> solo_runs(const std::vector<GenerateRequest>& reqs) {
  Engine e(fx().m, test::tiny_chat_options());
  std::vector<GenerateResult> out;
  for (const GenerateRequest& r : reqs) out.push_back(generate(e, fx().tok, r));
  return out;
}

TEST(Scheduler, ContinuousBatchingMatchesSoloRuns) {
  const std::vector<GenerateRequest> reqs = mixed_requests();
  const std::vector<GenerateResult> want = solo_runs(reqs);
  Engine e(fx().m, test::tiny_chat_options(4));
  SchedulerOptions so;
  so.max_running = 4;
  so.step_tokens = 8;  // prompts in chunks of at most 8 rows beside the decodes
  Scheduler s(e, fx().tok, so);
  Collector c;
  std::vector<Scheduler::RequestId> ids;
  int64_t most_sequences = 0, mixed_steps = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ids.push_back(c.add(s, reqs[i]));
    for (int k = 0; k < 3; ++k) {  // requests join while others run
      s.step();
      const SchedulerStats st = s.stats();
      most_sequences = std::max(most_sequences, st.last_step_sequences);
      mixed_steps += st.last_step_rows > st.last_step_sequences;
      // Prompt rows within the budget beside decodes (a quarter of it at least), or a chunk of
      // the engine's where nothing decodes.
      const int64_t decodes = st.last_step_rows - st.last_step_prompt_rows;
      EXPECT_LE(st.last_step_prompt_rows, decodes > 0 ? std::max<int64_t>(8 - decodes, 2)
                                                      : std::max<int64_t>(8, e.options().max_rows));
      EXPECT_LE(st.running_sequences, 4);
    }
  }
  s.run_until_idle();
  EXPECT_GT(most_sequences, 1);
  EXPECT_GT(mixed_steps, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerateResult& got = c.results.at({ids[i], 0});
    EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got.text, want[i].text) << "request " << i;
    EXPECT_EQ(c.streamed.at({ids[i], 0}), got.text) << "request " << i;
    EXPECT_EQ(got.finish_reason, want[i].finish_reason) << "request " << i;
  }
  // Idle: no request holds a block; the prefix cache keeps some until they are needed.
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
  EXPECT_GT(s.stats().kv_blocks_cached, 0);
  EXPECT_EQ(e.cache().used_blocks(), s.stats().kv_blocks_cached);
  s.clear_prefix_cache();
  EXPECT_EQ(e.cache().used_blocks(), 0);
}

TEST(Scheduler, PreemptsTheNewestWhenTheCacheRunsOutAndStillMatches) {
  std::vector<GenerateRequest> reqs = mixed_requests();
  for (GenerateRequest& r : reqs) r.max_new_tokens = 100;
  const std::vector<GenerateResult> want = solo_runs(reqs);
  // With and without the prefix cache, and with prompt rows held to a step-time ratio (what
  // rows a step takes changes, never what each request gets).
  for (const auto& [prefix, ratio] : {std::pair{false, 0.0}, {true, 0.0}, {true, 1.5}}) {
    EngineOptions eo = test::tiny_chat_options();
    eo.kv_tokens = 20 * 16;  // 20 blocks: room for three of the six at full length
    Engine e(fx().m, eo);
    SchedulerOptions so;
    so.max_running = 6;
    so.step_tokens = 16;
    so.prefix_cache = prefix;
    so.max_step_ratio = ratio;
    Scheduler s(e, fx().tok, so);
    Collector c;
    std::vector<Scheduler::RequestId> ids;
    for (const GenerateRequest& r : reqs) ids.push_back(c.add(s, r));
    s.run_until_idle();
    EXPECT_GT(s.stats().preemptions, 0) << "prefix cache " << prefix;
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(c.results.at({ids[i], 0}).tokens, want[i].tokens)
          << "request " << i << ", prefix cache " << prefix;
    s.clear_prefix_cache();
    EXPECT_EQ(e.cache().free_blocks(), e.cache().shape().n_blocks);
  }
}

// The same request twice, one at a time, in a cache that holds one at full length: the second
// takes back the blocks the prefix cache kept of the first.
TEST(Scheduler, PrefixCacheGivesItsBlocksBackToTheNextRequest) {
  EngineOptions eo = test::tiny_chat_options();
  eo.kv_tokens = 12 * 16;
  Engine e(fx().m, eo);
  SchedulerOptions so;
  so.max_running = 1;
  Scheduler s(e, fx().tok, so);
  // A prompt longer than a block: the second request also takes the first's first block.
  GenerateRequest r = greedy(
      "the quick brown fox jumps over the lazy dog. héllo wörld the lazy dog jumps over the quick "
      "brown fox",
      150);
  ASSERT_GT(r.prompt.size(), 16u);
  Collector c;
  const Scheduler::RequestId a = c.add(s, r), b = c.add(s, r);
  s.run_until_idle();
  EXPECT_EQ(c.results.at({a, 0}).tokens.size(), 150u);
  EXPECT_EQ(c.results.at({b, 0}).tokens, c.results.at({a, 0}).tokens);
  EXPECT_EQ(c.results.at({b, 0}).cached_tokens, 16);
}

TEST(Scheduler, PrefixCacheSkipsTheSharedPrefill) {
  std::string prefix;
  for (int i = 0; i < 8; ++i) prefix += "the quick brown fox jumps over the lazy dog. ";
  const GenerateRequest a = greedy(prefix + "héllo", 20), b = greedy(prefix + "wörld the", 20);
  const std::vector<GenerateResult> want = solo_runs({a, b});
  Engine e(fx().m, test::tiny_chat_options(2));
  SchedulerOptions so;
  so.max_running = 2;
  Scheduler s(e, fx().tok, so);
  const GenerateResult ra = generate(s, a), rb = generate(s, b);
  EXPECT_EQ(ra.tokens, want[0].tokens);
  EXPECT_EQ(rb.tokens, want[1].tokens);
  EXPECT_EQ(ra.cached_tokens, 0);
  // Every full block of the shared prefix comes from the cache.
  const int64_t shared = static_cast<int64_t>(fx().tok.encode(prefix).size()) / 16 * 16;
  EXPECT_GE(rb.cached_tokens, shared - 16);
  EXPECT_GT(rb.cached_tokens, 0);
  EXPECT_EQ(rb.computed_prompt_tokens, rb.prompt_tokens - rb.cached_tokens);
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.prefix_hit_tokens, rb.cached_tokens);
  EXPECT_EQ(st.prefix_query_tokens, ra.prompt_tokens + rb.prompt_tokens);
}

TEST(Scheduler, SamplesShareThePromptAndMatchSeparateRequests) {
  GenerateRequest r = greedy("the quick brown fox jumps over the lazy dog. héllo", 25);
  r.sampling = SamplingParams{};
  r.sampling.seed = 7;
  std::vector<GenerateRequest> separate(3, r);
  for (size_t i = 0; i < 3; ++i) separate[i].sampling.seed = 7 + i;
  const std::vector<GenerateResult> want = solo_runs(separate);
  r.n = 3;
  Engine e(fx().m, test::tiny_chat_options(3));
  SchedulerOptions so;
  so.max_running = 3;
  so.prefix_cache = false;
  Scheduler s(e, fx().tok, so);
  Collector c;
  const Scheduler::RequestId id = c.add(s, r);
  s.step();  // the prompt, once; the samples' first tokens
  const auto prompt_blocks = static_cast<int64_t>((r.prompt.size() + 15) / 16);
  EXPECT_LE(e.cache().used_blocks(), prompt_blocks + 3) << "the prompt's blocks were copied";
  s.run_until_idle();
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(c.results.at({id, k}).tokens, want[k].tokens) << "sample " << k;
    EXPECT_EQ(c.results.at({id, k}).cached_tokens, k == 0 ? 0 : r.prompt.size());
  }
  EXPECT_EQ(s.stats().computed_prompt_tokens, static_cast<int64_t>(r.prompt.size()));
  EXPECT_EQ(e.cache().free_blocks(), e.cache().shape().n_blocks);
}

TEST(Scheduler, CancelEndsTheRequestAndFreesItsBlocksAtOnce) {
  Engine e(fx().m, test::tiny_chat_options(2));
  SchedulerOptions so;
  so.prefix_cache = false;
  Scheduler s(e, fx().tok, so);
  Collector c;
  const Scheduler::RequestId a = c.add(s, greedy("the quick brown", 200));
  const Scheduler::RequestId b = c.add(s, greedy("lazy", 5));
  for (int i = 0; i < 3; ++i) s.step();
  EXPECT_GT(s.stats().kv_blocks_used, 0);
  s.cancel(a);
  EXPECT_EQ(c.results.at({a, 0}).finish_reason, FinishReason::cancelled);
  s.run_until_idle();
  EXPECT_EQ(c.results.at({b, 0}).finish_reason, FinishReason::length);
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
  s.cancel(a);  // already finished: ignored
}

TEST(Scheduler, WaitLimitAndDeadlineEndRequests) {
  Engine e(fx().m, test::tiny_chat_options(2));
  SchedulerOptions so;
  so.max_running = 1;
  so.max_wait_seconds = 1e-6;  // the second request cannot start before the first ends
  so.prefix_cache = false;
  Scheduler s(e, fx().tok, so);
  Collector c;
  const Scheduler::RequestId a = c.add(s, greedy("the quick", 20));
  const Scheduler::RequestId b = c.add(s, greedy("lazy", 20));
  s.run_until_idle();
  EXPECT_EQ(c.results.at({a, 0}).finish_reason, FinishReason::length);
  EXPECT_EQ(c.results.at({b, 0}).finish_reason, FinishReason::wait_limit);
  EXPECT_TRUE(c.results.at({b, 0}).tokens.empty());
  GenerateRequest late = greedy("the quick", 200);
  late.deadline_seconds = 1e-6;
  const Scheduler::RequestId d = c.add(s, late);
  s.run_until_idle();
  EXPECT_EQ(c.results.at({d, 0}).finish_reason, FinishReason::deadline);
  EXPECT_LT(c.results.at({d, 0}).tokens.size(), 200u);
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
}

TEST(Scheduler, LogprobsAreTheModelsLogSoftmax) {
  Engine ref_engine(fx().m, test::tiny_chat_options());
  GenerateRequest r = greedy("the quick brown", 4);
  r.top_logprobs = 3;
  Engine e(fx().m, test::tiny_chat_options());
  Scheduler s(e, fx().tok, SchedulerOptions{});
  std::vector<GeneratedToken> got;
  RequestSink sink;
  sink.on_tokens = [&](size_t, std::span<const GeneratedToken> t, std::string_view) {
    got.insert(got.end(), t.begin(), t.end());
    return true;
  };
  s.add(r, sink);
  s.run_until_idle();
  ASSERT_EQ(got.size(), 4u);
  // The first token's distribution: the prompt's last logits.
  const int32_t seq = ref_engine.new_sequence();
  const std::vector<float> logits = ref_engine.forward({Feed{seq, r.prompt, false}});
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l));
  const double lp = logits[static_cast<size_t>(got[0].token)] - std::log(sum);
  EXPECT_NEAR(got[0].logprob, lp, 1e-4);
  ASSERT_EQ(got[0].top.size(), 3u);
  EXPECT_EQ(got[0].top[0].token, got[0].token) << "greedy takes the most likely";
  EXPECT_GE(got[0].top[0].logprob, got[0].top[1].logprob);
  EXPECT_GE(got[0].top[1].logprob, got[0].top[2].logprob);
}

TEST(Scheduler, RequestsThatCannotFitAreRefusedNamingTheField) {
  EngineOptions eo = test::tiny_chat_options();
  eo.kv_tokens = 4 * 16;
  Engine e(fx().m, eo);
  SchedulerOptions so;
  so.max_running = 2;
  Scheduler s(e, fx().tok, so);
  test::expect_error([&] { s.add(greedy("the quick", 255), {}); }, "exceeds the context length");
  test::expect_error([&] { s.add(greedy("the quick", 100), {}); }, "KV-cache blocks");
  GenerateRequest r = greedy("the", 5);
  r.n = 3;
  test::expect_error([&] { s.add(r, {}); }, "n must be in [1, 2]");
  r = greedy("the", 5);
  r.top_logprobs = 21;
  test::expect_error([&] { s.add(r, {}); }, "top_logprobs");
  r = greedy("the", 5);
  r.sampling.top_p = 2;
  test::expect_error([&] { s.add(r, {}); }, "top_p");
  EXPECT_TRUE(s.idle());
}

}  // namespace
}  // namespace tessera::infer
