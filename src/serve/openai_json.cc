// Builders of OpenAI's response objects.
#include "serve/openai_json.h"

#include <algorithm>
#include <random>

namespace tessera::serve {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string base64(std::string_view bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k)
      v = v << 8 | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? abc[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

json error_json(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"code", e.status}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  return {{"error", err}};
}

std::string new_id(Endpoint e) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = e == Endpoint::chat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

const char* api_finish_reason(infer::FinishReason r) {
  switch (r) {
    case infer::FinishReason::stop:
      return "stop";
    case infer::FinishReason::length:
    case infer::FinishReason::deadline:
      return "length";
    case infer::FinishReason::cancelled:
    case infer::FinishReason::wait_limit:
      return "abort";
  }
  return "stop";
}

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

json logprobs_json(Endpoint e, const tokenizer::Tokenizer& tok,
                   std::span<const infer::GeneratedToken> tokens, size_t offset) {
  if (e == Endpoint::chat) {
    json content = json::array();
    for (const infer::GeneratedToken& g : tokens) {
      const std::string t = tok.decode_token(g.token);
      json top = json::array();
      for (const infer::TokenLogprob& x : g.top) {
        const std::string s = tok.decode_token(x.token);
        top.push_back({{"token", s}, {"logprob", x.logprob}, {"bytes", bytes_of(s)}});
      }
      content.push_back(
          {{"token", t}, {"logprob", g.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const infer::GeneratedToken& g : tokens) {
    const std::string t = tok.decode_token(g.token);
    toks.push_back(t);
    lps.push_back(g.logprob);
    json top = json::object();
    for (const infer::TokenLogprob& x : g.top) top[tok.decode_token(x.token)] = x.logprob;
    tops.push_back(top);
    offs.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json choice_json(const ResponseHead& h, size_t index, const std::string& text, const json& logprobs,
                 infer::FinishReason finish) {
  json c = {{"index", index}, {"logprobs", logprobs}, {"finish_reason", api_finish_reason(finish)}};
  if (h.endpoint == Endpoint::chat)
    c["message"] = {{"role", "assistant"}, {"content", text}};
  else
    c["text"] = text;
  return c;
}

json response_json(const ResponseHead& h, json choices, const json& usage) {
  return {{"id", h.id},
          {"object", h.endpoint == Endpoint::chat ? "chat.completion" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"system_fingerprint", "tessera"},
          {"choices", std::move(choices)},
          {"usage", usage}};
}

json chunk_json(const ResponseHead& h, json choices, const json* usage) {
  json c = {{"id", h.id},
            {"object", h.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", h.created},
            {"model", h.model},
            {"system_fingerprint", "tessera"},
            {"choices", std::move(choices)}};
  if (usage) c["usage"] = *usage;
  return c;
}

json chunk_choice(const ResponseHead& h, size_t index, const std::string& text, bool first,
                  const json& logprobs, const char* finish_reason) {
  json c = {{"index", index}, {"logprobs", logprobs}};
  c["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  if (h.endpoint == Endpoint::chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!finish_reason || !text.empty()) delta["content"] = text;
    c["delta"] = delta;
  } else {
    c["text"] = text;
  }
  return c;
}

}  // namespace tessera::serve
