// Prompt construction for generate and chat.
#include "apps/cli/chat_prompt.h"

#include "core/error.h"

namespace tessera::cli {

ChatPrompt make_prompt(const LoadedModel& m, const std::vector<tokenizer::ChatMessage>& msgs,
                       const std::string& system, bool raw, const std::string& format_override) {
  ChatPrompt p;
  const tokenizer::SpecialTokens& sp = m.tok.special_tokens();
  tokenizer::ChatFormat f = tokenizer::ChatFormat::raw;
  if (!raw)
    f = format_override.empty() ? tokenizer::detect_chat_format(m.chat_template)
                                : tokenizer::parse_chat_format(format_override);
  if (f == tokenizer::ChatFormat::raw) {
    for (const tokenizer::ChatMessage& msg : msgs) p.text += msg.content;
    if (sp.add_bos && sp.bos >= 0) p.tokens.push_back(sp.bos);
    const std::vector<int32_t> ids = m.tok.encode_ordinary(p.text);
    p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
  } else {
    const std::string bos = sp.bos >= 0 ? m.tok.decode({sp.bos}) : "";
    std::vector<tokenizer::ChatMessage> conv;
    if (!system.empty()) conv.push_back({"system", system});
    conv.insert(conv.end(), msgs.begin(), msgs.end());
    p.text = tokenizer::render_chat(f, conv, true, bos,
                                    tokenizer::default_system_prompt(m.chat_template));
    // The rendered text carries its special tokens (bos, <|im_start|>, ...) literally.
    p.tokens = m.tok.encode(p.text);
    p.stop_strings = tokenizer::chat_stop_strings(f);
  }
  TS_CHECK(!p.tokens.empty(), "[prompt] the prompt is empty; give -p TEXT");
  return p;
}

}  // namespace tessera::cli
