// libFuzzer target: the server's OpenAI request parsers (chat, completions, embeddings) on an
// arbitrary body. ApiError (a 400 naming the field) is the expected outcome for bad input; a
// crash, a sanitizer report or any other exception is a bug. What parses must hold values in
// the ranges the parser promises.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz_util.h"
#include "serve/api_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::serve;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    const GenerationRequest r = parse_chat_request(body);
    if (r.messages.empty() || r.n < 1 || r.n > 128 || r.top_logprobs > 20 ||
        !(r.sampling.temperature >= 0 && r.sampling.temperature <= 2) ||
        !(r.sampling.top_p > 0 && r.sampling.top_p <= 1) ||
        (r.max_tokens != -1 && r.max_tokens < 1))
      std::abort();
  } catch (const ApiError& e) {
    tessera::fuzz::note_rejected("parse_chat_request", e);
  }
  try {
    const GenerationRequest r = parse_completion_request(body);
    if ((r.prompt.empty() && r.prompt_tokens.empty()) || r.n < 1) std::abort();
  } catch (const ApiError& e) {
    tessera::fuzz::note_rejected("parse_completion_request", e);
  }
  try {
    const EmbeddingRequest r = parse_embedding_request(body);
    if (r.texts.empty() && r.token_lists.empty()) std::abort();
  } catch (const ApiError& e) {
    tessera::fuzz::note_rejected("parse_embedding_request", e);
  }
  return 0;
}
