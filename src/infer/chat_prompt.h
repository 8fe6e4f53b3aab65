// Turns a conversation into prompt tokens with the model's chat template (or raw text), and the
// stop strings that go with it.
#pragma once

#include <string>
#include <vector>

#include "infer/loaded_model.h"
#include "tokenizer/chat_template.h"

namespace tessera::infer {

struct ChatPrompt {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<std::string> stop_strings;
  std::string notice;  // what the caller should tell the user (a model without a chat template)
};

// raw: the text of the messages as is (bos first when the model asks for it). Otherwise the
// built-in format named by `format_override`, or ("" ) the model's own chat template rendered
// by the Jinja renderer (jinja/template.h), or ChatML for a model that ships none (saying so in
// `notice`). `system`, when non-empty, goes first as a system message (replacing the
// template's default system prompt).
ChatPrompt make_prompt(const LoadedModel& m, const std::vector<tokenizer::ChatMessage>& msgs,
                       const std::string& system, bool raw, const std::string& format_override);

}  // namespace tessera::infer
