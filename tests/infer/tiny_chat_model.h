// A tiny random Llama-shaped model with a byte-level BPE tokenizer trained on a short text, for
// the generation and scheduler tests: greedy requests, engine options sized in sequences.
#pragma once

#include <string>

#include "infer/engine.h"
#include "infer/scheduler.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace tessera::test {

struct TinyChatModel {
  tokenizer::Tokenizer tok;
  model::DecoderModel m;
  TinyChatModel() {
    std::string text;
    for (int i = 0; i < 40; ++i)
      text += "the quick brown fox jumps over the lazy dog. héllo wörld ";
    tok = tokenizer::Tokenizer::train_bpe(text, 300);
    TinyOptions o;
    o.vocab = tok.vocab_size();
    o.ctx = 256;
    m = make_tiny_model(o);
  }
};

inline const TinyChatModel& tiny_chat() {
  static const TinyChatModel f;
  return f;
}

// Context 256, blocks of 16 tokens, room for `sequences` full contexts.
inline infer::EngineOptions tiny_chat_options(int64_t sequences = 1) {
  infer::EngineOptions o;
  o.max_ctx = 256;
  o.kv_tokens = 256 * sequences;
  o.block_tokens = 16;
  return o;
}

inline infer::GenerateRequest greedy(const std::string& prompt, int64_t n) {
  infer::GenerateRequest r;
  r.prompt = tiny_chat().tok.encode(prompt);
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  return r;
}

}  // namespace tessera::test
