// Prompt construction for generate and chat.
#include "apps/cli/chat_prompt.h"

#include "core/error.h"

namespace tessera::cli {

ChatPrompt make_prompt(const LoadedModel& m, const std::vector<model::ChatMessage>& msgs,
                       const std::string& system, bool raw, const std::string& format_override) {
  ChatPrompt p;
  const model::SpecialTokens& sp = m.tok.special_tokens();
  model::ChatFormat f = model::ChatFormat::raw;
  if (!raw)
    f = format_override.empty() ? model::detect_chat_format(m.chat_template)
                                : model::parse_chat_format(format_override);
  if (f == model::ChatFormat::raw) {
    for (const model::ChatMessage& msg : msgs) p.text += msg.content;
    if (sp.add_bos && sp.bos >= 0) p.tokens.push_back(sp.bos);
    const std::vector<int32_t> ids = m.tok.encode_ordinary(p.text);
    p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
  } else {
    const std::string bos = sp.bos >= 0 ? m.tok.decode({sp.bos}) : "";
    std::vector<model::ChatMessage> conv;
    if (!system.empty()) conv.push_back({"system", system});
    conv.insert(conv.end(), msgs.begin(), msgs.end());
    p.text = model::render_chat(f, conv, true, bos, model::default_system_prompt(m.chat_template));
    // The rendered text carries its special tokens (bos, <|im_start|>, ...) literally.
    p.tokens = m.tok.encode(p.text);
    p.stop_strings = model::chat_stop_strings(f);
  }
  TS_CHECK(!p.tokens.empty(), "[prompt] the prompt is empty; give -p TEXT");
  return p;
}

}  // namespace tessera::cli
