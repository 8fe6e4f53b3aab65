// OpenAI's response shapes: chat completions and completions (whole, and as server-sent-event
// chunks), log-probabilities, usage, and the error object.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "infer/scheduler.h"
#include "nlohmann/json.hpp"
#include "serve/api_request.h"
#include "tokenizer/tokenizer.h"

namespace tessera::serve {

using nlohmann::json;

// JSON text, with ill-formed UTF-8 (a token that is part of a character) replaced, never thrown.
std::string dump(const json& j);

// Standard base64 (RFC 4648, padded): embeddings with encoding_format "base64".
std::string base64(std::string_view bytes);

// {"error": {"message", "type", "param", "code"}}
json error_json(const ApiError& e);

// "chatcmpl-..." / "cmpl-..." with 24 random hex digits.
std::string new_id(Endpoint e);

// OpenAI's finish_reason for ours: a deadline ends like a length limit; a cancelled request
// (server shutdown) is "abort", as vLLM reports it.
const char* api_finish_reason(infer::FinishReason r);

// The log-probabilities of generated tokens in the endpoint's shape: chat {"content": [{token,
// logprob, bytes, top_logprobs}]}; completions {tokens, token_logprobs, top_logprobs,
// text_offset} (text_offset from `offset`, the text length before these tokens).
json logprobs_json(Endpoint e, const tokenizer::Tokenizer& tok,
                   std::span<const infer::GeneratedToken> tokens, size_t offset);

// Usage of a request: the prompt once, every sample's tokens; cached = prompt tokens taken from
// the prefix cache.
json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

// The header shared by every object of one response.
struct ResponseHead {
  Endpoint endpoint;
  std::string id, model;
  int64_t created;
};
// One choice of a whole response.
json choice_json(const ResponseHead& h, size_t index, const std::string& text, const json& logprobs,
                 infer::FinishReason finish);
json response_json(const ResponseHead& h, json choices, const json& usage);
// One streamed chunk: a choice's new text (with the role on its first chunk, chat) or its
// finish_reason; choices empty and usage set for the final usage chunk.
json chunk_json(const ResponseHead& h, json choices, const json* usage);
json chunk_choice(const ResponseHead& h, size_t index, const std::string& text, bool first,
                  const json& logprobs, const char* finish_reason);

}  // namespace tessera::serve
