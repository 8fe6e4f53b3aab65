// Continuous batching: admission by free KV blocks (first come, first served), one forward per
// step with decode rows first and prompt chunks within the token budget, preemption of the
// newest request when the cache runs out, sampling, stop handling and UTF-8-safe streaming,
// and the prefix cache's matches and offers.
#include "infer/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "ops/context.h"
#include "profile/timer.h"

namespace tessera::infer {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::deadline:
      return "deadline";
    case FinishReason::wait_limit:
      return "wait_limit";
  }
  return "?";
}

size_t complete_utf8_prefix(std::string_view text) {
  // Look back at most 3 bytes for the lead byte of a character that is not finished yet.
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

struct Scheduler::Sample {
  size_t index = 0;
  int32_t seq = -1;  // engine sequence while running
  Sampler sampler;
  std::vector<int32_t> tokens;  // prompt + generated: what the sequence must hold
  int64_t fed = 0;              // leading tokens whose keys and values are in the cache
  int64_t offered = 0;          // leading full blocks offered to the prefix cache
  uint64_t chain_key = PrefixCache::kRootKey;
  bool awaiting_fork = false;  // n > 1: takes sample 0's prompt blocks when they are done
  bool done = false;
  GenerateResult result;
  std::string full_text;                // decode of every generated token
  size_t streamed = 0;                  // bytes of full_text handed to the sink
  std::vector<GeneratedToken> pending;  // tokens not yet handed to the sink
  explicit Sample(const SamplingParams& p) : sampler(p) {}
};

struct Scheduler::Request {
  RequestId id = 0;
  GenerateRequest req;
  RequestSink sink;
  std::vector<Sample> samples;
  double added = 0, started = -1;
  bool running = false;  // its unfinished samples hold sequences (or await a fork)
  bool started_once = false;
  int64_t unfinished() const {
    int64_t n = 0;
    for (const Sample& s : samples) n += !s.done;
    return n;
  }
};

Scheduler::Scheduler(Engine& engine, const tokenizer::Tokenizer& tok, const SchedulerOptions& opts)
    : engine_(engine), tok_(tok), opts_(opts) {
  TS_CHECK(opts.max_running > 0, "[scheduler] max_running must be > 0 (got ", opts.max_running,
           ")");
  TS_CHECK(opts.step_tokens >= 0, "[scheduler] step_tokens must be >= 0 (got ", opts.step_tokens,
           ")");
  TS_CHECK(opts.max_wait_seconds >= 0 && std::isfinite(opts.max_wait_seconds),
           "[scheduler] max_wait_seconds must be >= 0");
  TS_CHECK(
      opts.max_step_ratio == 0 || (opts.max_step_ratio >= 1 && std::isfinite(opts.max_step_ratio)),
      "[scheduler] max_step_ratio must be 0 or at least 1 (got ", opts.max_step_ratio, ")");
  attention_scale_ = attention_scale(engine.config());
  if (opts.prefix_cache) prefix_.emplace(engine.cache());
}

Scheduler::~Scheduler() {
  for (auto& r : requests_)
    for (Sample& s : r->samples)
      if (s.seq >= 0) engine_.free_sequence(s.seq);
  if (prefix_) prefix_->clear();
}

Scheduler::RequestId Scheduler::add(GenerateRequest req, RequestSink sink) {
  const int64_t V = engine_.config().vocab, ctx = engine_.options().max_ctx;
  const int64_t BT = engine_.cache().shape().block_tokens;
  TS_CHECK(!req.prompt.empty(), "[generate] prompt is empty");
  for (int32_t t : req.prompt)
    TS_CHECK(t >= 0 && t < V, "[generate] prompt token ", t, " outside the vocabulary [0, ", V,
             ")");
  TS_CHECK(req.max_new_tokens >= 0, "[generate] max_new_tokens must be >= 0 (got ",
           req.max_new_tokens, ")");
  const auto P = static_cast<int64_t>(req.prompt.size());
  TS_CHECK(P + req.max_new_tokens <= ctx, "[generate] prompt (", P, " tokens) + max_new_tokens (",
           req.max_new_tokens, ") = ", P + req.max_new_tokens, " exceeds the context length ", ctx);
  TS_CHECK(req.n >= 1 && req.n <= opts_.max_running, "[generate] n must be in [1, ",
           opts_.max_running, "] (the running sequences), not ", req.n);
  // Alone in the cache it must fit: the prompt once, each sample's own blocks past it.
  const int64_t total = P + req.max_new_tokens;
  const int64_t need = (P / BT) + req.n * ((total + BT - 1) / BT - P / BT);
  TS_CHECK(need <= engine_.cache().shape().n_blocks, "[generate] the request needs ", need,
           " KV-cache blocks of ", BT, " tokens; the cache has ", engine_.cache().shape().n_blocks);
  TS_CHECK(req.top_logprobs >= -1 && req.top_logprobs <= 20,
           "[generate] top_logprobs must be in [0, 20] (or -1: none), not ", req.top_logprobs);
  TS_CHECK(req.deadline_seconds >= 0 && std::isfinite(req.deadline_seconds),
           "[generate] deadline_seconds must be >= 0");
  for (const std::string& s : req.stop_strings)
    TS_CHECK(!s.empty(), "[generate] empty stop string");
  req.sampling.validate();

  auto r = std::make_unique<Request>();
  r->id = next_id_++;
  r->added = profile::now_seconds();
  r->sink = std::move(sink);
  for (int64_t i = 0; i < req.n; ++i) {
    SamplingParams p = req.sampling;
    p.seed += static_cast<uint64_t>(i);
    Sample& s = r->samples.emplace_back(p);
    s.index = static_cast<size_t>(i);
    s.tokens = req.prompt;
    s.result.prompt_tokens = P;
  }
  r->req = std::move(req);
  stats_.prompt_tokens += P;
  const RequestId id = r->id;
  requests_.push_back(std::move(r));
  return id;
}

void Scheduler::cancel(RequestId id) {
  const double now = profile::now_seconds();
  for (auto& r : requests_)
    if (r->id == id)
      for (Sample& s : r->samples)
        if (!s.done) finish(*r, s, FinishReason::cancelled, now);
  remove_finished();
}

void Scheduler::release(Sample& s) {
  if (s.seq < 0) return;
  offer_blocks(s);
  engine_.free_sequence(s.seq);
  s.seq = -1;
}

void Scheduler::offer_blocks(Sample& s) {
  if (!prefix_ || s.seq < 0) return;
  const int64_t BT = engine_.cache().shape().block_tokens;
  if (s.fed / BT <= s.offered) return;
  s.offered = prefix_->insert(std::span<const int32_t>(s.tokens.data(), static_cast<size_t>(s.fed)),
                              engine_.sequence_blocks(s.seq), s.offered, &s.chain_key);
}

// Whether a request's unfinished samples can start beside the running ones: the blocks they
// need (*blocks: what the prefix cache lacks of their tokens, plus one for each sample's next
// token) against the free blocks and those the prefix cache can give back (less the matched
// ones, which stop being free for the asking once shared), keeping a block per running
// sequence for its next step.
bool Scheduler::fits(Request& r, int64_t* blocks) {
  const int64_t BT = engine_.cache().shape().block_tokens;
  int64_t need = 0, shared_cache_only = 0;
  for (Sample& s : r.samples) {
    if (s.done) continue;
    if (s.awaiting_fork || (!r.started_once && s.index > 0)) {
      ++need;  // a fork of sample 0: its copy of the prompt's last block, or its next block
      continue;
    }
    const auto T = static_cast<int64_t>(s.tokens.size());
    int64_t matched = 0;
    if (prefix_) {
      uint64_t key = 0;
      const std::vector<int32_t> m = prefix_->match(s.tokens, (T - 1) / BT, &key);
      matched = static_cast<int64_t>(m.size());
      for (int32_t b : m) shared_cache_only += engine_.cache().ref_count(b) == 1;
    }
    need += (T + BT) / BT - matched;  // its tokens and the next one
  }
  *blocks = need;
  const int64_t evictable = prefix_ ? prefix_->evictable() : 0;
  // Each running sequence may take a block in the next step.
  int64_t reserve = 0;
  for (auto& o : requests_)
    if (o->running) reserve += o->unfinished();
  return need + reserve <= engine_.cache().free_blocks() + evictable - shared_cache_only;
}

void Scheduler::start(Request& r) {
  const int64_t BT = engine_.cache().shape().block_tokens;
  const bool first = !r.started_once;
  for (Sample& s : r.samples) {
    if (s.done) continue;
    if (first && s.index > 0) {  // shares sample 0's prompt once it has run
      s.awaiting_fork = true;
      continue;
    }
    if (s.awaiting_fork) continue;
    s.seq = engine_.new_sequence();
    s.fed = 0;
    s.offered = 0;
    s.chain_key = PrefixCache::kRootKey;
    const auto T = static_cast<int64_t>(s.tokens.size());
    if (prefix_) {
      const std::vector<int32_t> m = prefix_->match(s.tokens, (T - 1) / BT, &s.chain_key);
      if (!m.empty()) {
        engine_.share_blocks(s.seq, m, static_cast<int64_t>(m.size()) * BT);
        s.fed = static_cast<int64_t>(m.size()) * BT;
        s.offered = static_cast<int64_t>(m.size());
      }
      if (first) {
        stats_.prefix_query_tokens += static_cast<int64_t>(r.req.prompt.size());
        stats_.prefix_hit_tokens += s.fed;
      }
    }
    if (first) s.result.cached_tokens = s.fed;
  }
  if (first) {
    r.started = profile::now_seconds();
    for (Sample& s : r.samples) s.result.queue_seconds = r.started - r.added;
  }
  r.started_once = true;
  r.running = true;
}

void Scheduler::admit(double now) {
  int64_t running = 0;
  for (auto& r : requests_)
    if (r->running) running += r->unfinished();
  for (auto& r : requests_) {
    if (r->running || r->unfinished() == 0) continue;
    if (running + r->unfinished() > opts_.max_running) break;
    int64_t need = 0;
    if (!fits(*r, &need)) {
      // Alone, every request fits (add() checks); with others running it waits its turn.
      if (running > 0) break;
      if (prefix_) prefix_->evict(need);
    }
    start(*r);
    running += r->unfinished();
    if (r->req.max_new_tokens == 0)
      for (Sample& s : r->samples)
        if (!s.done) finish(*r, s, FinishReason::length, now);
  }
}

void Scheduler::preempt(Request& r) {
  for (Sample& s : r.samples) {
    release(s);  // its full blocks stay in the prefix cache: a readmission may find them
    s.fed = 0;
  }
  r.running = false;
  ++stats_.preemptions;
}

bool Scheduler::step() {
  const double now = profile::now_seconds();
  auto end_if = [&](auto&& over, FinishReason why) {
    for (auto& r : requests_)
      if (r->unfinished() > 0 && over(*r))
        for (Sample& s : r->samples)
          if (!s.done) finish(*r, s, why, now);
    remove_finished();
  };
  end_if(
      [&](const Request& r) {
        return r.req.deadline_seconds > 0 && now - r.added > r.req.deadline_seconds;
      },
      FinishReason::deadline);
  admit(now);
  // What could not start now and has waited too long leaves the queue.
  end_if(
      [&](const Request& r) {
        return !r.started_once && opts_.max_wait_seconds > 0 &&
               now - r.added > opts_.max_wait_seconds;
      },
      FinishReason::wait_limit);

  // This step's rows: every decode (one pending token), then prompt chunks in arrival order
  // within the budget: step_tokens rows in all while some sequence decodes (at least a quarter of
  // it for prompts, so they always advance), at least a chunk of the engine's when none does
  // (no stream waits on the step then). When the cache lacks the blocks, the newest request
  // gives way.
  const int64_t unbounded = std::numeric_limits<int64_t>::max();
  int64_t decode_rows = 0, prompt_rows = 0;
  double decode_units = 0, prompt_units = 0;
  for (;;) {
    feeds_.clear();
    fed_.clear();
    decode_rows = prompt_rows = 0;
    decode_units = prompt_units = 0;
    int64_t blocks = 0, prompt_budget = 0;
    double unit_budget = std::numeric_limits<double>::infinity();
    Request* oldest = nullptr;
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1) {
        const int64_t T = opts_.step_tokens;
        prompt_budget = T == 0            ? unbounded
                        : decode_rows > 0 ? std::max(T - decode_rows, (T + 3) / 4)
                                          : std::max(T, engine_.options().max_rows);
        // The time bound: prompt units such that fixed + (decode + prompt units) x per_unit
        // stays within max_step_ratio x (fixed + decode units x per_unit).
        if (decode_rows > 0 && opts_.max_step_ratio > 0 && step_cost_.valid()) {
          const double f = step_cost_.fixed_seconds(), c = step_cost_.seconds_per_unit();
          unit_budget = (opts_.max_step_ratio - 1) * (f + decode_units * c) / c;
          unit_budget = std::max(unit_budget, static_cast<double>((T + 15) / 16));
        }
      }
      for (auto& r : requests_) {
        if (!r->running) continue;
        if (!oldest) oldest = r.get();
        for (Sample& s : r->samples) {
          if (s.done || s.seq < 0) continue;
          const int64_t pending = static_cast<int64_t>(s.tokens.size()) - s.fed;
          if ((pass == 0) != (pending == 1)) continue;
          int64_t take = pass == 0 ? 1 : std::min(pending, prompt_budget - prompt_rows);
          if (pass == 1 && take > 0 && std::isfinite(unit_budget)) {
            // As many rows as the units left allow, each costing about what the chunk's middle
            // row does.
            const double left = unit_budget - prompt_units;
            const double per_row =
                row_units(s.fed, take, attention_scale_) / static_cast<double>(take);
            const int64_t fits = static_cast<int64_t>(left / per_row);
            take = std::min(take, std::max<int64_t>(fits, prompt_rows == 0 ? 1 : 0));  // progress
          }
          if (take <= 0) continue;
          feeds_.push_back(Feed{
              s.seq, std::span<const int32_t>(s.tokens.data() + s.fed, static_cast<size_t>(take)),
              false});
          fed_.emplace_back(r.get(), &s);
          (pass == 0 ? decode_rows : prompt_rows) += take;
          (pass == 0 ? decode_units : prompt_units) += row_units(s.fed, take, attention_scale_);
          blocks += engine_.blocks_to_append(s.seq, take);
        }
      }
    }
    if (feeds_.empty()) return false;
    KvCache& cache = engine_.cache();
    if (blocks > cache.free_blocks() && prefix_) prefix_->evict(blocks - cache.free_blocks());
    if (blocks <= cache.free_blocks()) break;
    Request* newest = nullptr;
    for (auto& r : requests_)
      if (r->running && r.get() != oldest) newest = r.get();
    // The oldest request alone always fits (add() checks it against the whole cache).
    TS_CHECK(newest, "[scheduler] the KV cache cannot hold the oldest request (", blocks,
             " blocks needed, ", cache.free_blocks(), " free)");
    preempt(*newest);
  }

  const profile::Timer timer;
  const std::vector<float>& logits = engine_.forward(feeds_);
  const double step_seconds = timer.seconds();
  step_cost_.add(decode_units + prompt_units, step_seconds);
  stats_.busy_seconds += step_seconds;
  ++stats_.steps;
  const int64_t rows = decode_rows + prompt_rows;
  stats_.last_step_rows = rows;
  stats_.last_step_prompt_rows = prompt_rows;
  stats_.last_step_sequences = static_cast<int64_t>(feeds_.size());
  const int64_t max_rows = engine_.options().max_rows;
  stats_.memory_read_bytes +=
      (rows + max_rows - 1) / max_rows * engine_.model().weight_bytes_per_token();
  {
    // What follows the forward, named for a profiler: sampling each row's token and handing it
    // to its request (detokenizing, stop strings, streaming).
    const ops::Scope scope(engine_.options().ctx, "sample");
    after_forward(logits, profile::now_seconds());
    remove_finished();
  }
  return true;
}

void Scheduler::after_forward(const std::vector<float>& logits, double now) {
  const int64_t V = engine_.config().vocab;
  const int64_t kv_bytes_per_token = engine_.cache().bytes_per_token();
  for (size_t i = 0; i < fed_.size(); ++i) {
    Request& r = *fed_[i].first;
    Sample& s = *fed_[i].second;
    const auto n = static_cast<int64_t>(feeds_[i].tokens.size());
    if (s.done) continue;  // its request was cancelled by an earlier sample's sink
    const bool prompt_row = s.fed < static_cast<int64_t>(r.req.prompt.size()) || n > 1;
    if (prompt_row) stats_.computed_prompt_tokens += n;
    if (prompt_row) s.result.computed_prompt_tokens += n;
    s.fed += n;
    stats_.memory_read_bytes += s.fed * kv_bytes_per_token;
    offer_blocks(s);
    if (s.fed < static_cast<int64_t>(s.tokens.size())) continue;  // more prompt to run
    const float* row = logits.data() + static_cast<int64_t>(i) * V;
    if (s.index == 0)
      for (Sample& o : r.samples)
        if (o.awaiting_fork && !o.done) {
          o.awaiting_fork = false;
          o.seq = engine_.fork_sequence(s.seq);
          o.fed = s.fed;
          o.result.cached_tokens = s.fed;
          take_token(r, o, row, now);
        }
    if (!s.done) take_token(r, s, row, now);
  }
}

namespace {

// log-softmax of the row at `chosen`, and the k most likely tokens with theirs.
GeneratedToken logprobs_of(const float* logits, int64_t V, int32_t chosen, int64_t k) {
  float mx = logits[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, logits[v]);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[v] - mx));
  const double lse = static_cast<double>(mx) + std::log(sum);
  GeneratedToken g{chosen, static_cast<float>(logits[chosen] - lse), {}};
  if (k > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) ids[static_cast<size_t>(v)] = static_cast<int32_t>(v);
    const auto kk = std::min<int64_t>(k, V);
    std::partial_sort(ids.begin(), ids.begin() + kk, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t j = 0; j < kk; ++j)
      g.top.push_back({ids[static_cast<size_t>(j)],
                       static_cast<float>(logits[ids[static_cast<size_t>(j)]] - lse)});
  }
  return g;
}

}  // namespace

void Scheduler::take_token(Request& r, Sample& s, const float* logits, double now) {
  const int64_t V = engine_.config().vocab;
  if (s.result.tokens.empty() && s.pending.empty())
    s.result.prefill_seconds = now - (r.started >= 0 ? r.started : r.added);
  const int32_t t = s.sampler.sample({logits, static_cast<size_t>(V)}, s.tokens);
  const auto& stops = r.req.stop_tokens;
  if (std::find(stops.begin(), stops.end(), t) != stops.end()) {
    finish(r, s, FinishReason::stop, now);
    return;
  }
  s.tokens.push_back(t);
  s.result.tokens.push_back(t);
  ++stats_.generated_tokens;
  s.pending.push_back(r.req.top_logprobs >= 0 ? logprobs_of(logits, V, t, r.req.top_logprobs)
                                              : GeneratedToken{t, 0, {}});
  // Append the new token's bytes rather than decoding everything again (a long generation would
  // be quadratic). Until some text exists, decode it all: SentencePiece drops the leading space
  // of the whole text, which only a full decode knows (a continuation of the prompt keeps it).
  const bool skip = r.req.skip_special_tokens;
  if (s.full_text.empty() && !r.req.continuation)
    s.full_text = tok_.decode(s.result.tokens, skip);
  else if (!(skip && tok_.is_special(t)))
    s.full_text += tok_.decode_token(t);
  // A stop string ends the text where it starts.
  for (const std::string& stop : r.req.stop_strings) {
    const size_t at =
        s.full_text.find(stop, s.streamed > stop.size() ? s.streamed - stop.size() : 0);
    if (at != std::string::npos) {
      s.full_text.resize(at);
      finish(r, s, FinishReason::stop, now);
      return;
    }
  }
  if (static_cast<int64_t>(s.result.tokens.size()) >= r.req.max_new_tokens) {
    finish(r, s, FinishReason::length, now);
    return;
  }
  emit(r, s, false);
}

void Scheduler::emit(Request& r, Sample& s, bool final) {
  // Streamable text: whole characters, and nothing that may be the start of a stop string
  // (unless this is the end).
  size_t limit = s.full_text.size();
  if (!final) {
    limit = complete_utf8_prefix(s.full_text);
    for (const std::string& stop : r.req.stop_strings)
      for (size_t len = std::min(stop.size() - 1, limit); len > 0; --len)
        if (s.full_text.compare(limit - len, len, stop, 0, len) == 0) {
          limit -= len;
          break;
        }
    limit = std::max(limit, s.streamed);
  }
  if (s.pending.empty() && limit == s.streamed) return;
  const std::string_view text =
      std::string_view(s.full_text).substr(s.streamed, limit - s.streamed);
  s.streamed = limit;
  const bool go_on = !r.sink.on_tokens || r.sink.on_tokens(s.index, s.pending, text);
  s.pending.clear();
  if (!go_on && !final)
    for (Sample& o : r.samples)
      if (!o.done) finish(r, o, FinishReason::cancelled, profile::now_seconds());
}

void Scheduler::finish(Request& r, Sample& s, FinishReason why, double now) {
  if (s.done) return;
  s.done = true;
  s.awaiting_fork = false;
  s.result.finish_reason = why;
  if (why != FinishReason::cancelled) emit(r, s, true);  // what was held back, and last tokens
  s.result.text = s.full_text;
  if (!s.result.tokens.empty())
    s.result.decode_seconds =
        now - (r.started >= 0 ? r.started : r.added) - s.result.prefill_seconds;
  release(s);
  if (r.sink.on_finish) r.sink.on_finish(s.index, std::move(s.result));
}

void Scheduler::remove_finished() {
  std::erase_if(requests_, [](const std::unique_ptr<Request>& r) { return r->unfinished() == 0; });
  for (auto& r : requests_)
    if (r->running) {
      bool holds = false;
      for (const Sample& s : r->samples) holds |= !s.done && (s.seq >= 0 || s.awaiting_fork);
      r->running = holds;
    }
}

void Scheduler::run_until_idle() {
  while (!idle())
    if (!step() && !idle()) {
      // Nothing could run but requests remain: all are waiting on a limit that a step clears
      // (a cancelled or finished request frees room at the next admission).
      admit(profile::now_seconds());
      TS_CHECK(step() || idle(), "[scheduler] requests remain but none can run");
    }
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st = stats_;
  for (const auto& r : requests_) {
    if (r->running) {
      ++st.running;
      st.running_sequences += r->unfinished();
    } else {
      ++st.waiting;
    }
  }
  const int64_t cache_only = prefix_ ? prefix_->evictable() : 0;
  st.kv_blocks_free = engine_.cache().free_blocks() + cache_only;
  st.kv_blocks_used = engine_.cache().used_blocks() - cache_only;
  st.kv_blocks_cached = prefix_ ? prefix_->blocks() : 0;
  return st;
}

void Scheduler::clear_prefix_cache() {
  if (prefix_) prefix_->clear();
}

bool Scheduler::reserve_blocks(int64_t n) {
  KvCache& cache = engine_.cache();
  if (n > cache.free_blocks() && prefix_) prefix_->evict(n - cache.free_blocks());
  return n <= cache.free_blocks();
}

}  // namespace tessera::infer
