// Generation to completion on the scheduler: one request or a batch decoded together, text
// streamed as it becomes final (whole UTF-8 characters, never the start of a stop string). The
// server drives the same scheduler step by step; these run it until every request is done.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "infer/scheduler.h"

namespace tessera::infer {

// Text callback: returns false to stop generating (FinishReason::cancelled).
using TextCallback = std::function<bool(std::string_view)>;
// For batches: `index` counts the samples of every request in order (request 0's n samples,
// then request 1's, ...).
using BatchTextCallback = std::function<bool(size_t index, std::string_view)>;

// Runs the request on `sched` (whose prefix cache, kept between calls, lets a conversation's
// next turn skip the tokens it shares with the last one) and returns sample 0's result.
GenerateResult generate(Scheduler& sched, const GenerateRequest& req,
                        const TextCallback& on_text = {});
// On a scheduler of its own (no prefix cache).
GenerateResult generate(Engine& engine, const tokenizer::Tokenizer& tok, const GenerateRequest& req,
                        const TextCallback& on_text = {});

// Decodes all requests together (every sample of every request at once; prompts in one
// forward); results in the callback's order.
std::vector<GenerateResult> generate_batch(Engine& engine, const tokenizer::Tokenizer& tok,
                                           const std::vector<GenerateRequest>& reqs,
                                           const BatchTextCallback& on_text = {});

}  // namespace tessera::infer
