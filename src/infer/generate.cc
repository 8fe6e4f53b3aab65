// Generate loop: per-request state (sampler, decoded text, what has been streamed), batched
// steps through the engine, stop tokens and stop strings, and prefix reuse for sessions.
#include "infer/generate.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "profile/timer.h"

namespace tessera::infer {

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

namespace {

struct Live {
  const GenerateRequest* req;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> history;  // prompt + generated, for the penalties
  GenerateResult result;
  std::string full_text;  // decode of all generated tokens
  size_t streamed = 0;    // bytes of full_text already handed to the callback
  int32_t seq = -1;
  int32_t next = -1;  // sampled token to feed next
  bool done = false;
};

void check_request(const GenerateRequest& r, int64_t vocab) {
  TS_CHECK(!r.prompt.empty(), "[generate] empty prompt");
  TS_CHECK(r.max_new_tokens >= 0, "[generate] --n must be >= 0 (got ", r.max_new_tokens, ")");
  for (int32_t t : r.prompt)
    TS_CHECK(t >= 0 && t < vocab, "[generate] prompt token ", t, " outside [0, ", vocab, ")");
  r.sampling.validate();
  for (const std::string& s : r.stop_strings)
    TS_CHECK(!s.empty(), "[generate] empty --stop string");
}

// Text that can be streamed: whole characters, and nothing that may be the start of a stop
// string. Returns false when a stop string was found (full_text is then cut there).
bool advance_text(Live& s, const tokenizer::Tokenizer& tok, size_t request,
                  const BatchTextCallback& on_text) {
  // Append the new token's bytes rather than decoding everything again (a long generation would
  // be quadratic). Until some text exists, decode it all: SentencePiece drops the leading space
  // of the whole text, which only a full decode knows.
  if (s.full_text.empty())
    s.full_text = tok.decode(s.result.tokens);
  else
    s.full_text += tok.decode_token(s.result.tokens.back());
  bool stopped = false;
  size_t limit = complete_utf8_prefix(s.full_text);
  for (const std::string& stop : s.req->stop_strings) {
    const size_t at = s.full_text.find(stop);
    if (at != std::string::npos && at < limit) {
      limit = at;
      stopped = true;
    }
  }
  if (stopped) {
    s.full_text.resize(limit);
  } else {
    // Hold back a tail that is a prefix of some stop string.
    for (const std::string& stop : s.req->stop_strings)
      for (size_t len = std::min(stop.size() - 1, limit); len > 0; --len)
        if (s.full_text.compare(limit - len, len, stop, 0, len) == 0) {
          limit -= len;
          break;
        }
  }
  if (limit > s.streamed) {
    if (on_text &&
        !on_text(request, std::string_view(s.full_text).substr(s.streamed, limit - s.streamed))) {
      s.result.finish_reason = "cancelled";
      s.done = true;
    }
    s.streamed = limit;
  }
  return !stopped;
}

void finish(Live& s, size_t request, const BatchTextCallback& on_text, const std::string& reason) {
  if (!s.done) s.result.finish_reason = reason;
  s.done = true;
  // Flush what was held back (a partial stop-string prefix that never completed).
  if (s.full_text.size() > s.streamed && s.result.finish_reason != "cancelled" && on_text)
    on_text(request, std::string_view(s.full_text).substr(s.streamed));
  s.streamed = s.full_text.size();
  s.result.text = s.full_text;
}

// Samples from `logits` for request i; handles stop tokens, stop strings and the length limit.
void take_step(Live& s, const float* logits, int64_t vocab, const tokenizer::Tokenizer& tok,
               size_t i, const BatchTextCallback& on_text) {
  const int32_t t = s.sampler->sample({logits, static_cast<size_t>(vocab)}, s.history);
  if (std::find(s.req->stop_tokens.begin(), s.req->stop_tokens.end(), t) !=
      s.req->stop_tokens.end()) {
    finish(s, i, on_text, "stop");
    return;
  }
  s.result.tokens.push_back(t);
  s.history.push_back(t);
  s.next = t;
  if (!advance_text(s, tok, i, on_text)) {
    finish(s, i, on_text, "stop");
  } else if (s.done) {
    finish(s, i, on_text, "cancelled");
  } else if (static_cast<int64_t>(s.result.tokens.size()) >= s.req->max_new_tokens) {
    finish(s, i, on_text, "length");
  }
}

// Runs prefill (one forward over the prompts' remaining tokens) and the decode steps.
void run(Engine& engine, const tokenizer::Tokenizer& tok, std::vector<Live>& live,
         const std::vector<std::vector<int32_t>>& prefill, const BatchTextCallback& on_text) {
  const int64_t V = engine.config().vocab;
  profile::Timer timer;
  std::vector<Feed> feeds;
  for (size_t i = 0; i < live.size(); ++i) {
    live[i].result.prompt_tokens = static_cast<int64_t>(prefill[i].size());
    feeds.push_back(Feed{live[i].seq, prefill[i], false});
  }
  const std::vector<float>* logits = &engine.forward(feeds);
  const double prefill_s = timer.seconds();
  for (size_t i = 0; i < live.size(); ++i) {
    live[i].result.prefill_seconds = prefill_s;
    if (live[i].req->max_new_tokens == 0) {
      finish(live[i], i, on_text, "length");
      continue;
    }
    take_step(live[i], logits->data() + static_cast<int64_t>(i) * V, V, tok, i, on_text);
  }
  timer.reset();
  std::vector<size_t> active;
  std::vector<int32_t> next_tokens(live.size());
  for (;;) {
    feeds.clear();
    active.clear();
    for (size_t i = 0; i < live.size(); ++i) {
      if (live[i].done) continue;
      next_tokens[i] = live[i].next;
      feeds.push_back(Feed{live[i].seq, {&next_tokens[i], 1}, false});
      active.push_back(i);
    }
    if (feeds.empty()) break;
    logits = &engine.forward(feeds);
    for (size_t j = 0; j < active.size(); ++j)
      take_step(live[active[j]], logits->data() + static_cast<int64_t>(j) * V, V, tok, active[j],
                on_text);
  }
  const double decode_s = timer.seconds();
  for (Live& s : live) s.result.decode_seconds = decode_s;
}

}  // namespace

std::vector<GenerateResult> generate_batch(Engine& engine, const tokenizer::Tokenizer& tok,
                                           const std::vector<GenerateRequest>& reqs,
                                           const BatchTextCallback& on_text) {
  std::vector<Live> live(reqs.size());
  std::vector<std::vector<int32_t>> prefill;
  for (size_t i = 0; i < reqs.size(); ++i) {
    check_request(reqs[i], engine.config().vocab);
    live[i].req = &reqs[i];
    live[i].sampler = std::make_unique<Sampler>(reqs[i].sampling);
    live[i].history = reqs[i].prompt;
    prefill.push_back(reqs[i].prompt);
  }
  for (Live& s : live) s.seq = engine.new_sequence();
  try {
    run(engine, tok, live, prefill, on_text);
  } catch (...) {
    for (Live& s : live) engine.free_sequence(s.seq);
    throw;
  }
  std::vector<GenerateResult> out;
  for (Live& s : live) {
    engine.free_sequence(s.seq);
    out.push_back(std::move(s.result));
  }
  return out;
}

GenerateResult generate(Engine& engine, const tokenizer::Tokenizer& tok, const GenerateRequest& req,
                        const TextCallback& on_text, Session* session) {
  BatchTextCallback cb;
  if (on_text) cb = [&](size_t, std::string_view t) { return on_text(t); };
  if (!session) return std::move(generate_batch(engine, tok, {req}, cb)[0]);

  check_request(req, engine.config().vocab);
  if (session->seq < 0) {
    session->seq = engine.new_sequence();
    session->cached.clear();
  }
  // Reuse the cached prefix; at least the last prompt token runs again to give logits.
  size_t common = 0;
  while (common < session->cached.size() && common + 1 < req.prompt.size() &&
         session->cached[common] == req.prompt[common])
    ++common;
  engine.truncate_sequence(session->seq, static_cast<int64_t>(common));
  session->cached.resize(common);

  std::vector<Live> live(1);
  live[0].req = &req;
  live[0].sampler = std::make_unique<Sampler>(req.sampling);
  live[0].history = req.prompt;
  live[0].seq = session->seq;
  std::vector<std::vector<int32_t>> prefill{std::vector<int32_t>(
      req.prompt.begin() + static_cast<std::ptrdiff_t>(common), req.prompt.end())};
  try {
    run(engine, tok, live, prefill, cb);
  } catch (...) {
    engine.truncate_sequence(session->seq, static_cast<int64_t>(common));
    throw;
  }
  // The cache now holds the prompt and every generated token but the last one sampled.
  session->cached = req.prompt;
  const std::vector<int32_t>& gen = live[0].result.tokens;
  const int64_t fed =
      engine.sequence_length(session->seq) - static_cast<int64_t>(req.prompt.size());
  session->cached.insert(session->cached.end(), gen.begin(), gen.begin() + fed);
  return std::move(live[0].result);
}

}  // namespace tessera::infer
