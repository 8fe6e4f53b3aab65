// The OpenAI request bodies the server takes (/v1/chat/completions, /v1/completions,
// /v1/embeddings), parsed and checked in full before any work: a wrong type, an out-of-range
// number, an unknown field or one this server does not implement (tools, response_format, ...)
// is an ApiError naming the field; nothing is ignored silently.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "infer/sampler.h"
#include "tokenizer/chat_template.h"

namespace tessera::serve {

// An error the client sees as OpenAI's error JSON with this HTTP status.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "",
           std::string type = "invalid_request_error");
  int status;
  std::string param, type;
};

enum class Endpoint { chat, completion };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::chat;
  std::string model;
  std::vector<tokenizer::ChatMessage> messages;  // chat
  std::string prompt;                            // completion: text,
  std::vector<int32_t> prompt_tokens;            // or token ids (prompt then empty)
  bool prompt_is_tokens = false;
  int64_t max_tokens = -1;  // -1: not given (chat: what the context leaves; completion: 16)
  const char* max_tokens_field = "max_tokens";  // the name the client used
  // OpenAI's defaults where the client gives nothing: temperature 1, top_p 1, no top_k, min_p
  // or penalties; a fresh random seed unless `seed` is given.
  infer::SamplingParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  int64_t n = 1;
  bool stream = false, include_usage = false;
  int64_t top_logprobs = -1;  // -1: no log-probabilities
  // Extension (vLLM, llama-server): no end-of-generation token or chat-template end-of-turn
  // text ends the answer, so it runs to max_tokens (unless a `stop` string is met).
  bool ignore_eos = false;
  bool skip_special_tokens = true;  // as vLLM and SGLang: special tokens add no text
};

struct EmbeddingRequest {
  std::string model;
  std::vector<std::string> texts;                 // input as text,
  std::vector<std::vector<int32_t>> token_lists;  // or as token ids
  bool base64 = false;                            // encoding_format "base64"
};

// Each parses a body (a JSON object; nesting deeper than 32 levels is refused before it is
// built) and throws ApiError 400 naming the problem (ill-formed UTF-8 included).
GenerationRequest parse_chat_request(std::string_view body);
GenerationRequest parse_completion_request(std::string_view body);
EmbeddingRequest parse_embedding_request(std::string_view body);

}  // namespace tessera::serve
