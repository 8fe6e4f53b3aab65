// Perplexity over a token stream with sliding windows: each window of ctx tokens is run as a
// fresh sequence and scores only its tokens that earlier windows did not (all of the first
// window's), so every scored token sees at least ctx - stride tokens of context after the first.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "infer/engine.h"

namespace tessera::infer {

// sliding: windows every `stride` tokens, each scoring the tokens the ones before did not, every
// token once. chunks: llama.cpp's llama-perplexity: floor(tokens / ctx) non-overlapping windows,
// each starting with `bos` (when >= 0; it replaces the window's first token), scoring the
// predictions of its second half (ctx - 1 - ctx/2 tokens a window), so that figures compare
// with the tables people publish for GGUF files.
enum class Scoring { sliding, chunks };

struct PerplexityOptions {
  int64_t ctx = 512;
  Scoring scoring = Scoring::sliding;
  int64_t stride = 0;       // sliding: new tokens per window after the first; 0: ctx / 2
  int64_t max_windows = 0;  // 0: the whole text
  int32_t bos = -1;         // chunks: the token each window starts with; -1: none
};

struct PerplexityResult {
  double nll_sum = 0;  // natural log
  int64_t tokens = 0;  // tokens scored
  int64_t windows = 0;
  double seconds = 0;
  double ppl() const { return tokens ? std::exp(nll_sum / static_cast<double>(tokens)) : 0; }
};

// `progress` (optional) is called after each window with the running result.
PerplexityResult perplexity(Engine& engine, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& opts,
                            const std::function<void(const PerplexityResult&)>& progress = {});

}  // namespace tessera::infer
