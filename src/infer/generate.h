// The generate loop: prefill the prompt, then sample and feed one token per step, for one
// request or several decoded together; streams text as it becomes final (whole UTF-8
// characters, never the start of a stop string) and stops on end tokens, stop strings or length.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "infer/engine.h"
#include "infer/sampler.h"
#include "tokenizer/tokenizer.h"

namespace tessera::infer {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // at least one token
  int64_t max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;       // end-of-generation ids (not emitted)
  std::vector<std::string> stop_strings;  // cut before the first occurrence
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (a final stop token is not included)
  std::string text;             // their text, cut at a stop string
  std::string finish_reason;    // "stop" (end token or stop string), "length", "cancelled"
  int64_t prompt_tokens = 0;    // tokens actually run through the model for the prompt
  double prefill_seconds = 0, decode_seconds = 0;
};

// Text callback: returns false to stop generating ("cancelled").
using TextCallback = std::function<bool(std::string_view)>;
using BatchTextCallback = std::function<bool(size_t request, std::string_view)>;

// A conversation kept in the cache between calls (chat): `cached` lists the tokens whose keys
// and values the sequence holds. generate() reuses the longest common prefix with the new prompt
// and runs only the rest.
struct Session {
  int32_t seq = -1;
  std::vector<int32_t> cached;
};

GenerateResult generate(Engine& engine, const tokenizer::Tokenizer& tok, const GenerateRequest& req,
                        const TextCallback& on_text = {}, Session* session = nullptr);

// Decodes all requests together (one forward per step over every unfinished sequence).
std::vector<GenerateResult> generate_batch(Engine& engine, const tokenizer::Tokenizer& tok,
                                           const std::vector<GenerateRequest>& reqs,
                                           const BatchTextCallback& on_text = {});

// Length of the longest prefix of `text` that is complete UTF-8 (a character cut by a token
// boundary waits for the next token).
size_t complete_utf8_prefix(std::string_view text);

}  // namespace tessera::infer
