// /v1/chat/completions and /v1/completions: the request checked and turned into the engine's
// (prompt through the model's chat template, limits against the context and the cache), handed
// to the engine loop, and answered whole or as server-sent events while the client stays.
#include <httplib.h>

#include <chrono>
#include <ctime>

#include "core/error.h"
#include "infer/chat_prompt.h"
#include "serve/api_request.h"
#include "serve/engine_loop.h"
#include "serve/metrics.h"
#include "serve/openai_json.h"
#include "serve/peer.h"
#include "serve/server.h"

namespace tessera::serve {

namespace {

using std::chrono::milliseconds;

// What a response has gathered of each choice (sample).
struct Choices {
  explicit Choices(size_t n) : text(n), logprobs(n), results(n), started(n, false) {}
  std::vector<std::string> text;
  std::vector<std::vector<infer::GeneratedToken>> logprobs;
  std::vector<infer::GenerateResult> results;
  std::vector<bool> started;  // a chunk went out (streaming: the role is on the first)
  size_t finished = 0;
  std::string error;
  void take(RequestStream::Events& ev, bool keep_logprobs) {
    for (RequestStream::Delta& d : ev.deltas) {
      text[d.index] += d.text;
      if (keep_logprobs)
        logprobs[d.index].insert(logprobs[d.index].end(), d.tokens.begin(), d.tokens.end());
    }
    for (auto& [k, r] : ev.finished) {
      results[k] = std::move(r);
      ++finished;
    }
    if (!ev.error.empty()) error = ev.error;
  }
  // Every sample ended before it started (the queue's wait limit).
  bool never_started() const {
    for (const infer::GenerateResult& r : results)
      if (r.finish_reason != infer::FinishReason::wait_limit) return false;
    return true;
  }
};

}  // namespace

void Server::handle_generation(const httplib::Request& req, httplib::Response& res, bool chat) {
  const Endpoint endpoint = chat ? Endpoint::chat : Endpoint::completion;
  auto fail = [&](const ApiError& e) {
    if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
    res.status = e.status;
    res.set_content(dump(error_json(e)), "application/json");
    metrics_->count_request(req.path, e.status);
  };
  if (!authorized(req, res)) return metrics_->count_request(req.path, res.status);

  GenerationRequest g;
  infer::GenerateRequest r;
  try {
    if (draining_) throw ApiError(503, "the server is shutting down", "", "server_error");
    g = chat ? parse_chat_request(req.body) : parse_completion_request(req.body);
    check_model(g.model);
    const char* prompt_field = chat ? "messages" : "prompt";
    try {
      if (chat) {
        const infer::ChatPrompt p = infer::make_prompt(model_, g.messages, "", false, "");
        r.prompt = p.tokens;
        // The template's end-of-turn text stops like the end token (not with ignore_eos).
        if (!g.ignore_eos) r.stop_strings = p.stop_strings;
      } else if (g.prompt_is_tokens) {
        r.prompt = g.prompt_tokens;
      } else {
        r.prompt = infer::make_prompt(model_, {{"user", g.prompt}}, "", true, "").tokens;
      }
    } catch (const Error& e) {
      throw ApiError(400, e.what(), prompt_field);
    }
    const int64_t V = engine_.config().vocab, ctx = engine_.options().max_ctx;
    for (int32_t t : r.prompt)
      if (t >= V)
        throw ApiError(
            400,
            "token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(V),
            prompt_field);
    const auto P = static_cast<int64_t>(r.prompt.size());
    if (P >= ctx)
      throw ApiError(400,
                     "the prompt has " + std::to_string(P) + " tokens; the context holds " +
                         std::to_string(ctx) + " with room for at least one more",
                     prompt_field);
    r.max_new_tokens = g.max_tokens >= 0 ? g.max_tokens
                       : chat            ? ctx - P
                                         : std::min<int64_t>(16, ctx - P);
    if (P + r.max_new_tokens > ctx)
      throw ApiError(400,
                     "the prompt (" + std::to_string(P) + " tokens) + " + g.max_tokens_field +
                         " (" + std::to_string(r.max_new_tokens) +
                         ") = " + std::to_string(P + r.max_new_tokens) +
                         " exceeds the context of " + std::to_string(ctx) + " tokens",
                     g.max_tokens_field);
    if (g.n > max_running_)
      throw ApiError(400,
                     "n = " + std::to_string(g.n) + " is more than the " +
                         std::to_string(max_running_) + " sequences this server runs at once",
                     "n");
    const int64_t BT = engine_.cache().shape().block_tokens, total = P + r.max_new_tokens;
    const int64_t need = P / BT + g.n * ((total + BT - 1) / BT - P / BT);
    if (need > engine_.cache().shape().n_blocks)
      throw ApiError(400,
                     "the request needs " + std::to_string(need * BT) +
                         " tokens of KV cache; this server's cache holds " +
                         std::to_string(engine_.cache().shape().n_blocks * BT) + ": lower " +
                         g.max_tokens_field + " or n",
                     g.max_tokens_field);
    r.sampling = g.sampling;
    if (!g.ignore_eos) r.stop_tokens = model_.tok.end_of_generation_tokens();
    r.stop_strings.insert(r.stop_strings.end(), g.stop.begin(), g.stop.end());
    r.n = g.n;
    r.skip_special_tokens = g.skip_special_tokens;
    r.continuation = !chat;  // a completion's text continues its prompt
    r.top_logprobs = g.top_logprobs;
    r.deadline_seconds = opts_.request_timeout_seconds;
    if (loop_->waiting() >= opts_.max_queue)
      throw ApiError(429,
                     "the queue is full (" + std::to_string(opts_.max_queue) +
                         " requests waiting); retry later",
                     "", "rate_limit_error");
  } catch (const ApiError& e) {
    return fail(e);
  }

  const std::shared_ptr<RequestStream> stream = loop_->submit(r);
  const Peer peer(req.remote_addr, req.remote_port, req.local_port);
  const bool keep_logprobs = g.top_logprobs >= 0;
  Choices st(static_cast<size_t>(g.n));
  ResponseHead head{endpoint, new_id(endpoint), opts_.model_name,
                    static_cast<int64_t>(std::time(nullptr))};
  // Waits for events: until the first ones when streaming, to the end otherwise. False when
  // the client left (its request is then cancelled).
  auto gather = [&](bool until_end, RequestStream::Events* first) {
    for (;;) {
      RequestStream::Events ev;
      const bool got = stream->wait(&ev, milliseconds(100));
      if (got && !until_end) {
        *first = std::move(ev);
        return true;
      }
      if (got) st.take(ev, keep_logprobs);
      if (stream->over()) {
        while (stream->wait(&ev, milliseconds(0))) {
          if (!until_end) {
            *first = std::move(ev);
            return true;
          }
          st.take(ev, keep_logprobs);
        }
        return true;
      }
      if (peer.gone()) {
        loop_->cancel(stream);
        return false;
      }
    }
  };
  auto usage = [&] {
    int64_t completion = 0;
    for (const infer::GenerateResult& x : st.results)
      completion += static_cast<int64_t>(x.tokens.size());
    return usage_json(static_cast<int64_t>(r.prompt.size()), completion,
                      st.results[0].cached_tokens);
  };

  if (!g.stream) {
    RequestStream::Events unused;
    if (!gather(true, &unused)) return metrics_->count_request(req.path, 499);
    if (!st.error.empty()) return fail(ApiError(500, st.error, "", "server_error"));
    if (st.never_started())
      return fail(
          ApiError(503, "the request waited too long to start; retry later", "", "server_error"));
    json choices = json::array();
    for (size_t k = 0; k < st.results.size(); ++k) {
      const json lp =
          keep_logprobs ? logprobs_json(endpoint, model_.tok, st.logprobs[k], 0) : json(nullptr);
      choices.push_back(choice_json(head, k, st.text[k], lp, st.results[k].finish_reason));
    }
    res.status = 200;
    res.set_content(dump(response_json(head, std::move(choices), usage())), "application/json");
    return metrics_->count_request(req.path, 200);
  }

  // Streaming: the status waits for the first events, so a request that never starts still
  // gets its error status.
  auto first = std::make_shared<RequestStream::Events>();
  if (!gather(false, first.get())) return metrics_->count_request(req.path, 499);
  if (!first->error.empty()) return fail(ApiError(500, first->error, "", "server_error"));
  if (first->deltas.empty() && stream->over()) {
    Choices probe(static_cast<size_t>(g.n));
    RequestStream::Events copy = *first;
    probe.take(copy, false);
    if (probe.finished == probe.results.size() && probe.never_started())
      return fail(
          ApiError(503, "the request waited too long to start; retry later", "", "server_error"));
  }
  metrics_->count_request(req.path, 200);
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  auto state = std::make_shared<Choices>(static_cast<size_t>(g.n));
  const bool include_usage = g.include_usage;
  const int64_t prompt_tokens = static_cast<int64_t>(r.prompt.size());
  EngineLoop* loop = loop_.get();
  const tokenizer::Tokenizer* tok = &model_.tok;
  auto write_events = [=](RequestStream::Events& ev, httplib::DataSink& sink) {
    Choices& s = *state;
    const json null_usage = nullptr;
    const json* u = include_usage ? &null_usage : nullptr;
    auto send = [&](const json& chunk) {
      const std::string line = "data: " + dump(chunk) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    for (RequestStream::Delta& d : ev.deltas) {
      const bool first_chunk = !s.started[d.index];
      if (!first_chunk && d.text.empty() && !keep_logprobs) continue;
      const json lp = keep_logprobs
                          ? logprobs_json(endpoint, *tok, d.tokens, s.text[d.index].size())
                          : json(nullptr);
      s.started[d.index] = true;
      s.text[d.index] += d.text;
      if (!send(chunk_json(
              head, json::array({chunk_choice(head, d.index, d.text, first_chunk, lp, nullptr)}),
              u)))
        return false;
    }
    for (auto& [k, result] : ev.finished) {
      const bool first_chunk = !s.started[k];
      s.started[k] = true;
      s.results[k] = std::move(result);
      ++s.finished;
      if (!send(
              chunk_json(head,
                         json::array({chunk_choice(head, k, "", first_chunk, json(nullptr),
                                                   api_finish_reason(s.results[k].finish_reason))}),
                         u)))
        return false;
    }
    if (!ev.error.empty()) {
      send({{"error", error_json(ApiError(500, ev.error, "", "server_error"))["error"]}});
      return false;
    }
    if (s.finished == s.results.size()) {
      if (include_usage) {
        int64_t completion = 0;
        for (const infer::GenerateResult& x : s.results)
          completion += static_cast<int64_t>(x.tokens.size());
        const json us = usage_json(prompt_tokens, completion, s.results[0].cached_tokens);
        if (!send(chunk_json(head, json::array(), &us))) return false;
      }
      const std::string done = "data: [DONE]\n\n";
      if (!sink.write(done.data(), done.size())) return false;
      sink.done();
    }
    return true;
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        if (!first->empty()) {
          RequestStream::Events ev = std::move(*first);
          *first = RequestStream::Events{};
          return write_events(ev, sink);
        }
        RequestStream::Events ev;
        if (stream->wait(&ev, milliseconds(100))) return write_events(ev, sink);
        return !peer.gone();
      },
      [=](bool ok) {
        if (!ok) loop->cancel(stream);  // the client left mid-stream: free its blocks now
      });
}

}  // namespace tessera::serve
