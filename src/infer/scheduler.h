// The scheduler: continuous batching of generation requests over one engine. Requests are
// added at any time; every step() runs one engine forward in which each running sequence
// takes its next decode row, and prompts are prefilled in chunks within a token budget beside
// them (so a long prompt does not stall the streams already running). Finished sequences
// leave and waiting requests join between steps, first come first served, as far as free KV
// blocks allow; when the cache runs out mid-generation, the newest request is preempted (its
// blocks freed, its tokens run again when it is readmitted). With the prefix cache on, a
// prompt's leading full blocks come from earlier requests that held the same tokens; the n
// samples of one request share the prompt's blocks.
//
// Not thread-safe: one thread owns the scheduler and its engine (the server's engine loop,
// the generate command). Events reach the request's sink from inside step().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "infer/engine.h"
#include "infer/prefix_cache.h"
#include "infer/sampler.h"
#include "infer/step_cost.h"
#include "tokenizer/tokenizer.h"

namespace tessera::infer {

enum class FinishReason : uint8_t {
  stop,        // an end-of-generation token or a stop string
  length,      // max_new_tokens generated
  cancelled,   // cancel(), or the sink asked to stop
  deadline,    // the request's deadline passed while it ran
  wait_limit,  // not started within SchedulerOptions::max_wait_seconds
};
const char* finish_reason_name(FinishReason r);

// Length of the longest prefix of `text` that is complete UTF-8 (a character cut by a token
// boundary waits for the next token).
size_t complete_utf8_prefix(std::string_view text);

struct GenerateRequest {
  std::vector<int32_t> prompt;  // at least one token
  int64_t max_new_tokens = 128;
  SamplingParams sampling;                // sample i of n uses seed + i
  std::vector<int32_t> stop_tokens;       // end-of-generation ids (not emitted)
  std::vector<std::string> stop_strings;  // cut before the first occurrence
  int64_t n = 1;                          // samples of the prompt, sharing its cache blocks
  // Log-probabilities of each generated token under the model (log-softmax of the raw logits,
  // before penalties and temperature) and of the top_logprobs most likely tokens; -1: none.
  int64_t top_logprobs = -1;
  double deadline_seconds = 0;       // from add(); 0: none
  bool skip_special_tokens = false;  // special added tokens generated add no text
  // The text continues the prompt's (a raw completion): SentencePiece's space in front of the
  // first generated word is kept, as in the text of prompt and completion decoded together.
  // False (a chat reply): the reply's text starts as a text of its own, without it.
  bool continuation = false;
};

struct TokenLogprob {
  int32_t token;
  float logprob;
};
struct GeneratedToken {
  int32_t token;
  float logprob = 0;              // when asked for
  std::vector<TokenLogprob> top;  // the top_logprobs most likely, best first
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (a final stop token is not included)
  std::string text;             // their text, cut at a stop string
  FinishReason finish_reason = FinishReason::length;
  int64_t prompt_tokens = 0;  // the prompt's length
  int64_t cached_tokens = 0;  // prompt tokens taken from the prefix cache or another sample
  int64_t computed_prompt_tokens = 0;  // prompt tokens run through the model (recomputes too)
  double queue_seconds = 0;            // from add() to the first step that ran it
  double prefill_seconds = 0;          // from then to the first token
  double decode_seconds = 0;           // from the first token to the end
};

// Where a request's events go, from inside step(). Sample `index` of the request:
// on_tokens: new tokens (with log-probabilities when asked) and the text that became final
// with them (whole UTF-8 characters, never the start of a stop string; may be empty); return
// false to cancel the whole request. on_finish: the sample's result, once.
struct RequestSink {
  std::function<bool(size_t index, std::span<const GeneratedToken> tokens, std::string_view text)>
      on_tokens;
  std::function<void(size_t index, GenerateResult&& result)> on_finish;
};

struct SchedulerOptions {
  int64_t max_running = 32;  // sequences in the cache at once (each sample is one)
  // Token rows per engine step while sequences decode: every decode row, then prompt chunks up
  // to this many rows in all (at least a quarter of it for prompts); steps without decodes take
  // at least an engine chunk (EngineOptions::max_rows) of prompt. 0: no budget (every pending
  // row in one forward: the fastest prefill, for batch jobs). A step costs about its rows, so
  // the budget bounds how much a long prompt arriving slows the streams already running.
  int64_t step_tokens = 0;
  // While sequences decode, prompt rows are also held to what keeps the step within this many
  // times the cost of the decode rows alone, by the step costs seen so far (infer/step_cost.h: a
  // prompt row deep into a long context counts for more than one), so a long prompt's chunks
  // slow the streams by at most about this factor. At least a sixteenth of step_tokens still
  // goes to prompts each step. 0: rows alone bound the step.
  double max_step_ratio = 0;
  double max_wait_seconds = 0;  // a request not started by then ends with wait_limit; 0: none
  bool prefix_cache = true;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;  // requests
  int64_t running_sequences = 0;
  // Blocks requests hold; the others (free, or kept only by the prefix cache, which gives them
  // up when needed); blocks the prefix cache keeps (some also held by requests).
  int64_t kv_blocks_used = 0, kv_blocks_free = 0, kv_blocks_cached = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t computed_prompt_tokens = 0;  // prompt and recomputed rows run through the model
  int64_t preemptions = 0, steps = 0;
  int64_t last_step_sequences = 0, last_step_rows = 0, last_step_prompt_rows = 0;
  int64_t memory_read_bytes = 0;  // weights and cached keys/values the steps read (estimated)
  double busy_seconds = 0;        // in engine forwards
};

class Scheduler {
 public:
  using RequestId = uint64_t;
  Scheduler(Engine& engine, const tokenizer::Tokenizer& tok, const SchedulerOptions& opts);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks the request (throws naming the field: an empty prompt, a token outside the
  // vocabulary, prompt + max_new_tokens past the context, more cache than exists, bad sampling
  // values) and queues it.
  RequestId add(GenerateRequest req, RequestSink sink);
  // Ends the request (FinishReason::cancelled) and frees its blocks at once; an id that is
  // already finished is ignored.
  void cancel(RequestId id);
  // One engine forward over the running sequences' next rows; admits, preempts and finishes
  // around it. Returns false when there was nothing to run.
  bool step();
  bool idle() const { return requests_.empty(); }
  // Steps until every request has finished.
  void run_until_idle();

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return opts_; }
  Engine& engine() { return engine_; }
  // Drops every prefix-cache block no sequence holds (tests: KV blocks return to zero).
  void clear_prefix_cache();
  // Makes n cache blocks free for work beside the requests (an embedding's sequence), taking
  // them from the prefix cache if need be; false when the running requests hold too many.
  bool reserve_blocks(int64_t n);

 private:
  struct Sample;
  struct Request;
  void admit(double now);
  bool fits(Request& r, int64_t* blocks);
  void start(Request& r);
  void preempt(Request& r);
  void release(Sample& s);
  void after_forward(const std::vector<float>& logits, double now);
  void take_token(Request& r, Sample& s, const float* logits, double now);
  void finish(Request& r, Sample& s, FinishReason why, double now);
  void emit(Request& r, Sample& s, bool final);
  void remove_finished();
  void offer_blocks(Sample& s);

  Engine& engine_;
  const tokenizer::Tokenizer& tok_;
  SchedulerOptions opts_;
  std::optional<PrefixCache> prefix_;
  StepCostFit step_cost_;
  double attention_scale_ = 1;
  std::deque<std::unique_ptr<Request>> requests_;  // in order of arrival (preempted keep theirs)
  RequestId next_id_ = 1;
  SchedulerStats stats_;
  // This step's feeds and the samples they belong to (reused).
  std::vector<Feed> feeds_;
  std::vector<std::pair<Request*, Sample*>> fed_;
};

}  // namespace tessera::infer
