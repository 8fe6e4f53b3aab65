// Prompt construction for generate and chat: the model's own Jinja template where it ships one
// (rendered as transformers renders it), a named built-in format on request, ChatML with a notice
// otherwise.
#include "infer/chat_prompt.h"

#include "core/error.h"
#include "jinja/template.h"

namespace tessera::infer {

ChatPrompt make_prompt(const LoadedModel& m, const std::vector<tokenizer::ChatMessage>& msgs,
                       const std::string& system, bool raw, const std::string& format_override) {
  ChatPrompt p;
  const tokenizer::SpecialTokens& sp = m.tok.special_tokens();
  std::vector<tokenizer::ChatMessage> conv;
  if (!system.empty()) conv.push_back({"system", system});
  conv.insert(conv.end(), msgs.begin(), msgs.end());
  const std::string bos = sp.bos >= 0 ? m.tok.decode({sp.bos}) : "";
  const bool named = !format_override.empty();
  const tokenizer::ChatFormat f =
      named ? tokenizer::parse_chat_format(format_override) : tokenizer::ChatFormat::chatml;
  if (raw || f == tokenizer::ChatFormat::raw) {
    for (const tokenizer::ChatMessage& msg : msgs) p.text += msg.content;
    if (sp.add_bos && sp.bos >= 0) p.tokens.push_back(sp.bos);
    const std::vector<int32_t> ids = m.tok.encode_ordinary(p.text);
    p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
  } else if (!named && !m.chat_template.empty()) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    for (const tokenizer::ChatMessage& msg : conv)
      messages.push_back({{"role", msg.role}, {"content", msg.content}});
    const std::string eos = sp.eos >= 0 ? m.tok.decode({sp.eos}) : "";
    p.text = jinja::render_chat_template(m.chat_template, messages, bos, eos, true, nullptr,
                                         jinja::local_now, m.model.source + " chat template");
    // The rendered text carries its special tokens (bos, <|im_start|>, ...) literally; nothing
    // is added around it (transformers tokenizes a chat prompt without special tokens too).
    p.tokens = m.tok.encode(p.text);
    // Known formats also stop at their end-of-turn text; every format stops at the tokenizer's
    // end-of-generation ids.
    bool guessed = false;
    const tokenizer::ChatFormat known = tokenizer::detect_chat_format(m.chat_template, &guessed);
    if (!guessed) p.stop_strings = tokenizer::chat_stop_strings(known);
  } else {
    if (!named) p.notice = m.model.source + " ships no chat template: formatting as ChatML";
    p.text = tokenizer::render_chat(f, conv, true, bos,
                                    tokenizer::default_system_prompt(m.chat_template));
    p.tokens = m.tok.encode(p.text);
    p.stop_strings = tokenizer::chat_stop_strings(f);
  }
  TS_CHECK(!p.tokens.empty(), "[prompt] the prompt is empty");
  return p;
}

}  // namespace tessera::infer
