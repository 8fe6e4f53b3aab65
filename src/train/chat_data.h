// Chat data for fine-tuning: conversations in the OpenAI messages format (one JSON object a line,
// {"messages": [{"role": ..., "content": ...}, ...]}), rendered with the model's own chat
// template (the Jinja renderer, as transformers renders it) and tokenized, with a loss mask
// that counts the assistant turns only. Conversations are packed one after another into the
// token stream (a window may span two; attention then crosses the boundary, as with plain-text
// documents) or padded to start windows of their own, and split into train and validation by
// conversation.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "train/data.h"

namespace tessera::train {

// The model's chat template and the texts of its special tokens, as a prompt for it is rendered.
struct ChatTemplate {
  std::string source;    // the Jinja text
  std::string name;      // names the template in errors ("<model> chat template")
  std::string bos, eos;  // bos_token and eos_token as the template sees them
};

struct ChatTokens {
  std::vector<int32_t> tokens;
  std::vector<int32_t> mask;  // 1 on the tokens of the assistant turns (their end-of-turn text
                              // included), 0 elsewhere
};

// One conversation: for each assistant message, the conversation before it rendered with the
// generation prompt (everything up to the assistant's header, mask 0), then with the message
// (its text and end of turn, mask 1); what the template adds after the last message, mask 0.
// Each piece is tokenized on its own (special-token text as tokens) and the pieces joined.
// Throws naming `where` when the template does not render the conversation as a prefix of the
// longer one (such a template cannot say which tokens are the assistant's).
ChatTokens tokenize_chat(const tokenizer::Tokenizer& tok, const ChatTemplate& tmpl,
                         const nlohmann::ordered_json& messages, const std::string& where);

struct PrepareChatOptions {
  std::string input_path, out_dir;
  std::string tokenizer_json;  // written beside the shards
  double val_fraction = 0.05;
  int64_t min_tokens = 65;
  // 0: conversations packed back to back. Otherwise each conversation starts a window of its own:
  // it is padded (the tokenizer's pad token, else its eos, the loss mask 0) to a multiple of
  // pad_to, the training window, so no window holds two conversations; one longer than a window
  // is split over several.
  int64_t pad_to = 0;
};
// Reads the JSONL (every non-empty line a conversation with at least one assistant message;
// anything else is refused naming the file and line), tokenizes each conversation, puts the last
// ceil(val_fraction * conversations) in validation, and writes token shards with loss masks
// (<split>_NNN.bin and .mask), tokenizer.json, chat_template.jinja and meta.json. documents
// counts conversations.
PrepareStats prepare_chat_data(const PrepareChatOptions& opt, const tokenizer::Tokenizer& tok,
                               const ChatTemplate& tmpl);

}  // namespace tessera::train
